"""The synthetic benchmark cases: the same work on stock ``torch.nn.Module``, on
``fastmodule.Module`` and without module machinery (the lower bound), on small classes
built here.

- Calls (``call``, ``call_kwargs``, ``call_reassigned_buffer``, ``call_after_trace``),
  attribute reads (``getattr_*``) and writes (``setattr_*``) on one module.
- Whole-tree methods on a wide tree (``tree_*``), on a mixture-of-experts shaped tree
  (``moe_*``) and on a wide tree of stock classes under ``fastmodule.accelerate``
  (``accel_tree_*``).
- Small models: ``mlp64`` (``fastmodule.Module`` containers) and ``mlp64_accelerated``,
  ``cnn_accelerated``, ``block_accelerated`` (torch's layers, accelerated).

The stock and fast classes of each pair are built by
:func:`~fastmodule.bench.case.pair` from the *same* function objects, so the only
difference between the two columns is the base class. The case type and the shared
helpers are in :mod:`~fastmodule.bench.case`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fastmodule.acceleration import accelerated
from fastmodule.bench.case import Case, Variant, pair, scaled, three
from fastmodule.tools.strict import strict

__all__ = [
    "SYNTHETIC_CASES",
    "FastIdentity",
    "FastTree",
    "StockIdentity",
    "StockTree",
    "identity_forward",
    "mlp_lower",
    "torch_mlp",
]


class Plain:
    """A plain Python object: the lower bound for attribute reads and writes."""


def identity_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x


def _kwargs_forward(
    self: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None
) -> torch.Tensor:
    return x


def _leaf_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.weight = nn.Parameter(torch.zeros(4))


def _parent_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.child = type(self).leaf_cls()
    self.weight = nn.Parameter(torch.zeros(4))


def _parent_call_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.child(x) + self.weight


def _cache_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.register_buffer("cache", torch.zeros(1), persistent=False)


def _cache_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # A KV cache or running statistic written by assignment: every call
    # rebinds a registered buffer (Module.__setattr__ -> self._buffers[name]).
    self.cache = x
    return x


def _block_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.lin = nn.Linear(32, 32)


def _block_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.relu(self.lin(x))


def _mlp_init(self: nn.Module, depth: int = 64) -> None:
    nn.Module.__init__(self)
    self.blocks = nn.ModuleList(type(self).block_cls() for _ in range(depth))


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    for block in self.blocks:
        x = block(x)
    return x


StockIdentity, FastIdentity = pair("Identity", {"forward": identity_forward})
StockKwargs, FastKwargs = pair("Kwargs", {"forward": _kwargs_forward})
StockLeaf, FastLeaf = pair("Leaf", {"__init__": _leaf_init, "forward": identity_forward})
StockParent, FastParent = pair(
    "Parent",
    {"__init__": _parent_init, "forward": identity_forward},
    leaf_cls=(StockLeaf, FastLeaf),
)
StockTraced, FastTraced = pair(
    "Traced",
    {"__init__": _parent_init, "forward": _parent_call_forward},
    leaf_cls=(StockLeaf, FastLeaf),
)
StockCache, FastCache = pair("Cache", {"__init__": _cache_init, "forward": _cache_forward})
StockBlock, FastBlock = pair("Block", {"__init__": _block_init, "forward": _block_forward})
StockMLP, FastMLP = pair(
    "MLP", {"__init__": _mlp_init, "forward": _mlp_forward}, block_cls=(StockBlock, FastBlock)
)


def _build_call(device: torch.device) -> dict[str, Variant]:
    x = torch.zeros(1)
    stock, fast = StockIdentity(), FastIdentity()
    return three(
        Variant("m(x)", {"m": stock, "x": x}),
        Variant("m(x)", {"m": fast, "x": x}),
        Variant("m.forward(x)", {"m": stock, "x": x}),
    )


def _build_call_kwargs(device: torch.device) -> dict[str, Variant]:
    x, y = torch.zeros(1), torch.zeros(1)
    stock, fast = StockKwargs(), FastKwargs()
    return three(
        Variant("m(x, y=y)", {"m": stock, "x": x, "y": y}),
        Variant("m(x, y=y)", {"m": fast, "x": x, "y": y}),
        Variant("m.forward(x, y=y)", {"m": stock, "x": x, "y": y}),
    )


def _build_call_reassigned_buffer(device: torch.device) -> dict[str, Variant]:
    x, y = torch.zeros(1), torch.ones(1)
    stock, fast = StockCache(), FastCache()
    return three(
        Variant("m(x); m(y)", {"m": stock, "x": x, "y": y}),
        Variant("m(x); m(y)", {"m": fast, "x": x, "y": y}),
        Variant("m.forward(x); m.forward(y)", {"m": stock, "x": x, "y": y}),
    )


def _build_call_after_trace(device: torch.device) -> dict[str, Variant]:
    """``m(x)`` on a parent with a child, after ``torch.fx`` and ``torch.export`` traced it.

    Both tracers patch ``nn.Module.__call__``/``__getattr__`` for the duration of
    the trace, which resets fastmodule's C slots; this case shows they are back.
    """
    x = torch.zeros(4)
    stock, fast = StockTraced(), FastTraced()
    for m in (stock, fast):
        torch.fx.symbolic_trace(m)
        torch.export.export(m, (x,), strict=False)
    return three(
        Variant("m(x)", {"m": stock, "x": x}),
        Variant("m(x)", {"m": fast, "x": x}),
        # The same math with the module machinery removed: the child's forward
        # and the parameter pulled out beforehand.
        Variant("f(x) + w", {"f": stock.child.forward, "x": x, "w": stock.weight}),
    )


def _tree_block_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.lin = nn.Linear(4, 4)
    self.norm = nn.LayerNorm(4)
    self.register_buffer("scale", torch.ones(4))


def _tree_init(self: nn.Module, blocks: int = 2000) -> None:
    nn.Module.__init__(self)
    for i in range(blocks):
        self.add_module(f"b{i}", type(self).block_cls())


StockTreeBlock, FastTreeBlock = pair("TreeBlock", {"__init__": _tree_block_init})
StockTree, FastTree = pair(
    "Tree", {"__init__": _tree_init}, block_cls=(StockTreeBlock, FastTreeBlock)
)


def _pair_builder(
    make: Callable[[], tuple[nn.Module, nn.Module]],
    stmt: str,
    lower: Callable[[nn.Module], Variant],
    extra: Callable[[nn.Module], dict[str, Any]] | None = None,
) -> Callable[[torch.device], dict[str, Variant]]:
    """``stmt`` on a stock tree and on the same tree with fastmodule classes
    (``make()`` builds both; the fast one gets the stock one's values).
    ``extra(tree)``: more globals for ``stmt``, built from each side's own tree."""

    def build(device: torch.device) -> dict[str, Variant]:
        torch.manual_seed(0)
        stock, fast = make()
        sd = stock.state_dict()
        fast.load_state_dict(sd)

        def namespace(m: nn.Module) -> dict[str, Any]:
            return {"m": m, "sd": sd, **(extra(m) if extra else {})}

        return three(
            Variant(stmt, namespace(stock)),
            Variant(stmt, namespace(fast)),
            lower(stock),
        )

    return build


def _tree_builder(
    stmt: str,
    lower: Callable[[nn.Module], Variant],
    blocks: int = 2000,
    extra: Callable[[nn.Module], dict[str, Any]] | None = None,
) -> Callable[[torch.device], dict[str, Variant]]:
    """A whole-tree operation on the design notes' wide tree.

    2000 blocks of Linear(4,4) + LayerNorm(4) + a buffer: 6001 modules, 10000 tensors.
    """
    return _pair_builder(
        lambda: (StockTree(scaled(blocks)), FastTree(scaled(blocks))), stmt, lower, extra
    )


def _grads_of(tree: nn.Module) -> dict[str, Any]:
    """Each parameter of ``tree`` with a zero tensor to give it as its grad."""
    return {"given": [(p, torch.zeros_like(p)) for p in tree.parameters()]}


#: Every parameter gets a grad, as after a backward pass (same work on every side).
_GIVE_GRADS = "for p, g in given: p.grad = g\n"


def _expert_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.up = nn.Linear(8, 16)
    self.down = nn.Linear(16, 8)


def _moe_layer_init(self: nn.Module, experts: int = 64) -> None:
    nn.Module.__init__(self)
    self.router = nn.Linear(8, experts)
    self.experts = nn.ModuleList(type(self).expert_cls() for _ in range(experts))


def _moe_init(self: nn.Module, layers: int = 32) -> None:
    nn.Module.__init__(self)
    self.layers = nn.ModuleList(type(self).layer_cls() for _ in range(layers))


StockExpert, FastExpert = pair("Expert", {"__init__": _expert_init})
StockMoELayer, FastMoELayer = pair(
    "MoELayer", {"__init__": _moe_layer_init}, expert_cls=(StockExpert, FastExpert)
)
StockMoE, FastMoE = pair("MoE", {"__init__": _moe_init}, layer_cls=(StockMoELayer, FastMoELayer))


def _moe_builder(
    stmt: str, lower: Callable[[nn.Module], Variant]
) -> Callable[[torch.device], dict[str, Variant]]:
    """A whole-tree operation on a mixture-of-experts shaped tree.

    32 layers x (router Linear + 64 experts x 2 Linear): 6241 modules, 8256 tensors.
    The user classes differ by base; the Linear and ModuleList leaves are torch's.
    """
    return _pair_builder(lambda: (StockMoE(scaled(32)), FastMoE(scaled(32))), stmt, lower)


def _stock_tree(blocks: int) -> nn.Module:
    """The wide tree built from stock classes only (for ``fastmodule.accelerate``)."""
    root = nn.Module()
    for i in range(blocks):
        block = nn.Module()
        block.lin = nn.Linear(4, 4)
        block.norm = nn.LayerNorm(4)
        block.register_buffer("scale", torch.ones(4))
        root.add_module(f"b{i}", block)
    return root


def _accelerated_tree_builder(
    stmt: str, lower: Callable[[nn.Module], Variant], blocks: int = 2000
) -> Callable[[torch.device], dict[str, Variant]]:
    """A whole-tree operation on a tree of stock classes, stock vs ``accelerate``.

    Both columns time the very same tree; the fast column accelerates its classes
    (per class, so only for that column). On CPython 3.11 torch's whole-tree methods
    called from Python are not routed (see docs/design.md), so expect ~1x there.
    """

    def build(device: torch.device) -> dict[str, Variant]:
        torch.manual_seed(0)
        tree = _stock_tree(scaled(blocks))
        sd = tree.state_dict()

        @contextlib.contextmanager
        def fast() -> Any:
            with accelerated(tree):
                yield

        return three(
            Variant(stmt, {"m": tree, "sd": sd}),
            Variant(stmt, {"m": tree, "sd": sd}, fast),
            lower(tree),
        )

    return build


def _flat_lower(kind: str) -> Callable[[nn.Module], Variant]:
    """The same list without a walk: copying a list built once beforehand."""

    def make(stock: nn.Module) -> Variant:
        flat = {
            "named_parameters": list(stock.named_parameters()),
            "parameters": list(stock.parameters()),
            "named_modules": list(stock.named_modules()),
        }[kind]
        return Variant("list(flat)", {"flat": flat})

    return make


def _loop_lower(stmt: str, items: str) -> Callable[[nn.Module], Variant]:
    """The per-item work of a walk over a pre-built flat list."""

    def make(stock: nn.Module) -> Variant:
        return Variant(stmt, {"flat": list(getattr(stock, items)())})

    return make


def _copy_lower(stock: nn.Module) -> Variant:
    """load_state_dict's unavoidable work: one in-place copy per tensor."""
    sd = stock.state_dict()
    pairs = [(t, sd[k]) for k, t in stock.state_dict(keep_vars=True).items()]
    return Variant(
        "with torch.no_grad():\n        for dst, src in pairs: dst.copy_(src)",
        {"pairs": pairs, "torch": torch},
    )


def _detach_lower(stock: nn.Module) -> Variant:
    """state_dict's unavoidable work: detaching each of the 10000 tensors."""
    flat = list(stock.state_dict(keep_vars=True).values())
    return Variant("[t.detach() for t in flat]", {"flat": flat})


def _plain_object() -> Plain:
    obj = Plain()
    obj.plain = torch.zeros(4)
    obj.child = Plain()
    obj.child.plain = obj.plain
    return obj


def _getattr_builder(stmt: str, lower_stmt: str) -> Callable[[torch.device], dict[str, Variant]]:
    def build(device: torch.device) -> dict[str, Variant]:
        return three(
            Variant(stmt, {"parent": StockParent()}),
            Variant(stmt, {"parent": FastParent()}),
            Variant(lower_stmt, {"obj": _plain_object()}),
        )

    return build


def _setattr_builder(
    stmt: str, lower_stmt: str, value: Callable[[], Any]
) -> Callable[[torch.device], dict[str, Variant]]:
    def build(device: torch.device) -> dict[str, Variant]:
        v = value()
        return three(
            Variant(stmt, {"m": StockIdentity(), "v": v}),
            Variant(stmt, {"m": FastIdentity(), "v": v}),
            Variant(lower_stmt, {"obj": Plain(), "v": v}),
        )

    return build


def _build_setattr_strict_off(device: torch.device) -> dict[str, Variant]:
    # Strict registration on and off again: torch's own __setattr__ is back in place.
    with strict():
        pass
    return _setattr_builder("m.count = v", "obj.count = v", lambda: 1)(device)


def _build_setattr_strict_on(device: torch.device) -> dict[str, Variant]:
    v = 1
    return three(
        Variant("m.count = v", {"m": StockIdentity(), "v": v}, strict),
        Variant("m.count = v", {"m": FastIdentity(), "v": v}, strict),
        Variant("obj.count = v", {"obj": Plain(), "v": v}),
    )


def mlp_lower(x: torch.Tensor, params: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The MLP without modules: ``relu(linear(x, w, b))`` over pre-extracted weights."""
    for w, b in params:
        x = F.relu(F.linear(x, w, b))
    return x


def _build_mlp64(device: torch.device) -> dict[str, Variant]:
    torch.manual_seed(0)
    stock = StockMLP().to(device)
    fast = FastMLP().to(device)
    fast.load_state_dict(stock.state_dict())
    params = [(b.lin.weight.detach(), b.lin.bias.detach()) for b in stock.blocks]
    x = torch.randn(1, 32, device=device)
    with torch.inference_mode():
        ref = stock(x)
        if not (torch.allclose(ref, fast(x)) and torch.allclose(ref, mlp_lower(x, params))):
            raise RuntimeError("mlp64: stock, fast and lower bound disagree")
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    ctx = torch.inference_mode
    return three(
        Variant("m(x)", {"m": stock, "x": x}, ctx, sync),
        Variant("m(x)", {"m": fast, "x": x}, ctx, sync),
        Variant("f(x, p)", {"f": mlp_lower, "x": x, "p": params}, ctx, sync),
    )


def torch_mlp(depth: int = 64) -> nn.Module:
    """The design notes' MLP built from torch's own layers only."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(depth)])


def _build_mlp64_accelerated(device: torch.device) -> dict[str, Variant]:
    torch.manual_seed(0)
    stock = torch_mlp().to(device)
    fast = torch_mlp().to(device)
    fast.load_state_dict(stock.state_dict())
    params = [(blk[0].weight.detach(), blk[0].bias.detach()) for blk in stock]
    x = torch.randn(1, 32, device=device)
    with torch.inference_mode():
        ref = stock(x)
        with accelerated(fast):
            out = fast(x)
        if not (torch.equal(ref, out) and torch.allclose(ref, mlp_lower(x, params))):
            raise RuntimeError("mlp64_accelerated: stock, fast and lower bound disagree")
    sync = torch.cuda.synchronize if device.type == "cuda" else None

    @contextlib.contextmanager
    def fast_context() -> Any:
        # Acceleration is per class: on for the fast column only.
        with torch.inference_mode(), accelerated(fast):
            yield

    variants = three(
        Variant("m(x)", {"m": stock, "x": x}, torch.inference_mode, sync),
        Variant("m(x)", {"m": fast, "x": x}, fast_context, sync),
        Variant("f(x, p)", {"f": mlp_lower, "x": x, "p": params}, torch.inference_mode, sync),
    )
    # torch.compile of a stock copy (only timed with --compile).
    compiled = torch.compile(copy.deepcopy(stock))
    variants["compiled"] = Variant("m(x)", {"m": compiled, "x": x}, torch.inference_mode, sync)
    return variants


def _accelerated_variants(
    name: str,
    build: Callable[[], nn.Module],
    lower: Callable[..., torch.Tensor],
    extract: Callable[[nn.Module], Any],
    shape: tuple[int, ...],
) -> dict[str, Variant]:
    """Stock vs ``fastmodule.accelerated`` copies of one model of torch's layers (eval mode,
    inference_mode), and ``lower(x, p)`` over the tensors ``extract`` pulls out of it."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    stock = build().eval()
    fast = build().eval()
    fast.load_state_dict(stock.state_dict())
    params = extract(stock)
    with torch.inference_mode():
        ref = stock(x)
        with accelerated(fast):
            out = fast(x)
        if not (torch.equal(ref, out) and torch.allclose(ref, lower(x, params))):
            raise RuntimeError(f"{name}: stock, fast and lower bound disagree")

    @contextlib.contextmanager
    def fast_context() -> Any:
        with torch.inference_mode(), accelerated(fast):
            yield

    return three(
        Variant("m(x)", {"m": stock, "x": x}, torch.inference_mode),
        Variant("m(x)", {"m": fast, "x": x}, fast_context),
        Variant("f(x, p)", {"f": lower, "x": x, "p": params}, torch.inference_mode),
    )


def _torch_cnn() -> nn.Module:
    # BatchNorm's running statistics not left at 0/1, so eval-mode normalisation does work.
    cnn = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    with torch.no_grad():
        for bn in (cnn[1], cnn[5]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return cnn


def _cnn_params(m: nn.Module) -> list[torch.Tensor]:
    conv1, bn1, conv2, bn2, lin = m[0], m[1], m[4], m[5], m[9]
    return [
        t.detach()
        for t in (
            conv1.weight, conv1.bias,
            bn1.running_mean, bn1.running_var, bn1.weight, bn1.bias,
            conv2.weight, conv2.bias,
            bn2.running_mean, bn2.running_var, bn2.weight, bn2.bias,
            lin.weight, lin.bias,
        )
    ]  # fmt: skip


def cnn_lower(x: torch.Tensor, p: list[torch.Tensor]) -> torch.Tensor:
    """The small CNN without modules: the F ops over pre-extracted tensors (eval mode)."""
    cw1, cb1, m1, v1, w1, b1, cw2, cb2, m2, v2, w2, b2, lw, lb = p
    x = F.conv2d(x, cw1, cb1, 1, 1)
    x = F.relu(F.batch_norm(x, m1, v1, w1, b1, False, 0.1, 1e-5))
    x = F.max_pool2d(x, 2)
    x = F.conv2d(x, cw2, cb2, 1, 1)
    x = F.relu(F.batch_norm(x, m2, v2, w2, b2, False, 0.1, 1e-5))
    x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
    return F.linear(x, lw, lb)


def _build_cnn_accelerated(device: torch.device) -> dict[str, Variant]:
    return _accelerated_variants(
        "cnn_accelerated", _torch_cnn, cnn_lower, _cnn_params, (1, 3, 32, 32)
    )


def _torch_block() -> nn.Module:
    return nn.Sequential(
        nn.LayerNorm(64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.Dropout(0.1)
    )


def _block_params(m: nn.Module) -> list[torch.Tensor]:
    ln, l1, l2 = m[0], m[1], m[3]
    return [t.detach() for t in (ln.weight, ln.bias, l1.weight, l1.bias, l2.weight, l2.bias)]


def block_lower(x: torch.Tensor, p: list[torch.Tensor]) -> torch.Tensor:
    """The MLP block without modules: the F ops over pre-extracted tensors (eval mode)."""
    nw, nb, w1, b1, w2, b2 = p
    x = F.layer_norm(x, (64,), nw, nb, 1e-5)
    x = F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    return F.dropout(x, 0.1, False)


def _build_block_accelerated(device: torch.device) -> dict[str, Variant]:
    return _accelerated_variants(
        "block_accelerated", _torch_block, block_lower, _block_params, (1, 16, 64)
    )


#: The synthetic cases, in run order.
SYNTHETIC_CASES: tuple[Case, ...] = (
    Case("call", "m(x), forward returns x", _build_call),
    Case("call_kwargs", "m(x, y=y)", _build_call_kwargs),
    Case(
        "call_reassigned_buffer",
        "m(x); m(y), forward rebinds a registered buffer (self.cache = x: a KV cache)",
        _build_call_reassigned_buffer,
    ),
    Case(
        "getattr_submodule",
        "parent.child (registered submodule)",
        _getattr_builder("parent.child", "obj.plain"),
    ),
    Case(
        "getattr_parameter",
        "parent.weight (registered nn.Parameter)",
        _getattr_builder("parent.weight", "obj.plain"),
    ),
    Case(
        "getattr_nested",
        "parent.child.weight",
        _getattr_builder("parent.child.weight", "obj.child.plain"),
    ),
    Case(
        "setattr_parameter",
        "m.w = p (same nn.Parameter, re-assigned)",
        _setattr_builder("m.w = v", "obj.w = v", lambda: nn.Parameter(torch.zeros(4))),
    ),
    Case(
        "setattr_module",
        "m.sub = sub_module (re-assigned)",
        _setattr_builder("m.sub = v", "obj.sub = v", StockIdentity),
    ),
    Case(
        "setattr_plain",
        "m.count = 1 (plain attribute)",
        _setattr_builder("m.count = v", "obj.count = v", lambda: 1),
    ),
    Case(
        "setattr_strict_off",
        "m.count = 1 after fastmodule.strict() was on and off (nothing of it left)",
        _build_setattr_strict_off,
    ),
    Case(
        "setattr_strict_on",
        "m.count = 1 under fastmodule.strict() (each assignment checked)",
        _build_setattr_strict_on,
    ),
    Case(
        "call_after_trace",
        "parent(x) calling a child, after an FX trace and a torch.export of it",
        _build_call_after_trace,
    ),
    Case(
        "tree_named_parameters",
        "list(m.named_parameters()) on 2000 blocks (6001 modules, 10000 tensors)",
        _tree_builder("list(m.named_parameters())", _flat_lower("named_parameters")),
    ),
    Case(
        "tree_parameters",
        "list(m.parameters()) on the same tree",
        _tree_builder("list(m.parameters())", _flat_lower("parameters")),
    ),
    Case(
        "tree_named_modules",
        "list(m.named_modules()) on the same tree",
        _tree_builder("list(m.named_modules())", _flat_lower("named_modules")),
    ),
    Case(
        "tree_state_dict",
        "m.state_dict() on the same tree",
        _tree_builder("m.state_dict()", _loop_lower("[t.detach() for t in flat]", "parameters")),
    ),
    Case(
        "tree_load_state_dict",
        "m.load_state_dict(sd) on a 500-block tree (stock is quadratic in width)",
        _tree_builder("m.load_state_dict(sd)", _copy_lower, blocks=500),
    ),
    Case(
        "tree_train",
        "m.train() on the same tree",
        _tree_builder(
            "m.train()",
            _loop_lower("for x in flat: object.__setattr__(x, 'training', True)", "modules"),
        ),
    ),
    Case(
        "tree_eval_train",
        "m.eval(); m.train() on the same tree: every module's flag flips twice",
        _tree_builder(
            "m.eval(); m.train()",
            _loop_lower(
                "[object.__setattr__(x, 'training', f) for f in (False, True) for x in flat]",
                "modules",
            ),
        ),
    ),
    Case(
        "tree_zero_grad",
        "m.zero_grad() on the same tree (grads already None)",
        _tree_builder("m.zero_grad()", _loop_lower("for p in flat: p.grad", "parameters")),
    ),
    Case(
        "tree_zero_grad_grads",
        "grads given to every parameter, then m.zero_grad() (a training step's)",
        _tree_builder(
            _GIVE_GRADS + "m.zero_grad()",
            lambda stock: Variant(
                _GIVE_GRADS + "for p, g in given: p.grad = None", _grads_of(stock)
            ),
            extra=_grads_of,
        ),
    ),
    Case(
        "tree_float_noop",
        "m.float() on the same (float32) tree: a conversion that changes nothing",
        _tree_builder("m.float()", _loop_lower("[t.float() for t in flat]", "parameters")),
    ),
    Case(
        "tree_double_float",
        "m.double().float() on the same tree: two real conversions",
        _tree_builder(
            "m.double().float()",
            _loop_lower("[t.double().float() for t in flat]", "parameters"),
        ),
    ),
    Case(
        "moe_named_parameters",
        "list(m.named_parameters()) on a MoE tree (32 layers x 64 experts x 2 Linear)",
        _moe_builder("list(m.named_parameters())", _flat_lower("named_parameters")),
    ),
    Case(
        "moe_state_dict",
        "m.state_dict() on the MoE tree",
        _moe_builder("m.state_dict()", _loop_lower("[t.detach() for t in flat]", "parameters")),
    ),
    Case(
        "moe_load_state_dict",
        "m.load_state_dict(sd) on the MoE tree",
        _moe_builder("m.load_state_dict(sd)", _copy_lower),
    ),
    Case(
        "moe_train",
        "m.train() on the MoE tree",
        _moe_builder(
            "m.train()",
            _loop_lower("for x in flat: object.__setattr__(x, 'training', True)", "modules"),
        ),
    ),
    Case(
        "moe_to_noop",
        "m.to('cpu') on the MoE tree (already there)",
        _moe_builder("m.to('cpu')", _loop_lower("[t.to('cpu') for t in flat]", "parameters")),
    ),
    Case(
        "accel_tree_named_parameters",
        "list(m.named_parameters()) on the wide tree of stock classes, accelerate()",
        _accelerated_tree_builder("list(m.named_parameters())", _flat_lower("named_parameters")),
    ),
    Case(
        "accel_tree_load_state_dict",
        "m.load_state_dict(sd) on a 500-block tree of stock classes, accelerate()",
        _accelerated_tree_builder("m.load_state_dict(sd)", _copy_lower, blocks=500),
    ),
    Case(
        "accel_tree_float_noop",
        "m.float() on the wide tree of stock classes (float32), accelerate()",
        _accelerated_tree_builder(
            "m.float()", _loop_lower("[t.float() for t in flat]", "parameters")
        ),
    ),
    Case(
        "mlp64",
        "64 x (Linear(32,32) + ReLU), batch 1, inference_mode; fastmodule.Module containers",
        _build_mlp64,
        uses_device=True,
    ),
    Case(
        "mlp64_accelerated",
        "the same MLP of torch's own layers only, fastmodule.accelerate(model)",
        _build_mlp64_accelerated,
        uses_device=True,
    ),
    Case(
        "cnn_accelerated",
        "Conv2d+BatchNorm2d+ReLU+MaxPool2d+Conv2d+BatchNorm2d+ReLU+AdaptiveAvgPool2d+Flatten"
        "+Linear, 1x3x32x32, eval, inference_mode, fastmodule.accelerate(model)",
        _build_cnn_accelerated,
    ),
    Case(
        "block_accelerated",
        "LayerNorm(64)+Linear(64,256)+GELU+Linear(256,64)+Dropout, 1x16x64, eval, "
        "inference_mode, fastmodule.accelerate(model)",
        _build_block_accelerated,
    ),
)
