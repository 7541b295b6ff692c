"""The global names fastmodule reads from a function's bytecode (to decide whether a
method body can run with torch's module globals) are exactly what ``dis`` reports."""

from __future__ import annotations

import dis
import types

import torch

from fastmodule._methods import dispatch


def _codes(module: types.ModuleType) -> list[types.CodeType]:
    """Every code object defined in ``module``'s functions and classes, nested ones too."""
    todo: list[types.CodeType] = []
    for value in vars(module).values():
        if isinstance(value, types.FunctionType):
            todo.append(value.__code__)
        elif isinstance(value, type):
            for attr in vars(value).values():
                func = getattr(attr, "__func__", attr)
                if isinstance(func, types.FunctionType):
                    todo.append(func.__code__)
    out = []
    while todo:
        code = todo.pop()
        out.append(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


def _by_dis(code: types.CodeType) -> list[str]:
    return [ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"]


def test_global_names_match_dis_on_torch_code() -> None:
    modules = [torch.nn.modules.module, torch.nn.modules.container, torch.nn.functional]
    codes = [c for m in modules for c in _codes(m)]
    assert len(codes) > 500
    for code in codes:
        assert dispatch._global_names(code) == _by_dis(code), code


def test_global_names_with_extended_arguments() -> None:
    """A function reading its 300th name needs EXTENDED_ARG before LOAD_GLOBAL."""
    source = "def f():\n" + "".join(f"    g{i}\n" for i in range(300)) + "    return len\n"
    namespace: dict[str, object] = {}
    exec(compile(source, "<many>", "exec"), namespace)
    code = namespace["f"].__code__  # type: ignore[attr-defined]
    assert dispatch._global_names(code) == _by_dis(code)
    assert dispatch._global_names(code)[-1] == "len"
