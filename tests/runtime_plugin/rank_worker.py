"""One rank of the gloo rank-agreement test (run as ``python -m tests.runtime_plugin.rank_worker``).

Joins a gloo process group through a file store, admits the same bundle twice (first with the
live fingerprint of the bundle on every rank, then with a different GPU on the last rank) and
writes both decisions' reason codes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from dspark_calibrate.runtime_plugin.admission import admit
from tests.factories import make_fingerprint
from tests.runtime_plugin.bundles import LATER


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args.store}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=60),
    )
    agree = admit(args.bundle, args.root, live=make_fingerprint(), now=LATER)
    odd_one = make_fingerprint(gpu="B300") if args.rank == args.world - 1 else make_fingerprint()
    disagree = admit(args.bundle, args.root, live=odd_one, now=LATER)
    dist.barrier()
    dist.destroy_process_group()
    args.out.write_text(
        json.dumps(
            {
                "agree": [agree.active, agree.reason_code],
                "disagree": [disagree.active, disagree.reason_code],
                "rank_agreement_ms": disagree.timings_ms.get("rank_agreement"),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
