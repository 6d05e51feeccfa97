"""Plots of the release report, as PNG ``data:`` URIs for embedding in one self-contained page.

Uses matplotlib's object-oriented API on the non-interactive Agg canvas (no pyplot, no global
backend switch), imported on first use. PNGs are written without the ``Software`` text chunk, so
the page carries no URL even inside its images, and identical reports give identical bytes.
Presentation only: every number plotted is also in the page's tables.
"""

from __future__ import annotations

import base64
import math
from typing import TYPE_CHECKING, Any

from dspark_calibrate.calibrate._png import RAW_COLOR, new_figure, png_bytes
from dspark_calibrate.calibrate.report.model import (
    AdmissionSection,
    CalibrationSection,
    CostGroup,
    CostSection,
    Report,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_bucket_gain",
    "plot_cost_curves",
    "plot_metrics",
    "plot_reliability",
    "plot_saving_heatmap",
    "plot_survival",
    "render_plots",
]

#: Raster resolution of every plot (dots per inch); 100 keeps the page small and prints cleanly.
DPI = 100
_NATIVE = "#333333"
_COMPACT = "#1f6fb4"
_NOISY = "#e08a00"
_BAD = "#c0142c"
_CANDIDATE = "#8c8c8c"


def _figure(width: float, height: float) -> Figure:
    return new_figure(width, height, dpi=DPI, what="report plots", skip_flag="--no-plots")


def _data_uri(fig: Figure) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(fig)).decode("ascii")


def _grid(fig: Figure, n: int, cols: int) -> list[Axes]:
    rows = math.ceil(n / cols)
    return [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def _plot_cells(ax: Axes, group: CostGroup, cost: CostSection) -> None:
    """One G's deployed cells: native band and line, compact circles, non-monotone crosses."""
    if group.native is not None:
        nat = group.native
        ax.axhline(nat.step_time_ms, color=_NATIVE, ls="--", lw=1)
        ax.axhspan(nat.ci_low_ms, nat.ci_high_ms, color=_NATIVE, alpha=0.08)
    for c in group.cells:
        color = _NATIVE if c.native else _COMPACT
        ax.errorbar(
            [c.tokens],
            [c.step_time_ms],
            yerr=[[c.step_time_ms - c.ci_low_ms], [c.ci_high_ms - c.step_time_ms]],
            fmt="none",
            ecolor=color,
            elinewidth=1.2,
            capsize=3,
        )
        hollow = cost.has_replay and not c.native and not c.chosen_steps
        ax.plot(
            [c.tokens],
            [c.step_time_ms],
            marker="s" if c.native else "o",
            ms=6,
            mfc="white" if hollow else color,
            mec=_NOISY if c.noisy else color,
            mew=2 if c.noisy else 1,
            ls="none",
        )
        if c.non_monotone:
            ax.plot([c.tokens], [c.step_time_ms], marker="x", ms=10, mew=2, color=_BAD, ls="none")
    compact = list(group.compact)
    if compact:
        ax.plot(
            [c.tokens for c in compact], [c.step_time_ms for c in compact], color=_COMPACT, lw=0.8, alpha=0.6
        )


def _plot_candidates(ax: Axes, group: CostGroup, cost: CostSection) -> None:
    """One G's measured but undeployed cells, as grey diamonds."""
    for cand in (c for c in cost.candidates if c.graph_batch_size == group.graph_batch_size):
        ax.errorbar(
            [cand.tokens],
            [cand.step_time_ms],
            yerr=[[cand.step_time_ms - cand.ci_low_ms], [cand.ci_high_ms - cand.step_time_ms]],
            fmt="D",
            ms=4,
            mfc="white",
            mec=_CANDIDATE,
            ecolor=_CANDIDATE,
            elinewidth=0.8,
            capsize=2,
        )


def _cost_legend(fig: Figure, cost: CostSection) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="s", color=_NATIVE, ls="--", label="native cell (V=0), CI band"),
        Line2D(
            [],
            [],
            marker="o",
            color=_COMPACT,
            ls="none",
            label="compact cell" + (", chosen in replay" if cost.has_replay else ""),
        ),
    ]
    if cost.has_replay:
        handles.append(
            Line2D([], [], marker="o", mfc="white", mec=_COMPACT, ls="none", label="compact, never chosen")
        )
    handles += [
        Line2D(
            [],
            [],
            marker="o",
            mfc=_COMPACT,
            mec=_NOISY,
            mew=2,
            ls="none",
            label="noisy (wide saving interval / no precision stop)",
        ),
        Line2D([], [], marker="x", color=_BAD, mew=2, ls="none", label="non-monotone"),
    ]
    if cost.candidates:
        handles.append(
            Line2D([], [], marker="D", mfc="white", mec=_CANDIDATE, ls="none", label="measured, not deployed")
        )
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)


