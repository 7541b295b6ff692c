# torch's _call_impl reads `forward_call = self.forward` FIRST, then tests the hook dicts.
# fastmodule's module call decides "no hooks" (live(): every hook dict empty) and only then
# reads `self.forward`; where that read runs code (a `forward` property or any descriptor
# with a Python __get__ -> find_forward's Generic case), a hook that code registers runs in
# this very call on stock, and not on fastmodule (equally: a backward hook it registers is
# ignored by the native hook dispatch, and another thread's registration made while that
# code releases the GIL).
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

log = []


class M(nn.Module):
    arm = [False]

    def _forward(self, x):
        log.append("forward")
        return x + 1

    @property
    def forward(self):
        if M.arm[0]:
            M.arm[0] = False
            self.register_forward_pre_hook(lambda mod, args: log.append("pre-hook") or None)
            self.register_forward_hook(lambda mod, args, out: log.append("hook") or None)
        return self._forward


m = M()
if fast:
    fastmodule.accelerate(m)
x = torch.zeros(1)
M.arm[0] = True
print("call 1", m(x).tolist(), log)
log.clear()
print("call 2", m(x).tolist(), log)
