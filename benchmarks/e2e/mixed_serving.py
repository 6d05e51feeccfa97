"""Prefill traffic for the serving engine: chunked prefill in mixed prefill+decode steps.

Requests arrive on a fixed schedule (step indices) while others decode. An arrived request takes
a *prefill slot* and runs its prompt in chunks of ``chunk`` tokens, one chunk per step; while any
request is prefilling, a step is **mixed**: its context chunks and every decoding request's
verification rows run in one forward over a *body capacity* of packed rows (a bucket of the
route; pad rows included, as the consumer's captured prefill graphs run them). Steps without a
chunk are decode steps and run the engine's CUDA-graph cells exactly as :func:`serving.serve`
does. When a request's last chunk has run, its first token and first drafts come from that
forward and it joins the decoding rows in the next step.

**Mixed step.** Generation rows are packed first (anchor plus the verified drafts of each row),
then the chunks, then zero pad rows up to the capacity. Every GEMM runs over the whole capacity
in chunks of ``gemm_chunk`` tokens (the decode steps' batch-invariant numerics); attention runs
twice per layer, the generation rows in the decode steps' ``[rows, K+1]`` layout over their slots'
caches and the chunks in a ``[chunks, chunk]`` layout over theirs, each per (row, head) tile.
Greedy outputs therefore do not depend on the capacity a mixed step runs in, nor on whether a
token was verified in a decode or a mixed step.

**What a mixed step runs.** ``native``: the smallest bucket holding the native rows (context rows
plus K+1 rows per generation), every window K. With admitted mixed evidence, the toolkit's mixed
selector (``runtime_plugin.mixed.choose_mixed``: exact geometry lookup, the first-chunk rule, the
score test) picks the capacity and ``mixed_windows`` the windows; a step whose geometry has no
admitted cell runs native. Generation requests are all eligible and none is a bootstrap request:
this engine's first drafts come with confidence from the prefill forward.

Mixed steps are eager (host-packed) by default; ``mixed_graphs.MixedSteps`` runs them at fixed shapes,
one CUDA graph per body bucket. Decode steps keep their graphs.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from .model import Block
from .serving import (
    Engine,
    Policy,
    Slots,
    StepOutput,
    _chunked_linear,
    _compact,
    block_out,
    block_qkv,
    grouped_attention,
)

__all__ = [
    "ChunkRecord",
    "MixedArm",
    "MixedOut",
    "MixedRecord",
    "MixedRun",
    "MixedTraffic",
    "burst_arrivals",
    "enlarge_caches",
    "mixed_check",
    "mixed_factory",
    "mixed_forward",
    "paid_capacity",
    "register_mixed_engine",
    "serve_mixed",
]


@dataclass(frozen=True, slots=True)
class MixedTraffic:
    """The prefill traffic's shape.

    Attributes:
        chunk: context tokens per chunk (the prompt length is a multiple of it).
        prefill_slots: requests that may prefill at once (cache slots above the decoding ones).
        max_decoding: decoding requests at most (a request waits for a slot beyond it).
        buckets: body capacities (rows) a mixed step may run in, increasing.
    """

    chunk: int
    prefill_slots: int
    max_decoding: int
    buckets: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "chunk": self.chunk,
            "prefill_slots": self.prefill_slots,
            "max_decoding": self.max_decoding,
            "buckets": list(self.buckets),
        }


def burst_arrivals(requests: int, burst: int, period: int, start: int = 0) -> np.ndarray:
    """Step index at which each request arrives: ``burst`` requests every ``period`` steps."""
    return (start + (np.arange(requests) // burst) * period).astype(np.int64)


def paid_capacity(native_rows: int, buckets: Sequence[int]) -> int:
    """The smallest bucket holding ``native_rows``.

    Raises:
        ValueError: no bucket holds them (the traffic exceeds the route's grid).
    """
    for b in buckets:
        if b >= native_rows:
            return int(b)
    raise ValueError(f"{native_rows} native rows exceed the largest body bucket {buckets[-1]}")


def enlarge_caches(engine: Engine, slots: int) -> None:
    """Give the engine ``slots`` cache slots (decoding slots first, prefill slots above them).

    Call before any cell is prepared: captured graphs hold the cache tensors they were captured with.
    """
    if engine.cells:
        raise RuntimeError("enlarge the caches before preparing cells (graphs keep the old tensors)")
    shape = list(engine.cache_k.shape)
    if slots <= shape[1]:
        return
    shape[1] = slots
    engine.cache_k = engine.cache_k.new_zeros(shape)
    engine.cache_v = torch.zeros_like(engine.cache_k)


@dataclass(frozen=True, slots=True)
class MixedOut:
    """What a mixed forward returns (host arrays).

    Attributes:
        gen: of the ``n`` generation rows, as a decode step's.
        first, first_drafts, first_confidence: of the chunks flagged ``last`` (their requests'
            first token, drafts and confidence logits), in chunk order.
        pred: greedy token of every generation row position, ``[n, K+1]`` (-1 where not verified;
            only with ``keep_pred``).
    """

    gen: StepOutput
    first: np.ndarray
    first_drafts: np.ndarray
    first_confidence: np.ndarray
    pred: np.ndarray | None = None


@torch.no_grad()
def mixed_forward(
    engine: Engine,
    *,
    capacity: int,
    n: int,
    windows: np.ndarray,
    lengths: np.ndarray,
    anchors: np.ndarray,
    drafts: np.ndarray,
    chunk_slots: np.ndarray,
    chunk_pos: np.ndarray,
    chunk_tokens: np.ndarray,
    last: np.ndarray,
    keep_pred: bool = False,
) -> MixedOut:
    """One mixed step: the generation rows of slots ``0..n-1`` and the chunks, over ``capacity`` rows.

    Args:
        capacity: body rows the GEMMs run over (pad rows included; rounded up to the GEMM chunk).
        n: generation rows (slots ``0..n-1``).
        windows: drafts verified per generation row, ``[n]`` in ``0..K``.
        lengths, anchors, drafts: per slot, as for :meth:`Engine.step`.
        chunk_slots, chunk_pos: per chunk, its request's cache slot and prompt position.
        chunk_tokens: ``[m, chunk]`` prompt tokens of the chunks.
        last: ``[m]`` the chunk ends its prompt (its first token and drafts are returned).
        keep_pred: also return every verified position's greedy token (the output check).

    Raises:
        ValueError: the rows do not fit the capacity.
    """
    cfg, mc, tgt, dev = engine.cfg, engine.target.cfg, engine.target, engine.device
    k, width, chunk = cfg.k, cfg.width, cfg.gemm_chunk
    m = int(chunk_slots.shape[0])
    size = int(chunk_tokens.shape[1]) if m else 0
    w1 = windows[:n].astype(np.int64) + 1
    tg = int(w1.sum())
    total = tg + m * size
    if total > capacity:
        raise ValueError(f"{tg} generation rows and {m * size} context rows exceed the capacity {capacity}")
    cap = -(-capacity // chunk) * chunk
    row = np.repeat(np.arange(n, dtype=np.int64), w1)
    j = np.arange(tg, dtype=np.int64) - np.repeat(np.cumsum(w1) - w1, w1)
    table = np.concatenate([anchors[:n, None], drafts[:n]], axis=1) if n else np.zeros((0, width), np.int64)
    tok = np.zeros(cap, dtype=np.int64)
    pos = np.zeros(cap, dtype=np.int64)
    slot = np.zeros(total, dtype=np.int64)
    tok[:tg], pos[:tg], slot[:tg] = table[row, j], lengths[row] + j, row
    if m:
        cpos = chunk_pos[:, None] + np.arange(size)[None, :]
        tok[tg:total] = chunk_tokens.reshape(-1)
        pos[tg:total] = cpos.reshape(-1)
        slot[tg:total] = np.repeat(chunk_slots, size)
    t_tok, t_pos, t_slot = (torch.from_numpy(a).to(dev) for a in (tok, pos, slot))
    gflat = torch.from_numpy(row * width + j).to(dev)
    keys = torch.arange(cfg.max_len, device=dev)
    cos, sin = tgt.rope_cos[t_pos][:, None, :], tgt.rope_sin[t_pos][:, None, :]
    if n:
        qpos = torch.from_numpy(lengths[:n, None] + np.arange(width)[None, :]).to(dev)
        gmask = (keys[None, None, :] <= qpos[:, :, None]).repeat(1, mc.group, 1)[:, None]
    if m:
        c_slots = torch.from_numpy(chunk_slots.astype(np.int64)).to(dev)
        cq = torch.from_numpy(chunk_pos[:, None] + np.arange(size)[None, :]).to(dev)
        cmask = (keys[None, None, :] <= cq[:, :, None]).repeat(1, mc.group, 1)[:, None]
    x = tgt.embed(t_tok)
    with sdpa_kernel([engine.backend]):
        for layer, blk in enumerate(tgt.blocks):
            assert isinstance(blk, Block)
            q, k_new, v_new = block_qkv(tgt, blk, x, cos, sin, chunk)
            ck, cv = engine.cache_k[layer], engine.cache_v[layer]
            ck[t_slot, t_pos[:total]] = k_new[:total]
            cv[t_slot, t_pos[:total]] = v_new[:total]
            packed = x.new_zeros(cap, mc.d_model)
            if n:
                qpad = q.new_zeros(n * width, mc.n_heads, mc.head_dim)
                qpad.index_copy_(0, gflat, q[:tg])
                o = grouped_attention(qpad, n, width, ck[:n], cv[:n], gmask, mc)
                packed[:tg] = o.index_select(0, gflat)
            if m:
                kc, vc = ck.index_select(0, c_slots), cv.index_select(0, c_slots)
                packed[tg:total] = grouped_attention(q[tg:total], m, size, kc, vc, cmask, mc)
            x = block_out(blk, x, packed, chunk)
        hid = tgt.ln_f(x)
        pred = _chunked_linear(hid, tgt.lm_head.weight, chunk).argmax(-1)
    empty = np.zeros((0, k), dtype=np.int64)
    accepted = bonus = np.zeros(0, dtype=np.int64)
    out_drafts, out_conf, pred_host = empty, empty.astype(np.float32), None
    if n:
        pred_pad = torch.full((n * width,), -1, dtype=torch.int64, device=dev)
        pred_pad.index_copy_(0, gflat, pred[:tg])
        pred_pad = pred_pad.view(n, width)
        hid_pad = hid.new_zeros(n * width, mc.d_model)
        hid_pad.index_copy_(0, gflat, hid[:tg])
        win = torch.from_numpy(windows[:n].astype(np.int64)).to(dev)
        live = torch.arange(k, device=dev)[None, :] < win[:, None]
        dr = torch.from_numpy(drafts[:n]).to(dev)
        acc = torch.cumprod(((dr == pred_pad[:, :k]) & live).to(torch.int64), dim=1).sum(1)
        bon = pred_pad.gather(1, acc[:, None]).squeeze(1)
        h_last = hid_pad.view(n, width, mc.d_model)[torch.arange(n, device=dev), acc]
        nd, nc = engine.drafter.draft(h_last, bon)
        accepted, bonus = acc.cpu().numpy(), bon.cpu().numpy()
        out_drafts, out_conf = nd.cpu().numpy().astype(np.int64), nc.float().cpu().numpy()
        if keep_pred:
            pred_host = pred_pad.cpu().numpy()
    first, f_drafts, f_conf = np.zeros(0, dtype=np.int64), empty, empty.astype(np.float32)
    ends = np.flatnonzero(last)
    if ends.size:
        idx = torch.from_numpy(tg + ends * size + size - 1).to(dev)
        ft = pred[idx]
        fd, fc = engine.drafter.draft(hid[idx], ft)
        first, f_drafts, f_conf = (
            ft.cpu().numpy(),
            fd.cpu().numpy().astype(np.int64),
            fc.float().cpu().numpy(),
        )
    if dev.type == "cuda":
        torch.cuda.current_stream(dev).synchronize()
    return MixedOut(StepOutput(accepted, bonus, out_drafts, out_conf), first, f_drafts, f_conf, pred_host)


# -- arms and records ----------------------------------------------------------------------------
@dataclass
class MixedArm:
    """One arm of the experiment.

    Attributes:
        name: the arm's name in results.
        decode: the decode steps' policy (static K, or the admitted selector/allocator).
        table: the admitted mixed cost table (None: every mixed step runs native).
        calibration: the admitted calibration (the mixed selector's survivals; with ``table``).
        min_verify_len: the runtime's verify floor.
        plan_on_mixed: run the decode policy's planner on mixed steps too and discard its plan
            (the confidence path runs every step; without mixed evidence the step stays native).
    """

    name: str
    decode: Policy
    table: Any = None
    calibration: Any = None
    min_verify_len: int = 1
    plan_on_mixed: bool = False


@dataclass(frozen=True, slots=True)
class MixedRecord:
    """One generation row of one step (decode or mixed): a workload row with its KV history."""

    step: int
    request: int
    round: int
    confidence: np.ndarray
    accepted: int
    verified: int
    output_len: int
    history: int
    mixed: bool


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One context chunk of one mixed step."""

    step: int
    request: int
    size: int
    position: int


@dataclass
class MixedRun:
    """One serving run with prefill traffic.

    Attributes:
        arm: the arm's name.
        outputs: ``[requests, max_new]`` generated tokens.
        tokens: tokens emitted by generation rows (decode and mixed steps; not the first tokens).
        seconds: wall time of every step (decode, mixed and prefill-only): planning, packing,
            the device, bookkeeping.
        steps, mixed_steps, prefill_only_steps: steps run, mixed ones (a chunk and generation
            rows), steps with chunks only.
        covered_steps: mixed steps some of whose candidate geometries have an admitted cell.
        step_log: per step ``(step, kind, ms, G, V, "")`` for decode steps and ``(step, kind, ms,
            capacity, native capacity, reason)`` for mixed and prefill-only steps.
        reasons: the mixed selector's reasons over mixed steps, counted (``native`` without evidence).
        mixed_cells: geometry SHA-256 of each admitted cell a mixed step ran, counted.
        waiting: per step (parallel to ``step_log``), the requests that had arrived and waited for
            a slot when it started (the workload's queue depth).
    """

    arm: str
    outputs: np.ndarray
    tokens: int = 0
    seconds: float = 0.0
    mixed_seconds: float = 0.0
    decode_seconds: float = 0.0
    plan_seconds: float = 0.0
    steps: int = 0
    mixed_steps: int = 0
    covered_steps: int = 0
    prefill_only_steps: int = 0
    step_log: list[tuple[int, str, float, int, int, str]] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    mixed_cells: Counter[str] = field(default_factory=Counter)
    records: list[MixedRecord] = field(default_factory=list)
    chunks: list[ChunkRecord] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """Generated tokens per second of serving steps."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mixed_share(self) -> float:
        """Mixed steps (chunks and generation rows) over all steps."""
        return self.mixed_steps / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready numbers (no outputs, no records)."""
        return {
            "arm": self.arm,
            "requests": int(self.outputs.shape[0]),
            "tokens": self.tokens,
            "seconds": self.seconds,
            "goodput_tok_s": self.goodput,
            "steps": self.steps,
            "mixed_steps": self.mixed_steps,
            "prefill_only_steps": self.prefill_only_steps,
            "covered_steps": self.covered_steps,
            "mixed_share": self.mixed_share,
            "mixed_seconds": self.mixed_seconds,
            "decode_seconds": self.decode_seconds,
            "plan_ms_per_step": 1000.0 * self.plan_seconds / max(self.steps, 1),
            "mixed_reasons": dict(self.reasons),
            "mixed_cells_used": len(self.mixed_cells),
            "mixed_compact_steps": int(sum(self.mixed_cells.values())),
        }


def _mixed_choice(
    arm: MixedArm, n: int, conf: np.ndarray, lengths: np.ndarray, chunk_pos: np.ndarray, size: int, k: int
) -> tuple[Any, np.ndarray]:
    """The mixed selector's choice for one step and the windows it gives the generation rows."""
    from dspark_calibrate.artifacts import ContextChunk, GenerationRequest, MixedStep, RankStep
    from dspark_calibrate.runtime_plugin.mixed import choose_mixed, mixed_windows

    step = MixedStep(
        (
            RankStep(
                tuple(ContextChunk(size, int(p)) for p in chunk_pos),
                tuple(GenerationRequest(int(h)) for h in lengths[:n]),
            ),
        )
    )
    surv = [arm.calibration.survival(conf[:n]) if n else np.zeros((0, k))]
    feats = step.features(k)
    choice = choose_mixed(step, surv, arm.table, features=feats)
    windows = mixed_windows(step, surv, choice, k, arm.min_verify_len, features=feats)[0]
    return choice, windows


def serve_mixed(
    engine: Engine,
    prompts: np.ndarray,
    arrivals: np.ndarray,
    *,
    traffic: MixedTraffic,
    max_new: int,
    arm: MixedArm,
    record: bool = False,
    steps: Any = None,
) -> MixedRun:
    """Serve every prompt greedily, requests arriving at ``arrivals`` (step indices, non-decreasing).

    Decoding requests occupy slots ``0..n-1`` (``n ≤ traffic.max_decoding``); prefilling ones the
    slots from ``traffic.max_decoding`` up. A step with a chunk is mixed (see the module doc); with
    ``steps`` (a ``mixed_graphs.MixedSteps``) it runs at the fixed shapes of its body bucket.

    Raises:
        ValueError: shapes that do not fit the engine or the route's buckets.
    """
    cfg = engine.cfg
    total, plen = prompts.shape
    size, k, width = traffic.chunk, cfg.k, cfg.width
    if plen % size:
        raise ValueError(f"prompt length {plen} is not a multiple of the chunk {size}")
    if plen + max_new + width > cfg.max_len:
        raise ValueError(f"prompt {plen} + {max_new} new tokens + K+1 exceed the cache length {cfg.max_len}")
    n_slots = engine.cache_k.shape[1]
    if traffic.max_decoding > cfg.slots or traffic.max_decoding + traffic.prefill_slots > n_slots:
        raise ValueError(
            f"{traffic.max_decoding} decoding + {traffic.prefill_slots} prefill slots do not fit "
            f"{n_slots} cache slots and the ladder's {cfg.slots} rows"
        )
    st = Slots.empty(n_slots, k)  # prefilling requests keep req -1: compaction moves decoding ones only
    req, length, anchor, drafts, conf, produced, rounds = (
        st.req, st.length, st.anchor, st.drafts, st.conf, st.produced, st.rounds,
    )  # fmt: skip
    outputs = np.zeros((total, max_new), dtype=np.int64)
    flat_out = outputs.reshape(-1)
    run = MixedRun(arm=arm.name, outputs=outputs)
    prefill: list[list[int]] = []  # [request, slot, next position]
    free_prefill = list(range(traffic.max_decoding, traffic.max_decoding + traffic.prefill_slots))
    queue: list[int] = []
    nxt, n, step, done = 0, 0, 0, 0
    while done < total:
        while nxt < total and arrivals[nxt] <= step:
            queue.append(nxt)
            nxt += 1
        while queue and free_prefill and n + len(prefill) < traffic.max_decoding:
            prefill.append([queue.pop(0), free_prefill.pop(0), 0])
        if n == 0 and not prefill:
            assert nxt < total, "nothing in flight, nothing queued, requests left: a scheduling bug"
            step = int(arrivals[nxt])  # idle until the next arrival
            continue
        waiting = len(queue)
        t0 = time.perf_counter()
        if prefill:
            c_req = np.array([p[0] for p in prefill], dtype=np.int64)
            c_slot = np.array([p[1] for p in prefill], dtype=np.int64)
            c_pos = np.array([p[2] for p in prefill], dtype=np.int64)
            last = c_pos + size >= plen
            c_tok = np.stack([prompts[r, p : p + size] for r, p in zip(c_req, c_pos, strict=True)])
            paid = paid_capacity(len(prefill) * size + width * n, traffic.buckets)
            capacity, windows, reason, cell = paid, np.full(n, k), "native", None
            if n and arm.plan_on_mixed:
                arm.decode.plan(conf[:n])
            if n and arm.table is not None:
                choice, windows = _mixed_choice(arm, n, conf, length, c_pos, size, k)
                reason = choice.reason
                run.covered_steps += int(choice.covered)
                if choice.cell is not None:
                    capacity, cell = int(choice.capacity), choice.cell
            t1 = time.perf_counter()
            forward = steps.forward if steps is not None else functools.partial(mixed_forward, engine)
            mixed_out = forward(
                capacity=capacity,
                n=n,
                windows=windows,
                lengths=length,
                anchors=anchor,
                drafts=drafts,
                chunk_slots=c_slot,
                chunk_pos=c_pos,
                chunk_tokens=c_tok,
                last=last,
            )
            out = mixed_out.gen
            kind, g_or_cap, v = ("mixed" if n else "prefill"), capacity, paid
            if n:
                run.mixed_steps += 1
                run.reasons[reason] += 1
                if cell is not None:
                    run.mixed_cells[cell.geometry.sha256()] += 1
            else:
                run.prefill_only_steps += 1
            if record:
                run.chunks.extend(
                    ChunkRecord(step, int(r), size, int(p)) for r, p in zip(c_req, c_pos, strict=True)
                )
        else:
            plan = arm.decode.plan(conf[:n])
            t1 = time.perf_counter()
            windows = plan.windows if plan.windows is not None else np.full(n, k)
            out = engine.step(plan.g, plan.v, n, plan.windows, length, anchor, drafts)
            kind, g_or_cap, v, reason = "decode", plan.g, plan.v, ""
        run.plan_seconds += t1 - t0
        if n:
            acc = out.accepted
            if record:
                mixed_step = kind == "mixed"
                for r in range(n):
                    rec = MixedRecord(
                        step, int(req[r]), int(rounds[r]), conf[r].copy(), int(acc[r]), int(windows[r]),
                        int(produced[r]), int(length[r]), mixed_step,
                    )  # fmt: skip
                    run.records.append(rec)
            run.tokens += int(st.advance(out, n, max_new, flat_out).sum())
        elapsed = time.perf_counter() - t0
        run.seconds += elapsed
        if kind == "decode":
            run.decode_seconds += elapsed
        else:
            run.mixed_seconds += elapsed
        run.steps += 1
        run.step_log.append((step, kind, 1000.0 * elapsed, g_or_cap, v, reason))
        run.waiting.append(waiting)
        # Bookkeeping outside the step's time (as serving.serve keeps slot moves out of decode time):
        # finished requests leave, finished prompts join the decoding rows.
        fin = np.flatnonzero(produced[:n] >= max_new)
        if fin.size:
            req[fin] = -1
            done += int(fin.size)
            n = _compact_decoding(engine, st)
        if kind != "decode":
            ended = 0
            for p in list(prefill):
                p[2] += size
                if p[2] < plen:
                    continue
                src, dst = p[1], n
                engine.move_slots(np.array([src]), np.array([dst]))
                req[dst], length[dst], produced[dst], rounds[dst] = p[0], plen, 1, 0
                anchor[dst] = mixed_out.first[ended]
                drafts[dst] = mixed_out.first_drafts[ended]
                conf[dst] = mixed_out.first_confidence[ended]
                outputs[p[0], 0] = mixed_out.first[ended]
                ended += 1
                n += 1
                free_prefill.append(src)
                prefill.remove(p)
                if max_new == 1:  # the first token was the whole output
                    req[dst] = -1
                    done += 1
                    n = _compact_decoding(engine, st)
        step += 1
    finish = getattr(arm.decode, "finish", None)
    if finish is not None:
        finish()
    return run


def _compact_decoding(engine: Engine, st: Slots) -> int:
    """Move the highest decoding slots into holes (prefill slots hold no request); returns their count."""
    _compact(engine, st.req, *st.state())
    return int((st.req >= 0).sum())


# -- the mixed sweep's module-backend factory and output check -------------------------------------
_REGISTRY: dict[str, Any] = {}


def register_mixed_engine(engine: Engine, traffic: MixedTraffic, *, steps: Any = None) -> None:
    """Make ``engine`` the one :func:`mixed_factory` builds mixed steps from (same process only);
    with ``steps`` (``mixed_graphs.MixedSteps``) the sweep measures the fixed-shape steps serving runs."""
    _REGISTRY["engine"] = engine
    _REGISTRY["traffic"] = traffic
    _REGISTRY["steps"] = steps


def _shape_inputs(shape: Any, seed: int) -> dict[str, Any]:
    """The mixed forward's inputs for one rank's shape over a fixed synthetic state."""
    engine: Engine = _REGISTRY["engine"]
    traffic: MixedTraffic = _REGISTRY["traffic"]
    cfg = engine.cfg
    if shape.k != cfg.k:
        raise RuntimeError(f"the mixed sweep asks for K={shape.k} but the engine drafts K={cfg.k}")
    n, m = len(shape.generations), len(shape.context)
    sizes = {c.size for c in shape.context}
    if m and sizes != {traffic.chunk}:
        raise RuntimeError(f"chunks of sizes {sorted(sizes)}; this engine runs chunks of {traffic.chunk}")
    if n > traffic.max_decoding or m > traffic.prefill_slots:
        raise RuntimeError(f"{n} generations and {m} chunks exceed the engine's slots")
    slots = engine.cache_k.shape[1]
    rng = np.random.default_rng(seed)
    lengths = np.zeros(slots, dtype=np.int64)
    lengths[:n] = [g.history for g in shape.generations]
    if n and int(lengths[:n].max()) + cfg.width > cfg.max_len:
        raise RuntimeError(f"a generation history of {int(lengths[:n].max())} exceeds the cache")
    return {
        "capacity": int(shape.capacity),
        "n": n,
        "windows": np.array(shape.generation_rows, dtype=np.int64) - 1,
        "lengths": lengths,
        "anchors": rng.integers(32, 127, size=slots).astype(np.int64),
        "drafts": rng.integers(32, 127, size=(slots, cfg.k)).astype(np.int64),
        "chunk_slots": np.arange(traffic.max_decoding, traffic.max_decoding + m, dtype=np.int64),
        "chunk_pos": np.array([c.position for c in shape.context], dtype=np.int64),
        "chunk_tokens": rng.integers(32, 127, size=(m, traffic.chunk)).astype(np.int64),
        "last": np.zeros(m, dtype=bool),
    }


def _seed(shape: Any) -> int:
    """One synthetic state per step (native arm and cells alike): a seed from the step's description."""
    parts = [*(c.position for c in shape.context), *(g.history for g in shape.generations)]
    return int(sum((i + 1) * 1_000_003 * p for i, p in enumerate(parts)) % (1 << 31))


def mixed_factory(shape: Any, **_: Any) -> Callable[[], None]:
    """``module`` backend ``mixed_factory``: the registered engine's mixed step for one shape.

    Note that it writes keys into the cache: run it only between serving runs.

    Raises:
        RuntimeError: no engine registered, or a shape the engine cannot run.
    """
    if not isinstance(_REGISTRY.get("engine"), Engine):
        raise RuntimeError("no engine registered; call mixed_serving.register_mixed_engine first")
    inputs = _shape_inputs(shape, _seed(shape))
    forward = _forward()

    def run() -> None:
        forward(**inputs)

    return run


def _forward() -> Callable[..., MixedOut]:
    """The registered engine's mixed forward: the fixed-shape steps when registered, else eager."""
    steps = _REGISTRY.get("steps")
    if steps is not None:
        return steps.forward  # type: ignore[no-any-return]  # MixedSteps.forward, typed there
    return functools.partial(mixed_forward, _REGISTRY["engine"])


def mixed_check(native: Any, candidate: Any, **_: Any) -> tuple[int, int]:
    """``module`` backend ``mixed_check``: greedy tokens of every position both forwards verify.

    Both shapes run over the same synthetic state (same drafts, histories and chunks); the cell's
    forward must give each generation row's verified positions the native forward's tokens.
    """
    seed = _seed(native)
    forward = _forward()
    a = forward(**_shape_inputs(native, seed), keep_pred=True)
    b = forward(**_shape_inputs(candidate, seed), keep_pred=True)
    rows = mismatches = 0
    if a.pred is None or b.pred is None:
        return 0, 0
    for r, (na, nb) in enumerate(zip(native.generation_rows, candidate.generation_rows, strict=True)):
        both = min(na, nb)
        rows += both
        mismatches += int((a.pred[r, :both] != b.pred[r, :both]).sum())
    return rows, mismatches
