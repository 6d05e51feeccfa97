"""Measure every test once and rewrite ``tests/slow_tests.txt``: the tests over SLOW_TEST_S.

Run on an otherwise idle machine (``make test-durations``): the whole suite with
``--durations=0``; each test's setup, call and teardown are summed, and every test over the
threshold that its file does not already mark ``slow`` is listed. ``tests/conftest.py`` puts the
listed tests in the slow tier, so ``make test`` stays quick and ``make test-slow`` runs them.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

#: A test over this many seconds (two idle cores, xdist with two workers) belongs to the slow tier.
#: At 0.5 s the fast tier measured 81-98 s on one VM from run to run; at 0.3 s it keeps a margin.
SLOW_TEST_S = 0.3
ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "slow_tests.txt"
#: A test id runs to the end of the line: parametrize ids may hold spaces.
_LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(.+?)\s*$")


def durations(report: str) -> dict[str, float]:
    """Seconds per test id from pytest's ``--durations=0`` report (phases summed)."""
    total: dict[str, float] = collections.defaultdict(float)
    for line in report.splitlines():
        m = _LINE.match(line)
        if m:
            total[m.group(3)] += float(m.group(1))
    return dict(total)


def slow_ids(per_test: dict[str, float], threshold: float = SLOW_TEST_S) -> list[str]:
    """The ids over ``threshold``, sorted."""
    return sorted(t for t, s in per_test.items() if s > threshold)


def main() -> int:
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    cmd += ["--durations=0", "--durations-min=0.05"]
    # That test checks the list is not empty, which it is while it is being measured.
    cmd += ["--deselect", "tests/test_tiers.py::test_listed_tests_run_in_the_slow_tier"]
    LIST.write_text("", encoding="utf-8")  # measure every test, the listed ones included
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stdout.write(done.stdout[-4000:])
        print("the suite failed; slow_tests.txt left empty, fix the failures and measure again")
        return 1
    ids = slow_ids(durations(done.stdout))
    header = (
        f"# Tests over {SLOW_TEST_S} s on two idle cores, moved to the slow tier (`make test-slow`).\n"
        "# Written by `make test-durations` (tests/measure_durations.py); do not edit by hand.\n"
    )
    LIST.write_text(header + "".join(f"{t}\n" for t in ids), encoding="utf-8")
    print(f"{len(ids)} tests over {SLOW_TEST_S} s listed in {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
