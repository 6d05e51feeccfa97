"""The sweep's progress display: what the sweep is doing, and only what it knows.

The sweep reports events (:class:`~dspark_calibrate.calibrate.measurement.sweep.SweepEvent`):
stages outside the rounds, the start of each round, each visit, each cell that stops, the end.
This module turns them into a live line on a terminal and one line per round and stage
otherwise (logs, CI, pipes); nothing with ``--json``. Presentation only: every number shown comes
from an event or from the clock.

What it refuses to show: a total it does not have yet, a time left it cannot bound from below
(before a visit of this process was timed), a precision wider than the median itself.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.text import Text

from dspark_calibrate.cli._common import err_console, stage_line

__all__ = ["SweepProgress", "finish_line", "format_left", "format_precision", "format_seconds"]

#: Seconds without a finished visit after which the live line says how long it has waited.
STALL_S = 5.0


def format_seconds(seconds: float) -> str:
    """``M:SS`` (``H:MM:SS`` from an hour)."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_left(eta_s: float | None) -> str:
    """The least time left, when the sweep can bound it.

    ``eta_s`` is a lower bound (the rounds the open cells still need at least, at the measured
    time per visit, capped by the budget). ``None`` means no visit of this process was timed yet;
    under a second says nothing useful about a sweep that may need more rounds, so it is not shown.
    """
    if eta_s is None:
        return "time left: estimating"
    if not math.isfinite(eta_s) or eta_s < 1.0:
        return ""
    return f"at least {format_seconds(eta_s)} left"


def format_precision(half_width_rel: float | None, target_rel: float | None) -> str:
    """A cell's current relative half-width against the precision target, e.g. ``±1.20% (target
    ±0.50%)``; ``±>100%`` when the interval is wider than the median (early rounds, a near-zero
    or unstable cell), and nothing when there is no estimate yet."""
    if half_width_rel is None:
        return ""
    if not math.isfinite(half_width_rel) or half_width_rel > 1.0:
        shown = "±>100%"
    else:
        shown = f"±{100 * half_width_rel:.2f}%"
    return shown if target_rel is None else f"{shown} (target ±{100 * target_rel:.2f}%)"


def finish_line(result: Any, seconds: float, visits: int) -> str:
    """The last line of a sweep: cells stopped by reason, rounds, visits and wall time."""
    reasons = Counter(c.decision.reason for c in result.cells if c.decision.stops)
    stopped = sum(reasons.values())
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return (
        f"done: {stopped}/{len(result.cells)} cells stopped ({why or 'none'}) after {result.rounds} "
        f"rounds, {visits} visits in {format_seconds(seconds)}"
    )


class _SinceVisitColumn(ProgressColumn):
    """How long since the last visit finished, once that is long (a slow cell, a re-capture)."""

    def __init__(self, since: Callable[[], float | None]) -> None:
        super().__init__()
        self.since = since

    def render(self, task: Task) -> Text:
        """The waiting time, or nothing while visits come quickly."""
        waited = self.since()
        if waited is None or waited < STALL_S:
            return Text("")
        return Text(f"{format_seconds(waited)} since the last visit", style="yellow")


class SweepProgress:
    """Renders sweep events: a live line on a terminal, lines on a pipe, nothing when quiet.

    Args:
        quiet: print nothing (``--json``).
        precision_rel: the precision target shown beside a cell's current half-width.
        clock: seconds, monotonic (injected for tests).
        console: where to draw (default: stderr).
    """

    def __init__(
        self,
        *,
        quiet: bool,
        precision_rel: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        console: Console | None = None,
    ) -> None:
        self.console = console if console is not None else err_console
        self.quiet = quiet
        self.live = not quiet and self.console.is_terminal
        self.precision_rel = precision_rel
        self.clock = clock
        self.started = clock()
        self.measuring_since: float | None = None  # the first round's start
        self.visits = 0
        self.round_visits = 0
        self.round_size = 0
        self.measuring = False
        self.last_visit: float | None = None
        self.last_round = -1
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]sweep[/] {task.description}"),
            BarColumn(),
            TextColumn("{task.fields[cells]}"),
            TextColumn("{task.fields[current]}"),
            _SinceVisitColumn(self._since_visit),
            TextColumn("{task.fields[left]}"),
            console=self.console,
            transient=True,
            disable=not self.live,
        )
        self.task = self.progress.add_task("starting", total=None, cells="", current="", left="")

    def _since_visit(self) -> float | None:
        if not self.measuring:
            return None
        return self.clock() - (self.last_visit if self.last_visit is not None else self.started)

    def elapsed(self) -> float:
        """Wall seconds since the display was created."""
        return self.clock() - self.started

    def __call__(self, event: Any) -> None:
        """Show one event."""
        if self.quiet:
            return
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)
        if event.cells_total:
            self.progress.update(
                self.task,
                total=event.cells_total,
                completed=event.cells_done,
                cells=f"{event.cells_done}/{event.cells_total} cells done",
            )

    def _on_estimate(self, event: Any) -> None:
        self.console.print(escape(f"sweep: {event.detail}"), highlight=False)

    def _on_rewarm(self, event: Any) -> None:
        # Why the re-warm grew (a measured carry-over): worth a line of its own.
        self.console.print(escape(f"sweep: {event.detail}"), highlight=False)

    def _on_stage(self, event: Any) -> None:
        self.measuring = False
        self.progress.update(self.task, description=str(event.detail), current="", left="")
        if not self.live:
            stage_line("sweep", str(event.detail))

    def _on_round(self, event: Any) -> None:
        self.measuring = True
        if self.measuring_since is None:
            self.measuring_since = self.clock()
        self.round_visits = 0
        self.round_size = event.cells_total - event.cells_done
        left = format_left(event.eta_s)
        self.progress.update(self.task, description=f"round {event.round}", left=left)
        if not self.live and event.round != self.last_round:
            self.last_round = event.round
            measured = self.clock() - self.measuring_since
            detail = f"{event.cells_done}/{event.cells_total} cells done, {self.visits} visits in {measured:.1f} s"
            stage_line("sweep", f"round {event.round}", f"{detail}, {left}" if left else detail)

    def _on_visit(self, event: Any) -> None:
        self.visits += 1
        self.round_visits += 1
        self.last_visit = self.clock()
        current = ""
        if event.cell is not None:
            precision = format_precision(event.half_width_rel, self.precision_rel)
            current = f"{event.cell.label()} {precision}".rstrip()
        self.progress.update(
            self.task,
            description=f"round {event.round}: {self.round_visits}/{self.round_size} visits",
            current=current,
            left=format_left(event.eta_s),
        )

    def _on_end(self, event: Any) -> None:
        self.measuring = False
