"""PNG plots of a fit: reliability diagrams per position (with bin counts) and the survival curve.

Takes :class:`~dspark_calibrate.calibrate.confidence.metrics.MetricsReport` values and returns PNG bytes;
writing them is left to the caller (``fit`` writes them atomically). matplotlib is imported only
inside these functions and only its object-oriented API with the Agg canvas is used, so no pyplot
global state or display backend is touched and the rest of ``calibrate`` never pays for it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dspark_calibrate.calibrate._png import RAW_COLOR, new_figure, png_bytes
from dspark_calibrate.calibrate.confidence.metrics import MetricsReport, Reliability

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["reliability_png", "survival_png"]

_DPI = 110


def _figure(width: float, height: float) -> Figure:
    return new_figure(width, height, dpi=_DPI, what="fit plots", skip_flag="--no-plots")


_AFTER = "#1f77b4"
_OBSERVED = "#111111"


def _points(rel: Reliability) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for c, y in zip(rel.mean_confidence, rel.mean_label, strict=True):
        if c is not None and y is not None:
            xs.append(c)
            ys.append(y)
    return xs, ys


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _panel(ax: Axes, j: int, before: Reliability, after: Reliability, labelled: int) -> None:
    ax.plot([0, 1], [0, 1], linestyle=":", color="#555555", linewidth=1)
    bx, by = _points(before)
    ax.plot(
        bx, by, marker="x", linestyle="-", color=RAW_COLOR, linewidth=1, label=f"raw ECE {_fmt(before.ece)}"
    )
    axx, axy = _points(after)
    ax.plot(
        axx,
        axy,
        marker="o",
        linestyle="-",
        color=_AFTER,
        linewidth=1.5,
        label=f"calibrated ECE {_fmt(after.ece)}",
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(f"position {j}  (n={labelled})", fontsize=9)
    ax.set_xlabel("predicted S_j", fontsize=8)
    ax.set_ylabel("observed 1[A>=j]", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left")
    counts = ax.twinx()
    edges = after.edges
    widths = [edges[i + 1] - edges[i] for i in range(len(edges) - 1)]
    counts.bar(edges[:-1], after.counts, width=widths, align="edge", alpha=0.18, color=_AFTER)
    top = max(after.counts) if after.counts else 0
    counts.set_ylim(0, max(top, 1) * 4)  # bars stay in the lower quarter of the panel
    counts.tick_params(labelsize=6)
    counts.set_ylabel(f"rounds per bin (empty: {after.empty_bins})", fontsize=7)
    for left, w, c in zip(edges[:-1], widths, after.counts, strict=True):
        if c:
            counts.text(left + w / 2, c, str(c), ha="center", va="bottom", fontsize=5, rotation=90)


def reliability_png(before: MetricsReport, after: MetricsReport, *, title: str = "") -> bytes:
    """One equal-width reliability diagram per position (raw vs calibrated) with bin counts.

    Args:
        before: held-out metrics of the raw logits.
        after: held-out metrics of the calibration (same rounds).
        title: figure title.

    Returns:
        PNG bytes.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    k = after.k
    cols = min(k, 3)
    rows = math.ceil(k / cols)
    fig = _figure(4.2 * cols, 3.6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for idx in range(rows * cols):
        ax = axes[idx // cols][idx % cols]
        if idx >= k:
            ax.set_visible(False)
            continue
        b, a = before.positions[idx], after.positions[idx]
        _panel(ax, a.position, b.width, a.width, a.labelled)
    fig.suptitle(f"Reliability of S_j, {after.n_bins} equal-width bins, L1 ECE — {title}", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def survival_png(before: MetricsReport, after: MetricsReport, *, title: str = "") -> bytes:
    """Mean predicted survival per position (raw and calibrated) against the observed rate.

    Args:
        before: held-out metrics of the raw logits.
        after: held-out metrics of the calibration (same rounds).
        title: figure title.

    Returns:
        PNG bytes.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    fig = _figure(6.4, 4.2)
    ax = fig.subplots()
    js = [p.position for p in after.positions]

    def series(report: MetricsReport, observed: bool) -> list[float]:
        out = []
        for p in report.positions:
            v = p.observed_survival if observed else p.mean_survival
            out.append(math.nan if v is None else v)
        return out

    ax.plot(js, series(after, True), marker="s", color=_OBSERVED, label="observed")
    ax.plot(js, series(before, False), marker="x", linestyle="--", color=RAW_COLOR, label="raw logits")
    ax.plot(js, series(after, False), marker="o", color=_AFTER, label=f"calibrated ({after.rounds} rounds)")
    ax.set_xticks(js)
    ax.set_ylim(0, 1)
    ax.set_xlabel("draft position j")
    ax.set_ylabel("survival S_j = P(positions 1..j accepted)")
    ea = after.ea_measured
    pred_b, pred_a = before.ea_predicted, after.ea_predicted
    ax.set_title(
        f"{title}\nmean accepted (within verified) observed {_fmt(ea)}, raw {_fmt(pred_b)}, "
        f"calibrated {_fmt(pred_a)}",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)
