"""The sweep's own bias checks as the signed cost table carries them, for the "what to check" list.

A cost table of schema 3 repeats, on every row of a G, the saving of that G's control cell (the
native step captured again: 0 is the truth) and whether the G's compact saving intervals were
widened for it, and on every row the cell's median SM clock and power over its native cell's
(docs/sweep.md). This module turns them into check items: one INFO line per cost table with the
control bias of every G and the clock scaling, a WARNING per G whose control is biased, and an
INFO line when a compact cell's saving at its native cell's SM clock (a mix of steps switching
cells under a power cap) lies more than a point below its measured saving: its saving interval
holds that end, so the gate was charged for it, but the point estimate was not.
Pure; tables from before the checks (schema 1 and 2), or without any check stated, give nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from dspark_calibrate.calibrate.measurement.protocol import saving_at_native_clock
from dspark_calibrate.calibrate.report.verdict import Check, Severity

__all__ = ["sweep_bias_checks"]


def _spct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _by_g(rows: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(int(r["graph_batch_size"]), []).append(r)
    return dict(sorted(out.items()))


def _control(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, float] | None:
    names = ("control_bias", "control_bias_ci_low", "control_bias_ci_high")
    for r in rows:
        if all(r.get(n) is not None for n in names):
            return float(r[names[0]]), float(r[names[1]]), float(r[names[2]])
    return None


def _scaling(rows: Sequence[Mapping[str, Any]], column: str) -> str | None:
    """``+1.1..+4.0%``: the range of a compact cell's value over its native cell's, or None."""
    values = [float(r[column]) for r in rows if int(r["verifier_budget"]) > 0 and r.get(column) is not None]
    if not values:
        return None
    return f"{100 * (min(values) - 1):+.1f}..{100 * (max(values) - 1):+.1f}%"


#: A clock term smaller than this (a saving's points) is not worth a line of its own.
CLOCK_TERM_NOTE = 0.01


def _clock_term(rows: Sequence[Mapping[str, Any]]) -> tuple[float, Mapping[str, Any]] | None:
    """The largest drop of a compact saving at its native cell's clock, with its row, or None."""
    worst: tuple[float, Mapping[str, Any]] | None = None
    for r in rows:
        clock, saving = r.get("clock_rel"), r.get("saving")
        if int(r["verifier_budget"]) <= 0 or clock is None or saving is None:
            continue
        drop = float(saving) - saving_at_native_clock(float(saving), float(clock))
        if worst is None or drop > worst[0]:
            worst = (drop, r)
    return worst


def sweep_bias_checks(table: pa.Table) -> list[Check]:
    """Check items from a cost table's bias-check columns (none before schema 3)."""
    if "control_bias" not in table.column_names:
        return []
    groups = _by_g(table.to_pylist())
    out: list[Check] = []
    parts = []
    known = False
    for g, rows in groups.items():
        control = _control(rows)
        clock, power = _scaling(rows, "clock_rel"), _scaling(rows, "power_rel")
        known = known or control is not None or clock is not None or power is not None
        text = f"G={g}: control " + (
            "not measured"
            if control is None
            else f"{_spct(control[0])} [{_spct(control[1])}, {_spct(control[2])}]"
        )
        text += "".join(
            f", {name} {v}" for name, v in (("SM clock", clock), ("power", power)) if v is not None
        )
        parts.append(text)
        if control is not None and (control[1] > 0.0 or control[2] < 0.0):
            out.append(
                Check(
                    Severity.WARNING,
                    f"CONTROL_BIAS:G={g}",
                    "cost-table",
                    f"the control cell of G={g} (the native step captured again) saves {_spct(control[0])} "
                    f"[{_spct(control[1])}, {_spct(control[2])}] where 0 is the truth: this G's measurement is "
                    "biased, and the sweep widened its compact saving intervals by it; re-sweep (more passes, "
                    "--order serving) before trusting its savings",
                    f"G={g}",
                )
            )
    if not known:
        return out
    term = _clock_term([r for rows in groups.values() for r in rows])
    if term is not None and term[0] > CLOCK_TERM_NOTE:
        drop, row = term
        out.append(
            Check(
                Severity.INFO,
                "CLOCK_TERM",
                "cost-table",
                f"G={row['graph_batch_size']}, V={row['verifier_budget']} ran at {_spct(float(row['clock_rel']) - 1)} "
                f"SM clock over its native cell; at the native's clock (a power-capped GPU switching between "
                f"cells every few steps) its saving would be {100 * drop:.2f} points lower. Its saving interval "
                "holds that end and the gate drew from it; the predicted gain uses the measured saving "
                "(docs/sweep.md, Step protocol)",
                f"G={row['graph_batch_size']}",
            )
        )
    out.append(
        Check(
            Severity.INFO,
            "SWEEP_CHECKS",
            "cost-table",
            "the sweep's bias checks, per G (control saving, 0 is the truth; compact cells' SM clock and "
            "power over native): " + "; ".join(parts),
        )
    )
    return out
