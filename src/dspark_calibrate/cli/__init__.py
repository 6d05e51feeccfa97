"""Command-line apps ``dspark-calibrate`` and ``dspark-verify``: thin shells over the library.

Each command module exposes ``register(app)``; the ``dspark-calibrate`` app is assembled on first
use so that ``dspark-verify`` starts without importing the calibration stack. May import every
layer; a command imports the library it calls inside its own body, so that building the app (for
``--help`` and every command) does not load pyarrow, scipy or the calibration stack.
"""

from __future__ import annotations

import importlib

import typer

from dspark_calibrate.cli._common import VersionFlag, make_app
from dspark_calibrate.cli.verify import verify_app

__all__ = ["build_calibrate_app", "calibrate_main", "verify_main"]

#: Command modules of ``dspark-calibrate``, each with ``register(app)``.
COMMAND_MODULES: tuple[str, ...] = (
    "keys",
    "trust",
    "sign",
    "sweep",
    "fit",
    "workload",
    "build",
    "export",
    "report",
    "schema",
    "demo",
)


def build_calibrate_app() -> typer.Typer:
    """Assemble the ``dspark-calibrate`` Typer app from its command modules."""
    app = make_app(
        "dspark-calibrate",
        "Measure, calibrate, sign and export DSpark dynamic-verification evidence.\n\n"
        "Pipeline: keygen, trust init, sweep, traces/fit, workload, build, export trtllm, report; "
        "serving nodes run dspark-verify. README.md walks through it.",
    )

    @app.callback()
    def root(version: VersionFlag = False) -> None:
        """Measure, calibrate, sign and export DSpark dynamic-verification evidence."""

    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(app)
    return app


def calibrate_main() -> None:
    """Console-script entry point for ``dspark-calibrate``."""
    build_calibrate_app()()


def verify_main() -> None:
    """Console-script entry point for ``dspark-verify``."""
    verify_app()
