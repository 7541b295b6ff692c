# The native `_load_from_state_dict` (state/load_from_state_dict.rs, `ascii_names`) keeps the bytes
# of every `_modules` key borrowed (slices into the key strs, no reference taken) in `by_bytes`,
# then calls `local.try_iter()`, which allocates a GC-tracked iterator: a collection there runs
# Python code (a finalizer of cyclic garbage here) that can delete a child, freeing its
# name. The unexpected-key scan then compares keys against the freed bytes. A name large enough
# to be mmap'd is unmapped when freed: the comparison faults. Stock reads `self._modules` live.
# Usage: X.py stock|fast [N]  (N: gc threshold after the arming point; the fault needs the
# collection to land on the iterator's allocation; run.sh-style callers use the default).
import gc
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 3
if fast:
    import fastmodule

# Above glibc's largest mmap threshold (32 MiB): its allocation is unmapped when freed.
LEN = 40 << 20
name = "n" * LEN
root = nn.Module()
root.add_module(name, nn.Linear(2, 2))
if fast:
    fastmodule.accelerate(root)

sd = {}
sd[name + ".weight"] = torch.ones(2, 2)  # other str objects with the same bytes
sd[name + ".bias"] = torch.ones(2)
del name  # the child's name is now held by root._modules only


class Bomb:
    def __del__(self):
        for name in list(root._modules):
            del root._modules[name]  # frees the (40 MiB) name str


class Meta:
    def get(self, key, default):
        if key == "":
            gc.collect()
            b = Bomb()
            b.cycle = b  # garbage for the next collection, whose finalizer deletes the child
            del b
            gc.set_threshold(N)
        return default


class SD(dict):
    pass


sd = SD(sd)
sd._metadata = Meta()
try:
    root.load_state_dict(sd)
except RuntimeError:
    pass
gc.set_threshold(700, 10, 10)
print("done")
