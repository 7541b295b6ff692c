# torch's `_load_from_state_dict` copies each parameter (`param.copy_(input)`, which releases the
# GIL: another thread runs) and only then reads `self._modules` (the strict unexpected-key scan),
# `self.__class__.set_extra_state`, and, per parameter after the previous copy, the shapes.
# fastmodule's native `_load_from_state_dict` (state/load_from_state_dict.rs) and the load replay
# (state/load_state_dict_plan.rs + load_state_dict.rs replay_module) decide all of that before the
# first copy. A patched `Tensor.copy_` stands in for the other thread (deterministic).
import sys

import torch
from torch import nn

fast = sys.argv[1] == "fast"
if fast:
    import fastmodule

orig_copy = torch.Tensor.copy_
action = [None]


def copy_(self, src, *a, **k):
    f, action[0] = action[0], None
    if f is not None:
        f()
    return orig_copy(self, src, *a, **k)


torch.Tensor.copy_ = copy_


class Root(nn.Module):
    def __init__(self, child=True):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(2))
        self.b = nn.Parameter(torch.zeros(2))
        if child:
            self.c = nn.Linear(2, 2)


def build(child=True):
    m = Root(child)
    if fast:
        fastmodule.accelerate(m)
    return m


def run(name, m, sd, f, warm):
    if warm:  # first call records the plan (fastmodule); the second replays it
        m.load_state_dict(sd)
    action[0] = f
    try:
        r = m.load_state_dict(sd)
        print(name, "ok", sorted(r.missing_keys), sorted(r.unexpected_keys))
    except RuntimeError as e:
        print(name, "RuntimeError", str(e).replace("\n", " ")[:300])


src = {k: v.clone() for k, v in Root().state_dict().items()}
for warm in (False, True):
    tag = "replay" if warm else "live"

    # 1. a child removed during a copy: stock reports its keys as unexpected.
    m = build()
    run(tag + "/child-removed", m, src, lambda: delattr(m, "c"), warm)

    # 2. a child added during a copy: stock finds its keys expected (and loads it).
    m = build(child=False)
    sd = dict(src)
    if warm:
        m.c = nn.Linear(2, 2)  # recorded with the child, removed, re-added mid-copy
        m.load_state_dict(sd)
        del m.c
    run(tag + "/child-added", m, sd, lambda: setattr(m, "c", nn.Linear(2, 2)), False)

    # 3. a later parameter's shape changed during an earlier copy: stock compares shapes after.
    m = build()
    run(tag + "/shape-changed", m, src, lambda: setattr(m.b, "data", torch.zeros(3, 2)), warm)

    # 4. set_extra_state defined on the class during a copy: stock asks for `_extra_state`.
    Cls = type("Cls", (Root,), {})
    m = Cls()
    if fast:
        fastmodule.accelerate(m)
    run(
        tag + "/extra-state",
        m,
        src,
        lambda: setattr(Cls, "set_extra_state", lambda self, s: None),
        warm,
    )
