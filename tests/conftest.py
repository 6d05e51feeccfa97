"""Shared pytest configuration: the --update-goldens flag, hypothesis profiles, common fixtures."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings

# --- hypothesis profiles -------------------------------------------------------------------------
# ``dev`` (the default) draws new examples each run; ``ci`` draws the same ones every run, with no
# example database, so a CI failure reproduces and a loaded CI machine cannot fail a deadline.
# Tests that set ``max_examples`` themselves keep their own count under both profiles.
settings.register_profile("dev", deadline=None)
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


# --- the measured slow tier ----------------------------------------------------------------------
# Besides the tests marked ``slow`` in their files and those that need the demo's output
# (``demo_run``), a test is in the slow tier when it took longer
# than ``tests/measure_durations.SLOW_TEST_S`` on two idle cores (setup, call and teardown summed):
# ``tests/slow_tests.txt`` lists them, ``make test-durations`` measures again and rewrites it. A test
# whose id is not listed (new, or renamed) stays in the fast tier until the next measurement.
MEASURED_SLOW = Path(__file__).with_name("slow_tests.txt")


def measured_slow_ids(path: Path = MEASURED_SLOW) -> frozenset[str]:
    """The test ids ``slow_tests.txt`` lists (comment and blank lines skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = measured_slow_ids()
    for item in items:
        # A test that needs the whole demo's output is end to end: the demo alone takes 15 s.
        if item.nodeid in slow or "demo_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pytest_report_header(config: pytest.Config) -> str:
    return f"hypothesis profile: {settings.get_current_profile_name()}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="Rewrite golden files and test vectors instead of comparing against them.",
    )


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when golden files should be rewritten."""
    return bool(request.config.getoption("--update-goldens"))


# --- built once per run ------------------------------------------------------------------------
# Under pytest-xdist each worker is its own session, and would build each session fixture itself.
# What lives on disk is built once per run instead: the first worker to ask builds it under a file
# lock in the directory all workers share, and the others read what it wrote.


def built_once(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, build: Callable[[Path], None]
) -> Path:
    """``build(directory)`` run once per test run, however many xdist workers ask; the directory.

    The result is shared read-only: a test that changes it works on a copy.
    """
    if worker_id == "master":  # not under xdist
        directory = tmp_path_factory.mktemp(name)
        build(directory)
        return directory
    shared = tmp_path_factory.getbasetemp().parent / f"once-{name}"
    done = shared / ".built"
    with FileLock(str(shared) + ".lock"):
        if not done.exists():
            shared.mkdir(parents=True, exist_ok=True)
            build(shared)
            done.touch()
    return shared


# --- bundles with mixed evidence (built once per session; tests copy before changing) ---------


@pytest.fixture(scope="session")
def mixed_dep8(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A signed bundle with mixed evidence on TensorRT-LLM's route (K=3, DEP8, six buckets)."""
    from tests.mixed_bundles import build_mixed_bundle

    return build_mixed_bundle(tmp_path_factory.mktemp("mixed-dep8"), ranks=8)


@pytest.fixture(scope="session")
def mixed_tp1(tmp_path_factory: pytest.TempPathFactory) -> object:
    """A signed bundle with mixed evidence of a one-GPU deployment (its own six buckets)."""
    from tests.mixed_bundles import TP1_BUCKETS, TP1_MODEL, build_mixed_bundle

    return build_mixed_bundle(
        tmp_path_factory.mktemp("mixed-tp1"), ranks=1, buckets=TP1_BUCKETS, model=TP1_MODEL
    )


# --- the demo's output (built once per run, shared by the workers; tests copy before changing) ---


def _run_demo(directory: Path) -> None:
    from typer.testing import CliRunner

    from dspark_calibrate.cli import build_calibrate_app

    r = CliRunner().invoke(build_calibrate_app(), ["demo", "--out", str(directory / "out"), "--json"])
    assert r.exit_code == 0, r.output
    (directory / "result.json").write_text(r.stdout, encoding="utf-8")


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> tuple[Path, dict[str, object]]:
    """``dspark-calibrate demo --json``: its output directory and its JSON result."""
    directory = built_once(tmp_path_factory, worker_id, "demo", _run_demo)
    return directory / "out", json.loads((directory / "result.json").read_text(encoding="utf-8"))
