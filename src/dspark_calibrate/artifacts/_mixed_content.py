"""Content rules of the mixed prefill+decode kinds (DESIGN §4 step 8, §10). Pure: no I/O.

Registered with the decode kinds' rules in :mod:`._content` and run by the same pipeline step,
with the same reason codes (``CONTENT_INVALID``, ``K_INCONSISTENT``) plus one for the geometry
invariants: ``MIXED_GEOMETRY_INVALID:<rule>`` (the rule ids of
:data:`~._mixed_geometry.GEOMETRY_RULES`, and ``duplicate``/``cell_limit`` for the table).

The signed summary of a mixed cost table or sweep carries its ``route`` (K, world size, body
buckets, execution mode, verify floor); K and the world size must be the fingerprint's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from dspark_calibrate.artifacts._mixed_geometry import (
    MixedGeometry,
    MixedRoute,
    geometry_violations,
    paid_bucket,
)
from dspark_calibrate.artifacts._models import Fingerprint, is_sha256_hex
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import MAX_MIXED_CELLS, MIXED_COST_SUMMARY_KEYS

__all__ = ["mixed_admission_findings", "mixed_cost_table_findings", "mixed_sweep_findings", "route_of"]


def route_of(
    summary: Mapping[str, Any], fp: Fingerprint, where: str
) -> tuple[MixedRoute | None, list[Finding]]:
    """The signed route, checked against the fingerprint (K and world size)."""
    try:
        route = MixedRoute.from_dict(summary.get("route"), where="summary.route")
    except ConfigError as exc:
        return None, [Finding(Reason.CONTENT_INVALID, f"{where}: {exc}", field="summary.route")]
    out: list[Finding] = []
    if fp.max_draft_len is None or route.physical_k != fp.max_draft_len:
        out.append(
            Finding(
                Reason.K_INCONSISTENT,
                f"{where}: route.physical_k {route.physical_k} is not the fingerprint's max_draft_len "
                f"{fp.max_draft_len}",
                field="route.physical_k",
                expected=fp.max_draft_len,
                actual=route.physical_k,
            )
        )
    if fp.gpu_count is None or route.world_size != fp.gpu_count:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: route.world_size {route.world_size} is not the fingerprint's gpu_count {fp.gpu_count}",
                field="route.world_size",
                expected=fp.gpu_count,
                actual=route.world_size,
            )
        )
    return route, out


def _geometry(row: Mapping[str, Any]) -> MixedGeometry:
    return MixedGeometry.from_flat(
        row["rank_features"], row["capacity"], row["actual_rank_rows"], row["native_rank_rows"]
    )


def _geometry_findings(
    rows: list[dict[str, Any]],
    route: MixedRoute,
    where: str,
    *,
    gain: float | None,
    costs: bool,
) -> list[Finding]:
    """Every cell row's geometry invariants, its stored hash and paid bucket, and duplicates."""
    out: list[Finding] = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        cell = f"mixed cell {i} (capacity {row['capacity']}, geometry {row['geometry_sha256']!s})"
        try:
            geo = _geometry(row)
        except ConfigError as exc:
            out.append(Finding(Reason.MIXED_GEOMETRY_INVALID, f"{where}: {cell}: {exc}", field="ranks"))
            continue
        triple = None
        if costs and gain is not None:
            triple = (float(row["native_lower_ms"]), float(row["candidate_upper_ms"]), gain)
        for v in geometry_violations(
            geo,
            k=route.physical_k,
            buckets=route.body_buckets,
            world_size=route.world_size,
            min_verify_len=route.min_verify_len,
            costs=triple,
        ):
            out.append(
                Finding(Reason.MIXED_GEOMETRY_INVALID, f"{where}: {cell}: {v.describe()}", field=v.rule)
            )
        if geo.sha256() != row["geometry_sha256"]:
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: {cell}: geometry_sha256 is not the SHA-256 of the row's geometry",
                    field="geometry_sha256",
                )
            )
        if paid_bucket(geo.native_rank_rows, route.body_buckets) != row["native_capacity"]:
            out.append(
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{where}: {cell}: native_capacity {row['native_capacity']} is not the smallest bucket holding "
                    f"the native rows {list(geo.native_rank_rows)}",
                    field="native_capacity",
                )
            )
        key = str(row["geometry_sha256"])
        if key in seen:
            out.append(
                Finding(
                    Reason.MIXED_GEOMETRY_INVALID,
                    f"{where}: mixed cells {seen[key]} and {i} share one geometry; the runtime looks cells up "
                    "exactly, so each geometry has one cell",
                    field="duplicate",
                )
            )
        seen.setdefault(key, i)
    return out


def _finite(values: list[Any]) -> bool:
    return all(isinstance(x, int | float) and math.isfinite(x) for x in values)


