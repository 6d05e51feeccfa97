"""Shared pytest configuration: the --update-goldens flag and common fixtures."""

from __future__ import annotations

import pytest


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


# --- the demo's output (built once per session; tests copy before changing) ----------------------


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, dict[str, object]]:
    """``dspark-calibrate demo --json``: its output directory and its JSON result."""
    import json

    from typer.testing import CliRunner

    from dspark_calibrate.cli import build_calibrate_app

    out = tmp_path_factory.mktemp("demo") / "out"
    r = CliRunner().invoke(build_calibrate_app(), ["demo", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)
