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
