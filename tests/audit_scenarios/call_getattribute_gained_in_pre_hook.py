# A forward pre-hook gives the layer's class a __getattribute__ (then the hook is removed).
# torch's forward reads self.weight / self.bias / self.inplace / self._modules ... through it
# on this very call; fastmodule's native layer steps read the instance dicts directly.
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule
torch.manual_seed(0)
log = []


def ga(self, n):
    log.append(n)
    return object.__getattribute__(self, n)


def case(name, make, x):
    cls = type("My" + name, (make().__class__,), {})  # fresh class per case
    m = make()
    m.__class__ = cls
    if fast:
        fastmodule.accelerate(m)
    for _ in range(3):
        m(x)

    def hook(mod, args):
        cls.__getattribute__ = ga

    h = m.register_forward_pre_hook(hook)
    log.clear()
    y = m(x)
    h.remove()
    print(name, [round(float(v), 4) for v in y.flatten()[:3]], log)
    log.clear()
    m(x)
    print(name, "after", log)
    del cls.__getattribute__


x = torch.randn(2, 4)
case("Linear", lambda: nn.Linear(4, 4), x)
case("ReLU", lambda: nn.ReLU(), x)
case("GELU", lambda: nn.GELU(), x)
case("LayerNorm", lambda: nn.LayerNorm(4), x)
case("Dropout", lambda: nn.Dropout(0.0), x)
case("Softmax", lambda: nn.Softmax(dim=-1), x)
case("Sequential", lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU()), x)
case("BatchNorm1d", lambda: nn.BatchNorm1d(4), x)
case("Embedding", lambda: nn.Embedding(10, 4), torch.tensor([1, 2]))
case("Conv1d", lambda: nn.Conv1d(2, 2, 1), torch.randn(1, 2, 3))
