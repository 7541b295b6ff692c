"""Read a valgrind memcheck log (``--log-file``) and fail on any error with a frame in
fastmodule's extension (``_core.*.so``): an invalid read/write/free, a use of
uninitialised memory, an overlap, or a "definitely lost" block. Errors in other frames
only (CPython, torch, the loader) are counted and summarised, not failed on.

Usage: python tests/memcheck/check_log.py LOG
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# The first line of each kind of error report memcheck writes.
ERROR_HEAD = re.compile(
    r"^==\d+== (Invalid (read|write|free)|Mismatched free|Use of uninitialised|"
    r"Conditional jump or move depends|Syscall param|Source and destination overlap|"
    r"Argument '.*' of function|Invalid (alignment|size)|"
    r"\d[\d,]* (\(.*\) )?bytes in [\d,]+ blocks are definitely lost)"
)
FRAME = re.compile(r"^==\d+==\s+(at|by) 0x[0-9A-F]+: (.*)$")
OURS = re.compile(r"_core\.cpython-[^ )]*\.so|\bfastmodule::|\b_core::")


def blocks(lines: list[str]) -> list[list[str]]:
    """Each error report: its head line and the lines up to the next blank report line."""
    out: list[list[str]] = []
    cur: list[str] | None = None
    for line in lines:
        if ERROR_HEAD.match(line):
            cur = [line]
            out.append(cur)
        elif cur is not None:
            if re.match(r"^==\d+== ?$", line):
                cur = None
            else:
                cur.append(line)
    return out


def kind(head: str) -> str:
    text = head.split("== ", 1)[1]
    if "definitely lost" in text:
        return "definitely lost"
    return re.sub(r" of size \d+| \d+ bytes", "", text).strip()


def main(path: str) -> int:
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    ours: list[list[str]] = []
    others: Counter[str] = Counter()
    for b in blocks(lines):
        frames = [m.group(2) for line in b if (m := FRAME.match(line))]
        if any(OURS.search(fr) for fr in frames):
            ours.append(b)
        else:
            others[kind(b[0])] += 1
    summary = [ln for ln in lines if "ERROR SUMMARY" in ln or "definitely lost:" in ln]
    print("valgrind:", *(s.split("== ", 1)[-1] for s in summary), sep="\n  ")
    print(
        f"errors outside fastmodule frames (CPython, torch, loader; not failed on): "
        f"{dict(others) or 'none'}"
    )
    if not ours:
        print("errors with a fastmodule (_core) frame: none")
        return 0
    print(f"errors with a fastmodule (_core) frame: {len(ours)}")
    for b in ours:
        print("\n".join(b))
        print()
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
