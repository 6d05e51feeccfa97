"""``fit``: ground-truth recovery, the request split, data checks, outputs, drift, and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from dspark_calibrate.artifacts import Fingerprint, Provenance, canonical_json, logical_sha256, read_artifact
from dspark_calibrate.calibrate.confidence.fit import (
    CALIBRATION_FILE,
    MIN_ROUNDS_FLOOR,
    REPORT_FILE,
    STS_FILE,
    DriftTolerances,
    FitOptions,
    LoadedCalibration,
    check_sufficiency,
    evaluate_drift,
    fit_traces,
    load_calibration,
    load_fingerprint,
    run_evaluate,
    run_fit,
    split_by_request,
    write_fit_outputs,
)
from dspark_calibrate.calibrate.confidence.maps import Method, parse_sts_document
from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, synth_traces, write_synth_traces
from dspark_calibrate.calibrate.confidence.traces import TraceSet, read_traces, write_trace_parquet
from dspark_calibrate.calibrate.measurement.stats import Status
from dspark_calibrate.cli.fit import register
from dspark_calibrate.errors import ConfigError

TRUTH = (0.7, 0.9, 1.1, 1.4, 1.8)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def provenance(synthetic: bool = True) -> Provenance:
    return Provenance(tool_version="test", command=("pytest",), synthetic=synthetic)


def small(n: int = 4000, *, requests: int = 40, k: int = 3, seed: int = 0, **kw: Any) -> TraceSet:
    rng = np.random.default_rng(seed)
    x = rng.normal(1.0, 1.5, size=(n, k)).astype(np.float32)
    ok = rng.random((n, k)) < 1 / (1 + np.exp(-x / 1.2))
    ids = kw.get("ids", [f"r{i % requests}" for i in range(n)])
    seen: dict[str, int] = {}
    rounds = []
    for rid in ids:  # rounds numbered 0, 1, ... within each request
        rounds.append(seen.get(rid, 0))
        seen[rid] = rounds[-1] + 1
    return TraceSet.from_arrays(
        request_ids=ids,
        rounds=rounds,
        logits=x,
        accepted=np.cumprod(ok, axis=1).sum(axis=1),
        verified=[k] * n,
    )


# ---------------------------------------------------------------------------------------------
# Ground-truth recovery (the acceptance test)


@pytest.fixture(scope="module")
def recovered() -> Any:
    traces = synth_traces(SynthSpec(rounds=250_000, seed=21, censor_fraction=0.3))
    return fit_traces(traces, FitOptions(method="sts", bootstrap=50))


def test_sts_recovers_the_truth_on_held_out_requests(recovered: Any) -> None:
    result = recovered
    fitted = np.asarray(result.calibration.sts_temperatures())
    assert np.all(np.abs(fitted - TRUTH) / TRUTH < 0.05), fitted
    assert result.fit_rounds + result.holdout_rounds == 250_000
    assert result.holdout_rounds == pytest.approx(50_000, rel=0.15)
    for pos in result.after.positions:
        assert pos.ece.value is not None and pos.ece.value <= 0.02, (pos.position, pos.ece)
        assert pos.ece_mass.value is not None and pos.ece_mass.value <= 0.02
    # Calibration must beat the raw logits on the proper score and fix the mean accepted length.
    assert result.after.nll.value < result.before.nll.value
    assert abs(result.after.ea_error.value) < abs(result.before.ea_error.value)
    assert result.after.ea_error.low <= 0 <= result.after.ea_error.high


def test_auto_selects_and_still_calibrates() -> None:
    traces = synth_traces(SynthSpec(rounds=60_000, seed=8))
    result = fit_traces(traces, FitOptions(method="auto", bootstrap=0))
    assert result.cv_nll is not None and set(result.cv_nll) == {"sts", "platt", "beta", "isotonic"}
    assert result.calibration.method == min(result.cv_nll, key=lambda m: result.cv_nll[m])
    assert result.after.max_ece is not None and result.after.max_ece < 0.03
    assert result.after.bootstrap == 0 and result.after.nll.low is None


# ---------------------------------------------------------------------------------------------
# Split by request


def test_split_never_puts_a_request_on_both_sides() -> None:
    ts = small(20_000, requests=500)
    split = split_by_request(ts, holdout=0.3, seed=1, folds=5)
    held = set(ts.request[split.holdout].tolist())
    fit = set(ts.request[~split.holdout].tolist())
    assert not held & fit
    assert len(held) == split.holdout_requests and len(fit) == split.fit_requests
    assert split.holdout_requests / 500 == pytest.approx(0.3, abs=0.07)
    # Folds are per request too.
    for code in range(0, 500, 37):
        assert len(set(split.folds[ts.request == code].tolist())) == 1


def test_split_depends_on_ids_and_seed_not_file_order() -> None:
    ts = small(6000, requests=300)
    order = np.random.default_rng(0).permutation(ts.rounds)
    shuffled = TraceSet.from_arrays(
        request_ids=[ts.request_names[i] for i in ts.request[order]],
        rounds=ts.round[order],
        logits=ts.logits[order],
        accepted=ts.accepted[order],
        verified=ts.verified[order],
    )

    def held_names(t: TraceSet, seed: int) -> set[str]:
        s = split_by_request(t, holdout=0.2, seed=seed, folds=5)
        return {t.request_names[i] for i in t.request[s.holdout]}

    assert held_names(ts, 3) == held_names(shuffled, 3)
    assert held_names(ts, 3) != held_names(ts, 4)


def test_two_requests_split_one_each() -> None:
    ts = small(400, requests=2)
    for holdout in (0.01, 0.9):
        split = split_by_request(ts, holdout=holdout, seed=0, folds=5)
        assert split.holdout_requests == 1 and split.fit_requests == 1


# ---------------------------------------------------------------------------------------------
# Data checks: one row per way the data can be wrong


def notice_codes(traces: TraceSet, force: bool = False) -> set[str]:
    decision, notices = check_sufficiency(traces, force=force)
    assert decision.status is Status.ACCEPT
    return {n.code for n in notices}


def test_too_few_rounds_is_refused_unless_forced() -> None:
    tiny = small(MIN_ROUNDS_FLOOR - 1, requests=10)
    decision, _ = check_sufficiency(tiny)
    assert (decision.status, decision.reason) == (Status.REJECT, "too_few_rounds")
    with pytest.raises(ConfigError, match=r"below the floor of 200.*--force"):
        fit_traces(tiny, FitOptions(method="sts", bootstrap=0))
    assert "FEW_ROUNDS" in notice_codes(tiny, force=True)
    forced = fit_traces(tiny, FitOptions(method="sts", bootstrap=0, force=True))
    assert "FEW_ROUNDS" in {n.code for n in forced.notices}


DATA_WARNINGS = [
    ("few_rounds", lambda: small(800, requests=40), "FEW_ROUNDS"),
    (
        "dominant_request",
        lambda: small(4000, ids=["big"] * 2000 + [f"r{i % 40}" for i in range(2000)]),
        "DOMINANT_REQUEST",
    ),
    ("few_requests", lambda: small(4000, requests=5), "FEW_REQUESTS"),
]


@pytest.mark.parametrize(("name", "make", "code"), DATA_WARNINGS, ids=[d[0] for d in DATA_WARNINGS])
def test_data_warnings(name: str, make: Any, code: str) -> None:
    assert code in notice_codes(make())


def test_healthy_data_has_no_warnings() -> None:
    assert notice_codes(small(4000, requests=40)) == set()


def test_single_request_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least two are needed"):
        fit_traces(small(2000, requests=1), FitOptions(method="sts", bootstrap=0))


def test_mixed_sampling_is_reported(tmp_path: Path) -> None:
    greedy = synth_traces(SynthSpec(rounds=1500, seed=1, sampling="greedy"))
    path_a, path_b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_synth_traces(path_a, SynthSpec(rounds=1500, seed=1, sampling="greedy"))
    tbl = pq.read_table(path_a)
    # Same rounds under other request ids and another sampling tag.
    tbl = tbl.set_column(0, "request_id", [[f"x-{r}" for r in tbl.column("request_id").to_pylist()]])
    tbl = tbl.set_column(5, "sampling", [["top_p"] * tbl.num_rows])
    pq.write_table(tbl, path_b)
    both = read_traces([path_a, path_b])
    assert "MIXED_SAMPLING" in notice_codes(both)
    assert read_traces([path_a, path_b], sampling="greedy").rounds == greedy.rounds


def test_empty_risk_set_is_reported_and_falls_back() -> None:
    n = 3000
    ts = TraceSet.from_arrays(
        request_ids=[f"r{i % 30}" for i in range(n)],
        rounds=[i // 30 for i in range(n)],
        logits=np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32),
        accepted=[i % 2 for i in range(n)],
        verified=[3] * n,
    )
    result = fit_traces(ts, FitOptions(method="platt", bootstrap=0))
    codes = {n.code: n.message for n in result.notices}
    assert "EMPTY_RISK_SET" in codes and "position 3" in codes["EMPTY_RISK_SET"]
    assert result.calibration.positions[2].method is Method.IDENTITY


BAD_OPTIONS = [
    ("method", {"method": "magic"}, "--method 'magic'"),
    ("holdout_zero", {"holdout": 0.0}, r"--holdout 0.0 must be in \(0, 0.9\]"),
    ("holdout_big", {"holdout": 0.95}, "--holdout"),
    ("folds", {"folds": 1}, "--folds 1"),
    ("bootstrap", {"bootstrap": -1}, "--bootstrap -1"),
    ("bins", {"n_bins": 1}, "n_bins 1"),
    ("seed", {"seed": -2}, "--seed -2"),
]


@pytest.mark.parametrize(("name", "kwargs", "message"), BAD_OPTIONS, ids=[b[0] for b in BAD_OPTIONS])
def test_bad_options(name: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FitOptions(**kwargs)


# ---------------------------------------------------------------------------------------------
# Outputs


@pytest.fixture(scope="module")
def traces_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "fit-traces.parquet"
    write_synth_traces(path, SynthSpec(rounds=30_000, seed=5, censor_fraction=0.2, rounds_per_request=60))
    return path


@pytest.fixture(scope="module")
def fitted(traces_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    out = tmp_path_factory.mktemp("out")
    result, outputs, _ = run_fit(
        [traces_file], out, options=FitOptions(method="sts", bootstrap=40), tool_version="t", command=("x",)
    )
    return result, outputs


def test_calibration_table_is_a_valid_unsigned_artifact(fitted: tuple[Any, Any]) -> None:
    result, outputs = fitted
    loaded = read_artifact(outputs.calibration)
    assert loaded.kind == "calibration" and loaded.schema_version == 1 and loaded.envelope is None
    assert (
        loaded.metadata["logical_sha256"]
        == outputs.logical_sha256
        == logical_sha256(loaded.table, "calibration")
    )
    rows = loaded.table.to_pylist()
    assert [r["position"] for r in rows] == [1, 2, 3, 4, 5]
    for row, pm in zip(rows, result.calibration.positions, strict=True):
        assert row["method"] == "sts" and row["params"] == [row["temperature"]] == [pm.params[0]]
        assert row["risk_set_size"] == pm.risk_set_size > 0 and row["holdout_risk_set_size"] > 0
        assert row["ece_after"] < row["ece_before"] or row["ece_after"] < 0.02
    assert loaded.provenance_untrusted().synthetic is True
    assert loaded.fingerprint_untrusted().max_draft_len == 5
    summary = loaded.metadata["summary"]
    for key in ("nll_accepted_length", "brier_survival", "ea_error"):
        after = summary[key]["after"]
        assert after["low"] <= after["value"] <= after["high"]
    assert summary["ece"]["binning"]["bins"] == 15 and summary["ece"]["binning"]["norm"] == "L1"
    assert summary["bootstrap"] == {"replicates": 40, "unit": "request", "confidence": 0.95}
    assert summary["sts_temperatures"] == [r["temperature"] for r in rows]


def test_sts_json_report_and_plots(fitted: tuple[Any, Any]) -> None:
    result, outputs = fitted
    data = outputs.sts.read_bytes()
    doc = parse_sts_document(data, k=5)
    assert canonical_json(doc.to_dict()) == data  # canonical bytes, exactly
    assert doc.temperatures == result.calibration.sts_temperatures()
    assert doc.num_samples == result.fit_rounds and doc.max_draft_len == 5
    assert doc.dataset == "fit-traces.parquet"
    assert doc.ece_after is not None and doc.ece_before is not None and doc.ece_after < doc.ece_before
    report = json.loads(outputs.report.read_bytes())
    assert report["outputs"]["logical_sha256"] == outputs.logical_sha256
    assert len(report["after"]["positions"][0]["equal_width"]["counts"]) == 15
    assert outputs.report.name == REPORT_FILE and outputs.calibration.name == CALIBRATION_FILE
    assert [p.name for p in outputs.plots] == ["reliability.png", "survival.png"]
    for p in outputs.plots:
        assert p.read_bytes()[:8] == PNG_MAGIC


def test_sts_json_only_for_sts_or_when_asked(traces_file: Path, tmp_path: Path) -> None:
    traces = read_traces([traces_file])
    result = fit_traces(traces, FitOptions(method="platt", bootstrap=0))
    plain = write_fit_outputs(result, tmp_path / "a", provenance=provenance(), plots=False)
    assert plain.sts is None and "--sts-approx" in plain.sts_reason
    assert not (tmp_path / "a" / STS_FILE).exists()
    approx = write_fit_outputs(result, tmp_path / "b", provenance=provenance(), plots=False, sts_approx=True)
    assert approx.sts is not None
    doc = parse_sts_document(approx.sts.read_bytes(), k=5)
    assert doc.temperatures == result.calibration.sts_temperatures()
    assert np.all(np.abs(np.asarray(doc.temperatures) - TRUTH) / TRUTH < 0.1)


def test_fingerprint_binding(traces_file: Path, tmp_path: Path) -> None:
    result = fit_traces(read_traces([traces_file]), FitOptions(method="sts", bootstrap=0))
    fp = Fingerprint(gpu="H200", gpu_count=1, max_draft_len=4)
    with pytest.raises(ConfigError, match="max_draft_len is 4 but the traces have K=5"):
        write_fit_outputs(result, tmp_path, fingerprint=fp, provenance=provenance(), plots=False)
    out = write_fit_outputs(
        result, tmp_path, fingerprint=fp.replace(max_draft_len=None), provenance=provenance(), plots=False
    )
    assert read_artifact(out.calibration).fingerprint_untrusted() == fp.replace(max_draft_len=5)
    good = tmp_path / "fp.json"
    good.write_text(json.dumps({"gpu": "H200", "max_draft_len": 5}))
    assert load_fingerprint(good).gpu == "H200"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpu": "H200", "colour": "blue"}))
    with pytest.raises(ConfigError, match=r"bad\.json: invalid fingerprint.*colour"):
        load_fingerprint(bad)
    with pytest.raises(ConfigError, match="cannot read fingerprint"):
        load_fingerprint(tmp_path / "missing.json")


# ---------------------------------------------------------------------------------------------
# Drift check


def test_drift_accepts_fresh_traces_from_the_same_truth(fitted: tuple[Any, Any], tmp_path: Path) -> None:
    _, outputs = fitted
    fresh = tmp_path / "fresh.parquet"
    write_synth_traces(fresh, SynthSpec(rounds=30_000, seed=99))
    for source in (outputs.calibration, outputs.sts):
        report = run_evaluate(source, [fresh], bootstrap=40)
        assert report.decision.status in (Status.ACCEPT, Status.UNDECIDED), report.decision
        assert report.decision.status is not Status.REJECT
        regret = next(c for c in report.checks if c.name == "nll_regret")
        assert regret.value.value is not None and regret.value.value < 0.005


def test_drift_rejects_traces_from_another_truth(fitted: tuple[Any, Any]) -> None:
    _, outputs = fitted
    shifted = synth_traces(SynthSpec(rounds=30_000, seed=98, temperatures=tuple(1.7 * t for t in TRUTH)))
    report = evaluate_drift(load_calibration(outputs.calibration), shifted, bootstrap=40)
    assert report.decision.status is Status.REJECT
    assert {c.name for c in report.checks if c.decision.status is Status.REJECT} >= {"nll_regret", "ece[1]"}
    assert np.all(np.asarray(report.refit_temperatures) > 1.5 * np.asarray(TRUTH))


def test_drift_tolerances_and_k_mismatch(fitted: tuple[Any, Any]) -> None:
    _, outputs = fitted
    with pytest.raises(ConfigError, match="--ece-tolerance"):
        DriftTolerances(ece=-0.1)
    loaded = load_calibration(outputs.calibration)
    with pytest.raises(ConfigError, match="K=5 positions but the traces have K=3"):
        evaluate_drift(loaded, small(2000), bootstrap=0)
    assert isinstance(loaded, LoadedCalibration) and all(e is not None for e in loaded.reference_ece)


def test_load_calibration_refuses_other_files(traces_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"a draft-round trace table .* not a signed artifact"):
        load_calibration(traces_file)
    (tmp_path / "sts.json").write_text('{"sts_temperatures": [1.0, -2.0]}')
    with pytest.raises(ConfigError, match=r"sts_temperatures\[2\] is -2.0"):
        load_calibration(tmp_path / "sts.json")


# ---------------------------------------------------------------------------------------------
# CLI (CliRunner over a Typer app with the fit commands registered)


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    cli = typer.Typer(pretty_exceptions_show_locals=False)

    @cli.callback()
    def main() -> None:
        """Test app."""

    register(cli)
    return cli


runner = CliRunner()


def test_cli_synth_then_fit_then_evaluate(app: typer.Typer, tmp_path: Path) -> None:
    traces = tmp_path / "t.parquet"
    res = runner.invoke(
        app, ["traces", "synth", "--out", str(traces), "--rounds", "20000", "--seed", "4", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["rounds"] == 20000
    out = tmp_path / "out"
    res = runner.invoke(
        app,
        ["fit", "--traces", str(traces), "--out", str(out), "--method", "sts", "--bootstrap", "20", "--json"],
    )
    assert res.exit_code == 0, res.stderr
    body = json.loads(res.stdout)
    assert body["status"] == "ok" and body["synthetic"] is True
    assert body["outputs"]["sts"] == str(out / STS_FILE) and (out / "reliability.png").exists()
    assert read_artifact(out / CALIBRATION_FILE).provenance_untrusted().command[0].endswith("fit")
    res = runner.invoke(
        app, ["fit", "--evaluate", str(out / CALIBRATION_FILE), "--traces", str(traces), "--json"]
    )
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["status"] in ("ACCEPT", "UNDECIDED")
    # Table output renders too.
    res = runner.invoke(
        app, ["fit", "--traces", str(traces), "--out", str(out), "--method", "platt", "--no-plots"]
    )
    assert res.exit_code == 0 and "no sts.json" in res.stdout


def test_cli_evaluate_exits_1_on_drift(app: typer.Typer, fitted: tuple[Any, Any], tmp_path: Path) -> None:
    _, outputs = fitted
    drifted = tmp_path / "drifted.parquet"
    write_synth_traces(drifted, SynthSpec(rounds=20_000, seed=3, temperatures=tuple(2.0 * t for t in TRUTH)))
    res = runner.invoke(
        app, ["fit", "--evaluate", str(outputs.calibration), "--traces", str(drifted), "--json"]
    )
    assert res.exit_code == 1
    assert json.loads(res.stdout)["status"] == "REJECT"
    assert "rejected:" in res.stderr
    res = runner.invoke(app, ["fit", "--evaluate", str(outputs.calibration), "--traces", str(drifted)])
    assert res.exit_code == 1 and "REJECT" in res.stdout


def _nan_traces(path: Path) -> Path:
    ts = small(500)
    write_trace_parquet(path, ts.batches())
    tbl = pq.read_table(path)
    logits = tbl.column("logits").to_pylist()
    logits[7][1] = float("nan")
    pq.write_table(tbl.set_column(2, "logits", [logits]), path)
    return path


def _jsonl(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    return path


def _bad_shard(path: Path, **fields: Any) -> Path:
    import torch

    shard: dict[str, Any] = {
        "logits": torch.zeros(4, 3),
        "prefix_mask": torch.zeros(4, 3),
        "meta": {"pairing": "draft_seq_ring", "block_size": 3},
    }
    shard.update(fields)
    torch.save(shard, path)
    return path


def _sparse_logits() -> Any:
    import torch

    return torch.zeros(4, 3).to_sparse()


def _unloadable_shard(path: Path) -> Path:
    _bad_shard(path)
    path.write_bytes(bytes([path.read_bytes()[0] ^ 1]) + path.read_bytes()[1:])
    return path


def _parquet_not_utf8(path: Path) -> Path:
    ids = pa.array([b"r", b"\xff"], pa.binary()).view(pa.string())
    pq.write_table(
        pa.table(
            {
                "request_id": ids,
                "round": [0, 0],
                "logits": [[0.0] * 3] * 2,
                "accepted": [0, 0],
                "verified": [3, 3],
            }
        ),
        path,
    )
    return path


_LINE = '{{"request_id":{rid},"round":0,"logits":[{logit},0,0],"accepted":0,"verified":3{extra}}}'


def _fit(path_of: Any) -> Any:
    return lambda d: ["fit", "--traces", str(path_of(d)), "--out", str(d / "out")]


#: Malformed traces: each once escaped fit as a traceback (exit 1); now exit 2 naming the file and
#: line, and the field where the strict JSON loader has not already refused the line.
MALFORMED_TRACES = [
    (
        "jsonl_integer_logit_of_400_digits",
        _fit(lambda d: _jsonl(d / "t.jsonl", _LINE.format(rid='"r"', logit="9" * 400, extra=""))),
        r"t\.jsonl: line 1: integer literal of 400 digits is longer than the 64-digit limit",
    ),
    (
        "jsonl_integer_temperature_of_400_digits",
        _fit(
            lambda d: _jsonl(
                d / "t.jsonl", _LINE.format(rid='"r"', logit="0", extra=',"temperature":' + "9" * 400)
            )
        ),
        r"t\.jsonl: line 1: integer literal of 400 digits is longer than the 64-digit limit",
    ),
    (
        "jsonl_lone_surrogate_request_id",
        _fit(lambda d: _jsonl(d / "t.jsonl", _LINE.format(rid='"\\ud800"', logit="0", extra=""))),
        r"t\.jsonl: line 1: field 'request_id' holds .* a lone surrogate",
    ),
    (
        "pt_ragged_logits",
        _fit(lambda d: _bad_shard(d / "s.pt", logits=[[0.0] * 3, [0.0] * 2, [0.0] * 3, [0.0] * 3])),
        r"s\.pt: 'logits' is not a rectangular array",
    ),
    (
        "pt_string_logits",
        _fit(lambda d: _bad_shard(d / "s.pt", logits=[["a"] * 3] * 4)),
        r"s\.pt: 'logits' must hold numbers",
    ),
    (
        "pt_sparse_logits",
        _fit(lambda d: _bad_shard(d / "s.pt", logits=_sparse_logits())),
        r"s\.pt: 'logits' is a torch\.sparse_coo tensor",
    ),
    (
        "pt_unloadable",
        _fit(lambda d: _unloadable_shard(d / "s.pt")),
        r"s\.pt: cannot load as a recorder shard",
    ),
    (
        "parquet_string_not_utf8",
        _fit(lambda d: _parquet_not_utf8(d / "t.parquet")),
        r"t\.parquet: row 1: request_id holds bytes that are not UTF-8",
    ),
]

CLI_ERRORS = [
    ("no_traces", lambda d: ["fit", "--out", str(d)], "--traces is required"),
    ("no_out", lambda d: ["fit", "--traces", str(_nan_traces(d / "n.parquet"))], "--out is required"),
    (
        "missing_file",
        lambda d: ["fit", "--traces", str(d / "nope.parquet"), "--out", str(d)],
        "no such trace file",
    ),
    (
        "nan_logits",
        lambda d: ["fit", "--traces", str(_nan_traces(d / "n.parquet")), "--out", str(d)],
        r"row 7 .*NaN/Inf",
    ),
    (
        "bad_method",
        lambda d: ["fit", "--traces", str(_nan_traces(d / "n.parquet")), "--out", str(d), "--method", "x"],
        "--method 'x'",
    ),
    ("synth_suffix", lambda d: ["traces", "synth", "--out", str(d / "t.csv")], "give a name ending in .parquet"),
    (
        "synth_spec",
        lambda d: ["traces", "synth", "--out", str(d / "t.parquet"), "--k", "3", "--temperatures", "1,2"],
        "has 2 values but --k is 3",
    ),
    (
        "synth_floats",
        lambda d: ["traces", "synth", "--out", str(d / "t.parquet"), "--temperatures", "1,a"],
        "must be a number",
    ),
    (
        "evaluate_missing",
        lambda d: ["fit", "--evaluate", str(d / "c.parquet"), "--traces", str(d)],
        "cannot read",
    ),
]


@pytest.mark.parametrize(
    ("name", "argv", "message"),
    CLI_ERRORS + MALFORMED_TRACES,
    ids=[c[0] for c in CLI_ERRORS + MALFORMED_TRACES],
)
def test_cli_usage_and_input_errors_exit_2(
    app: typer.Typer, tmp_path: Path, name: str, argv: Any, message: str
) -> None:
    res = runner.invoke(app, argv(tmp_path))
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.stderr  # one line, no traceback
    assert re.search(message, " ".join(res.stderr.split())), res.stderr
