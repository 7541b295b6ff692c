"""Whole-tree walks (named_modules & co., train/eval, requires_grad_, zero_grad, apply).

Every scenario runs once on stock ``torch.nn.Module`` and once on ``fastmodule.Module``;
the results are compared by name paths and positions, never by ``id()`` across trees.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fastmodule
from tests.conftest import BASES, outcome
from tests.isolation import at_fixed_depth

Base = type[nn.Module]

ITERATORS = [
    "named_modules",
    "modules",
    "named_children",
    "children",
    "named_parameters",
    "parameters",
    "named_buffers",
    "buffers",
]


# --------------------------------------------------------------------------- helpers


class Index:
    """Name paths of everything reachable through one tree's registries.

    The paths are read straight from ``_modules``/``_parameters``/``_buffers`` (no
    traversal method is involved), first path wins, so an object of the stock tree and
    its counterpart in the fast tree get the same label.
    """

    def __init__(self, root: nn.Module) -> None:
        self.paths: dict[int, tuple[Any, ...]] = {}
        self.modules: list[nn.Module] = []
        self.params: list[torch.Tensor] = []
        self.buffers: list[torch.Tensor] = []
        self.extend(root)

    def extend(self, root: nn.Module, path: tuple[Any, ...] = ()) -> None:
        """Add what is reachable from ``root`` and not known yet (iteratively)."""
        stack = [(root, path)]
        while stack:
            m, p = stack.pop()
            if id(m) in self.paths:
                continue
            self.paths[id(m)] = ("module", p)
            self.modules.append(m)
            d = m.__dict__
            for kind, registry, out in (
                ("param", "_parameters", self.params),
                ("buffer", "_buffers", self.buffers),
            ):
                for k, v in d[registry].items():
                    if v is not None and id(v) not in self.paths:
                        self.paths[id(v)] = (kind, (*p, k))
                        out.append(v)
            children = [(c, (*p, k)) for k, c in d["_modules"].items() if c is not None]
            stack.extend(reversed(children))

    def label(self, obj: Any) -> Any:
        return self.paths.get(id(obj), ("other", type(obj).__name__))

    def item(self, x: Any) -> Any:
        """A yielded item: ``(name, obj)`` pairs keep the name, objects become labels."""
        if isinstance(x, tuple) and len(x) == 2:
            return (x[0], self.label(x[1]))
        return self.label(x)

    def items(self, it: Any) -> list[Any]:
        return [self.item(x) for x in it]


def both(scenario: Callable[[Base], Any]) -> tuple[Any, Any]:
    """``outcome(scenario(base))`` for stock and for fast."""
    stock, fast = (outcome(lambda b=b: scenario(b)) for b in BASES)
    return stock, fast


def assert_same(scenario: Callable[[Base], Any]) -> None:
    stock, fast = both(scenario)
    assert fast == stock


def grads(ix: Index, before: list[Any]) -> list[Any]:
    """Every parameter's ``.grad``: None, or its values, whether it is the same tensor as
    ``before``, its requires_grad and whether it has a grad_fn."""
    out = []
    for p, old in zip(ix.params, before, strict=True):
        g = p.grad
        if g is None:
            out.append(None)
        else:
            out.append((g.tolist(), g is old, g.requires_grad, g.grad_fn is None))
    return out


def walks(root: nn.Module, ix: Index) -> dict[Any, Any]:
    """Every iterator of ``root`` with every argument combination, by labels."""
    out: dict[Any, Any] = {}
    for rd in (True, False):
        for prefix in ("", "root"):
            out["named_modules", prefix, rd] = outcome(
                lambda: ix.items(root.named_modules(prefix=prefix, remove_duplicate=rd))
            )
            out["named_modules/pos", prefix, rd] = outcome(
                lambda: ix.items(root.named_modules(set(), prefix, rd))
            )
            for rec in (True, False):
                for meth in ("named_parameters", "named_buffers"):
                    out[meth, prefix, rec, rd] = outcome(
                        lambda: ix.items(
                            getattr(root, meth)(prefix=prefix, recurse=rec, remove_duplicate=rd)
                        )
                    )
                    out[meth + "/pos", prefix, rec, rd] = outcome(
                        lambda: ix.items(getattr(root, meth)(prefix, rec, rd))
                    )
        out["modules", rd] = outcome(lambda: ix.items(root.modules(remove_duplicate=rd)))
    for rec in (True, False):
        out["parameters", rec] = outcome(lambda: ix.items(root.parameters(recurse=rec)))
        out["buffers", rec] = outcome(lambda: ix.items(root.buffers(rec)))
    for meth in ITERATORS:
        out[meth] = outcome(lambda: ix.items(getattr(root, meth)()))
    # The same walks started at every module of the tree.
    for i, m in enumerate(ix.modules):
        for meth in ITERATORS:
            out[meth, "at", i] = outcome(lambda: ix.items(getattr(m, meth)()))
    return out


def effects(root: nn.Module, ix: Index) -> dict[str, Any]:
    """train/eval/requires_grad_/apply/zero_grad on ``root``, and what they changed."""
    out: dict[str, Any] = {}

    def flags() -> list[bool]:
        return [m.training for m in ix.modules]

    def req() -> list[bool]:
        return [p.requires_grad for p in ix.params]

    out["train(False)"] = (outcome(lambda: ix.label(root.train(False))), flags())
    out["train()"] = (outcome(lambda: ix.label(root.train())), flags())
    out["eval()"] = (outcome(lambda: ix.label(root.eval())), flags())
    out["train(True)"] = (outcome(lambda: ix.label(root.train(True))), flags())
    out["train(mode=False)"] = (outcome(lambda: ix.label(root.train(mode=False))), flags())
    out["train('yes')"] = (outcome(lambda: root.train("yes")), flags())
    root.train()
    out["requires_grad_(False)"] = (outcome(lambda: ix.label(root.requires_grad_(False))), req())
    out["requires_grad_()"] = (outcome(lambda: ix.label(root.requires_grad_())), req())
    out["requires_grad_(requires_grad=False)"] = (
        outcome(lambda: ix.label(root.requires_grad_(requires_grad=False))),
        req(),
    )
    root.requires_grad_(True)
    visits: list[Any] = []
    out["apply"] = (outcome(lambda: ix.label(root.apply(lambda m: visits.append(ix.label(m))))),)
    out["apply visits"] = visits

    # Gradients on every other parameter; the rest keep grad None.
    for p in ix.params:
        p.grad = None
    subset = [p for p in ix.params[::2] if p.requires_grad]
    if subset:
        sum((p * p).sum() for p in subset).backward()
    before = [p.grad for p in ix.params]
    out["zero_grad(False)"] = (outcome(lambda: root.zero_grad(False)), grads(ix, before))
    if subset:
        sum((3 * p).sum() for p in subset).backward()
    out["grads accumulate"] = grads(ix, before)
    out["zero_grad(set_to_none=False)"] = (
        outcome(lambda: root.zero_grad(set_to_none=False)),
        grads(ix, before),
    )
    out["zero_grad()"] = (outcome(lambda: root.zero_grad()), grads(ix, before))
    return out


# --------------------------------------------------------------------------- sample tree


def sample_classes(base: Base) -> tuple[type[nn.Module], type[nn.Module]]:
    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_parameter("gone_p", None)
            self.register_buffer("rb", torch.randn(2))
            self.register_buffer("nb", torch.randn(2), persistent=False)
            self.register_buffer("gone_b", None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w + self.rb

    class Node(base):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    return Leaf, Node


def sample_tree(base: Base) -> nn.Module:
    """Custom nodes, stock Linear/Sequential/ModuleList, shared modules, tied parameters,
    a shared buffer, None entries in every registry."""
    torch.manual_seed(0)
    Leaf, Node = sample_classes(base)
    root = Node()
    root.a = Leaf()
    root.lin = nn.Linear(2, 2)
    root.seq = nn.Sequential(Leaf(), root.a, nn.Linear(2, 2))
    root.seq[2].weight = root.lin.weight  # tied across stock modules
    root.ml = nn.ModuleList([Leaf(), root.lin, nn.Sequential()])
    root.register_module("gone", None)
    root.inner = Node()
    root.inner.deep = Leaf()
    root.inner.again = root.a
    root.inner.p = nn.Parameter(torch.randn(2))
    root.inner.register_parameter("tied", root.a.w)
    root.inner.register_buffer("shared_buf", root.a.rb)
    root.inner.register_parameter("none_p", None)
    root.tail = root.inner
    root.register_buffer("top", torch.randn(3), persistent=False)
    root.q = nn.Parameter(torch.randn(1))
    return root


@pytest.mark.parametrize("wrapped", [False, True], ids=["fast_root", "stock_root"])
def test_walks_match_on_sample_tree(wrapped: bool) -> None:
    """All iterators with all argument combinations, then every mutating walk."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        if wrapped:  # a stock root holding the fast (or stock) tree
            root = nn.Sequential(root, nn.Linear(2, 2))
        ix = Index(root)
        return walks(root, ix), effects(root, ix)

    stock, fast = both(sc)
    assert stock[0] == "ok"
    assert fast == stock


