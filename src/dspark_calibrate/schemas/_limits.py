"""Engine limits on the cells a deployment carries (DESIGN §2, "cell"). Imports nothing.

TensorRT-LLM's exact SPS table, and so every artifact that feeds it, holds at most
:data:`MAX_COMPACT_CELLS_PER_G` compact cells per graph batch size and
:data:`MAX_COMPACT_CELLS_TOTAL` in all. The runtime planner, the sweep ladder, cell selection,
the cost-table content rules and the TensorRT-LLM exporter all read these two numbers from here.
"""

from __future__ import annotations

__all__ = ["MAX_COMPACT_CELLS_PER_G", "MAX_COMPACT_CELLS_TOTAL", "MAX_COST_TABLE_ROWS", "MAX_MIXED_CELLS"]

#: Compact cells (G <= V < G·(K+1)) per graph batch size G.
MAX_COMPACT_CELLS_PER_G = 4
#: Compact cells in all.
MAX_COMPACT_CELLS_TOTAL = 32
#: Rows of a signed ``cost-table``, native cells included: the format stays within the engine's
#: total even counting the natives, so ``build`` selects at most ``32 - len(ladder)`` compact cells.
MAX_COST_TABLE_ROWS = MAX_COMPACT_CELLS_TOTAL
#: Mixed prefill+decode cells of one deployment: TensorRT-LLM's mixed cost file holds 1 to 256.
#: The mixed sweep measures at most this many candidate geometries, build deploys at most this many
#: and the exporter refuses more.
MAX_MIXED_CELLS = 256
