"""``--plot PATH.png``: the speedups of a run and, when measured, the size series."""

from __future__ import annotations

from pathlib import Path

from fastmodule.bench.runner import CaseResult
from fastmodule.bench.series import SeriesPoint

__all__ = ["write_plot"]


def write_plot(
    path: str | Path,
    results: list[CaseResult],
    series: list[SeriesPoint] | None,
    title: str,
) -> None:
    """Write a PNG: speedup per case (log scale), plus time against tree size.

    Raises:
        RuntimeError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from e

    panels = 2 if series else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 0.32 * len(results) + 2.5))
    ax = axes[0] if panels == 2 else axes
    names = [r.case for r in results]
    speedups = [r.speedup or 0.0 for r in results]
    ax.barh(names, speedups, color=["#2a7" if s >= 1 else "#c44" for s in speedups])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("speedup over stock torch.nn.Module (median, log scale)")
    for y, s in enumerate(speedups):
        ax.text(s, y, f" {s:.2f}x", va="center", fontsize=8)
    if series:
        ax2 = axes[1]
        for op, style in (("state_dict", "o"), ("load_state_dict", "s")):
            pts = [p for p in series if p.operation == op]
            blocks, fast_ms = [p.blocks for p in pts], [p.fast_ms for p in pts]
            ax2.plot(blocks, fast_ms, style + "-", label=f"{op} fast")
            stock = [p for p in pts if p.stock_ms is not None]
            ax2.plot(
                [p.blocks for p in stock],
                [p.stock_ms for p in stock],
                style + "--",
                label=f"{op} stock",
            )
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("blocks (3N+1 modules, 5N tensors)")
        ax2.set_ylabel("ms (best of runs)")
        ax2.legend(fontsize=8)
        ax2.set_title("whole-tree cost against tree size")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