def test_sample_tree_covers_duplicates() -> None:
    """Sanity check of the scenario itself: it does exercise de-duplication."""
    root = sample_tree(BASES[0])
    assert len(list(root.modules())) < len(list(root.modules(remove_duplicate=False)))
    assert len(list(root.parameters())) < len(list(root.named_parameters(remove_duplicate=False)))
    assert len(list(root.buffers())) < len(list(root.named_buffers(remove_duplicate=False)))


def test_eval_train_requires_grad_return_self(base: Base) -> None:
    root = sample_tree(base)
    assert root.eval() is root
    assert root.train() is root
    assert root.train(False) is root
    assert root.requires_grad_(False) is root
    assert root.apply(lambda m: None) is root
    assert root.zero_grad() is None
    assert not any(m.training for m in root.modules())
    assert not any(p.requires_grad for p in root.parameters())


def test_iterators_are_generators(base: Base) -> None:
    root = sample_tree(base)
    for meth in ITERATORS:
        assert type(getattr(root, meth)()).__name__ == "generator", meth


def test_walks_follow_every_change_after_warm_calls() -> None:
    """The walks remember, per module, what they read from its ``__dict__`` and class
    (registries, whether a method is shadowed, the ``training`` value); each change below,
    made after repeated walks, must be seen by the very next walk as stock sees it."""

    def sc(b: Base) -> Any:
        Leaf, Node = sample_classes(b)
        torch.manual_seed(0)
        root = Node()
        for i in range(40):
            node = Node()
            node.leaf = Leaf()
            node.lin = nn.Linear(2, 2)
            root.add_module(f"n{i}", node)
        ix = Index(root)
        leaf, lin, node = root.n3.leaf, root.n5.lin, root.n7
        log: list[Any] = []
        out: list[Any] = []

        def check(tag: str) -> None:
            for mode in (True, True, False, False, True):
                r = outcome(lambda mode=mode: ix.label(root.train(mode)))
                out.append((tag, "train", mode, r, [m.training for m in ix.modules]))
            out.append((tag, "eval", outcome(lambda: ix.label(root.eval()))))
            out.append((tag, "flags", [m.training for m in ix.modules]))
            for meth in ("named_modules", "named_parameters", "named_buffers", "children"):
                for _ in range(2):
                    out.append(
                        (tag, meth, outcome(lambda meth=meth: ix.items(getattr(root, meth)())))
                    )
            out.append((tag, "log", list(log)))
            del log[:]
            out.append((tag, "reset", outcome(lambda: ix.label(root.train()))))

        check("warm")
        leaf.__dict__["train"] = lambda mode=True: log.append(("inst train", mode)) or leaf
        check("instance train")
        del leaf.__dict__["train"]
        check("instance train removed")
        node.__dict__["children"] = lambda: iter([lin])
        node.__dict__["named_modules"] = lambda *a, **k: iter([("own", node)])
        check("instance children/named_modules")
        del node.__dict__["children"], node.__dict__["named_modules"]
        check("removed")
        type(leaf).train = lambda self, mode=True: log.append(("class train", mode)) or self
        check("class train")
        del type(leaf).train
        check("class train removed")
        for reg in ("_parameters", "_buffers", "_modules"):
            getattr(leaf, reg)["training"] = None
            check(f"training in {reg}")
            del getattr(leaf, reg)["training"]
            check(f"training out of {reg}")
        leaf.__dict__["training"] = 1
        check("non-bool training")
        type(leaf).training = property(
            lambda self: self.__dict__.get("training"),
            lambda self, v: log.append(("training setter", v)),
        )
        check("training property")
        del type(leaf).training
        check("training property removed")
        leaf.__dict__["_parameters"] = {"fresh": nn.Parameter(torch.ones(1))}
        check("new _parameters dict")
        leaf._parameters["more"] = nn.Parameter(torch.zeros(1))
        check("_parameters grows")
        node.__dict__["_modules"] = {"only": lin}
        check("new _modules dict")
        del node.__dict__["_modules"]
        check("no _modules")
        node.__dict__["_modules"] = {}
        lin.__class__ = type("Other", (nn.Linear,), {})
        check("class changed")
        original = nn.Module.train
        nn.Module.train = lambda self, mode=True: log.append(("patched", mode)) or self  # type: ignore[method-assign]
        try:
            check("torch's train patched")
        finally:
            nn.Module.train = original  # type: ignore[method-assign]
        check("torch's train restored")
        return out

    stock, fast = both(sc)
    assert stock[0] == "ok"
    assert fast == stock


