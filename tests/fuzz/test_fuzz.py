"""A short, seeded run of every fuzz target (part of ``make test``; ``make fuzz`` runs them long).

Each target must end every execution in a reason code (or, for trace readers, a DsparkError):
no crash, no hang, and no mutant accepted with a changed meaning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS, Corpus, Stats, Target, fuzz

#: Examples per target in the seeded run: enough to reach every mutation kind of a target,
#: few enough to keep the suite's fuzz share to tens of seconds on two cores.
EXAMPLES = 40
SEED = 20261130


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(Path(tmp_path_factory.mktemp("fuzz")))


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_seeded_fuzz_run(corpus: Corpus, target: Target) -> None:
    stats = Stats()
    fuzz(target, corpus, stats, examples=EXAMPLES, seed=SEED, strict=True)
    assert stats.executions >= EXAMPLES // 2  # hypothesis may stop early only on a small space
    assert not stats.crashes and not stats.hangs and stats.accepted_mutants == 0
    # The run exercised refusals, not just one outcome.
    assert any(o.startswith("rejected:") for o in stats.outcomes), stats.outcomes


def test_targets_cover_every_untrusted_input() -> None:
    names = {t.name for t in TARGETS}
    assert {
        "envelope",
        "footer",
        "manifest",
        "trust-root",
        "state",
        "state-nesting",
    } <= names  # verify / admit
    assert "options-yaml" in names  # --base-options: the bounded YAML loader and the merge
    assert {"trace-jsonl", "trace-parquet", "trace-pt", "workload-pt"} <= names  # every trace reader
