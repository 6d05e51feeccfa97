"""A PNG of T(G, V) per G with its intervals, for eyeballing the staircase.

Needs matplotlib (the ``plots`` extra) and uses its non-interactive Agg canvas; writes the PNG
atomically. Presentation only: it reads a finished :class:`~dspark_calibrate.calibrate.measurement.sweep.SweepResult`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dspark_calibrate.artifacts import atomic_write_bytes
from dspark_calibrate.calibrate._png import new_figure, png_bytes

if TYPE_CHECKING:
    from dspark_calibrate.calibrate.measurement.sweep import SweepResult

__all__ = ["plot_sweep"]


def plot_sweep(result: SweepResult, path: Path) -> Path:
    """Plot step time against verified tokens, one panel per G; native cells as a dashed line.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    ladder = result.config.ladder
    fig = new_figure(
        4.0 * min(len(ladder), 4),
        3.2 * ((len(ladder) + 3) // 4),
        what="the sweep plot",
        skip_flag="--no-plot",
    )
    cols = min(len(ladder), 4)
    rows = (len(ladder) + 3) // 4
    for i, g in enumerate(ladder):
        ax = fig.add_subplot(rows, cols, i + 1)
        compact = [
            c for c in result.cells if c.spec.graph_batch_size == g and c.spec.verifier_budget and c.summary
        ]
        native = [
            c
            for c in result.cells
            if c.spec.graph_batch_size == g and not c.spec.verifier_budget and c.summary
        ]
        if compact:
            xs = [c.spec.tokens for c in compact]
            ys = [c.summary.median_ms for c in compact if c.summary]
            lo = [c.summary.median_ms - c.summary.ci_low_ms for c in compact if c.summary]
            hi = [c.summary.ci_high_ms - c.summary.median_ms for c in compact if c.summary]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", ms=3, lw=1, capsize=2, label="compact V")
        for c in native:
            assert c.summary is not None
            ax.axhline(c.summary.median_ms, ls="--", color="k", lw=1, label="native (V=0)")
            ax.axhspan(c.summary.ci_low_ms, c.summary.ci_high_ms, color="k", alpha=0.1)
        ax.set_title(f"G={g}, K={result.config.k}")
        ax.set_xlabel("verified tokens V")
        ax.set_ylabel("step time (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write_bytes(path, png_bytes(fig))
    return path
