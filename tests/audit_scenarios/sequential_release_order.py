# Sequential.forward (`for module in self: input = module(input)`): stock drops the previous
# input at `input = ...` right after the child returns, and the child only when the loop
# variable is rebound (next iteration) or the frame ends. The native loop drops the child
# first, then the input. When both were the last references (the child removed itself from
# _modules during its call, the input was the previous child's output), their weakref
# callbacks / finalizers run in the opposite order.
import sys
import weakref

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

log = []
keep = []


class Producer(nn.Module):
    def forward(self, x):
        y = x + 1
        keep.append(weakref.ref(y, lambda r: log.append("input of child 1 freed")))
        return y


class SelfRemoving(nn.Module):
    def forward(self, x):
        seq = owner[0]
        del seq._modules["1"]
        seq._modules["1b"] = nn.Identity()  # same size: iteration goes on
        keep.append(weakref.ref(self, lambda r: log.append("child 1 freed")))
        return x * 2


seq = nn.Sequential(Producer(), SelfRemoving(), nn.Identity())
owner = [seq]
if fast:
    fastmodule.accelerate(seq)
try:
    out = seq(torch.zeros(1))
    print("result", out.tolist())
except RuntimeError as e:
    print("error", e)
print(log)
