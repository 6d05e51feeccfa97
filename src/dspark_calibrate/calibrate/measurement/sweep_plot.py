"""A PNG of T(G, V) per G with its intervals, for eyeballing the staircase.

Needs matplotlib (the ``plots`` extra) and uses its non-interactive Agg canvas; writes the PNG
atomically. Presentation only: it takes the measured cells as plain values (the harness in
``sweep.py`` hands them over), so it knows nothing of the harness.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dspark_calibrate.artifacts import atomic_write_bytes
from dspark_calibrate.calibrate._png import new_figure, png_bytes
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.stats import CellSummary

__all__ = ["plot_sweep"]


def plot_sweep(
    k: int, ladder: Sequence[int], cells: Sequence[tuple[CellSpec, CellSummary | None]], path: Path
) -> Path:
    """Plot step time against verified tokens, one panel per G; native cells as a dashed line.

    Args:
        k: the draft length K.
        ladder: the graph ladder, one panel per G.
        cells: each measured cell with its summary (``None`` when no sample was kept).
        path: the PNG to write.

    Raises:
        ConfigError: matplotlib is not installed.
    """
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
            (spec, summary)
            for spec, summary in cells
            if spec.graph_batch_size == g and spec.verifier_budget and summary is not None
        ]
        native = [
            summary
            for spec, summary in cells
            if spec.graph_batch_size == g and not spec.verifier_budget and summary is not None
        ]
        if compact:
            xs = [spec.tokens for spec, _ in compact]
            ys = [s.median_ms for _, s in compact if s]
            lo = [s.median_ms - s.ci_low_ms for _, s in compact if s]
            hi = [s.ci_high_ms - s.median_ms for _, s in compact if s]
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", ms=3, lw=1, capsize=2, label="compact V")
        for summary in native:
            ax.axhline(summary.median_ms, ls="--", color="k", lw=1, label="native (V=0)")
            ax.axhspan(summary.ci_low_ms, summary.ci_high_ms, color="k", alpha=0.1)
        ax.set_title(f"G={g}, K={k}")
        ax.set_xlabel("verified tokens V")
        ax.set_ylabel("step time (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write_bytes(path, png_bytes(fig))
    return path
