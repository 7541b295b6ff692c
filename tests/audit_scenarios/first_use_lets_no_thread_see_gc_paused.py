# The first call of each native path in a fresh interpreter, with another thread polling
# `gc.isenabled()`. Recording a plan (state_dict, load_state_dict, _apply, train) and the
# replays that check one pause the cyclic GC, and only code that lets no other thread run
# may be inside such a pause. pyo3's `intern!` is not such code: it fills its cell
# through `PyOnceLock`, which releases the GIL the first time each site runs, and the
# watcher then saw the GC off (the thread-stress `walks` scenario found it on CPython
# 3.13). Stock never changes the GC's state: on both sides the watcher must never see it
# off. The rest of the output (what the calls returned) must be the same too.
import ctypes
import gc
import sys
import threading

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

    Base = fastmodule.Module
else:
    Base = nn.Module

# Threads change hands every microsecond: the watcher runs at every GIL release.
sys.setswitchinterval(1e-6)
torch.set_num_threads(1)


class Block(Base):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("b", torch.zeros(2))

    def forward(self, x):
        return self.norm(self.lin(x))


class Tree(Base):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(40))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


torch.manual_seed(0)
model = Tree()
if fast:
    fastmodule.accelerate(model)

PR_SET_TIMERSLACK = 29
stop = threading.Event()
polls = [0, 0]  # polls, polls that saw the GC off


def watch():
    # The watcher asks for the GIL after 1 us of waiting, not after the OS's default
    # 50 us of timer slack: a pause that releases the GIL past its first microseconds
    # hands it over.
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    while not stop.is_set():
        polls[0] += 1
        if not gc.isenabled():
            polls[1] += 1


watcher = threading.Thread(target=watch)
watcher.start()
out = []
try:
    x = torch.randn(5, 4)
    sd = None
    # Each call three times: the first walks live and records, the next ones replay.
    for _ in range(3):
        # keep_vars first: a live walk that releases no GIL (no detach), so the
        # watcher is asking for it when the recording starts.
        out.append(list(model.state_dict(keep_vars=True)))
        sd = model.state_dict()
        out.append(list(sd))
        out.append(model.load_state_dict(sd))
        model.float()
        model.to(torch.float32)
        model.train(False)
        model.train()
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        model.zero_grad(set_to_none=False)
        model.zero_grad()
        out.append([n for n, _ in model.named_parameters()])
        out.append([n for n, _ in model.named_buffers()])
        out.append([n for n, _ in model.named_modules()])
        out.append(len(list(model.children())))
        out.append(model(x).shape)
finally:
    stop.set()
    watcher.join()

for o in out:
    print(o)
print("the watcher polled:", polls[0] > 0)
print("polls that saw the GC off:", polls[1])
