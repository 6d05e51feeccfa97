"""Runtime plugin: the live fingerprint, the admission hook, the reference selector, engine adapters.

Light by design: importing this package pulls in neither torch nor ``dspark_calibrate.calibrate``
(a serving process must not pay for what it does not use).

Example:
    >>> from dspark_calibrate.runtime_plugin import collect_live
    >>> ctx = collect_live(max_draft_len=5, rank_local_graph_batch_sizes=[8, 16], topology="TP1")
    >>> ctx.fingerprint.max_draft_len
    5
"""

from dspark_calibrate.runtime_plugin.live import (
    GpuInfo,
    LiveContext,
    LiveEnvironment,
    SystemEnvironment,
    collect_live,
)

__all__ = ["GpuInfo", "LiveContext", "LiveEnvironment", "SystemEnvironment", "collect_live"]
