"""The measured slow tier: the durations parser and the list conftest applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import measured_slow_ids
from tests.measure_durations import SLOW_TEST_S, durations, slow_ids

REPORT = """\
============================= slowest durations ==============================
15.36s setup    tests/a/test_x.py::test_one
0.40s call     tests/a/test_x.py::test_one
0.30s call     tests/b/test_y.py::test_two[p-1]
0.25s setup    tests/b/test_y.py::test_two[p-1]
0.20s call     tests/b/test_y.py::test_three
0.35s call     tests/c/test_z.py::test_cli[fit without --out]
(12 durations < 0.05s hidden.  Use -vv to show these durations.)
"""


def test_phases_of_a_test_are_summed() -> None:
    got = durations(REPORT)
    assert got == pytest.approx(
        {
            "tests/a/test_x.py::test_one": 15.76,
            "tests/b/test_y.py::test_two[p-1]": 0.55,
            "tests/b/test_y.py::test_three": 0.2,
            "tests/c/test_z.py::test_cli[fit without --out]": 0.35,
        }
    )


@pytest.mark.parametrize(
    ("threshold", "expected"),
    [
        (0.5, ["tests/a/test_x.py::test_one", "tests/b/test_y.py::test_two[p-1]"]),
        (
            SLOW_TEST_S,
            [
                "tests/a/test_x.py::test_one",
                "tests/b/test_y.py::test_two[p-1]",
                "tests/c/test_z.py::test_cli[fit without --out]",
            ],
        ),
        (1.0, ["tests/a/test_x.py::test_one"]),
        (20.0, []),
    ],
)
def test_tests_over_the_threshold_are_listed_in_order(threshold: float, expected: list[str]) -> None:
    assert slow_ids(durations(REPORT), threshold) == expected


def test_the_list_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    listed = tmp_path / "slow_tests.txt"
    listed.write_text("# header\n\ntests/a/test_x.py::test_one\n  tests/b/test_y.py::test_two[p-1]  \n")
    assert measured_slow_ids(listed) == {"tests/a/test_x.py::test_one", "tests/b/test_y.py::test_two[p-1]"}
    assert measured_slow_ids(tmp_path / "absent.txt") == frozenset()


def test_listed_tests_run_in_the_slow_tier(request: pytest.FixtureRequest) -> None:
    """The project's list is read, and what it names carries the marker (this test is not listed)."""
    assert measured_slow_ids(), "tests/slow_tests.txt lists no test: run `make test-durations`"
    assert request.node.get_closest_marker("slow") is None
