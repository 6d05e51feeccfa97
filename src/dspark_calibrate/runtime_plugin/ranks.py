"""Rank agreement: every rank of a distributed engine runs the same verification mode.

When ``torch.distributed`` is initialised, each rank publishes a digest of its admission decision's
behaviour (active or not, the engine configuration, the bundle when active) and all ranks gather
all digests. Any disagreement makes every rank inactive with ``RANK_DISAGREEMENT``: a deployment
where one rank verifies dynamically and another statically would desynchronise its collectives
and its step shapes, so the only safe common ground is static K.

Ranks that are all inactive agree even when their reasons differ: they all run static K.

torch is never imported here: if the serving process has not imported it, ``torch.distributed``
cannot be initialised and there is nothing to agree on. :func:`reconcile` is pure; the gather is
injected, so the rule is tested without processes, and with real gloo processes separately.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from dspark_calibrate.artifacts import Finding, Reason
from dspark_calibrate.runtime_plugin.admission_decision import AdmissionDecision

__all__ = ["Gather", "agree", "distributed_ready", "gather_digests", "reconcile"]

#: Collects one string per rank, in rank order, from the local rank's string.
Gather = Callable[[str], Sequence[str]]


def distributed_ready() -> bool:
    """True when torch is already imported and its default process group is initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    dist: Any = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def gather_digests(digest: str, group: Any = None) -> list[str]:
    """All ranks' digests in rank order, through ``torch.distributed.all_gather_object``.

    Every rank of ``group`` must call this exactly once per admission (it is a collective).
    """
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, digest, group=group)
    return [str(d) for d in out]


def reconcile(
    decision: AdmissionDecision, digests: Sequence[str], rank: int | None = None
) -> AdmissionDecision:
    """Apply the agreement rule to one rank's decision given every rank's digest. Pure.

    Args:
        decision: this rank's decision.
        digests: the digests of all ranks, in rank order (this rank's included).
        rank: this rank's index, for the message.

    Returns:
        ``decision`` unchanged when all digests are equal, otherwise an inactive decision with
        ``RANK_DISAGREEMENT`` naming how the ranks split.
    """
    if len(set(digests)) <= 1:
        return decision
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(digests):
        groups.setdefault(d, []).append(i)
    split = "; ".join(
        f"ranks {ranks} -> {d[:12]}" for d, ranks in sorted(groups.items(), key=lambda kv: kv[1])
    )
    mine = decision.agreement_digest()
    where = f"rank {rank}" if rank is not None else "this rank"
    message = (
        f"ranks disagree on the admission decision ({split}); {where} was "
        f"{'active' if decision.active else 'inactive: ' + decision.reason_code}; every rank falls back to "
        "static K; check that all ranks see the same bundle, trust root, state and live fingerprint"
    )
    finding = Finding(Reason.RANK_DISAGREEMENT, message, field="ranks", expected=mine, actual=list(digests))
    return decision.fallback(finding)


def agree(decision: AdmissionDecision, gather: Gather | None = None) -> AdmissionDecision:
    """Exchange decision digests across ranks and reconcile them.

    Args:
        decision: this rank's decision.
        gather: collects every rank's digest; default ``torch.distributed`` when it is initialised.
            Without torch.distributed (and no ``gather``) the decision is returned unchanged.

    Raises:
        Whatever the collective raises (the admission boundary turns it into static K).
    """
    rank: int | None = None
    if gather is None:
        if not distributed_ready():
            return decision
        import torch.distributed as dist

        rank = int(dist.get_rank())
        gather = gather_digests
    return reconcile(decision, gather(decision.agreement_digest()), rank)
