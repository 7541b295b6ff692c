# `m.p = nn.Parameter(...)` (and `m.p = None` for a parameter slot): torch's __setattr__ calls
# `self.register_parameter(name, value)`, which finds an instance-dict entry first (a function
# set on one module, e.g. by a tool that records registrations). fastmodule's __setattr__ checks
# only the class's register_parameter.
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

m = nn.Linear(2, 2)
if fast:
    fastmodule.accelerate(m)
calls = []
orig = m.register_parameter


def recording(name, value):
    calls.append(name)
    return orig(name, value)


m.__dict__["register_parameter"] = recording
m.extra = nn.Parameter(torch.ones(1))
m.extra = nn.Parameter(torch.zeros(1))
m.bias = None
m.register_parameter("direct", None)
print("recorded", calls)
print(sorted(m._parameters))
