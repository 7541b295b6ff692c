"""fastmodule.Module against the rest of the PyTorch ecosystem.

Every test runs one scenario on stock ``torch.nn.Module`` and on
``fastmodule.Module`` (the ``base`` fixture) and compares what the tool
produces: compiled frames and graphs, FX graphs, export metadata, TorchScript
graphs, pickles, state dicts, functional calls, parametrizations and pruning.
On the "stock" id the comparison is stock against itself, a sanity check of
the scenario.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import re
import shutil

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch._dynamo.utils
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as prune
from torch import nn

import fastmodule
from tests.conftest import NATIVE

STOCK = torch.nn.Module
FAST = fastmodule.Module
#: The (call, getattr, setattr) slots of a plain fastmodule.Module subclass: all of
#: them, or none where no native path is on (it runs torch's code there).
ALL_SLOTS = (NATIVE, NATIVE, NATIVE)

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
]


@pytest.fixture(params=[STOCK, FAST], ids=["stock", "fast"])
def base(request):
    return request.param


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def x_in(rows: int = 3, cols: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(rows, cols, generator=g)


def build(factory, base, seed: int = 0):
    """Instantiate ``factory(base)()`` with a fixed seed, so stock and fast share weights."""
    torch.manual_seed(seed)
    return factory(base)()


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert sa._metadata == sb._metadata


def assert_rearmed(model: nn.Module, base, x: torch.Tensor) -> None:
    """One normal call puts every fastmodule class of the model back on the native path."""
    model(x)
    if base is FAST:
        for m in model.modules():
            if isinstance(m, FAST):
                assert fastmodule.slots_of(type(m)) == ALL_SLOTS, type(m)


# --------------------------------------------------------------------------- models


def make_net(base):
    class Block(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return torch.relu(self.lin(x)) * self.scale

    class Net(base):
        def __init__(self):
            super().__init__()
            self.b1 = Block()
            self.b2 = Block()
            self.head = nn.Linear(4, 2)
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x):
            x = self.b1(x) + self.w
            return self.head(self.b2(x))

    return Net


def make_breaking_net(base):
    class Stage(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            x = torch.tanh(self.lin(x))
            torch._dynamo.graph_break()
            return x * 2

    class BreakingNet(base):
        def __init__(self):
            super().__init__()
            self.s1 = Stage()
            self.s2 = Stage()

        def forward(self, x):
            return self.s2(self.s1(x)).sum(-1)

    return BreakingNet


def make_tiny(base):
    class Tiny(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x)).sum(-1)

    return Tiny


# ------------------------------------------------------------------ torch.compile


def _compile_counted(factory, base, x):
    model = build(factory, base)
    eager = model(x)
    torch._dynamo.reset()
    cnt = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=cnt)
    out1 = compiled(x)
    out2 = compiled(x)  # must hit the cache: no second frame
    torch._dynamo.reset()
    return eager, out1, out2, cnt.frame_count, cnt.op_count


def test_compile_fullgraph_counter(base):
    x = x_in()
    eager, out1, out2, frames, ops = _compile_counted(make_net, base, x)
    torch.testing.assert_close(out1, eager, rtol=0, atol=0)
    torch.testing.assert_close(out2, eager, rtol=0, atol=0)
    s_eager, _, _, s_frames, s_ops = _compile_counted(make_net, STOCK, x)
    assert frames == s_frames == 1
    assert ops == s_ops
    torch.testing.assert_close(eager, s_eager, rtol=0, atol=0)


def test_compile_fullgraph_eager_backend(base):
    x = x_in()
    model = build(make_net, base)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(compiled(x), build(make_net, STOCK)(x), rtol=0, atol=0)


def _explain(factory, base, x):
    torch._dynamo.reset()
    model = build(factory, base)
    ex = torch._dynamo.explain(model)(x)
    torch._dynamo.reset()
    return ex.graph_count, ex.graph_break_count, ex.op_count, len(ex.break_reasons)


@pytest.mark.parametrize("factory", [make_net, make_breaking_net], ids=["net", "breaking"])
def test_dynamo_explain_graph_breaks(base, factory):
    x = x_in()
    got = _explain(factory, base, x)
    want = _explain(factory, STOCK, x)
    assert got == want
    if factory is make_breaking_net:
        assert got[1] > 0  # the scenario really breaks
    else:
        assert got[:2] == (1, 0)


def make_probing_net(base):
    class Probing(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("maybe_buf", None)

        def forward(self, x):
            y = self.lin(x)
            if hasattr(self, "extra"):  # missing: nn.Module.__getattr__ raises
                y = y + 1
            if getattr(self, "maybe_buf", None) is None:  # registered as None
                y = y * 2
            return y + ("lin" in self._modules)

    return Probing


def test_dynamo_attribute_probes(base):
    x = x_in()
    got = _explain(make_probing_net, base, x)
    assert got == _explain(make_probing_net, STOCK, x)
    assert got[:2] == (1, 0)
    model = build(make_probing_net, base)
    out = torch.compile(model, fullgraph=True, backend="eager")(x)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    torch.testing.assert_close(out, build(make_probing_net, STOCK)(x), rtol=0, atol=0)


def _mutating_compile(base, x):
    """Compile, then mutate the model through attribute assignment; record frames/outputs."""
    model = build(make_net, base)
    cnt = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=cnt)
    steps = []

    def step(label, check_eager=True):
        out = compiled(x)
        if check_eager:
            torch.testing.assert_close(out, model(x), rtol=0, atol=0, msg=label)
        steps.append((label, cnt.frame_count, out))

    step("first")
    step("cached")
    torch.manual_seed(7)
    model.head = nn.Linear(4, 2)  # replace a submodule
    step("new head")
    model.b1.scale = torch.tensor(3.0)  # assign to a buffer name
    step("buffer value")
    with torch.no_grad():
        model.w.mul_(-1)  # in-place parameter update
    step("param inplace")
    model.w = nn.Parameter(torch.ones(4))  # replace a parameter
    step("new param")
    handle = model.b2.register_forward_hook(lambda m, a, o: o + 1)
    # skip_nnmodule_hook_guards (default True): a hook added after compiling is not
    # guarded on, so the compiled output may be stale; it must be as stale as stock's
    step("hook", check_eager=False)
    handle.remove()
    step("hook removed")
    model.eval()
    step("eval")
    return steps


def test_compile_after_mutation(base):
    x = x_in()
    got = _mutating_compile(base, x)
    torch._dynamo.reset()
    want = _mutating_compile(STOCK, x)
    assert [s[:2] for s in got] == [s[:2] for s in want]
    for (label, _, a), (_, _, b) in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=label)


def test_module_compile_method(base):
    x = x_in()
    model = build(make_net, base)
    eager = model(x)
    cnt = torch._dynamo.testing.CompileCounter()
    model.compile(backend=cnt)
    out = model(x)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    assert cnt.frame_count == 1
    model(x)
    assert cnt.frame_count == 1  # cached

    torch._dynamo.reset()
    stock = build(make_net, STOCK)
    s_cnt = torch._dynamo.testing.CompileCounter()
    stock.compile(backend=s_cnt)
    torch.testing.assert_close(stock(x), out, rtol=0, atol=0)
    assert (s_cnt.frame_count, s_cnt.op_count) == (cnt.frame_count, cnt.op_count)


def test_module_compile_method_eager_backend(base):
    x = x_in()
    model = build(make_net, base)
    eager = model(x)
    model.compile(backend="eager")
    torch.testing.assert_close(model(x), eager, rtol=0, atol=0)
    torch.testing.assert_close(model(x), build(make_net, STOCK)(x), rtol=0, atol=0)


# The default backend (inductor) compiles C++ for CPU: ~8 s for this tiny graph with a cold
# inductor cache on a 2-core CPU box (the fx-graph cache makes the second model free).
# FASTMODULE_SKIP_INDUCTOR=1 skips it.
_CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")


@pytest.mark.skipif(_CXX is None, reason="inductor's CPU backend needs a C++ compiler")
@pytest.mark.skipif(
    os.environ.get("FASTMODULE_SKIP_INDUCTOR") == "1", reason="FASTMODULE_SKIP_INDUCTOR=1"
)
def test_compile_inductor_tiny(base):
    x = x_in(2, 4)
    results = {}
    for b in dict.fromkeys([STOCK, base]):
        torch._dynamo.reset()
        model = build(make_tiny, b)
        torch._dynamo.utils.counters.clear()
        with torch.no_grad():
            eager = model(x)
            out = torch.compile(model, fullgraph=True)(x)  # default backend: inductor
        torch.testing.assert_close(out, eager)
        stats = dict(torch._dynamo.utils.counters["stats"])
        results[b] = (out, stats.get("unique_graphs"), stats.get("calls_captured"))
    torch.testing.assert_close(results[base][0], results[STOCK][0], rtol=0, atol=0)
    assert results[base][1:] == results[STOCK][1:]
    assert results[STOCK][1] == 1


# --------------------------------------------------------------------------- torch.fx


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}"


def _fx(base, x):
    model = build(make_net, base)
    gm = torch.fx.symbolic_trace(model)
    nodes = [(n.op, _target_name(n.target)) for n in gm.graph.nodes]
    return model, gm, nodes


def test_fx_symbolic_trace(base):
    x = x_in()
    model, gm, nodes = _fx(base, x)
    _, s_gm, s_nodes = _fx(STOCK, x)
    assert nodes == s_nodes
    assert str(gm.code) == str(s_gm.code)
    call_modules = [t for op, t in nodes if op == "call_module"]
    assert call_modules == ["b1.lin", "b2.lin", "head"]
    assert ("get_attr", "w") in nodes
    assert ("get_attr", "b1.scale") in nodes
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(gm(x), s_gm(x), rtol=0, atol=0)
    assert_rearmed(model, base, x)


def _fx_custom_leaf(base):
    model = build(make_net, base)
    block_cls = type(model.b1)

    class BlockLeafTracer(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, block_cls) or super().is_leaf_module(m, qualname)

    graph = BlockLeafTracer().trace(model)
    gm = torch.fx.GraphModule(model, graph)
    return model, gm, [(n.op, _target_name(n.target)) for n in graph.nodes]


def test_fx_custom_leaf_modules(base):
    x = x_in()
    model, gm, nodes = _fx_custom_leaf(base)
    _, s_gm, s_nodes = _fx_custom_leaf(STOCK)
    assert nodes == s_nodes
    assert [t for op, t in nodes if op == "call_module"] == ["b1", "b2", "head"]
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(gm(x), s_gm(x), rtol=0, atol=0)
    assert_rearmed(model, base, x)


def _fx_wrapped(base, x):
    """A stock root holding a fastmodule tree, and a traced free function."""
    inner = build(make_net, base)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) * 2

    outer = Outer()
    gm = torch.fx.symbolic_trace(outer)
    nodes = [(n.op, _target_name(n.target)) for n in gm.graph.nodes]
    try:
        torch.fx.symbolic_trace(lambda y: inner(y) + 1)
        free = None
    except Exception as e:  # noqa: BLE001 - compared against stock below
        free = (type(e), str(e))
    return outer, gm, nodes, free


def test_fx_stock_root_fast_children(base):
    x = x_in()
    outer, gm, nodes, free = _fx_wrapped(base, x)
    _, s_gm, s_nodes, s_free = _fx_wrapped(STOCK, x)
    assert nodes == s_nodes
    assert free == s_free
    assert ("call_module", "inner.b2.lin") in nodes
    torch.testing.assert_close(gm(x), outer(x), rtol=0, atol=0)
    torch.testing.assert_close(gm(x), s_gm(x), rtol=0, atol=0)
    assert_rearmed(outer.inner, base, x)


def make_branchy(base):
    class Branchy(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            if self.lin(x).sum() > 0:  # data-dependent: symbolic tracing fails
                return x
            return -x

    return Branchy


def _failed_trace(base, x):
    model = build(make_branchy, base)
    try:
        torch.fx.symbolic_trace(model)
    except Exception as e:  # noqa: BLE001 - compared against stock below
        err = type(e)
    else:
        err = None
    # the patches are undone even though the trace raised
    assert torch.nn.Module.__call__ is STOCK.__dict__["__call__"]
    return model, err, model(x)


def test_fx_failed_trace_restores(base):
    x = x_in()
    model, err, out = _failed_trace(base, x)
    _, s_err, s_out = _failed_trace(STOCK, x)
    assert err is s_err is torch.fx.proxy.TraceError
    torch.testing.assert_close(out, s_out, rtol=0, atol=0)
    assert_rearmed(model, base, x)


# ----------------------------------------------------------------------- torch.export


def _stack_values(stack):
    if stack is None:
        return None
    out = []
    for path, ty in stack.values():
        name = ty if isinstance(ty, str) else f"{ty.__module__}.{ty.__qualname__}"
        # stock and fast classes come from the same factory: equal qualname suffix
        out.append((path, name.rsplit(".", 1)[-1]))
    return out


def _export(base, x, strict):
    model = build(make_net, base)
    ep = torch.export.export(model, (x,), strict=strict)
    meta = [
        (str(n.target), _stack_values(n.meta.get("nn_module_stack")))
        for n in ep.graph.nodes
        if n.op == "call_function"
    ]
    return model, ep, meta


@pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])
def test_export(base, strict):
    x = x_in()
    model, ep, meta = _export(base, x, strict)
    _, s_ep, s_meta = _export(STOCK, x, strict)
    assert meta == s_meta
    assert any(stack and ("b1.lin", "Linear") in stack for _, stack in meta)
    assert any(stack and ("b2", "Block") in stack for _, stack in meta)
    assert [s.arg.name for s in ep.graph_signature.input_specs] == [
        s.arg.name for s in s_ep.graph_signature.input_specs
    ]
    assert list(ep.state_dict) == list(s_ep.state_dict)
    torch.testing.assert_close(ep.module()(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(ep.module()(x), s_ep.module()(x), rtol=0, atol=0)
    assert_rearmed(model, base, x)


def _export_dynamic(base):
    model = build(make_net, base)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, (x_in(),), dynamic_shapes=({0: batch},))
    return model, ep


def test_export_dynamic_batch(base):
    model, ep = _export_dynamic(base)
    _, s_ep = _export_dynamic(STOCK)
    assert str(ep.graph) == str(s_ep.graph)
    for rows in (1, 7):
        x = x_in(rows)
        torch.testing.assert_close(ep.module()(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(ep.module()(x), s_ep.module()(x), rtol=0, atol=0)
    assert_rearmed(model, base, x_in())


# -------------------------------------------------------------------------- torch.jit

_MANGLE = re.compile(r"___torch_mangle_\d+\.")


def _jit_trace(base, x):
    model = build(make_net, base)
    traced = torch.jit.trace(model, x)
    return model, traced, _MANGLE.sub("", str(traced.graph))


def test_jit_trace(base):
    x = x_in()
    model, traced, graph = _jit_trace(base, x)
    _, s_traced, s_graph = _jit_trace(STOCK, x)
    assert graph == s_graph
    kinds = [n.kind() for n in traced.graph.nodes()]
    assert kinds == [n.kind() for n in s_traced.graph.nodes()]
    assert "prim::CallMethod" in kinds
    torch.testing.assert_close(traced(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(traced(x), s_traced(x), rtol=0, atol=0)
    # Submodules traced too
    b1_kinds = [n.kind() for n in traced.b1.graph.nodes()]
    assert b1_kinds == [n.kind() for n in s_traced.b1.graph.nodes()]
    # scopes are recorded by _slow_forward, which the tracer needs on every module call
    scopes = [(n.kind(), n.scopeName()) for n in traced.inlined_graph.nodes()]
    assert scopes == [(n.kind(), n.scopeName()) for n in s_traced.inlined_graph.nodes()]
    assert any("__module.b1/__module.b1.lin" in sc for _, sc in scopes)
    assert_rearmed(model, base, x)


def _jit_script(factory, base):
    model = build(factory, base)
    try:
        scripted = torch.jit.script(model)
    except Exception as e:  # noqa: BLE001 - compared against stock below
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return model, None, (type(e), _MANGLE.sub("", lines[0]) if lines else "")
    return model, scripted, None


SCRIPT_FACTORIES = {
    "net": make_net,
    "breaking": make_breaking_net,
    "own_getattr": lambda b: make_getattr_net(b, []),
    "own_call": lambda b: make_call_net(b, []),
}


@pytest.mark.parametrize("which", list(SCRIPT_FACTORIES))
def test_jit_script(base, which):
    x = x_in()
    factory = SCRIPT_FACTORIES[which]
    model, scripted, err = _jit_script(factory, base)
    s_model, s_scripted, s_err = _jit_script(factory, STOCK)
    assert err == s_err
    if which == "net":
        assert err is None
    if scripted is not None:
        torch.testing.assert_close(scripted(x), model(x), rtol=0, atol=0)
        torch.testing.assert_close(scripted(x), s_scripted(x), rtol=0, atol=0)
        assert [n.kind() for n in scripted.graph.nodes()] == [
            n.kind() for n in s_scripted.graph.nodes()
        ]
    if which in ("net", "breaking"):  # the others opt out of a native slot by design
        assert_rearmed(model, base, x)


# ------------------------------------------------------------------ pickling / saving


class PStockBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("running", torch.arange(4.0))
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x):
        return torch.relu(self.lin(x)) + self.running + self.scratch


class PFastBlock(fastmodule.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("running", torch.arange(4.0))
        self.register_buffer("scratch", torch.ones(4), persistent=False)

    def forward(self, x):
        return torch.relu(self.lin(x)) + self.running + self.scratch


class PStockNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = PStockBlock()
        self.norm = nn.BatchNorm1d(4)
        self.w = nn.Parameter(torch.randn(4))
        self.register_parameter("missing", None)
        self.register_buffer("absent", None)
        self.tag = "net"

    def forward(self, x):
        return self.norm(self.block(x)) * self.w


class PFastNet(fastmodule.Module):
    def __init__(self):
        super().__init__()
        self.block = PFastBlock()
        self.norm = nn.BatchNorm1d(4)
        self.w = nn.Parameter(torch.randn(4))
        self.register_parameter("missing", None)
        self.register_buffer("absent", None)
        self.tag = "net"

    def forward(self, x):
        return self.norm(self.block(x)) * self.w


PICKLE_NET = {STOCK: PStockNet, FAST: PFastNet}


def _pnet(base):
    torch.manual_seed(0)
    model = PICKLE_NET[base]()
    model(x_in())  # update BatchNorm running stats
    model.eval()
    return model


def _roundtrips():
    def via_pickle(m):
        return pickle.loads(pickle.dumps(m))

    def via_deepcopy(m):
        return copy.deepcopy(m)

    def via_torch_save(m):
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    return {"pickle": via_pickle, "deepcopy": via_deepcopy, "torch_save": via_torch_save}


def _describe(m: nn.Module):
    return (
        # PStockX / PFastX share their bodies: compare the names without the prefix
        [(n, re.sub("^P(Stock|Fast)", "P", type(s).__name__)) for n, s in m.named_modules()],
        {k: (None if v is None else type(v).__name__) for k, v in m._parameters.items()},
        {k: (None if v is None else type(v).__name__) for k, v in m._buffers.items()},
        sorted(m._non_persistent_buffers_set),
        m.training,
        m.tag,
    )


@pytest.mark.parametrize("how", list(_roundtrips()))
def test_roundtrip_whole_model(base, how):
    x = x_in()
    rt = _roundtrips()[how]
    model, s_model = _pnet(base), _pnet(STOCK)
    loaded, s_loaded = rt(model), rt(s_model)
    assert type(loaded) is type(model)
    assert loaded is not model
    assert _describe(loaded) == _describe(s_loaded) == _describe(model)
    assert_same_state(loaded, model)
    assert_same_state(loaded, s_loaded)
    torch.testing.assert_close(loaded.block.scratch, model.block.scratch, rtol=0, atol=0)
    out = loaded(x)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    torch.testing.assert_close(out, s_loaded(x), rtol=0, atol=0)
    # the loaded parameters are the loaded module's own, not the original's
    assert loaded.w is not model.w
    assert loaded.w is loaded._parameters["w"]
    if base is FAST:
        assert fastmodule.slots_of(type(loaded))[0] is NATIVE
        assert fastmodule.slots_of(type(loaded.block)) == ALL_SLOTS


def test_state_dict_save_load(base):
    x = x_in()
    model, s_model = _pnet(base), _pnet(STOCK)

    def save_load(sd):
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        return torch.load(buf)

    sd, s_sd = model.state_dict(), s_model.state_dict()
    assert list(sd) == list(s_sd)
    assert sd._metadata == s_sd._metadata
    loaded_sd, s_loaded_sd = save_load(sd), save_load(s_sd)
    assert list(loaded_sd) == list(s_loaded_sd) == list(sd)
    assert loaded_sd._metadata == s_loaded_sd._metadata == sd._metadata
    for k in sd:
        assert torch.equal(loaded_sd[k], s_loaded_sd[k]), k

    torch.manual_seed(99)  # different init, overwritten by the load
    fresh = PICKLE_NET[base]().eval()
    torch.manual_seed(99)
    s_fresh = PICKLE_NET[STOCK]().eval()
    r = fresh.load_state_dict(loaded_sd)
    s_r = s_fresh.load_state_dict(s_loaded_sd)
    assert (r.missing_keys, r.unexpected_keys) == (s_r.missing_keys, s_r.unexpected_keys)
    assert_same_state(fresh, model)
    torch.testing.assert_close(fresh(x), s_fresh(x), rtol=0, atol=0)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


# ------------------------------------------------------------------------ torch.func


def test_functional_call(base):
    x = x_in()
    results = {}
    for b in (base, STOCK):
        model = build(make_net, b)
        before = dict(model._parameters)
        before_b1 = dict(model.b1._parameters)
        before_buf = dict(model.b1._buffers)
        snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
        pb = {k: v.detach() * 2 for k, v in model.named_parameters()}
        pb.update({k: v * 3 for k, v in model.named_buffers()})
        out_full = torch.func.functional_call(model, pb, (x,))
        out_part = torch.func.functional_call(model, {"w": torch.zeros(4)}, (x,))
        out_kw = torch.func.functional_call(model, (pb,), args=(), kwargs={"x": x})
        # the module's own registries are untouched afterwards
        assert model._parameters.keys() == before.keys()
        assert all(model._parameters[k] is v for k, v in before.items())
        assert all(model.b1._parameters[k] is v for k, v in before_b1.items())
        assert all(model.b1._buffers[k] is v for k, v in before_buf.items())
        assert model.w is before["w"]
        for k, v in model.state_dict().items():
            assert torch.equal(v, snapshot[k]), k
        results[b] = (out_full, out_part, out_kw, model(x))
    for got, want in zip(results[base], results[STOCK], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.equal(results[base][0], results[base][3])


def test_functional_call_grad(base):
    x = x_in()
    grads = {}
    for b in (base, STOCK):
        model = build(make_net, b)
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, model=model):
            return torch.func.functional_call(model, p, (x,)).square().sum()

        grads[b] = torch.func.grad(loss)(params)
        assert all(p.grad is None for p in model.parameters())
    assert list(grads[base]) == list(grads[STOCK])
    for k in grads[base]:
        torch.testing.assert_close(grads[base][k], grads[STOCK][k], rtol=0, atol=0)


# ---------------------------------------------------------- parametrize and prune


class Symmetric(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


def make_square_net(base):
    class Square(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.m = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return self.lin(x) @ self.m

    return Square


def _parametrized(base, x):
    model = build(make_square_net, base)
    orig_cls = type(model)
    before = model(x)
    parametrize.register_parametrization(model.lin, "weight", Symmetric())
    parametrize.register_parametrization(model, "m", Symmetric())
    info = {
        "names": (type(model).__name__, type(model.lin).__name__),
        "is_param": (
            parametrize.is_parametrized(model, "m"),
            parametrize.is_parametrized(model.lin, "weight"),
        ),
        "sym": torch.equal(model.m, model.m.T)
        and torch.equal(model.lin.weight, model.lin.weight.T),
        "keys": list(model.state_dict()),
        "params": [n for n, _ in model.named_parameters()],
    }
    out = model(x)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    cached = None
    with parametrize.cached():
        cached = model(x)
    parametrize.remove_parametrizations(model, "m", leave_parametrized=True)
    parametrize.remove_parametrizations(model.lin, "weight", leave_parametrized=False)
    restored = {
        "cls": type(model) is orig_cls,
        "lin_cls": type(model.lin) is nn.Linear,
        "m_is_param": isinstance(model.m, nn.Parameter) and model.m is model._parameters["m"],
        "keys": list(model.state_dict()),
    }
    return model, before, out, cached, info, grads, restored


def test_parametrize(base):
    x = x_in()
    model, before, out, cached, info, grads, restored = _parametrized(base, x)
    s_model, s_before, s_out, s_cached, s_info, s_grads, s_restored = _parametrized(STOCK, x)
    assert info == s_info
    assert info["names"][0].startswith("Parametrized")
    assert info["names"] == ("ParametrizedSquare", "ParametrizedLinear")
    assert all(info["is_param"]) and info["sym"]
    assert restored == s_restored
    assert all(v for k, v in restored.items() if k != "keys")
    assert sorted(restored["keys"]) == ["lin.bias", "lin.weight", "m"]
    for a, b in ((before, s_before), (out, s_out), (cached, s_cached)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(cached, out, rtol=0, atol=0)
    assert list(grads) == list(s_grads)
    for k in grads:
        torch.testing.assert_close(grads[k], s_grads[k], rtol=0, atol=0)
    assert_same_state(model, s_model)
    torch.testing.assert_close(model(x), s_model(x), rtol=0, atol=0)
    assert_rearmed(model, base, x)


def test_parametrize_class_slots(base):
    """The dynamic Parametrized subclass of a fastmodule class keeps the native paths."""
    x = x_in()
    model = build(make_square_net, base)
    parametrize.register_parametrization(model, "m", Symmetric())
    model(x)
    if base is FAST:
        assert issubclass(type(model), FAST)
        assert fastmodule.slots_of(type(model)) == ALL_SLOTS
    # the property wins over the registries, as on stock
    assert "m" not in model._parameters
    assert torch.equal(model.m, model.m.T)
    with pytest.raises(AttributeError):
        model.nope  # noqa: B018


def _parametrized_copies(base, x):
    model = build(make_square_net, base)
    parametrize.register_parametrization(model, "m", Symmetric())
    clone = copy.deepcopy(model)
    try:
        pickle.dumps(model)
    except Exception as e:  # noqa: BLE001 - compared against stock below
        pickled = (type(e), str(e))
    else:
        pickled = None
    return model, clone, pickled


def test_parametrize_deepcopy_and_pickle(base):
    x = x_in()
    model, clone, pickled = _parametrized_copies(base, x)
    s_model, s_clone, s_pickled = _parametrized_copies(STOCK, x)
    assert pickled == s_pickled  # stock refuses: "only supported through state_dict()"
    assert type(clone).__name__ == type(s_clone).__name__ == "ParametrizedSquare"
    assert type(clone) is type(model)  # deepcopy reuses the parametrized class
    assert clone.parametrizations.m.original is not model.parametrizations.m.original
    assert_same_state(clone, s_clone)
    torch.testing.assert_close(clone(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(clone(x), s_clone(x), rtol=0, atol=0)
    assert_rearmed(clone, base, x)


def _pruned(base, x):
    model = build(make_square_net, base)
    prune.l1_unstructured(model.lin, "weight", amount=0.5)
    prune.l1_unstructured(model, "m", amount=0.5)
    mid = {
        "keys": list(model.state_dict()),
        "params": [n for n, _ in model.named_parameters()],
        "buffers": [n for n, _ in model.named_buffers()],
        "hooks": (len(model._forward_pre_hooks), len(model.lin._forward_pre_hooks)),
        "m_plain": type(model.m) is torch.Tensor and "m" not in model._parameters,
        "zeros": int((model.m == 0).sum()),
    }
    mid_sd = model.state_dict()
    out = model(x)
    prune.remove(model.lin, "weight")
    prune.remove(model, "m")
    return model, mid, mid_sd, out


def test_prune(base):
    x = x_in()
    model, mid, mid_sd, out = _pruned(base, x)
    s_model, s_mid, s_mid_sd, s_out = _pruned(STOCK, x)
    assert mid == s_mid
    assert mid["hooks"] == (1, 1) and mid["m_plain"] and mid["zeros"] == 8
    assert "m_orig" in mid["keys"] and "m_mask" in mid["keys"]
    for k in mid_sd:
        assert torch.equal(mid_sd[k], s_mid_sd[k]), k
    torch.testing.assert_close(out, s_out, rtol=0, atol=0)
    assert_same_state(model, s_model)
    # prune.remove re-registers the parameter last (same order as stock, checked above)
    assert list(model.state_dict()) == ["m", "lin.bias", "lin.weight"]
    assert isinstance(model.m, nn.Parameter) and model.m is model._parameters["m"]
    assert len(model._forward_pre_hooks) == 0
    torch.testing.assert_close(model(x), s_model(x), rtol=0, atol=0)
    assert_rearmed(model, base, x)


# ----------------------------------------------- overridden __getattr__ / __call__


def make_getattr_net(base, log):
    class WithGetattr(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("shift", torch.ones(4))

        def __getattr__(self, name):
            log.append(name)
            if name.startswith("alias_"):
                return getattr(self, name[len("alias_") :])
            return super().__getattr__(name)

        def forward(self, x):
            return self.alias_lin(x) + self.shift

    return WithGetattr


def _getattr_scenario(base, x):
    log = []
    torch.manual_seed(0)
    model = make_getattr_net(base, log)()
    result = {"out": model(x), "lin_is": model.lin is model._modules["lin"]}
    try:
        model.nope  # noqa: B018
    except AttributeError as e:
        result["err"] = (type(e), str(e))
    result["hasattr"] = (hasattr(model, "alias_shift"), hasattr(model, "alias_nope"))
    model.extra = nn.Linear(2, 2)
    result["extra"] = type(model.extra).__name__
    del model.extra
    result["after_del"] = hasattr(model, "extra")
    result["log"] = list(log)
    return model, result


def test_own_getattr(base):
    x = x_in()
    model, got = _getattr_scenario(base, x)
    _, want = _getattr_scenario(STOCK, x)
    out, s_out = got.pop("out"), want.pop("out")
    torch.testing.assert_close(out, s_out, rtol=0, atol=0)
    assert got == want
    assert "lin" in got["log"] and "shift" in got["log"]
    assert got["err"][1] == "'WithGetattr' object has no attribute 'nope'"
    if base is FAST:
        call, getattr_slot, _ = fastmodule.slots_of(type(model))
        assert getattr_slot is False  # overridden __getattr__ runs Python


def make_call_net(base, log):
    class Inner(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            log.append("inner.forward")
            return self.lin(x)

    class WithCall(base):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def __call__(self, *args, **kwargs):
            log.append("call")
            return super().__call__(*args, **kwargs) * 2

        def forward(self, x, *, bias=0.0):
            log.append("forward")
            return self.inner(x) + bias

    return WithCall


def _call_scenario(base, x):
    log = []
    torch.manual_seed(0)
    model = make_call_net(base, log)()
    model.register_forward_pre_hook(lambda m, a: log.append("pre"))
    model.register_forward_hook(lambda m, a, o: log.append("post"))
    outs = [model(x), model(x, bias=1.0), model.forward(x)]
    return model, outs, log


def test_own_call(base):
    x = x_in()
    model, outs, log = _call_scenario(base, x)
    s_model, s_outs, s_log = _call_scenario(STOCK, x)
    for a, b in zip(outs, s_outs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert log == s_log
    assert log[:5] == ["call", "pre", "forward", "inner.forward", "post"]
    assert type(model).__call__ is not torch.nn.Module.__call__
    assert type(model.inner).__call__ is torch.nn.Module.__call__
    if base is FAST:
        assert fastmodule.slots_of(type(model))[0] is False  # overridden __call__
        assert fastmodule.slots_of(type(model.inner)) == ALL_SLOTS
    # compile sees the user __call__ only through the wrapper it is given
    log.clear()
    s_log.clear()
    cnt = torch._dynamo.testing.CompileCounter()
    out = torch.compile(model, backend=cnt)(x)
    torch._dynamo.reset()
    s_cnt = torch._dynamo.testing.CompileCounter()
    s_out = torch.compile(s_model, backend=s_cnt)(x)
    torch.testing.assert_close(out, s_out, rtol=0, atol=0)
    assert (cnt.frame_count, cnt.op_count) == (s_cnt.frame_count, s_cnt.op_count)
    assert log == s_log
    assert "call" in log and "pre" in log
