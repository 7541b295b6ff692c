# A class gains __getattribute__ while `_apply(fn)` converts a child (in `fn` here; a
# child's `_apply` override does the same). torch's `_apply` of the parent then reads
# `self._parameters` (after its children) through it; fastmodule reads the instance dict.
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule


class Node(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        if d:
            self.sub = Node(d - 1)


m = Node(1)
if fast:
    fastmodule.accelerate(m)
for _ in range(3):
    m.double()
    m.float()
log = []


def ga(self, n):
    log.append(n)
    return object.__getattribute__(self, n)


def fn(t):
    if "__getattribute__" not in Node.__dict__:
        Node.__getattribute__ = ga
    return t.double()


m._apply(fn)
del Node.__getattribute__
print([p.dtype for p in m.parameters()])
print("reads through the new __getattribute__:", log)
