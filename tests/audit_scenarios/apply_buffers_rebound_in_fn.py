# torch's `_apply` ends with `for key, buf in self._buffers.items(): self._buffers[key] = fn(buf)`:
# `self._buffers` is read again for every store. fastmodule's `_apply` (state/apply.rs) skips the
# store of a buffer the conversion leaves as is, checking only the dict it iterates; when
# `_buffers` was rebound meanwhile (by code inside an earlier `fn(buf)`: another thread while the
# kernel releases the GIL; here, deterministically, an instance attribute the closure calls) the
# store into the new dict is lost. Stock's new dict gets every later buffer.
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

m = nn.Module()
m.register_buffer("b0", torch.zeros(2, dtype=torch.float64))  # converted by .float()
m.register_buffer("b1", torch.zeros(2))  # float32 already: left as is
if fast:
    fastmodule.accelerate(m)
b0 = m.b0


def float_and_rebind():
    del b0.float  # once
    m._buffers = {"b0": m._buffers["b0"]}  # another thread rebinds the registry
    return torch.Tensor.float(b0)


b0.float = float_and_rebind  # torch's closure calls `t.float()`: the instance attribute
m.float()
print(sorted(m._buffers), {k: v.dtype for k, v in m._buffers.items()})
print("b1" in m._buffers and m.b1.dtype)
