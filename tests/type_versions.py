"""Each test starts with the module classes' type-version budget of a fresh process.

From CPython 3.13 on, a class gets at most 1,000 version tags in a process: each
modification of the class (or of a base) that a lookup follows uses one, and then the
class and every subclass keep none. The interpreter's attribute caches and
fastmodule's recorded walks are keyed on version tags, so both stay off for every
module class from then on (fastmodule then hands over to torch, as stock: correct,
and covered by ``test_parity_mixin_roots``).

The suite modifies ``nn.Module`` on purpose (``install()``/``uninstall()``,
``strict()``, patched methods) a few thousand times, far more than a program does:
whichever test that expects a walk to replay came after the thousandth modification
failed, depending on the order. ``reset_module_classes`` puts the count of
``nn.Module`` and of each of its subclasses back to zero before every test.

The count is CPython's ``tp_versions_used``, an unsigned 16-bit field that follows
``tp_watched`` in ``PyTypeObject``. Its offset is computed from the layout and then
confirmed by watching it count a fresh class's modifications; where it is not
confirmed (another layout, a debug build), nothing is written.
"""

from __future__ import annotations

import ctypes
import sys

import torch


def _layout_offset() -> int:
    # 48 pointer-sized fields up to tp_version_tag (unsigned int), then tp_finalize
    # and tp_vectorcall (pointers), tp_watched (unsigned char), tp_versions_used.
    ptr = ctypes.sizeof(ctypes.c_void_p)
    version_tag = 48 * ptr
    finalize = version_tag + ptr  # the unsigned int, padded to a pointer
    return finalize + 2 * ptr + 2


def _count(cls: type, offset: int) -> int:
    return ctypes.c_uint16.from_address(id(cls) + offset).value


def _confirmed_offset() -> int | None:
    if sys.implementation.name != "cpython" or sys.version_info < (3, 13):
        return None
    offset = _layout_offset()
    for _ in range(2):
        probe = type("Probe", (), {})
        probe.x = 0  # type: ignore[attr-defined]
        counts = []
        for i in range(4):
            probe.x = i  # type: ignore[attr-defined]
            _ = probe.x  # type: ignore[attr-defined] # a lookup: a new version tag
            counts.append(_count(probe, offset))
        if counts[0] == 0 or counts != list(range(counts[0], counts[0] + 4)):
            return None
    return offset


OFFSET = _confirmed_offset()


def _module_classes() -> list[type]:
    seen: set[type] = set()
    todo: list[type] = [torch.nn.Module]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            todo.extend(type.__subclasses__(cls))
    return list(seen)


def reset_module_classes() -> None:
    """Give ``nn.Module`` and its subclasses a fresh process's version-tag budget."""
    if OFFSET is None:
        return
    for cls in _module_classes():
        if _count(cls, OFFSET):
            ctypes.c_uint16.from_address(id(cls) + OFFSET).value = 0
