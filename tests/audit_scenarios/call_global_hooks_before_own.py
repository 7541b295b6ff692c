# torch builds `(*_global_forward_hooks.items(), *self._forward_hooks.items())`: the global
# registry's items() is called and iterated BEFORE `self._forward_hooks` is read.
# hooks_dispatch::hooks_to_run reads `self._forward_hooks` first, then snapshots the global
# one: where that snapshot runs code (a registry that is not an exact dict/OrderedDict, put
# in place after the call's decision, here by a forward pre-hook) and rebinds
# `self._forward_hooks`, stock runs the new registry's hooks, fastmodule the old one's.
import sys
from collections import OrderedDict

import torch
import torch.nn.modules.module as module_py
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

log = []
m = nn.Linear(1, 1)
if fast:
    fastmodule.accelerate(m)


class Registry(dict):
    def items(self):
        new = OrderedDict()
        new[12345] = lambda mod, args, out: log.append("new registry's hook") or None
        m._forward_hooks = new
        module_py._global_forward_hooks = OrderedDict()  # put torch's kind back
        return super().items()


def pre(mod, args):
    log.append("pre-hook")
    module_py._global_forward_hooks = Registry(
        {999: lambda mod, args, out: log.append("global hook") or None}
    )


original = module_py._global_forward_hooks
m.register_forward_pre_hook(pre)
m.register_forward_hook(lambda mod, args, out: log.append("old registry's hook") or None)
m(torch.zeros(1, 1))
module_py._global_forward_hooks = original
print(log)
