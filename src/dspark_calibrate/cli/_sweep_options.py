"""The options of ``dspark-calibrate sweep``: one ``Annotated`` alias per option, and the frozen
:class:`SweepOptions` they parse into.

The command's signature lists each option once by its alias (cli/sweep.py); what the options
mean for a run is decided by :func:`dspark_calibrate.cli.sweep.run_sweep`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "BackendOptPairs",
    "BackendOption",
    "BudgetOption",
    "BudgetsOption",
    "ClockPolicyOption",
    "ConfigOption",
    "ContextLenOption",
    "ControlFlag",
    "DeviceOption",
    "DwellOption",
    "EpochsRequiredOption",
    "FactoryOption",
    "FingerprintOption",
    "ForcedKFlag",
    "InputPathOption",
    "InterleaveFlag",
    "JournalOption",
    "KOption",
    "LadderOption",
    "LayersOption",
    "MaxCandidatesOption",
    "MaxCellSecondsOption",
    "MaxSamplesOption",
    "MemoryCheckFlag",
    "MinRoundsOption",
    "MinSamplesOption",
    "MinTimeOption",
    "MinVerifyLenOption",
    "MixedBucketsOption",
    "MixedExecutionModeOption",
    "MixedFlag",
    "MixedGridOption",
    "MixedMaxCellsOption",
    "MixedWorkloadOption",
    "ModelOption",
    "OrderOption",
    "OutOption",
    "PassIndexOption",
    "PassesOption",
    "PlotFlag",
    "PrecisionOption",
    "PresetOption",
    "ProtocolOption",
    "RecaptureEveryOption",
    "ReplaysOption",
    "RequirePrecisionFlag",
    "ResumeFlag",
    "RewarmOption",
    "SamplesPerVisitOption",
    "SeedOption",
    "SettleOption",
    "SweepOptions",
    "ThrottlePolicyOption",
    "UntilRoundOption",
    "VerboseFlag",
    "WarmupOption",
    "WorkloadOption",
]

#: The help panel of the mixed prefill+decode options.
_MIXED = "Mixed prefill+decode"

KOption = Annotated[
    int,
    typer.Option("--k", help="Physical draft length K (drafted tokens per block).", metavar="K"),
]
LadderOption = Annotated[
    str,
    typer.Option("--ladder", help="Rank-local graph batch sizes, e.g. 8,16,32.", metavar="G1,G2,..."),
]
OutOption = Annotated[
    Path,
    typer.Option(
        "--out",
        help="Summary Parquet; samples go to <stem>.samples.parquet.",
        metavar="SWEEP.parquet",
    ),
]
BackendOption = Annotated[
    str,
    typer.Option(
        "--backend",
        help="synthetic | reference | module | trtllm | import-samples | pkg.mod:Factory.",
        metavar="NAME",
    ),
]
BudgetsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--budgets",
        help="Compact budgets for one G, e.g. 16:20,24,32 (repeatable; default: all, thinned to "
        "--max-candidates).",
        metavar="G:V1,V2",
        show_default=False,
    ),
]
MaxCandidatesOption = Annotated[
    int, typer.Option(help="Default compact candidates per G before thinning.", metavar="N")
]
ControlFlag = Annotated[bool, typer.Option("--control/--no-control", help="Measure V=G*(K+1) as a control.")]
ForcedKFlag = Annotated[
    bool,
    typer.Option(
        "--forced-k/--no-forced-k",
        help="Measure the forced-K arm (confidence path on, windows forced to K) of every G "
        "when the backend offers it; build charges its excess as the per-step overhead.",
    ),
]
ThrottlePolicyOption = Annotated[
    str,
    typer.Option(
        help="Which throttled samples to keep: serving (keep power-capped samples, the steady "
        "state of a serving GPU; drop thermal and hardware slowdowns), strict (drop every "
        "slowdown) or keep-all.",
        metavar="POLICY",
    ),
]
RecaptureEveryOption = Annotated[
    int | None,
    typer.Option(
        help="Rounds per capture epoch: every that many rounds each cell is captured again and "
        "fully re-warmed, so the sweep estimates its own between-run variation (0: never; "
        "default 3, quick preset 2).",
        metavar="ROUNDS",
        show_default=False,
    ),
]
PassesOption = Annotated[
    int,
    typer.Option(
        min=1,
        help="Run the sweep as this many consecutive processes over one journal, each one "
        "capture epoch of --recapture-every rounds, so what a new process draws (context, "
        "memory layout, clock state) enters the intervals; every cell spans all passes.",
    ),
]
UntilRoundOption = Annotated[
    int | None, typer.Option(hidden=True, help="End this process's pass before this round.")
]
EpochsRequiredOption = Annotated[
    int | None, typer.Option(hidden=True, help="Epochs a cell spans before it may stop.")
]
PassIndexOption = Annotated[int | None, typer.Option(hidden=True, help="This process's pass (its epoch).")]
OrderOption = Annotated[
    str,
    typer.Option(
        help="Visiting order in a round: random (seeded), or serving: one G's cells together, moving "
        "between G the way --workload's steps do, so carry-over between visits is the serving mix's.",
        metavar="ORDER",
    ),
]
InterleaveFlag = Annotated[
    bool | None,
    typer.Option(
        "--interleave/--no-interleave",
        help="Visit a G's open cells together in one sequence that alternates them step by step, as a "
        "policy does, so every cell is timed at the clock the G's mix runs at (not the higher clock a "
        "light cell reaches alone under a power cap). Off by default; on with --preset power-capped.",
        show_default=False,
    ),
]
SettleOption = Annotated[
    float | None,
    typer.Option(
        "--settle-s",
        help="With --interleave: seconds each visit runs its G's mix untimed before timing it "
        "(default 0.2). A power-capped GPU's clock follows a new mix over seconds; see docs/sweep.md.",
        metavar="S",
        show_default=False,
    ),
]
DwellOption = Annotated[
    str | None,
    typer.Option(
        "--dwell",
        help="With --interleave: the mean run, in steps, your policy stays on one cell (1 = it switches "
        "every step): one for every G (2.7), one per G (8=1.4,16=2.1,...,256=3.1), or a bare value for "
        "the G not named (2.7,256=3.1); build reports the replayed policy's per G and the --dwell to "
        "give. Every visit is then timed in runs of its G's length, instead of half the rounds "
        "switching every step and half in runs of four. At a power cap a saving moves with it by up "
        "to 3-4 pp at large G; see docs/sweep.md.",
        metavar="STEPS|G=STEPS,...",
        show_default=False,
    ),
]
ResolveOption = Annotated[
    float | None,
    typer.Option(
        "--resolve",
        help="With --interleave: keep each G measuring (all its cells timed) until its own cells "
        "resolve a between-run shift of this size (0.004 = 0.4%), or the budget ends; the summary "
        "states what each G resolves and how many times its epochs it would need. Off by default: a G "
        "stops when its cells reach --precision. Costs time at the heavy G (2-4x their epochs on an "
        "H200 at its cap); see docs/sweep.md.",
        metavar="REL",
        show_default=False,
    ),
]
WorkloadOption = Annotated[
    Path | None,
    typer.Option(
        help="--order serving: the recorded workload whose step-to-step moves between G the rounds follow.",
        metavar="WORKLOAD.parquet",
        show_default=False,
    ),
]
ProtocolOption = Annotated[
    str, typer.Option(help="adaptive (rounds, stop on precision) or fixed (128+64).", metavar="NAME")
]
PresetOption = Annotated[
    str,
    typer.Option(
        help="Threshold preset: default; quick (2% precision, small caps: CPU trials); or power-capped "
        "(the design held out on an H200 at its power cap: --interleave, --settle-s 0.75, 6 samples per "
        "visit, a capture epoch every 6 rounds, 0.4% precision, a 320-sample cap; options given win).",
        metavar="NAME",
    ),
]
PrecisionOption = Annotated[
    float | None,
    typer.Option(
        help="Target relative half-width (default 0.005 = 0.5%; quick preset 0.02).",
        metavar="REL",
        show_default=False,
    ),
]
MinSamplesOption = Annotated[
    int | None,
    typer.Option(help="Kept samples before a cell may stop (default 8).", metavar="N", show_default=False),
]
MinRoundsOption = Annotated[
    int | None,
    typer.Option(help="Rounds before a cell may stop (default 6).", metavar="N", show_default=False),
]
MinTimeOption = Annotated[
    float | None,
    typer.Option(help="Seconds per cell before it may stop (default 0).", metavar="S", show_default=False),
]
MaxSamplesOption = Annotated[
    int | None,
    typer.Option(help="Per-cell sample cap (default 128; quick preset 48).", metavar="N", show_default=False),
]
MaxCellSecondsOption = Annotated[
    float | None,
    typer.Option(help="Per-cell time cap in s (default 60; quick 10).", metavar="S", show_default=False),
]
BudgetOption = Annotated[
    float | None,
    typer.Option(help="Total sweep budget in s (default 3600; quick 600).", metavar="S", show_default=False),
]
WarmupOption = Annotated[
    int | None,
    typer.Option(
        help="Warm-up replays on a cell's first visit (default 8).", metavar="N", show_default=False
    ),
]
RewarmOption = Annotated[
    int | None,
    typer.Option(help="Warm-up replays on later visits (default 2).", metavar="N", show_default=False),
]
ReplaysOption = Annotated[
    int | None,
    typer.Option(help="Back-to-back replays per sample (default 2).", metavar="N", show_default=False),
]
SamplesPerVisitOption = Annotated[
    int | None, typer.Option(help="Samples per visit (default 2).", metavar="N", show_default=False)
]
SeedOption = Annotated[int, typer.Option(help="Seed of the round order and the bootstrap.", metavar="N")]
ResumeFlag = Annotated[bool, typer.Option("--resume", help="Continue the journal of an interrupted sweep.")]
JournalOption = Annotated[
    Path | None,
    typer.Option(help="Journal path (default <stem>.journal.jsonl).", metavar="FILE", show_default=False),
]
ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        help="reference: HF-style config.json, or a bundled one: tiny, mla-tiny, deepseek-v3, llama-8b.",
        metavar="CONFIG",
        show_default=False,
    ),
]
LayersOption = Annotated[
    int | None,
    typer.Option(help="reference: layers to build (default: the config's).", metavar="N", show_default=False),
]
ContextLenOption = Annotated[
    int | None,
    typer.Option(
        help="reference: KV-cache tokens per row (default 256).", metavar="TOKENS", show_default=False
    ),
]
DeviceOption = Annotated[
    str | None,
    typer.Option(
        help="reference: cpu or cuda[:i] (default: cuda when available).",
        metavar="DEV",
        show_default=False,
    ),
]
ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="trtllm: the model path or name for tensorrt_llm.LLM.",
        metavar="MODEL",
        show_default=False,
    ),
]
FactoryOption = Annotated[
    str | None,
    typer.Option(
        help="module: pkg.mod:factory returning a step for (G, V, K).",
        metavar="PKG.MOD:FN",
        show_default=False,
    ),
]
InputPathOption = Annotated[
    Path | None,
    typer.Option("--input", help="import-samples: profiler JSONL.", metavar="FILE", show_default=False),
]
BackendOptPairs = Annotated[
    list[str] | None,
    typer.Option(
        help="Backend option key=value (JSON value), e.g. ep=8, lm_head=false (repeatable).",
        metavar="KEY=VALUE",
        show_default=False,
    ),
]
MemoryCheckFlag = Annotated[
    bool,
    typer.Option(
        "--memory-check/--no-memory-check",
        help="reference: refuse to start when the estimated memory exceeds what the machine has.",
    ),
]
FingerprintOption = Annotated[
    Path | None,
    typer.Option(
        help="Fingerprint JSON with fields the sweep cannot establish (docs/fingerprint.md).",
        metavar="FP.json",
        show_default=False,
    ),
]
ClockPolicyOption = Annotated[
    str | None,
    typer.Option(help="GPU clock policy, e.g. default or locked:1980.", metavar="POLICY", show_default=False),
]
PlotFlag = Annotated[bool, typer.Option("--plot/--no-plot", help="Write <stem>.png (needs matplotlib).")]
RequirePrecisionFlag = Annotated[bool, typer.Option(help="Exit 1 unless every cell reached precision.")]
VerboseFlag = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Print every cell's row (the default prints one row per G; every cell is in the summary Parquet).",
    ),
]
MixedFlag = Annotated[
    bool,
    typer.Option(
        "--mixed",
        help="Measure mixed prefill+decode cells (each paired with its step's native width) instead of "
        "decode cells; see docs/mixed.md.",
        rich_help_panel=_MIXED,
    ),
]
MixedWorkloadOption = Annotated[
    Path | None,
    typer.Option(
        help="--mixed: a recorded workload whose mixed steps say what to measure.",
        metavar="WORKLOAD.parquet",
        show_default=False,
        rich_help_panel=_MIXED,
    ),
]
MixedGridOption = Annotated[
    Path | None,
    typer.Option(
        help="--mixed: a JSON grid of steps to measure (instead of a workload).",
        metavar="GRID.json",
        show_default=False,
        rich_help_panel=_MIXED,
    ),
]
MixedBucketsOption = Annotated[
    str,
    typer.Option(
        help="--mixed: the captured prefill body buckets (rows).",
        metavar="B1,B2,...",
        rich_help_panel=_MIXED,
    ),
]
MixedExecutionModeOption = Annotated[
    str,
    typer.Option(
        help="--mixed: the prefill graph mode of the deployment.",
        metavar="MODE",
        rich_help_panel=_MIXED,
    ),
]
MixedMaxCellsOption = Annotated[
    int,
    typer.Option(
        help="--mixed: cells to measure at most (TensorRT-LLM holds <= 256).",
        metavar="N",
        rich_help_panel=_MIXED,
    ),
]
MinVerifyLenOption = Annotated[
    int,
    typer.Option(
        help="--mixed: draft tokens an eligible generation always keeps.",
        metavar="N",
        rich_help_panel=_MIXED,
    ),
]


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Every ``sweep`` option as parsed, one field per option (same names as the command's
    parameters; ``None``: not given)."""

    k: int
    ladder: str
    out: Path
    backend: str
    budgets: list[str] | None
    max_candidates: int
    control: bool
    forced_k: bool
    throttle_policy: str
    recapture_every: int | None
    passes: int
    until_round: int | None
    epochs_required: int | None
    pass_index: int | None
    protocol: str
    order: str
    interleave: bool | None
    settle_s: float | None
    dwell: str | None
    resolve: float | None
    workload: Path | None
    preset: str
    precision: float | None
    min_samples: int | None
    min_rounds: int | None
    min_time: float | None
    max_samples: int | None
    max_cell_seconds: float | None
    budget: float | None
    warmup: int | None
    rewarm: int | None
    replays: int | None
    samples_per_visit: int | None
    seed: int
    resume: bool
    journal: Path | None
    config: str | None
    layers: int | None
    context_len: int | None
    device: str | None
    model: str | None
    factory: str | None
    input_path: Path | None
    backend_opt: list[str] | None
    memory_check: bool
    fingerprint: Path | None
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
    clock_policy: str | None
    plot: bool
    require_precision: bool
    verbose: bool
    mixed: bool
    mixed_workload: Path | None
    mixed_grid: Path | None
    mixed_buckets: str
    mixed_execution_mode: str
    mixed_max_cells: int
    min_verify_len: int
    as_json: bool
