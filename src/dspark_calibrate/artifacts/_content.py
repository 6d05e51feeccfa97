"""Content rules of verified tables, per kind (DESIGN §4 step 8, §6). Pure: no I/O.

Run only after the signature and the logical hash have passed, on the signed predicate and the
loaded table. Each rule returns findings; an empty list means the content is acceptable. Notices
(:func:`content_notices`) never reject: they tell a consumer what an accepted artifact means, e.g.
that a cost table predates paired savings.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dspark_calibrate.artifacts._arrow_numpy import float_values
from dspark_calibrate.artifacts._cells import NATIVE_BUDGET, cell_kind, full_width, is_deployable
from dspark_calibrate.artifacts._mixed_content import (
    mixed_admission_findings,
    mixed_cost_table_findings,
    mixed_sweep_findings,
)
from dspark_calibrate.artifacts._models import TRTLLM_FINGERPRINT_FIELDS, Fingerprint
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.schemas import (
    MAX_COMPACT_CELLS_PER_G,
    MAX_COST_TABLE_ROWS,
    SCHEMA_VERSION,
    arrow_schema,
)

__all__ = ["LEGACY_UNPAIRED_COSTS", "ArtifactNotice", "content_findings", "content_notices"]


@dataclass(frozen=True, slots=True)
class ArtifactNotice:
    """Something a consumer should know about an accepted artifact (never a rejection).

    Attributes:
        code: a stable code, e.g. ``LEGACY_UNPAIRED_COSTS``.
        message: one line naming the file and what to do.
    """

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"code": self.code, "message": self.message}


#: ArtifactNotice codes (stable, like reason codes).
LEGACY_UNPAIRED_COSTS = "LEGACY_UNPAIRED_COSTS"


def content_notices(kind: str, schema_version: int, *, where: str) -> tuple[ArtifactNotice, ...]:
    """Notices for an accepted artifact of ``kind`` written under ``schema_version``."""
    if kind == "cost-table" and schema_version < 2:
        return (
            ArtifactNotice(
                LEGACY_UNPAIRED_COSTS,
                f"{where}: cost-table schema {schema_version} predates paired savings; its economics were "
                "priced the pre-pairing way (per-step worst case of two unpaired intervals), which refuses "
                "gains that are real. Re-sweep and rebuild for the joint uncertainty model.",
            ),
        )
    return ()


def _schema(kind: str, table: pa.Table, where: str, version: int | None = None) -> list[Finding]:
    want = arrow_schema(kind, version)
    have = table.schema
    if [(f.name, f.type) for f in have] == [(f.name, f.type) for f in want]:
        return []
    diffs = []
    for i in range(max(len(want), len(have))):
        w = f"{want[i].name}:{want[i].type}" if i < len(want) else "-"
        h = f"{have[i].name}:{have[i].type}" if i < len(have) else "-"
        if w != h:
            diffs.append(f"column {i}: expected {w}, found {h}")
    return [
        Finding(
            Reason.SCHEMA_MISMATCH,
            f"{where}: {kind} table does not match schema: "
            + "; ".join(diffs[:4])
            + "; rebuild with this tool",
        )
    ]


def _k(fp: Fingerprint, where: str) -> tuple[int | None, list[Finding]]:
    if fp.max_draft_len is None:
        return None, [
            Finding(
                Reason.K_INCONSISTENT,
                f"{where}: fingerprint.max_draft_len (K) is not set",
                field="max_draft_len",
            )
        ]
    return fp.max_draft_len, []


def _cost_table(table: pa.Table, fp: Fingerprint, where: str) -> list[Finding]:
    out: list[Finding] = []
    missing = fp.missing(TRTLLM_FINGERPRINT_FIELDS)
    if missing:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: a cost table must carry all ten engine fingerprint fields; missing {list(missing)}",
                field="fingerprint",
            )
        )
    k, f = _k(fp, where)
    out += f
    if k is None:
        return out
    # A deployed table has at most 32 rows: plain Python over lists beats numpy call overhead.
    gl: list[int] = table.column("graph_batch_size").to_pylist()
    vl: list[int] = table.column("verifier_budget").to_pylist()
    out += _cost_cells(gl, vl, fp.rank_local_graph_batch_sizes or (), k, where)
    if table.num_rows > MAX_COST_TABLE_ROWS:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: {table.num_rows} cells, above the engine limit of {MAX_COST_TABLE_ROWS}",
            )
        )
    out += _cost_times(table, where)
    if "saving" in table.column_names:
        out += _paired_savings(table, gl, vl, where)
    return out


def _cost_cells(gl: list[int], vl: list[int], ladder: Sequence[int], k: int, where: str) -> list[Finding]:
    """The cells' keys: G on the ladder, deployable compact budgets, a native cell per G, and the
    engine's compact-cell limit per G."""
    out: list[Finding] = []
    rungs = set(ladder)
    for gi, vi in zip(gl, vl, strict=True):
        if gi not in rungs:
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: cell (G={gi}, V={vi}) has G outside the graph ladder {list(ladder)}",
                    field="graph_batch_size",
                )
            )
        elif not is_deployable(gi, vi, k):
            # V = G is legal but can never carry a real row (DESIGN §6), so it is never deployed.
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: cell (G={gi}, V={vi}) is not a deployable compact budget; "
                    f"need G < V < G*(K+1)={full_width(gi, k)}",
                    field="verifier_budget",
                )
            )
    natives = {gi for gi, vi in zip(gl, vl, strict=True) if vi == NATIVE_BUDGET}
    for gi in ladder:
        if gi not in natives:
            out.append(
                Finding(
                    Reason.NATIVE_CELL_MISSING,
                    f"{where}: G={gi} has no native cell (V=0); every G needs its static full-K fallback",
                    field="verifier_budget",
                    expected=NATIVE_BUDGET,
                )
            )
    per_g = Counter(gi for gi, vi in zip(gl, vl, strict=True) if vi != NATIVE_BUDGET)
    over = {x: n for x, n in per_g.items() if n > MAX_COMPACT_CELLS_PER_G}
    if over:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: more than {MAX_COMPACT_CELLS_PER_G} compact cells for G {sorted(over)} (engine limit)",
            )
        )
    return out


