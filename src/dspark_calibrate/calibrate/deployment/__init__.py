"""Stage 3, deployment: price the measured cells on a recorded workload and build the bundle.

What lives here (DESIGN §6):

- :mod:`.workload`: the recorded serving steps (``workload`` table), from recorder shards or
  synthesized for demos.
- :mod:`.cells`: the measured cells build prices with (medians, intervals, paired savings, the
  forced-K arm), from sweep or cost-table rows of any schema version.
- :mod:`.uncertainty`: the one uncertainty model: joint draws of the deployed cells' serving costs
  (paired savings, a common level factor, the measured overhead) for the replay's resampling.
- :mod:`.replay`: static K against dynamic verification over the workload, with the runtime's own
  selection rule, goodput, gain and the joint intervals and receipt economics.
- :mod:`.select_cells`: which measured compact cells to deploy (at most 4 per G, 32 in all).
- :mod:`.build`: cross-checks the inputs, selects, replays, signs and verifies the bundle.

May import: ``measurement`` (the cell and statistics types of the sweep it prices),
``confidence`` (the calibration types of the fit it deploys), ``runtime_plugin`` (the pure planner
and economics — ``build`` replays the runtime's own decision functions, so build and serving
cannot disagree), ``artifacts`` (signing and verification, loaded on first use), ``schemas``,
``decision``, ``errors`` and ``calibrate._png``; not ``report``.

Example:
    >>> from dspark_calibrate.calibrate.deployment import synthesize_workload
    >>> workload = synthesize_workload(k=3, steps=20, seed=0)
    >>> workload.k, workload.steps, workload.synthetic
    (3, 20, True)
"""

from dspark_calibrate.calibrate.deployment.build import (
    BuildOptions,
    BuildResult,
    build_bundle,
    load_build_inputs,
)
from dspark_calibrate.calibrate.deployment.cells import CellGrid, CellTime
from dspark_calibrate.calibrate.deployment.replay import (
    BootstrapSettings,
    ReplayReport,
    prepare_evidence,
    replay,
)
from dspark_calibrate.calibrate.deployment.select_cells import CellSelection, SelectionRefused, select_cells
from dspark_calibrate.calibrate.deployment.workload import (
    Workload,
    read_recorder_shards,
    read_workload,
    synthesize_workload,
    workload_from_arrays,
    write_workload,
)

__all__ = [
    "BootstrapSettings",
    "BuildOptions",
    "BuildResult",
    "CellGrid",
    "CellSelection",
    "CellTime",
    "ReplayReport",
    "SelectionRefused",
    "Workload",
    "build_bundle",
    "load_build_inputs",
    "prepare_evidence",
    "read_recorder_shards",
    "read_workload",
    "replay",
    "select_cells",
    "synthesize_workload",
    "workload_from_arrays",
    "write_workload",
]
