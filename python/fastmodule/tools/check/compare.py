"""Exact comparison of two results, whatever a model returns.

A result is first *captured* (:func:`capture`): copied into a tree that later runs
cannot change. Tensors are detached and cloned and later compared bitwise (dtype,
shape, device, layout, then every bit: NaNs with the same payload are equal, ``-0.0``
differs from ``0.0``). Mappings (dicts, ``OrderedDict``, Hugging Face ``ModelOutput``),
lists, tuples and namedtuples, and any object with a ``__dict__`` or ``__slots__``
(dataclasses, Hugging Face ``Cache`` objects such as ``DynamicCache``,
``torch.distributions``, ``SimpleNamespace``) are captured by type and then field by
field, recursively. An object met again (shared, or a cycle) is captured as a
reference to where it was first met. Python floats compare with NaN equal to NaN.
Anything else compares with ``==`` only when it is a value type (numbers, strings,
``torch.dtype``, ``torch.Size``, enums, ...); other objects are equal when they are the
same object, and otherwise reported as not compared (never as a difference).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import math
import pathlib
import types
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "Captured",
    "Comparison",
    "capture",
    "compare",
    "detached",
    "differences",
    "is_numpy_array",
]

#: Types compared with ``==`` (and their subclasses, whose type must match exactly).
_VALUE_TYPES: tuple[type, ...] = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    range,
    slice,
    type(Ellipsis),
    type(NotImplemented),
    enum.Enum,
    type,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    torch.Size,
    decimal.Decimal,
    fractions.Fraction,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    datetime.tzinfo,
    uuid.UUID,
    pathlib.PurePath,
    types.BuiltinFunctionType,
    types.ModuleType,
)

#: Longest repr shown in a difference.
_REPR = 80


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that raises: name the type
        text = f"<{type(value).__qualname__}>"
    return text if len(text) <= _REPR else text[: _REPR - 3] + "..."


def _type_name(t: type) -> str:
    return (
        t.__qualname__ if t.__module__ in ("builtins", None) else f"{t.__module__}.{t.__qualname__}"
    )


# The captured tree's nodes. Tensors are kept as (cloned) tensors, value types as
# themselves.


@dataclasses.dataclass(frozen=True)
class _Tree:
    """A container or an object: its type and its labelled parts, in order."""

    type: type
    #: "mapping" (labels are keys), "sequence" (indexes), "fields" (attribute names).
    kind: str
    items: tuple[tuple[Any, Any], ...]
    #: Where it was first met (the path a later reference names).
    path: str
    index: int


@dataclasses.dataclass(frozen=True)
class _Ref:
    """An object met before in the same capture (shared, or a cycle)."""

    index: int
    path: str


@dataclasses.dataclass(frozen=True)
class _Opaque:
    """An object with no fields and no value ``==``: equal only to itself."""

    obj: Any


@dataclasses.dataclass(frozen=True)
class _Function:
    """A Python function: compared by its code and what its closure and defaults hold."""

    code: Any
    parts: Any


@dataclasses.dataclass(frozen=True)
class _Array:
    """A NumPy array: dtype, shape and bytes."""

    type: type
    dtype: str
    shape: tuple[int, ...]
    data: bytes


class _Unset:
    """A ``__slots__`` attribute with no value."""

    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


class Captured:
    """A copy of a value that later runs cannot change, for :func:`compare`."""

    __slots__ = ("arrays", "root", "tensors")

    def __init__(self, root: Any, tensors: int, arrays: int = 0) -> None:
        self.root = root
        #: How many tensors it holds.
        self.tensors = tensors
        #: How many NumPy arrays it holds.
        self.arrays = arrays

    def __repr__(self) -> str:
        return f"Captured({self.tensors} tensor(s))"


class _Capture:
    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, str]] = {}
        self.alive: list[Any] = []  # keeps ids unique while capturing
        self.tensors = 0
        self.arrays = 0

    def value(self, value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            self.tensors += 1
            with torch.no_grad():
                return value.detach().clone()
        if isinstance(value, _VALUE_TYPES):
            return value
        if isinstance(value, types.FunctionType):
            return self._function(value, path)
        if is_numpy_array(value):
            self.arrays += 1
            return _Array(type(value), str(value.dtype), tuple(value.shape), value.tobytes())
        if isinstance(value, torch.nn.Module):
            # A module in the output (the model's own, usually): the same object or not.
            return _Opaque(value)
        key = id(value)
        if key in self.seen:
            index, first = self.seen[key]
            return _Ref(index, first)
        index = len(self.seen)
        self.seen[key] = (index, path)
        self.alive.append(value)
        items = self._items(value, path)
        if items is None:
            # No fields to compare: a value type of its own (an ``==`` and a hash) is
            # compared with ``==``, anything else is equal only to itself.
            cls = type(value)
            if cls.__eq__ is not object.__eq__ and cls.__hash__ is not None:
                return value
            return _Opaque(value)
        kind, parts = items
        return _Tree(type(value), kind, tuple(parts), path, index)

    def _function(self, fn: types.FunctionType, path: str) -> _Function:
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:
                cells.append(_UNSET)
        parts = self.value((tuple(cells), fn.__defaults__, fn.__kwdefaults__), path)
        return _Function(fn.__code__, parts)

    def _items(self, value: Any, path: str) -> tuple[str, list[tuple[Any, Any]]] | None:
        if isinstance(value, Mapping):
            return "mapping", [
                (k, self.value(v, f"{path}[{_short(k)}]")) for k, v in list(value.items())
            ]
        names = _tuple_fields(value)
        if names is not None:  # a namedtuple, or a structseq (torch.return_types)
            return "fields", [
                (name, self.value(v, f"{path}.{name}"))
                for name, v in zip(names, value, strict=True)
            ]
        if isinstance(value, (list, tuple, collections.deque)):
            return "sequence", [(i, self.value(v, f"{path}[{i}]")) for i, v in enumerate(value)]
        if isinstance(value, types.MethodType):
            return "fields", [
                ("__func__", self.value(value.__func__, f"{path}.__func__")),
                ("__self__", self.value(value.__self__, f"{path}.__self__")),
            ]
        if isinstance(value, (set, frozenset)):
            ordered = sorted(value, key=_short)
            return "sequence", [(i, self.value(v, f"{path}{{{i}}}")) for i, v in enumerate(ordered)]
        fields = dict(_fields(value))
        if isinstance(value, BaseException):  # its args live outside __dict__
            fields["args"] = value.args
        if not fields and not _has_fields(value):
            return None
        return "fields", [
            (name, self.value(v, f"{path}.{name}")) for name, v in sorted(fields.items())
        ]


def _tuple_fields(value: Any) -> tuple[str, ...] | None:
    """A named tuple's field names (None: not one, or they do not cover it)."""
    if not isinstance(value, tuple):
        return None
    cls = type(value)
    names = getattr(cls, "_fields", None) or getattr(cls, "__match_args__", None)
    if not isinstance(names, tuple) or len(names) != len(value):
        return None
    return names