def mixed_cost_table_findings(
    table: pa.Table, fp: Fingerprint, summary: Mapping[str, Any], where: str
) -> list[Finding]:
    """A deployed mixed cost table: route, 1..256 cells, valid geometries, live cells, real savings."""
    missing = sorted(set(MIXED_COST_SUMMARY_KEYS) - set(summary))
    extra = sorted(set(summary) - set(MIXED_COST_SUMMARY_KEYS))
    if missing or extra:
        return [
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: summary keys: missing {missing}, unknown {extra}; rebuild with this tool",
                field="summary",
            )
        ]
    route, out = route_of(summary, fp, where)
    gain = summary["minimum_predicted_gain"]
    if isinstance(gain, bool) or not isinstance(gain, int | float) or not math.isfinite(gain) or gain < 0.01:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: minimum_predicted_gain {gain!r} must be a finite number >= 0.01 (the mixed path never "
                "loosens the 1% gate)",
                field="minimum_predicted_gain",
            )
        )
        gain = None
    if not is_sha256_hex(summary["protocol_sha256"]):
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: protocol_sha256 must be SHA-256 hex",
                field="protocol_sha256",
            )
        )
    n = table.num_rows
    if not 1 <= n <= MAX_MIXED_CELLS or summary["cells"] != n:
        out.append(
            Finding(
                Reason.MIXED_GEOMETRY_INVALID,
                f"{where}: {n} mixed cells (summary says {summary['cells']!r}); a mixed cost table holds 1 to "
                f"{MAX_MIXED_CELLS}",
                field="cell_limit",
            )
        )
    if route is None:
        return out
    rows = table.to_pylist()
    out += _geometry_findings(rows, route, where, gain=gain, costs=True)
    for i, row in enumerate(rows):
        out += _mixed_cost_row_findings(row, f"mixed cell {i}", where)
    return out


def _mixed_cost_row_findings(row: Mapping[str, Any], cell: str, where: str) -> list[Finding]:
    """One deployed mixed cell's numbers: positive times, a saving that is sure, sane noise
    levels, SHA-256 pins and samples in both arms."""
    out: list[Finding] = []
    times = [row[c] for c in ("native_lower_ms", "candidate_upper_ms", "native_ms", "candidate_ms")]
    if not _finite(times) or min(times) <= 0:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: {cell}: step times must be finite and > 0",
                field="native_lower_ms",
            )
        )
    lo, s, hi = row["saving_ci_low"], row["saving"], row["saving_ci_high"]
    if not _finite([lo, s, hi]) or not lo <= s <= hi < 1.0:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: {cell}: needs finite saving_ci_low <= saving <= saving_ci_high < 1, got {lo}, {s}, {hi}",
                field="saving",
            )
        )
    elif lo <= 0.0:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: {cell}: saving_ci_low {lo:.4g} <= 0; a deployed mixed cell must save for sure",
                field="saving_ci_low",
            )
        )
    rel = [row["common_mode_rel"], row["native_level_rel"]]
    if not _finite(rel) or min(rel) < 0:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: {cell}: common_mode_rel and native_level_rel must be finite and >= 0",
                field="common_mode_rel",
            )
        )
    if not is_sha256_hex(row["measurement_result_sha256"]) or not is_sha256_hex(row["group_sha256"]):
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: {cell}: measurement_result_sha256 and group_sha256 must be SHA-256 hex",
                field="measurement_result_sha256",
            )
        )
    if row["samples"] < 1 or row["native_samples"] < 1:
        out.append(
            Finding(Reason.CONTENT_INVALID, f"{where}: {cell}: every arm needs >= 1 sample", field="samples")
        )
    return out


def mixed_sweep_findings(
    table: pa.Table, fp: Fingerprint, summary: Mapping[str, Any], where: str
) -> list[Finding]:
    """A mixed sweep: route, valid candidate geometries, a native arm for every group."""
    route, out = route_of(summary, fp, where)
    if route is None or table.num_rows == 0:
        return out
    rows = table.to_pylist()
    cells = [r for r in rows if r["capacity"] != 0]
    out += _geometry_findings(cells, route, where, gain=None, costs=False)
    natives = {r["mixed_group"] for r in rows if r["capacity"] == 0}
    orphans = sorted({r["mixed_group"] for r in cells} - natives)
    if orphans:
        out.append(
            Finding(
                Reason.NATIVE_CELL_MISSING,
                f"{where}: mixed groups {orphans[:8]} have cells but no native arm (capacity 0); every cell is "
                "paired with the native width of its step",
                field="capacity",
            )
        )
    return out


def mixed_admission_findings(
    table: pa.Table, fp: Fingerprint, summary: Mapping[str, Any], where: str
) -> list[Finding]:
    """A mixed admission table: one row per deployed cell, non-negative counts, finite values."""
    out: list[Finding] = []
    rows = table.to_pylist()
    keys = [r["geometry_sha256"] for r in rows]
    if len(set(keys)) != len(keys) or not all(is_sha256_hex(k) for k in keys):
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: every row names one deployed mixed cell by its geometry SHA-256, once",
                field="geometry_sha256",
            )
        )
    if any(r["chosen_steps"] < 0 for r in rows) or not _finite(
        [r["value_ms"] for r in rows] + [r["value_ms_lower_bound"] for r in rows]
    ):
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{where}: chosen_steps must be >= 0 and values finite",
                field="chosen_steps",
            )
        )
    return out
