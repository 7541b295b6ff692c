# An instance-dict `_call_impl` (set on one module, e.g. by a tool that wraps one layer's
# call) is what torch's `_wrapped_call_impl` calls: `self._call_impl(*args, **kwargs)`.
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

calls = []
for kind in ("Linear", "Custom", "Sequential"):

    class Custom(nn.Module):
        def forward(self, x):
            return x + 1

    m = {
        "Linear": lambda: nn.Linear(2, 2),
        "Custom": Custom,
        "Sequential": lambda: nn.Sequential(nn.ReLU()),
    }[kind]()
    if fast:
        fastmodule.accelerate(m)
    for _ in range(3):
        m(torch.ones(1, 2))
    orig = m._call_impl

    def wrapper(*a, **k):
        calls.append(kind)
        return orig(*a, **k)

    m._call_impl = wrapper  # instance attribute, nn.Module.__setattr__ -> __dict__
    print(kind, "in __dict__:", "_call_impl" in m.__dict__)
    m(torch.ones(1, 2))
print("wrapper calls", calls)