def is_numpy_array(value: Any) -> bool:
    """A NumPy ``ndarray`` (checked without importing NumPy)."""
    t = type(value)
    return t.__module__ == "numpy" and t.__name__ == "ndarray"


def _has_fields(value: Any) -> bool:
    """Does ``value`` keep its state in a ``__dict__`` or ``__slots__`` (even empty)?"""
    try:
        d = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        d = None
    return isinstance(d, dict) or any("__slots__" in vars(c) for c in type(value).__mro__[:-1])


def _slot_names(cls: type) -> Iterator[tuple[type, str]]:
    for klass in cls.__mro__[:-1]:
        slots = vars(klass).get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{klass.__name__.lstrip('_')}{name}"
            yield klass, name


def _fields(value: Any) -> Iterator[tuple[str, Any]]:
    """An object's attributes: its ``__dict__`` and its ``__slots__`` (unset: ``<unset>``),
    read without running ``__getattr__``/``__getattribute__`` overrides."""
    try:
        d = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        d = None
    if isinstance(d, dict):
        yield from list(d.items())
    for klass, name in _slot_names(type(value)):
        descriptor = vars(klass).get(name)
        if descriptor is None or not hasattr(descriptor, "__get__"):
            continue
        try:
            yield name, descriptor.__get__(value, type(value))
        except AttributeError:
            yield name, _UNSET


def capture(value: Any) -> Captured:
    """A copy of ``value`` that later runs cannot change (tensors detached and cloned,
    containers and objects field by field; shared objects and cycles as references)."""
    if isinstance(value, Captured):
        return value
    state = _Capture()
    root = state.value(value, "")
    return Captured(root, state.tensors, state.arrays)


#: The old name: a copy kept for comparing later.
detached = capture


@dataclasses.dataclass
class Comparison:
    """Where two captured values differ, and what could not be compared."""

    differences: list[str] = dataclasses.field(default_factory=list)
    #: Objects with no fields and no value ``==``, different objects in the two runs.
    not_compared: list[str] = dataclasses.field(default_factory=list)


def compare(a: Any, b: Any, path: str = "output", limit: int = 20) -> Comparison:
    """Compare ``a`` and ``b`` (values or :class:`Captured` copies), at most ``limit``
    differences; an empty ``differences`` means identical."""
    result = Comparison()
    _Walk(result, limit, path).walk(capture(a).root, capture(b).root, path)
    return result


def differences(a: Any, b: Any, path: str = "output", limit: int = 20) -> list[str]:
    """Where ``a`` and ``b`` differ (at most ``limit`` entries; empty: identical)."""
    return compare(a, b, path, limit).differences


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float):
        return _same_float(a, b)
    if isinstance(a, complex):
        return _same_float(a.real, b.real) and _same_float(a.imag, b.imag)
    if isinstance(a, decimal.Decimal) and a.is_nan():
        return b.is_nan()
    try:
        # Equal, or both NaN-like (unequal to themselves: NumPy's float scalars).
        return bool(a == b) or (bool(a != a) and bool(b != b))
    except Exception:  # noqa: BLE001 - an == that raises: the same object or not
        return a is b


