"""Count the instructions each side of a benchmark case executes, with callgrind.

Wall-clock times on a shared machine drift by up to 2x; instruction counts do
not (within about 1%), so small differences — fastmodule against the
hand-written loop, say — are settled here. Each of a case's three statements
(stock, fastmodule, lower bound) runs in its own process under
``valgrind --tool=callgrind``, with instrumentation switched on only around
``--loops`` executions after a warm-up (a tiny C helper issues callgrind's
start/stop requests; it is compiled on the fly and needs a C compiler and
valgrind's headers).

Usage::

    python benches/instructions.py mlp64_accelerated tree_train --loops 20
    python benches/instructions.py tree_load_state_dict --growth 1 2 4 8 --loops 3

``--growth SCALE ...`` counts only the fastmodule side, with the case's tree
scaled by each factor (``tree_load_state_dict`` has 500 blocks at scale 1, the
other tree cases 2000), and prints each count's growth from the previous one.
``--no-lower`` counts stock and fastmodule only. ``--keep DIR`` keeps
callgrind's files (``CASE.SIDE.SCALE.out.1``) for ``callgrind_annotate``.

Instructions are not time: cache misses and branch mispredictions are not
counted, so a memory-bound walk can gain less time than instructions.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HELPER = r"""
#include <valgrind/callgrind.h>
void fm_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void fm_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""

SIDES = ("stock", "fast", "lower")


def build_helper(workdir: Path) -> Path:
    """Compile the start/stop helper; exits with a message if that is not possible."""
    if shutil.which("valgrind") is None:
        sys.exit("instructions.py needs valgrind (apt install valgrind)")
    src, lib = workdir / "helper.c", workdir / "libfmcg.so"
    src.write_text(HELPER)
    cc = os.environ.get("CC", "cc")
    done = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=False)
    if done.returncode != 0:
        sys.exit("instructions.py could not compile its helper (needs cc and valgrind/callgrind.h)")
    return lib


def child(case_name: str, side: str, loops: int, helper: str, scale: float = 1.0) -> None:
    """Run inside valgrind: build the case, warm up, count ``loops`` executions."""
    import torch

    from fastmodule.bench.case import set_scale
    from fastmodule.bench.registry import get_case

    torch.set_num_threads(1)
    set_scale(scale)
    variant = get_case(case_name).build(torch.device("cpu"))[side]
    op = variant.as_callable()
    lib = ctypes.CDLL(helper)
    with variant.context():
        for _ in range(3):
            op()
        lib.fm_start()
        for _ in range(loops):
            op()
        lib.fm_stop()


def count(
    case_name: str, side: str, loops: int, helper: Path, workdir: Path, scale: float = 1.0
) -> float:
    """Instructions per execution of one side of a case (its tree scaled by ``scale``)."""
    out = workdir / f"{case_name}.{side}.{scale}.out"
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--child",
        case_name,
        side,
        str(loops),
        str(helper),
        str(scale),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # The dump requested by fm_stop is the one ending in ".1".
    text = Path(f"{out}.1").read_text()
    m = re.search(r"^summary:\s+(\d+)", text, re.M)
    if m is None:
        raise RuntimeError(f"no summary in callgrind output for {case_name}/{side}")
    return int(m.group(1)) / loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", default=["mlp64_accelerated"])
    parser.add_argument("--loops", type=int, default=20, help="counted executions per side")
    parser.add_argument(
        "--growth",
        type=float,
        nargs="+",
        metavar="SCALE",
        help="count the fastmodule side only, at each tree scale",
    )
    parser.add_argument(
        "--no-lower",
        action="store_true",
        help="count stock and fastmodule only (the lower bound's column left empty)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep callgrind's files in DIR (for callgrind_annotate) instead of a temp folder",
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, side, loops, helper, scale = args.child
        child(name, side, int(loops), helper, float(scale))
        return
    with contextlib.ExitStack() as stack:
        if args.keep:
            workdir = Path(args.keep)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        helper = build_helper(workdir)
        if args.growth:
            print("| case | scale | fastmodule | growth |")
            print("|---|---|---|---|")
            for name in args.cases:
                prev = None
                for scale in args.growth:
                    n = count(name, "fast", args.loops, helper, workdir, scale)
                    growth = "" if prev is None else f"{n / prev:.2f}x"
                    print(f"| {name} | {scale:g} | {n:,.0f} | {growth} |", flush=True)
                    prev = n
            return
        print("| case | stock | fastmodule | lower bound | stock / fast | fast / lower |")
        print("|---|---|---|---|---|---|")
        for name in args.cases:
            sides = [s for s in SIDES if not (args.no_lower and s == "lower")]
            n = {side: count(name, side, args.loops, helper, workdir) for side in sides}
            lower = f"{n['lower']:,.0f}" if "lower" in n else ""
            vs_lower = f"{n['fast'] / n['lower']:.3f}" if "lower" in n else ""
            print(
                f"| {name} | {n['stock']:,.0f} | {n['fast']:,.0f} | {lower} "
                f"| {n['stock'] / n['fast']:.2f}x | {vs_lower} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