def _cost_times(table: pa.Table, where: str) -> list[Finding]:
    """Positive step times inside their intervals, and samples behind every cell."""
    out: list[Finding] = []
    t = float_values(table.column("step_time_ms"))
    lo = float_values(table.column("ci_low_ms"))
    hi = float_values(table.column("ci_high_ms"))
    if np.any(t <= 0) or np.any(lo <= 0):
        out.append(
            Finding(Reason.CONTENT_INVALID, f"{where}: step times must be positive", field="step_time_ms")
        )
    if np.any(lo > t) or np.any(t > hi):
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: need ci_low_ms <= step_time_ms <= ci_high_ms",
                field="ci_low_ms",
            )
        )
    if np.any(float_values(table.column("samples")) < 1):
        out.append(Finding(Reason.CONTENT_INVALID, f"{where}: every cell needs >= 1 sample", field="samples"))
    return out


def _paired_savings(table: pa.Table, gl: list[int], vl: list[int], where: str) -> list[Finding]:
    """Schema 2: savings finite and ordered; native cells exactly 0; every deployed compact cell
    saves with its whole 95% interval above 0 (no negative or NaN bound is ever signed)."""
    out: list[Finding] = []
    s = table.column("saving").to_pylist()
    lo = table.column("saving_ci_low").to_pylist()
    hi = table.column("saving_ci_high").to_pylist()
    extra = table.column("common_mode_rel").to_pylist() + table.column("level_rel").to_pylist()
    if not all(math.isfinite(x) and x >= 0 for x in extra):
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: common_mode_rel and level_rel must be finite and >= 0",
                field="common_mode_rel",
            )
        )
    for g, v, x, a, b in zip(gl, vl, s, lo, hi, strict=True):
        cell = f"cell (G={g}, V={v})"
        if not all(math.isfinite(y) for y in (x, a, b)) or not a <= x <= b < 1.0:
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: {cell} needs finite saving_ci_low <= saving <= saving_ci_high < 1, got {a}, {x}, {b}",
                    field="saving",
                )
            )
        elif v == NATIVE_BUDGET and (x, a, b) != (0.0, 0.0, 0.0):
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: native {cell} must have saving 0 with a zero-width interval, got {a}, {x}, {b}",
                    field="saving",
                )
            )
        elif v != NATIVE_BUDGET and a <= 0.0:
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: compact {cell} has saving_ci_low {a:.4g} <= 0; a deployed cell must save for "
                    "sure; rebuild (build deploys only such cells)",
                    field="saving_ci_low",
                )
            )
    return out