class _Walk:
    def __init__(self, result: Comparison, limit: int, root: str) -> None:
        self.result = result
        self.limit = limit
        self.root = root

    def differ(self, text: str) -> None:
        if len(self.result.differences) < self.limit:
            self.result.differences.append(text)

    def walk(self, a: Any, b: Any, path: str) -> None:
        if len(self.result.differences) >= self.limit:
            return
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            found = _tensor_difference(path, a, b)
            if found:
                self.differ(found)
            return
        if type(a) is not type(b):
            self.differ(f"{path}: {self._describe(a)} != {self._describe(b)}")
            return
        if isinstance(a, _Ref):
            if a.index != b.index:
                self.differ(
                    f"{path}: the object at {self.root}{a.path} != the object at "
                    f"{self.root}{b.path}"
                )
            return
        if isinstance(a, _Tree):
            self._tree(a, b, path)
            return
        if isinstance(a, _Function):
            if a.code is not b.code:
                self.differ(f"{path}: function {a.code.co_qualname} != {b.code.co_qualname}")
            else:
                self.walk(a.parts, b.parts, f"{path} (closure and defaults)")
            return
        if isinstance(a, _Array):
            if (a.dtype, a.shape) != (b.dtype, b.shape):
                self.differ(f"{path}: array {a.dtype} {a.shape} != {b.dtype} {b.shape}")
            elif a.data != b.data:
                self.differ(f"{path}: array values differ")
            return
        if isinstance(a, _Opaque):
            if a.obj is not b.obj:
                self.result.not_compared.append(
                    f"{path}: a {_type_name(type(a.obj))} (no fields, no value ==), a "
                    "different object in each run"
                )
            return
        if not _same_value(a, b):
            self.differ(f"{path}: {_short(a)} != {_short(b)}")

    def _tree(self, a: _Tree, b: _Tree, path: str) -> None:
        if a.type is not b.type:
            self.differ(f"{path}: {_type_name(a.type)} != {_type_name(b.type)}")
            return
        labels_a = [k for k, _ in a.items]
        labels_b = [k for k, _ in b.items]
        if a.kind == "sequence":
            if len(labels_a) != len(labels_b):
                self.differ(f"{path}: length {len(labels_a)} != {len(labels_b)}")
                return
        elif not _same_labels(labels_a, labels_b):
            what = "keys" if a.kind == "mapping" else "attributes"
            self.differ(f"{path}: {what} {_short(labels_a)} != {_short(labels_b)}")
            return
        for (label, x), (_, y) in zip(a.items, b.items, strict=True):
            if a.kind == "mapping":
                where = f"{path}[{_short(label)}]"
            elif a.kind == "fields":
                where = f"{path}.{label}"
            else:
                where = f"{path}[{label}]"
            self.walk(x, y, where)

    def _describe(self, value: Any) -> str:
        if isinstance(value, _Ref):
            return f"the object at {self.root}{value.path}"
        return _describe(value)


def _same_labels(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        type(x) is type(y) and _same_value(x, y) for x, y in zip(a, b, strict=True)
    )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if isinstance(value, _Tree):
        return _type_name(value.type)
    if isinstance(value, _Opaque):
        return _type_name(type(value.obj))
    if isinstance(value, _Function):
        return f"function {value.code.co_qualname}"
    if isinstance(value, _Array):
        return _type_name(value.type)
    if value is _UNSET:
        return "<unset>"
    return f"{_type_name(type(value))} {_short(value)}"


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, one integer per element (floats: NaN payloads, -0.0)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.contiguous().reshape(-1)
    if t.is_floating_point():
        return t.view(_INT_OF_SIZE[t.element_size()])
    return t


def _tensor_difference(path: str, a: torch.Tensor, b: torch.Tensor) -> str | None:
    for what, x, y in (
        ("type", _type_name(type(a)), _type_name(type(b))),
        ("dtype", a.dtype, b.dtype),
        ("shape", tuple(a.shape), tuple(b.shape)),
        ("device", a.device, b.device),
        ("layout", a.layout, b.layout),
    ):
        if x != y:
            return f"{path}: {what} {x} != {y}"
    if a.device.type == "meta":
        return None
    try:
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
        if a.is_quantized:
            a, b = a.int_repr(), b.int_repr()
        # Bitwise, so NaNs in the same places with the same payload compare equal and
        # -0.0 differs from 0.0: "exactly the same numbers".
        bits_a, bits_b = _bits(a), _bits(b)
        unequal = bits_a != bits_b
    except (RuntimeError, TypeError, NotImplementedError):
        return None if torch.equal(a, b) else f"{path}: values differ"
    if a.is_complex():
        unequal = unequal.reshape(-1, 2).any(dim=1)
    count = int(unequal.sum().item())
    if count == 0:
        return None
    if a.is_floating_point():
        diff = (a.double() - b.double()).abs()
        finite = diff[torch.isfinite(diff)]
        worst = f"max abs difference {finite.max().item():.3g}" if finite.numel() else "NaN/inf"
        return f"{path}: {count} of {a.numel()} values differ ({worst})"
    return f"{path}: {count} of {a.numel()} values differ"