# --------------------------------------------------------------------------- laziness

LAZY_CALLS = [
    ("named_modules", ()),
    ("named_modules", (None, "r", False)),
    ("modules", ()),
    ("modules", (False,)),
    ("named_children", ()),
    ("children", ()),
    ("named_parameters", ()),
    ("named_parameters", ("r", False, False)),
    ("parameters", ()),
    ("parameters", (False,)),
    ("named_buffers", ()),
    ("named_buffers", ("r", True, False)),
    ("buffers", ()),
    ("buffers", (False,)),
]


def logging_child_class(base: Base, log: list[Any]) -> type[nn.Module]:
    class Logged(base):  # type: ignore[misc, valid-type]
        def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            log.append("named_modules")
            return super().named_modules(*args, **kwargs)

        def named_children(self) -> Iterator[Any]:
            log.append("named_children")
            return super().named_children()

        def _named_members(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            log.append("_named_members")
            return super()._named_members(*args, **kwargs)

    return Logged


@pytest.mark.parametrize("meth,args", LAZY_CALLS)
def test_nothing_happens_before_first_next(meth: str, args: tuple[Any, ...]) -> None:
    """Calling an iterator method neither walks, calls overrides nor raises; changes made
    before the first next() are seen."""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        Leaf, Node = sample_classes(b)
        Logged = logging_child_class(b, log)
        torch.manual_seed(0)
        root = Node()
        root.a = Logged()
        root.a.leaf = Leaf()
        root.b = Leaf()
        it = getattr(root, meth)(*args)
        early = list(log)
        root.late = Logged()
        root.late.x = Leaf()
        root.late_p = nn.Parameter(torch.zeros(1))
        root.register_buffer("late_b", torch.zeros(1))
        del root.b
        ix = Index(root)
        return early, outcome(lambda: ix.items(it)), log

    assert_same(sc)


@pytest.mark.parametrize("meth", ITERATORS)
@pytest.mark.parametrize("registry", ["_modules", "_parameters", "_buffers"])
def test_errors_wait_for_first_next(meth: str, registry: str) -> None:
    def sc(b: Base) -> Any:
        Leaf, Node = sample_classes(b)
        root = Node()
        root.a = Leaf()
        value = {"_modules": Leaf(), "_parameters": nn.Parameter(torch.ones(1))}.get(
            registry, torch.ones(1)
        )
        it = getattr(root, meth)()
        root.__dict__[registry][7] = value  # a non-string key, inserted after the call
        ix = Index(root)
        return outcome(lambda: ix.items(it))

    assert_same(sc)


# --------------------------------------------------------------------------- mutation


def _add(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.late = leaf()


def _delete(root: nn.Module, leaf: type[nn.Module]) -> None:
    del root.lin


def _set_none(root: nn.Module, leaf: type[nn.Module]) -> None:
    root._modules["lin"] = None


def _replace_dict(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.__dict__["_modules"] = {"z": leaf()}


def _add_nested(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.late = leaf()


def _add_param(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.late_p = nn.Parameter(torch.zeros(1))


MUTATIONS = {
    "add": _add,
    "delete": _delete,
    "set_none": _set_none,
    "replace_dict": _replace_dict,
    "add_nested": _add_nested,
    "add_param": _add_param,
}


def mutate_while_iterating(
    root: nn.Module,
    meth: str,
    after: int,
    mutate: Callable[[nn.Module, type[nn.Module]], None],
    ix: Index,
    base: Base,
) -> Any:
    """Take ``after`` items of ``root.<meth>()``, mutate the tree, take the rest: the
    outcomes of both parts and every item taken, by label."""
    leaf, _ = sample_classes(base)
    it = getattr(root, meth)()
    seen: list[Any] = []
    first = outcome(lambda: [seen.append(next(it)) for _ in range(after)] and None)
    mutate(root, leaf)
    rest = outcome(lambda: seen.extend(it))
    ix.extend(root)
    return first, rest, ix.items(seen)


@pytest.mark.parametrize("after", [1, 2, 4])
@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("meth", ITERATORS)
def test_mutating_registries_while_iterating(meth: str, mutation: str, after: int) -> None:
    """Same items, then the same RuntimeError (or none) as stock."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        return mutate_while_iterating(root, meth, after, MUTATIONS[mutation], Index(root), b)

    assert_same(sc)


# --------------------------------------------------------------------------- replayed walks
# A complete walk of a tree is recorded; the next walk of the unchanged tree replays
# the recording, checking each registry where the live walk would read it. These
# scenarios walk twice first, so the walk under test starts from a recording.


def _add_nested_param(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.deep.late_p = nn.Parameter(torch.zeros(1))


def _replace_param(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.a.w = nn.Parameter(torch.zeros(2))  # same keys, new value


def _param_none(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.deep.w = None


def _replace_module(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.deep = leaf()  # same keys, new value


def _tie(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.seq[0].w = root.inner.deep.w


def _shadow_walk(root: nn.Module, leaf: type[nn.Module]) -> None:
    # An instance attribute shadowing the method: torch calls it.
    root.inner.named_modules = lambda memo=None, prefix="", remove_duplicate=True: iter(
        [(prefix + "!", root.inner)]
    )


def _patch_class(root: nn.Module, leaf: type[nn.Module]) -> None:
    type(root.inner.deep).extra_attr = 1  # any class change


def _new_module_dict(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.__dict__ = dict(root.inner.__dict__)


def _drop_rebuild(root: nn.Module, leaf: type[nn.Module]) -> None:
    del root.inner
    del root.tail
    root.inner = leaf()


REPLAY_MUTATIONS = {
    **MUTATIONS,
    "add_nested_param": _add_nested_param,
    "replace_param": _replace_param,
    "param_none": _param_none,
    "replace_module": _replace_module,
    "tie": _tie,
    "shadow_walk": _shadow_walk,
    "patch_class": _patch_class,
    "new_module_dict": _new_module_dict,
    "drop_rebuild": _drop_rebuild,
}


@pytest.mark.parametrize("after", [0, 1, 3, 6, 10])
@pytest.mark.parametrize("mutation", list(REPLAY_MUTATIONS))
@pytest.mark.parametrize("meth", ITERATORS)
def test_mutating_registries_while_replaying(meth: str, mutation: str, after: int) -> None:
    """A walk that starts from a recording and sees the tree change part way: the same
    items, then the same RuntimeError (or none) as stock."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        full = [ix.items(getattr(root, meth)()) for _ in range(2)]
        mutated = mutate_while_iterating(root, meth, after, REPLAY_MUTATIONS[mutation], ix, b)
        again = outcome(lambda: ix.items(getattr(root, meth)()))
        return full, mutated, again

    assert_same(sc)


@pytest.mark.parametrize("mutation", list(REPLAY_MUTATIONS))
def test_tree_changed_between_walks(mutation: str) -> None:
    """Every walk after a change sees the change, recorded or not."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        Leaf, _ = sample_classes(b)
        ix = Index(root)
        before = [walks(root, ix) for _ in range(2)]
        REPLAY_MUTATIONS[mutation](root, Leaf)
        ix.extend(root)
        after = [outcome(lambda: walks(root, ix)) for _ in range(2)]
        return before, after

    assert_same(sc)


@pytest.mark.requires_native("counts the native walks' recorded plans (_core.plan_stats)")
def test_second_walk_replays() -> None:
    """White box: a complete walk is kept, and the next walk of the tree starts from it
    (the scenarios above would pass without replaying at all)."""
    from fastmodule import _core

    root = sample_tree(fastmodule.Module)
    # No plan or refusal an earlier test left (at an address this tree reuses) counts.
    _core.clear_plans()
    for meth in ("named_modules", "modules", "named_parameters", "parameters", "buffers"):
        recorded, replayed = _core.plan_stats()
        list(getattr(root, meth)())
        assert _core.plan_stats()[0] == recorded + 1, meth
        list(getattr(root, meth)())
        assert _core.plan_stats() == (recorded + 1, replayed + 1), meth
    recorded, replayed = _core.plan_stats()
    root.zero_grad()
    root.zero_grad()
    assert _core.plan_stats()[1] > replayed
    # Not kept: a walk that stopped early, or one the tree changed under.
    _core.clear_plans()
    recorded, replayed = _core.plan_stats()
    next(root.named_parameters())
    it = root.named_parameters()
    names = []
    while "a.w" not in names:
        names.append(next(it)[0])
    root.a.w = nn.Parameter(torch.zeros(2))  # a registry this walk has read already
    list(it)
    assert _core.plan_stats() == (recorded, replayed)
    # A change before the walk reads it is simply part of what it records.
    it = root.named_parameters()
    next(it)
    root.late = nn.Linear(1, 1)
    list(it)
    assert _core.plan_stats() == (recorded + 1, replayed)


def test_replay_keeps_generators_collectable() -> None:
    """A replaying generator dropped part way releases what it holds."""
    import gc
    import weakref

    root = sample_tree(fastmodule.Module)
    for _ in range(2):
        list(root.named_parameters())
    it = root.named_parameters()
    next(it)
    next(it)
    ref = weakref.ref(root.inner.deep)
    del it
    del root.inner, root.tail
    gc.collect()
    assert ref() is None


# --------------------------------------------------------------------------- errors

OPERATIONS: dict[str, Callable[[nn.Module, Index], Any]] = {
    **{m: (lambda m: lambda r, ix: ix.items(getattr(r, m)()))(m) for m in ITERATORS},
    "named_modules(prefix)": lambda r, ix: ix.items(r.named_modules(prefix="p")),
    "named_parameters(prefix)": lambda r, ix: ix.items(r.named_parameters("p")),
    "named_parameters(recurse=False)": lambda r, ix: ix.items(r.named_parameters(recurse=False)),
    "parameters(False)": lambda r, ix: ix.items(r.parameters(False)),
    "buffers(False)": lambda r, ix: ix.items(r.buffers(False)),
    "train(False)": lambda r, ix: ix.label(r.train(False)),
    "eval": lambda r, ix: ix.label(r.eval()),
    "requires_grad_(False)": lambda r, ix: ix.label(r.requires_grad_(False)),
    "zero_grad": lambda r, ix: r.zero_grad(),
    "zero_grad(False)": lambda r, ix: r.zero_grad(False),
    "apply": lambda r, ix: ix.label(r.apply(lambda m: None)),
}


@pytest.mark.parametrize("where", ["root", "nested"])
@pytest.mark.parametrize("registry", ["_modules", "_parameters", "_buffers"])
def test_non_string_key_errors(registry: str, where: str) -> None:
    """A non-string key inserted into a registry: the same TypeError wherever names are
    built (and none where stock builds none)."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        Leaf, _ = sample_classes(b)
        target = root if where == "root" else root.inner.deep
        value = {"_modules": Leaf(), "_parameters": nn.Parameter(torch.ones(1))}.get(
            registry, torch.ones(1)
        )
        target.__dict__[registry][3] = value
        ix = Index(root)
        out = {}
        for name, op in OPERATIONS.items():
            out[name] = outcome(lambda: op(root, ix))
            out[name, "flags"] = [m.training for m in ix.modules]
        return out

    assert_same(sc)


@pytest.mark.parametrize(
    "mode",
    ["yes", 1, 0, None, 1.0, torch.tensor(True)],
    ids=["str", "one", "zero", "none", "float", "tensor"],
)
def test_train_mode_must_be_boolean(mode: Any) -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        root.train(False)
        r = outcome(lambda: root.train(mode))
        return r, [m.training for m in ix.modules]

    stock, fast = both(sc)
    assert stock[1][0] == ("raised", ValueError, "training mode is expected to be boolean")
    assert fast == stock


# --------------------------------------------------------------------------- memo


def test_named_modules_with_caller_memo() -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        out = []
        for rd in (True, False):
            for prefix in ("", "p"):
                memo = {root.a, root.inner}
                got = outcome(lambda: ix.items(root.named_modules(memo, prefix, rd)))
                out.append((got, sorted(map(repr, map(ix.label, memo)))))
                memo = set()
                got = outcome(lambda: ix.items(root.named_modules(memo=memo, prefix=prefix)))
                out.append((got, sorted(map(repr, map(ix.label, memo)))))
        # A memo shared by two walks, as torch's own callers do.
        memo = set()
        first = ix.items(root.inner.named_modules(memo, "inner"))
        second = ix.items(root.named_modules(memo))
        out.append((first, second))
        return out

    assert_same(sc)


def test_named_modules_memo_set_subclass() -> None:
    """The caller's memo is used through its own ``in``/``add``, as in torch's code."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        log: list[Any] = []

        class RecordingSet(set):
            def add(self, x: Any) -> None:
                log.append(("add", ix.label(x)))
                super().add(x)

            def __contains__(self, x: object) -> bool:
                log.append(("in", ix.label(x)))
                return super().__contains__(x)

        got = ix.items(root.named_modules(RecordingSet(), "r"))
        return got, log

    assert_same(sc)


# --------------------------------------------------------------------------- dispatch


def override_tree(base: Base, log: list[Any]) -> nn.Module:
    """A tree whose nodes override each whole-tree method (mostly calling super())."""

    def rec(*entry: Any) -> None:
        log.append(entry)

    class Plain(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))

    class OwnNamedModules(Plain):
        def named_modules(
            self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True
        ) -> Iterator[Any]:
            rec("named_modules", self, memo is None, prefix, remove_duplicate)
            yield from super().named_modules(memo, prefix, remove_duplicate)

    class HidesChildren(Plain):
        def named_modules(
            self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True
        ) -> Iterator[Any]:
            rec("hidden named_modules", self, prefix)
            yield prefix, self

    class OwnNamedChildren(Plain):
        def named_children(self) -> Iterator[Any]:
            rec("named_children", self)
            yield from reversed(list(super().named_children()))

    class OwnChildren(Plain):
        def children(self) -> Iterator[Any]:
            rec("children", self)
            yield from super().children()

    class OwnTrain(Plain):
        def train(self, mode: bool = True) -> Any:
            rec("train", self, mode)
            return super().train(mode)

    class TrainNoRecurse(Plain):
        def train(self, mode: bool = True) -> Any:
            rec("train-no-recurse", self, mode)
            self.training = mode
            return self

    class OwnApply(Plain):
        def apply(self, fn: Any) -> Any:
            rec("apply", self)
            return super().apply(fn)

    class OwnParameters(Plain):
        def parameters(self, recurse: bool = True) -> Iterator[Any]:
            rec("parameters", self, recurse)
            yield from super().parameters(recurse)

    class OwnNamedParameters(Plain):
        def named_parameters(
            self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
        ) -> Iterator[Any]:
            rec("named_parameters", self, prefix, recurse, remove_duplicate)
            yield from super().named_parameters(prefix, recurse, remove_duplicate)

    class OwnNamedBuffers(Plain):
        def named_buffers(
            self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
        ) -> Iterator[Any]:
            rec("named_buffers", self, prefix, recurse, remove_duplicate)
            yield from super().named_buffers(prefix, recurse, remove_duplicate)

    class OwnNamedMembers(Plain):
        def _named_members(self, get: Any, prefix: str = "", *args: Any, **kw: Any) -> Any:
            rec("_named_members", self, prefix, args, sorted(kw.items()))
            yield from super()._named_members(get, prefix, *args, **kw)

    class LinearSub(nn.Linear):
        def train(self, mode: bool = True) -> Any:
            rec("Linear train", self, mode)
            return super().train(mode)

        def named_children(self) -> Iterator[Any]:
            rec("Linear named_children", self)
            yield from super().named_children()

    torch.manual_seed(0)
    root = Plain()
    overriders = [
        OwnNamedModules,
        HidesChildren,
        OwnNamedChildren,
        OwnChildren,
        OwnTrain,
        TrainNoRecurse,
        OwnApply,
        OwnParameters,
        OwnNamedParameters,
        OwnNamedBuffers,
        OwnNamedMembers,
    ]
    for i, cls in enumerate(overriders):
        node = cls()
        node.kid = Plain()
        node.lin = LinearSub(2, 2)
        node.seq = nn.Sequential(Plain(), nn.Linear(2, 2))
        root.add_module(f"m{i}", node)
    # Nesting of overriders, and a shared overrider under a second parent.
    root.m0.nested = OwnTrain()
    root.m0.nested.deeper = OwnNamedChildren()
    root.m0.nested.deeper.leaf = OwnNamedModules()
    root.m4.again = root.m2
    # Instance attributes shadowing the class's methods.
    inst = Plain()
    inst.kid = Plain()
    inst.train = lambda mode=True: rec("instance train", inst, mode) or inst
    inst.children = lambda: (rec("instance children", inst), iter(()))[1]
    inst.named_modules = lambda memo=None, prefix="", remove_duplicate=True: iter(
        [(prefix + "!", inst)]
    )
    root.inst = inst
    return root


def test_overrides_are_dispatched_like_torch() -> None:
    def sc(b: Base) -> Any:
        log: list[Any] = []
        root = override_tree(b, log)
        ix = Index(root)
        out: dict[Any, Any] = {}
        starts = [("root", root)] + [(k, v) for k, v in root._modules.items()]
        for where, start in starts:
            for name, op in OPERATIONS.items():
                del log[:]
                r = outcome(lambda: op(start, ix))
                entries = [
                    tuple(ix.label(e) if isinstance(e, nn.Module) else e for e in x) for x in log
                ]
                out[where, name] = (r, entries, [m.training for m in ix.modules])
            for rd in (True, False):
                for prefix in ("", "p"):
                    del log[:]
                    r = outcome(lambda: ix.items(start.named_modules(None, prefix, rd)))
                    out[where, "named_modules", prefix, rd] = (r, len(log))
                    for rec in (True, False):
                        r = outcome(lambda: ix.items(start.named_parameters(prefix, rec, rd)))
                        out[where, "named_parameters", prefix, rec, rd] = r
                        r = outcome(lambda: ix.items(start.named_buffers(prefix, rec, rd)))
                        out[where, "named_buffers", prefix, rec, rd] = r
            start.train()
            start.requires_grad_(True)
        return out

    stock, fast = both(sc)
    assert stock[0] == "ok"
    assert fast == stock


def test_super_train_with_bad_mode_deep_in_tree() -> None:
    def sc(b: Base) -> Any:
        Leaf, Node = sample_classes(b)

        class Bad(Node):
            def train(self, mode: bool = True) -> Any:
                return super().train(int(mode))

        root = Node()
        root.a = Leaf()
        root.bad = Bad()
        root.bad.x = Leaf()
        root.z = Leaf()
        ix = Index(root)
        r = outcome(lambda: root.eval())
        return r, [m.training for m in ix.modules]

    assert_same(sc)


def test_subclass_super_train_and_eval(base: Base) -> None:
    log: list[Any] = []

    class Recorder(base):  # type: ignore[misc, valid-type]
        def train(self, mode: bool = True) -> Any:
            log.append(mode)
            return super().train(mode)

    root = Recorder()
    root.kid = Recorder()
    root.kid.lin = nn.Linear(2, 2)
    assert root.eval() is root
    assert log == [False, False]
    assert not root.kid.lin.training
    assert root.train() is root and root.kid.lin.training


# --------------------------------------------------------------------------- apply


def test_apply_order_and_repeats() -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        root.seq.append(root.inner)  # a shared subtree reached from two parents
        ix = Index(root)
        seen: list[Any] = []
        r = root.apply(lambda m: seen.append(ix.label(m)))
        return ix.label(r), seen

    stock, fast = both(sc)
    _, seen = stock[1]
    assert len(seen) > len(set(seen))  # shared modules are visited more than once
    assert fast == stock


def test_apply_exception_stops_walk() -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        seen: list[Any] = []

        def fn(m: nn.Module) -> None:
            seen.append(ix.label(m))
            if isinstance(m, nn.Linear):
                raise KeyError("stop")

        return outcome(lambda: root.apply(fn)), seen

    assert_same(sc)


# --------------------------------------------------------------------------- grads


def test_zero_grad_in_place_and_to_none() -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # create_graph=True warns about a ref cycle
            loss = sum((p * p * p).sum() for p in ix.params[1:])
            loss.backward(create_graph=True)
        before = [p.grad for p in ix.params]
        out.append([g is not None and g.grad_fn is not None for g in before])
        out.append((outcome(lambda: root.zero_grad(set_to_none=False)), grads(ix, before)))
        sum((2 * p).sum() for p in ix.params[::3]).backward()
        out.append(grads(ix, before))
        out.append((outcome(lambda: root.inner.zero_grad(False)), grads(ix, before)))
        out.append((outcome(lambda: root.ml.zero_grad()), grads(ix, before)))
        out.append((outcome(lambda: root.zero_grad()), grads(ix, before)))
        return out

    stock, fast = both(sc)
    assert any(stock[1][0])  # some grads had a grad_fn
    assert fast == stock


def test_memo_sizes_carry_between_walks() -> None:
    """A whole-tree memo starts at the size the previous walk reached; walks of trees
    larger and smaller than that, with shared modules and tied parameters, still
    de-duplicate exactly as stock."""

    def tree(b: Base, n: int) -> nn.Module:
        Leaf, Node = sample_classes(b)
        torch.manual_seed(n)
        root = Node()
        shared = Leaf()
        for i in range(n):
            node = Node()
            node.leaf = Leaf() if i % 3 else shared
            node.lin = nn.Linear(1, 1)
            if i % 4 == 0:
                node.lin.weight = shared.w
            root.add_module(f"n{i}", node)
        return root

    def sc(b: Base) -> Any:
        out = []
        for n in (600, 3, 9, 40, 1500, 2, 130):
            root = tree(b, n)
            ix = Index(root)
            for rd in (True, False):
                out.append(ix.items(root.named_modules(remove_duplicate=rd)))
                out.append(ix.items(root.named_parameters(remove_duplicate=rd)))
            out.append(ix.items(root.parameters()))
            out.append(ix.items(root.children()))
        return out

    assert_same(sc)


def test_grad_reads_go_through_the_parameters_class() -> None:
    """zero_grad and the conversions read ``p.grad`` (and ``.dtype``); a Parameter
    subclass that serves them itself (a property, ``__getattribute__``, ``__getattr__``)
    is asked exactly as stock asks it. Registering such a parameter runs
    ``_ParameterMeta.__instancecheck__`` (its ``_is_param`` read reaches ``__getattr__``)
    as in stock."""

    def sc(b: Base) -> Any:
        log: list[Any] = []

        class PropGrad(nn.Parameter):
            @property
            def grad(self) -> Any:  # type: ignore[override]
                log.append("grad property")
                return torch.ones(2)

            @grad.setter
            def grad(self, v: Any) -> None:
                log.append(("grad set", v))

        class Intercept(nn.Parameter):
            def __getattribute__(self, name: str) -> Any:
                if name in ("grad", "dtype"):
                    log.append(("getattribute", name))
                return super().__getattribute__(name)

        class Fallback(nn.Parameter):
            def __getattr__(self, name: str) -> Any:
                log.append(("getattr", name))
                raise AttributeError(name)

        Leaf, Node = sample_classes(b)
        root = Node()
        root.a = Leaf()
        root.a.pg = PropGrad(torch.zeros(2))
        root.b = Leaf()
        root.b.ic = Intercept(torch.zeros(2))
        root.b.ic.grad = torch.full((2,), 3.0)
        root.c = Leaf()
        root.c.fb = Fallback(torch.zeros(2))
        root.c.fb.grad = torch.full((2,), 4.0)
        out: list[Any] = []
        for op in (
            lambda: root.zero_grad(set_to_none=False),
            lambda: root.zero_grad(),
            lambda: root.float(),
            lambda: root.double(),
        ):
            r = outcome(lambda op=op: (op(), None)[1])
            out.append((r, list(log)))
            del log[:]
        out.append(Index(root).items(root.named_parameters()))
        return out

    assert_same(sc)


def test_zero_grad_on_replica_warns_like_stock() -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        sum(p.sum() for p in ix.params).backward()
        root._is_replica = True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            root.zero_grad(False)
        return (
            [(w.category, str(w.message), os.path.basename(w.filename)) for w in caught],
            grads(ix, [None] * len(ix.params)),
        )

    stock, fast = both(sc)
    assert stock[1][0][0][2] == os.path.basename(__file__)
    assert fast == stock


def test_requires_grad_flags() -> None:
    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        out = []
        for target, flag in ((root.inner, False), (root, False), (root.seq, True), (root, True)):
            r = target.requires_grad_(flag)
            out.append((ix.label(r), [p.requires_grad for p in ix.params]))
        return out

    assert_same(sc)


# --------------------------------------------------------------------------- patching

PATCHABLE = [
    "named_modules",
    "modules",
    "named_children",
    "children",
    "named_parameters",
    "parameters",
    "named_buffers",
    "buffers",
    "train",
    "eval",
    "requires_grad_",
    "zero_grad",
    "apply",
]


def run_patched(meth: str, scenario: Callable[[nn.Module, Index, list[Any]], Any]) -> Any:
    """``scenario`` on each base while ``nn.Module.<meth>`` records and calls the original."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        log: list[Any] = []
        original = nn.Module.__dict__[meth]

        def patched(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            shown = tuple(
                sorted(map(repr, map(ix.label, a))) if isinstance(a, set) else a for a in args
            )
            log.append((ix.label(self), shown, sorted(kwargs.items())))
            return original(self, *args, **kwargs)

        setattr(nn.Module, meth, patched)
        try:
            return scenario(root, ix, log)
        finally:
            setattr(nn.Module, meth, original)

    return both(sc)


@pytest.mark.parametrize("meth", PATCHABLE)
def test_patched_torch_method_is_honoured(meth: str) -> None:
    """The patch runs for the same modules, in the same order, with the same results."""

    def scenario(root: nn.Module, ix: Index, log: list[Any]) -> Any:
        out = {}
        for name, op in OPERATIONS.items():
            del log[:]
            r = outcome(lambda: op(root, ix))
            out[name] = (r, [entry[0] for entry in log], [m.training for m in ix.modules])
        return out

    stock, fast = run_patched(meth, scenario)
    assert stock[0] == "ok"
    assert any(calls for _, calls, _ in stock[1].values())
    assert fast == stock
    assert nn.Module.__dict__[meth].__name__ == meth  # restored


PATCH_CALLS: dict[str, Callable[[nn.Module], Any]] = {
    "named_modules": lambda r: r.named_modules(),
    "modules": lambda r: r.modules(),
    "named_parameters": lambda r: r.parameters(),
    "train": lambda r: r.train(),
    "children": lambda r: r.children(),
}


@pytest.mark.parametrize("meth", list(PATCH_CALLS))
def test_patched_torch_method_receives_callers_arguments(meth: str) -> None:
    """The patch sees the arguments the caller passed (defaults not filled in)."""

    def scenario(root: nn.Module, ix: Index, log: list[Any]) -> Any:
        r = PATCH_CALLS[meth](root)
        if not isinstance(r, nn.Module):
            list(r)
        return log

    stock, fast = run_patched(meth, scenario)
    assert fast == stock


@pytest.mark.parametrize("meth", ["named_modules", "modules", "named_parameters"])
def test_patched_torch_method_runs_when_called(meth: str) -> None:
    """A patched (plain-function) method runs when stock calls it, not at first next()."""

    def scenario(root: nn.Module, ix: Index, log: list[Any]) -> Any:
        it = getattr(root, meth)()
        calls_before_next = len(log)
        list(it)
        return calls_before_next

    stock, fast = run_patched(meth, scenario)
    assert stock == ("ok", 1)
    assert fast == stock


# --------------------------------------------------------------------------- deep trees


def test_deep_tree_behaves_like_stock() -> None:
    """A chain deeper than the recursion limit: stock's generators raise RecursionError.
    (Run at a fixed depth under a limit of 1000, whatever limit earlier code left.)"""

    def sc(b: Base) -> Any:
        _, Node = sample_classes(b)
        root = cur = Node()
        for _ in range(2000):
            cur.c = Node()
            cur = cur.c
        out = {}
        for meth in ("named_modules", "modules", "parameters", "named_buffers"):
            r = at_fixed_depth(lambda: outcome(lambda: len(list(getattr(root, meth)()))))
            out[meth] = r[:2]
        for meth, args in (("train", (False,)), ("apply", (lambda m: None,))):
            r = at_fixed_depth(lambda: outcome(lambda: getattr(root, meth)(*args)))
            out[meth] = r[:2] if r[0] == "raised" else "ok"
        return out

    stock, fast = both(sc)
    assert fast == stock
    methods = ("named_modules", "modules", "parameters", "named_buffers", "train", "apply")
    assert stock == ("ok", dict.fromkeys(methods, ("raised", RecursionError)))


# --------------------------------------------------------------------------- torch.compile

COMPILED_LOOPS = ["parameters", "named_buffers", "children", "named_parameters", "modules"]


@pytest.mark.parametrize("loop", COMPILED_LOOPS)
def test_compiled_forward_iterating_the_tree(loop: str) -> None:
    def sc(b: Base) -> Any:
        class Net(b):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(2, 2)
                self.seq = nn.Sequential(nn.Linear(2, 2))
                self.register_buffer("scale", torch.full((2,), 0.5))
                self.register_buffer("none_b", None)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                if loop == "parameters":
                    for p in self.parameters():
                        x = x + p.sum()
                elif loop == "named_parameters":
                    for _, p in self.named_parameters():
                        x = x + p.mean()
                elif loop == "named_buffers":
                    for _, buf in self.named_buffers():
                        x = x * buf
                elif loop == "children":
                    for c in self.children():
                        x = c(x)
                else:
                    for m in self.modules():
                        if isinstance(m, nn.Linear):
                            x = m(x)
                return x

        torch.manual_seed(0)
        net = Net()
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(net, backend=counter, fullgraph=True)
        ys = [compiled(torch.ones(2)).tolist() for _ in range(2)]
        torch._dynamo.reset()
        return counter.frame_count, counter.op_count, ys, net(torch.ones(2)).tolist()

    stock, fast = both(sc)
    assert stock[0] == "ok" and stock[1][0] == 1
    assert fast == stock


# --------------------------------------------------------------------------- hypothesis

NAMES = ["a", "b", "w", "0", "1", "_x", "T", "é", "mod_2"]
ENTRY_KINDS = [
    "param",
    "param_none",
    "tie",
    "buffer",
    "buffer_np",
    "buffer_none",
    "share_buffer",
    "module_none",
    "module",
]
MAX_DEPTH = 4


@st.composite
def node_recipe(draw: Any, depth: int = 0, custom_only: bool = False) -> tuple[Any, ...]:
    kinds = ["custom", "odd"]
    if not custom_only:
        kinds += ["linear", "share", "share"]
        if depth < MAX_DEPTH:
            kinds += ["seq", "mlist"]
    kind = draw(st.sampled_from(kinds))
    if kind == "linear":
        return ("linear",)
    if kind == "share":
        return ("share", draw(st.integers(0, 30)))
    if kind in ("seq", "mlist"):
        return (kind, tuple(draw(st.lists(node_recipe(depth + 1), min_size=1, max_size=3))))
    # Submodules are drawn more often than the other entries, so trees get deep.
    extra = ["module"] * (6 if depth == 0 else 3 if depth < MAX_DEPTH else 0)
    entry_kinds = ENTRY_KINDS[:-1] + extra
    entries = draw(
        st.lists(
            st.tuples(st.sampled_from(entry_kinds), st.sampled_from(NAMES), st.integers(0, 30)),
            min_size=2 if depth == 0 else 0,
            max_size=5,
            unique_by=lambda e: e[1],
        )
    )
    built = []
    for what, name, k in entries:
        sub = draw(node_recipe(depth + 1)) if what == "module" else k
        built.append((what, name, sub))
    return (kind, tuple(built))


def recipe_classes(base: Base) -> dict[str, type[nn.Module]]:
    class Custom(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any) -> Any:
            return x

    class Odd(base):  # type: ignore[misc, valid-type]
        """Overrides that reorder and delegate through super()."""

        def named_children(self) -> Iterator[Any]:
            yield from reversed(list(super().named_children()))

        def named_modules(
            self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True
        ) -> Iterator[Any]:
            yield from super().named_modules(memo, prefix, remove_duplicate)

        def train(self, mode: bool = True) -> Any:
            return super().train(mode)

    return {"custom": Custom, "odd": Odd}


RECIPE_CLASSES = {b: recipe_classes(b) for b in BASES}


class Builder:
    """Builds a recipe into a tree; completed modules can be shared (post-order, so a
    module is never shared into its own subtree)."""

    def __init__(self, base: Base) -> None:
        self.classes = RECIPE_CLASSES[base]
        self.done: list[nn.Module] = []
        self.params: list[nn.Parameter] = []
        self.buffers: list[torch.Tensor] = []

    def node(self, r: tuple[Any, ...]) -> nn.Module:
        kind = r[0]
        if kind == "share" and self.done:
            return self.done[r[1] % len(self.done)]
        if kind in ("linear", "share"):
            m: nn.Module = nn.Linear(2, 2)
            self.params += [m.weight, m.bias]
        elif kind == "seq":
            m = nn.Sequential(*[self.node(c) for c in r[1]])
        elif kind == "mlist":
            m = nn.ModuleList([self.node(c) for c in r[1]])
        else:
            m = self.classes[kind]()
            for what, name, arg in r[1]:
                self.entry(m, what, name, arg)
        self.done.append(m)
        return m

    def entry(self, m: nn.Module, what: str, name: str, arg: Any) -> None:
        if what == "param" or (what == "tie" and not self.params):
            p = nn.Parameter(torch.randn(2))
            self.params.append(p)
            m.register_parameter(name, p)
        elif what == "tie":
            m.register_parameter(name, self.params[arg % len(self.params)])
        elif what == "param_none":
            m.register_parameter(name, None)
        elif what in ("buffer", "buffer_np") or (what == "share_buffer" and not self.buffers):
            t = torch.randn(2)
            self.buffers.append(t)
            m.register_buffer(name, t, persistent=what != "buffer_np")
        elif what == "share_buffer":
            m.register_buffer(name, self.buffers[arg % len(self.buffers)], persistent=arg % 2 == 0)
        elif what == "buffer_none":
            m.register_buffer(name, None)
        elif what == "module":
            m.add_module(name, self.node(arg))
        else:
            m.add_module(name, None)


def run_recipe(base: Base, recipe: tuple[Any, ...]) -> Any:
    torch.manual_seed(1234)
    root = Builder(base).node(recipe)
    ix = Index(root)
    # Walked twice: the second walk replays the first's recording.
    return walks(root, ix), walks(root, ix), effects(root, ix), walks(root, ix)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_recipe(custom_only=True))
def test_random_trees_match(recipe: tuple[Any, ...]) -> None:
    stock, fast = (outcome(lambda b=b: run_recipe(b, recipe)) for b in BASES)
    assert stock[0] == "ok"
    assert fast == stock
