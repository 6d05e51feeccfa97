"""The synthetic trace generator: a known truth, determinism, censoring, and the file it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.special import expit

from dspark_calibrate.calibrate.confidence.synth_traces import (
    DEFAULT_TRUE_TEMPERATURES,
    SynthSpec,
    generate_batches,
    synth_traces,
    write_synth_traces,
)
from dspark_calibrate.calibrate.confidence.traces import TRACE_FOOTER_KEY, read_traces
from dspark_calibrate.errors import ConfigError

BAD_SPECS = [
    ("zero_rounds", {"rounds": 0}, "--rounds 0"),
    ("k_zero", {"k": 0}, "--k 0"),
    ("temperatures_vs_k", {"k": 3, "temperatures": (1.0, 1.0)}, "has 2 values but --k is 3"),
    ("negative_temperature", {"k": 2, "temperatures": (1.0, -1.0)}, "finite and > 0"),
    ("rounds_per_request", {"rounds_per_request": 0.5}, "--rounds-per-request"),
    ("censor_fraction", {"censor_fraction": 1.5}, r"--censor-fraction 1.5 must be in \[0, 1\]"),
    ("censor_k1", {"k": 1, "censor_fraction": 0.2}, "needs --k >= 2"),
    ("censor_mode", {"censor_mode": "sometimes"}, "--censor-mode 'sometimes'"),
    ("request_spread", {"request_spread": -1.0}, "--request-spread"),
    ("seed", {"seed": -1}, "--seed -1"),
]


@pytest.mark.parametrize(("name", "changes", "message"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_bad_specs_name_the_flag(name: str, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SynthSpec(**{"rounds": 100, **changes})


def test_default_truth_extends_to_any_k() -> None:
    assert SynthSpec(rounds=1).true_temperatures() == DEFAULT_TRUE_TEMPERATURES
    assert SynthSpec(rounds=1, k=2).true_temperatures() == DEFAULT_TRUE_TEMPERATURES[:2]
    long = SynthSpec(rounds=1, k=7).true_temperatures()
    assert len(long) == 7 and long[:5] == DEFAULT_TRUE_TEMPERATURES and long[5] < long[6]


def test_generation_is_deterministic_and_seeded() -> None:
    spec = SynthSpec(rounds=5000, seed=3, censor_fraction=0.3)
    a, b = synth_traces(spec), synth_traces(spec)
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_array_equal(a.accepted, b.accepted)
    np.testing.assert_array_equal(a.verified, b.verified)
    c = synth_traces(SynthSpec(rounds=5000, seed=4, censor_fraction=0.3))
    assert not np.array_equal(a.logits, c.logits)


def test_rounds_requests_and_censoring() -> None:
    spec = SynthSpec(rounds=50_000, rounds_per_request=50, censor_fraction=0.4, seed=1)
    ts = synth_traces(spec, batch_rows=7_000)
    assert ts.rounds == 50_000 and ts.k == 5
    per_request = ts.rounds_per_request()
    assert per_request.min() >= 1 and per_request.mean() == pytest.approx(50, rel=0.15)
    # Rounds of a request are numbered 0..n-1 in order.
    first = np.flatnonzero(ts.round == 0)
    assert len(first) == ts.requests
    assert np.all((ts.accepted >= 0) & (ts.accepted <= ts.verified) & (ts.verified <= ts.k))
    trimmed = ts.verified < ts.k
    assert trimmed.mean() == pytest.approx(0.4 * 0.95, abs=0.05)  # a few trims keep every position
    assert ts.verified[trimmed].min() >= 1


def test_acceptance_follows_the_truth() -> None:
    spec = SynthSpec(rounds=100_000, seed=7, k=3, temperatures=(0.5, 1.0, 3.0))
    ts = synth_traces(spec)
    for j, t in enumerate(spec.true_temperatures(), start=1):
        risk = ts.accepted >= j - 1
        observed = (ts.accepted[risk] >= j).mean()
        expected = expit(ts.logits[risk, j - 1].astype(np.float64) / t).mean()
        assert observed == pytest.approx(expected, abs=0.01)


def test_confidence_censoring_depends_on_logits_only() -> None:
    spec = SynthSpec(rounds=40_000, seed=2, censor_fraction=1.0)
    ts = synth_traces(spec)
    raw_s2 = np.cumprod(expit(ts.logits.astype(np.float64)), axis=1)[:, 1]
    # Blocks trimmed to one position have lower raw confidence than blocks verified further.
    assert raw_s2[ts.verified == 1].mean() < raw_s2[ts.verified >= 3].mean()


def test_written_file_is_marked_synthetic_and_reads_back(tmp_path: Path) -> None:
    spec = SynthSpec(rounds=3000, seed=5, censor_fraction=0.2, sampling="greedy")
    path = tmp_path / "synth.parquet"
    summary = write_synth_traces(path, spec, batch_rows=1000)
    footer = json.loads(pq.read_schema(path).metadata[TRACE_FOOTER_KEY])
    assert footer["synthetic"] is True and footer["kind"] == "trace" and footer["k"] == 5
    assert footer["generator"]["temperatures"] == list(spec.true_temperatures())
    back = read_traces([path])
    mem = synth_traces(spec, batch_rows=1000)
    assert back.synthetic and back.rounds == summary.rounds == 3000
    assert summary.requests == mem.requests == back.requests
    assert summary.censored_rounds == mem.censored_rounds
    assert summary.mean_accepted == pytest.approx(float(mem.accepted.mean()))
    np.testing.assert_array_equal(np.sort(back.logits, axis=0), np.sort(mem.logits, axis=0))
    assert dict(back.sampling_tags) == {"greedy@-": 3000}


def test_batches_have_one_k_and_valid_counts() -> None:
    for batch in generate_batches(SynthSpec(rounds=2500, k=2, seed=0), batch_rows=1000):
        assert batch.k == 2 and batch.rows <= 1000
        assert np.all(batch.accepted <= batch.verified)
