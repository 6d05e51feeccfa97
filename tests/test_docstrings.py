"""The usage examples in the package docstrings run (STYLE rule 2: each subpackage shows its use)."""

from __future__ import annotations

import doctest
import importlib

import pytest

PACKAGES = [
    "dspark_calibrate",
    "dspark_calibrate.decision",
    "dspark_calibrate.schemas",
    "dspark_calibrate.artifacts",
    "dspark_calibrate.runtime_plugin",
    "dspark_calibrate.calibrate",
    "dspark_calibrate.calibrate.measurement",
    "dspark_calibrate.calibrate.confidence",
    "dspark_calibrate.calibrate.deployment",
    "dspark_calibrate.calibrate.report",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_docstring_example_runs(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__ and "Example" in module.__doc__, f"{name} has no usage example"
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0