def plot_cost_curves(cost: CostSection) -> str:
    """T(G, V) against verified tokens, one panel per G, with CI bars and the cells marked.

    Native cells are black squares with their CI as a band; compact cells are circles, filled when
    the workload replay chose them (hollow when never chosen), orange-edged when noisy, crossed in
    red when non-monotone; measured but undeployed cells are grey diamonds.
    """
    n = len(cost.groups)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = _figure(4.2 * cols, 3.2 * rows)
    for ax, group in zip(_grid(fig, n, cols), cost.groups, strict=True):
        _plot_cells(ax, group, cost)
        _plot_candidates(ax, group, cost)
        ax.set_title(f"G={group.graph_batch_size} (K={cost.k})", fontsize=10)
        ax.set_xlabel("verified tokens (V; native = G·(K+1))", fontsize=8)
        ax.set_ylabel("step time (ms)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    _cost_legend(fig, cost)
    fig.subplots_adjust(
        left=0.07, right=0.99, top=1 - 0.08 / rows, bottom=0.28 / rows, wspace=0.28, hspace=0.5
    )
    return _data_uri(fig)


def plot_saving_heatmap(cost: CostSection) -> str:
    """Saving versus the native cell: rows are G, columns are verified tokens per row (V/G)."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import TwoSlopeNorm

    columns, rows = cost.heatmap()
    data = np.full((len(rows), max(len(columns), 1)), np.nan)
    for i, (_, cells) in enumerate(rows):
        for j, c in enumerate(cells):
            if c is not None and c.saving is not None:
                data[i, j] = 100.0 * c.saving
    fig = _figure(max(4.5, 0.9 * len(columns) + 2.5), max(2.2, 0.55 * len(rows) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    finite = data[np.isfinite(data)]
    span = max(float(np.max(np.abs(finite))) if finite.size else 1.0, 1.0)
    image = ax.imshow(
        np.ma.masked_invalid(data),
        cmap=colormaps["RdYlGn"].with_extremes(bad="#eeeeee"),
        norm=TwoSlopeNorm(vcenter=0.0, vmin=-span, vmax=span),
        aspect="auto",
    )
    for i, (_, cells) in enumerate(rows):
        for j, c in enumerate(cells):
            if c is not None and c.saving is not None:
                ax.text(
                    j,
                    i,
                    f"{100 * c.saving:.1f}%\nV={c.verifier_budget}",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
    ax.set_xticks(range(len(columns)), [f"{x:g}" for x in columns], fontsize=8)
    ax.set_yticks(range(len(rows)), [f"G={g}" for g, _ in rows], fontsize=8)
    ax.set_xlabel("verified tokens per row (V/G); native = K+1", fontsize=8)
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.set_label("saving vs native (%)", fontsize=8)
    colorbar.ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _data_uri(fig)


def plot_reliability(cal: CalibrationSection) -> str:
    """Per-position reliability diagrams with the bin counts as bars (calibrated; raw in grey).

    Bars share the panel: the tallest bar spans the lower 30 % of the height and the panel's title
    gives its count, so one axis per position suffices.
    """
    n = len(cal.reliability)
    cols = min(n, 5)
    rows = math.ceil(n / cols)
    fig = _figure(2.9 * cols, 2.9 * rows)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.14 / rows, top=1 - 0.2 / rows, wspace=0.3, hspace=0.6)
    for ax, diagram in zip(_grid(fig, n, cols), cal.reliability, strict=True):
        peak = max((b.count for b in diagram.bins), default=0) or 1
        ax.bar(
            [(b.lo + b.hi) / 2 for b in diagram.bins],
            [0.3 * b.count / peak for b in diagram.bins],
            width=[b.hi - b.lo for b in diagram.bins],
            color="#c9d6e8",
            edgecolor="#9fb3cf",
            linewidth=0.4,
        )
        ax.plot([0, 1], [0, 1], color="#777777", lw=0.8, ls=":")
        for bins, color, label in (
            (diagram.before, RAW_COLOR, "raw"),
            (diagram.bins, _COMPACT, "calibrated"),
        ):
            pts = [
                (b.mean_predicted, b.observed)
                for b in bins
                if b.count and b.mean_predicted is not None and b.observed is not None
            ]
            if pts:
                ax.plot(
                    [p for p, _ in pts], [o for _, o in pts], marker="o", ms=3, lw=1, color=color, label=label
                )
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ece = "" if diagram.ece is None else f", ECE {diagram.ece:.3f}"
        ax.set_title(f"j={diagram.position}{ece}\nbars: rounds/bin, max {peak}", fontsize=8)
        ax.set_xlabel("predicted S_j", fontsize=7)
        ax.set_ylabel("observed 1[A ≥ j]", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6, loc="upper left", frameon=False)
    return _data_uri(fig)


def plot_survival(cal: CalibrationSection) -> str:
    """Mean predicted survival S_j against the observed rate, per position."""
    fig = _figure(5.5, 3.4)
    ax = fig.add_subplot(1, 1, 1)
    xs = [p.position for p in cal.survival]
    ax.plot(xs, [p.observed for p in cal.survival], marker="o", color=_NATIVE, label="observed")
    lows = [p.observed_ci_low for p in cal.survival]
    highs = [p.observed_ci_high for p in cal.survival]
    if all(v is not None for v in lows + highs):
        ax.fill_between(
            xs,
            [float(v) for v in lows if v is not None],
            [float(v) for v in highs if v is not None],
            color=_NATIVE,
            alpha=0.12,
            label="observed CI",
        )
    ax.plot(
        xs, [p.predicted for p in cal.survival], marker="s", color=_COMPACT, label="predicted (calibrated)"
    )
    before = [p.predicted_before for p in cal.survival if p.predicted_before is not None]
    if len(before) == len(xs):
        ax.plot(xs, before, marker="^", ls="--", color=RAW_COLOR, label="predicted (raw logits)")
    ax.set_xticks(xs)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position j", fontsize=8)
    ax.set_ylabel("survival S_j = P(A ≥ j)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _data_uri(fig)


def plot_metrics(cal: CalibrationSection) -> str:
    """Held-out metrics before and after calibration with their bootstrap CIs.

    One panel per method-level metric, and one panel with every position's ECE.
    """
    overall = [
        m
        for m in cal.metrics
        if not m.name.startswith("ECE position") and (m.before is not None or m.after is not None)
    ]
    per_position = [m for m in cal.metrics if m.name.startswith("ECE position")]
    n = len(overall) + (1 if per_position else 0)
    fig = _figure(2.8 * n + (1.5 if per_position else 0), 2.6)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.2, top=0.86, wspace=0.45)
    axes = [fig.add_subplot(1, n, i + 1) for i in range(n)]

    def point(ax: Axes, x: float, value: float | None, ci: tuple[float, float] | None, color: str) -> None:
        if value is None:
            return
        yerr: Any = None
        if ci is not None:
            yerr = [[max(value - ci[0], 0.0)], [max(ci[1] - value, 0.0)]]
        ax.errorbar([x], [value], yerr=yerr, fmt="o", color=color, capsize=3, ms=4)

    for ax, m in zip(axes, overall, strict=False):
        point(ax, 0, m.before, m.before_ci, RAW_COLOR)
        point(ax, 1, m.after, m.after_ci, _COMPACT)
        ax.set_xticks([0, 1], ["before", "after"], fontsize=8)
        ax.set_xlim(-0.6, 1.6)
        ax.set_title(m.name, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    if per_position:
        ax = axes[-1]
        for i, m in enumerate(per_position):
            point(ax, i + 0.88, m.before, m.before_ci, RAW_COLOR)
            point(ax, i + 1.12, m.after, m.after_ci, _COMPACT)
        ax.set_xticks(
            range(1, len(per_position) + 1), [str(i) for i in range(1, len(per_position) + 1)], fontsize=8
        )
        ax.set_xlabel("position j (grey: before, blue: after)", fontsize=7)
        ax.set_title("ECE per position (equal width)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    return _data_uri(fig)


def plot_bucket_gain(adm: AdmissionSection) -> str:
    """Predicted gain with its CI per concurrency bucket, and the share of compact steps."""
    fig = _figure(max(5.0, 0.8 * len(adm.buckets) + 3.0), 3.4)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(adm.buckets)))
    share_ax = ax.twinx()
    share_ax.bar(
        xs, [100 * b.compact_share for b in adm.buckets], color="#c9d6e8", alpha=0.6, width=0.6, zorder=0
    )
    share_ax.set_ylim(0, 100)
    share_ax.set_ylabel("compact steps (%)", fontsize=8)
    share_ax.tick_params(labelsize=7)
    ax.set_zorder(share_ax.get_zorder() + 1)
    ax.patch.set_visible(False)
    gains = [100 * b.predicted_gain for b in adm.buckets]
    ax.errorbar(
        xs,
        gains,
        yerr=[
            [100 * (b.predicted_gain - b.ci_low) for b in adm.buckets],
            [100 * (b.ci_high - b.predicted_gain) for b in adm.buckets],
        ],
        fmt="o",
        color=_COMPACT,
        capsize=4,
        label="predicted gain (95% CI)",
    )
    ax.axhline(0.0, color=_NATIVE, lw=0.8)
    if adm.minimum_predicted_gain is not None:
        ax.axhline(
            100 * adm.minimum_predicted_gain, color=_BAD, lw=1, ls="--", label="minimum predicted gain"
        )
    ax.set_xticks(xs, [f"G={b.graph_batch_size}\n{b.steps} steps" for b in adm.buckets], fontsize=7)
    ax.set_ylabel("goodput gain vs static K (%)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return _data_uri(fig)


def render_plots(report: Report) -> dict[str, str]:
    """Every plot the report's data supports, by name, as ``data:image/png;base64`` URIs.

    Names: ``cost_curves``, ``saving_heatmap``, ``reliability``, ``survival``, ``metrics``,
    ``bucket_gain``; a name is absent when its data is.

    Raises:
        ConfigError: matplotlib is not installed.
    """
    out: dict[str, str] = {}
    if report.cost is not None and report.cost.groups:
        out["cost_curves"] = plot_cost_curves(report.cost)
        if any(not c.native for c in report.cost.cells):
            out["saving_heatmap"] = plot_saving_heatmap(report.cost)
    cal = report.calibration
    if cal is not None:
        if cal.reliability:
            out["reliability"] = plot_reliability(cal)
        if cal.survival:
            out["survival"] = plot_survival(cal)
        if any(m.before is not None or m.after is not None for m in cal.metrics):
            out["metrics"] = plot_metrics(cal)
    if report.admission is not None and report.admission.buckets:
        out["bucket_gain"] = plot_bucket_gain(report.admission)
    return out
