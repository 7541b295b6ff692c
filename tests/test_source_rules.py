"""Rules on the Rust core's source that no behaviour test can pin down reliably.

pyo3's lazily filled cells (``intern!``, ``PyOnceLock``, ``GILOnceCell`` and the
``*_py_attached`` helpers) and ``Python::detach``/``allow_threads`` release the GIL:
the cells on the first use of each site. Inside a native path that lets another
thread run in its middle, which must happen only where torch's own code lets it
(a kernel, a call into Python): a thread saw the cyclic GC paused by a recording
(the thread-stress ``walks`` scenario on CPython 3.13), and a borrowed reference
held across the release can be freed. The crate's ``intern!`` is
``crate::cpython::interned``'s, which releases nothing;
``tests/audit_scenarios/first_use_lets_no_thread_see_gc_paused.py`` is the
behaviour check for the paths that pause the GC.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

#: What releases the GIL behind the caller's back, and the one file that may name it
#: (in its docs, to say why it is not used).
RELEASES_GIL = {
    "pyo3's intern!": re.compile(r"\bpyo3::intern\b|use\s+pyo3::\{[^}]*\bintern\b"),
    "pyo3's Interned": re.compile(r"\bsync::Interned\b"),
    "PyOnceLock": re.compile(r"\bPyOnceLock\b"),
    "GILOnceCell": re.compile(r"\bGILOnceCell\b"),
    "a *_py_attached helper": re.compile(r"_py_attached\b|\bOnceLockExt\b|\bOnceExt\b"),
    "Python::detach / allow_threads": re.compile(
        r"\ballow_threads\b|\bPython::detach\b|\bpy\.detach\s*\("
    ),
}


def code_of(path: Path) -> str:
    """The file's text without comments (``//`` to the end of the line, and ``/* */``)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def rust_files() -> list[Path]:
    files = sorted(SRC.rglob("*.rs"))
    assert files, f"no Rust sources under {SRC}"
    return files


@pytest.mark.parametrize("what", sorted(RELEASES_GIL))
def test_no_pyo3_helper_that_releases_the_gil(what: str) -> None:
    pattern = RELEASES_GIL[what]
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in rust_files()
        for n, line in enumerate(code_of(path).splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, f"{what} releases the GIL (see this file's docs):\n" + "\n".join(found)


def test_the_crate_intern_is_used() -> None:
    """The replacement is in use (the rule above is not vacuous)."""
    uses = sum(code_of(p).count("interned::intern") for p in rust_files())
    assert uses > 20, uses