def _calibration(table: pa.Table, fp: Fingerprint, where: str) -> list[Finding]:
    k, out = _k(fp, where)
    if k is None:
        return out
    positions = sorted(table.column("position").to_pylist())
    if positions != list(range(1, k + 1)):
        out.append(
            Finding(
                Reason.K_INCONSISTENT,
                f"{where}: calibration positions {positions} do not cover 1..K={k}",
                field="position",
                expected=list(range(1, k + 1)),
                actual=positions,
            )
        )
    temps = float_values(table.column("temperature"))
    finite = temps[~np.isnan(temps)]
    if finite.size and np.any(finite <= 0):
        out.append(
            Finding(Reason.CONTENT_INVALID, f"{where}: temperatures must be positive", field="temperature")
        )
    return out


def _sweep(table: pa.Table, fp: Fingerprint, where: str) -> list[Finding]:
    k, out = _k(fp, where)
    if k is None or table.num_rows == 0:
        return out
    gl: list[int] = table.column("graph_batch_size").to_pylist()
    vl: list[int] = table.column("verifier_budget").to_pylist()
    # The markers (native, forced-K arm) and G <= V <= G*(K+1) are legal in a sweep.
    bad = next(((g, v) for g, v in zip(gl, vl, strict=True) if cell_kind(g, v, k) is None), None)
    if bad is not None:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: cell (G={bad[0]}, V={bad[1]}) is outside G <= V <= G*(K+1)",
                field="verifier_budget",
            )
        )
    return out


def _none(table: pa.Table, fp: Fingerprint, where: str) -> list[Finding]:
    return []


_Rule = Callable[[pa.Table, Fingerprint, Mapping[str, Any], str], list[Finding]]


def _decode(rule: Callable[[pa.Table, Fingerprint, str], list[Finding]]) -> _Rule:
    """A decode kind's rule, which does not read the signed summary."""

    def run(table: pa.Table, fp: Fingerprint, summary: Mapping[str, Any], where: str) -> list[Finding]:
        return rule(table, fp, where)

    return run


_RULES: Mapping[str, _Rule] = {
    "cost-table": _decode(_cost_table),
    "calibration": _decode(_calibration),
    "sweep": _decode(_sweep),
    "sweep-samples": _decode(_none),
    "admission": _decode(_none),
    "mixed-cost-table": mixed_cost_table_findings,
    "mixed-sweep": mixed_sweep_findings,
    "mixed-sweep-samples": lambda table, fp, summary, where: [],
    "mixed-admission": mixed_admission_findings,
}


def content_findings(
    kind: str,
    table: pa.Table,
    fingerprint: Fingerprint,
    provenance: Mapping[str, Any],
    *,
    allow_synthetic: bool,
    where: str,
    schema_version: int | None = None,
    summary: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """All content findings for a verified table of ``kind`` (empty when acceptable).

    ``schema_version`` is the signed one (default: the current version of the kind); ``summary``
    the signed predicate's summary (the mixed kinds state their route there).
    """
    version = SCHEMA_VERSION[kind] if schema_version is None else schema_version
    out = _schema(kind, table, where, version)
    if out:
        return out  # the per-kind rules read columns the schema guarantees
    out += _RULES[kind](table, fingerprint, summary or {}, where)
    if provenance.get("synthetic") is True and not allow_synthetic:
        extra = provenance.get("extra")
        named = extra.get("synthetic_inputs") if isinstance(extra, Mapping) else None
        if isinstance(named, list) and named and all(isinstance(n, str) for n in named):
            what = f"synthetic inputs ({', '.join(named)})"
        else:
            what = f"synthetic input (backend {provenance.get('backend')!r})"
        out.append(
            Finding(
                Reason.SYNTHETIC_REFUSED,
                f"{where}: built from {what}; use real inputs, or pass --allow-synthetic for demos and tests",
                field="provenance.synthetic",
            )
        )
    return out
