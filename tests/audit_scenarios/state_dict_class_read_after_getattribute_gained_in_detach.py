# A class gains __getattribute__ while a module's _save_to_state_dict is running (code in a
# kernel: a TorchFunctionMode at the parameter's detach). torch's body then reads
# `self._buffers`, `self._non_persistent_buffers_set` and `self.__class__` (the get_extra_state
# check) through it; fastmodule's native save_own reads `__class__` by a class lookup only.
import sys

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule


class Leaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.register_buffer("buf", torch.zeros(2))


m = Leaf()
if fast:
    fastmodule.accelerate(m)
for _ in range(3):
    m.state_dict()
log = []


def ga(self, n):
    log.append(n)
    return object.__getattribute__(self, n)


class Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if "__getattribute__" not in Leaf.__dict__:
            Leaf.__getattribute__ = ga
        return func(*args, **(kwargs or {}))


with Mode():
    sd = m.state_dict()
print(list(sd))
print("reads through the new __getattribute__:", log)
