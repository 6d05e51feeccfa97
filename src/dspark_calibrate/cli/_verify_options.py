"""The options of ``dspark-verify``: one ``Annotated`` alias per option of its own (the shared
``--live-*`` and runtime-form ones live in cli/_common.py and cli/verify_runtime.py), and the
frozen :class:`VerifyOptions` they parse into.

What the options mean is decided by :func:`dspark_calibrate.cli.verify.run_verify`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from dspark_calibrate.cli._numeric import check_max_age_days

__all__ = [
    "ArtifactsArgument",
    "ExpectFingerprintOption",
    "KeyOption",
    "LiveFlag",
    "LiveKOption",
    "LiveLadderOption",
    "MaxAgeDaysOption",
    "NoMixedFlag",
    "OptionalTrustRootOption",
    "RecordFlag",
    "StateOption",
    "UnbindOption",
    "VerboseFlag",
    "VerifyOptions",
]

ArtifactsArgument = Annotated[
    list[Path],
    typer.Argument(
        help="Signed Parquet artifacts and/or bundle directories.", metavar="PATH...", show_default=False
    ),
]
OptionalTrustRootOption = Annotated[
    Path | None,
    typer.Option(
        "--trust-root",
        help="The pinned trust root (root.json) to verify against.",
        metavar="ROOT.json",
        show_default=False,
    ),
]
KeyOption = Annotated[
    Path | None,
    typer.Option(
        "--key",
        help="Verify with this one public key instead of a trust root (one-key setups, like cosign "
        "verify --key): threshold 1, no rotation, no trust-root rollback.",
        metavar="PUB.pem",
        show_default=False,
    ),
]
ExpectFingerprintOption = Annotated[
    Path | None,
    typer.Option(
        "--expect-fingerprint",
        help="Fingerprint JSON the artifact must be bound to (docs/fingerprint.md).",
        metavar="FP.json",
        show_default=False,
    ),
]
LiveFlag = Annotated[
    bool, typer.Option("--live", help="Bind to this host's live deployment (probes plus --live-*).")
]
LiveKOption = Annotated[
    int | None,
    typer.Option("--live-k", help="The engine's K (max draft length).", metavar="K", show_default=False),
]
LiveLadderOption = Annotated[
    str | None,
    typer.Option(
        "--live-ladder",
        help="The engine's rank-local graph ladder.",
        metavar="G1,G2,...",
        show_default=False,
    ),
]
NoMixedFlag = Annotated[
    bool,
    typer.Option("--no-mixed", help="Leave a bundle's mixed evidence out (mixed steps stay native)."),
]
UnbindOption = Annotated[
    list[str] | None,
    typer.Option(
        "--unbind",
        help="Fingerprint field not to compare (repeatable).",
        metavar="FIELD",
        show_default=False,
    ),
]
StateOption = Annotated[
    Path | None,
    typer.Option(
        "--state",
        help="Rollback state file (highest accepted versions, newest trust root).",
        metavar="STATE.json",
        show_default=False,
    ),
]
RecordFlag = Annotated[
    bool, typer.Option("--record/--no-record", help="Record accepted versions in --state.")
]
MaxAgeDaysOption = Annotated[
    float | None,
    typer.Option(
        "--max-age-days",
        help="Refuse artifacts issued longer ago than this (default: no limit; the runtime form: 30).",
        metavar="DAYS",
        show_default=False,
        callback=check_max_age_days,
    ),
]
VerboseFlag = Annotated[bool, typer.Option("--verbose", "-v", help="Print every finding.")]


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """Every ``dspark-verify`` option as parsed, one field per option (same names as the command's
    parameters; ``None``: not given)."""

    artifacts: list[Path]
    trust_root: Path | None
    key: Path | None
    expect_fingerprint: Path | None
    live: bool
    live_k: int | None
    live_ladder: str | None
    live_topology: str | None
    live_gpu: str | None
    live_gpu_count: int | None
    live_gpu_snapshot_sha256: str | None
    live_source_dir: Path | None
    live_source_head: str | None
    live_source_diff: str | None
    live_runtime_snapshot: str | None
    live_model_config: str | None
    live_checkpoint_sha256: str | None
    live_attention_backend: str | None
    live_moe_backend: str | None
    live_kv_dtype: str | None
    live_body_buckets: str | None
    live_execution_mode: str | None
    no_mixed: bool
    unbind: list[str] | None
    state: Path | None
    record: bool
    root_chain: list[Path] | None
    allow_synthetic: bool
    max_age_days: float | None
    verbose: bool
    json_out: bool
    emit_trtllm_options: Path | None
    fail_open_to_static: bool
    selector_identity: str | None
    trtllm_dir: Path | None
    base_options: Path | None
    version: bool
