"""tests/memcheck/check_log.py, which judges ``make test-memcheck``: an error with a frame
in fastmodule's extension fails the run, CPython's and torch's own do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.memcheck.check_log import main

CORE = "/x/python/fastmodule/_core.cpython-311-x86_64-linux-gnu.so"
HEADER = """==7== Memcheck, a memory error detector
==7== Command: python tests/memcheck/entry_points.py
==7==
"""
OURS = f"""==7== Invalid read of size 8
==7==    at 0x4952682: Py_INCREF (object.h:502)
==7==    by 0x1A2B3C: _core::attr::getattro (in {CORE})
==7==    by 0x4AA2A3F: _PyEval_EvalFrameDefault (ceval.c:6434)
==7==  Address 0x5 is not stack'd, malloc'd or (recently) free'd
==7==
"""
OURS_LEAK = f"""==7== 48 bytes in 1 blocks are definitely lost in loss record 6 of 9
==7==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==7==    by 0x49C8C89: PyUnicode_New (unicodeobject.c:1425)
==7==    by 0x1A2B3C: ??? (in {CORE})
==7==
"""
THEIRS = """==7== Conditional jump or move depends on uninitialised value(s)
==7==    at 0x49E04DA: maybe_small_long (longobject.c:71)
==7==    by 0x49E075F: int_from_bytes_impl (longobject.c:5946)
==7==
==7== 24 bytes in 1 blocks are definitely lost in loss record 1 of 9
==7==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==7==    by 0x49C8C89: PyFloat_FromDouble (floatobject.c:149)
==7==
"""
FOOTER = """==7== ERROR SUMMARY: 2 errors from 2 contexts (suppressed: 10 from 3)
"""


@pytest.mark.parametrize(
    ("body", "status"),
    [(THEIRS, 0), (OURS + THEIRS, 1), (THEIRS + OURS_LEAK, 1), ("", 0)],
    ids=["cpython-only", "invalid-read-in-core", "leak-from-core", "clean"],
)
def test_fails_only_on_fastmodule_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, status: int
) -> None:
    log = tmp_path / "memcheck.log"
    log.write_text(HEADER + body + FOOTER)
    assert main(str(log)) == status
    out = capsys.readouterr().out
    assert ("errors with a fastmodule (_core) frame: none" in out) is (status == 0)
