"""A small serving engine with the mechanics of the real runtime: continuous batching of greedy
requests, per-request KV caches with rewind, packed ragged verification, one CUDA graph per
(G, V) cell of the ladder, and a static-K or a planner-driven dynamic policy.

**One step.** Every active request owns a cache slot; active requests always occupy slots
``0..n-1`` (finished ones are replaced by queued requests, remaining holes are filled by moving
the last requests down), so the graph of batch size G works on the first G slots. A step
verifies, for each real row r, its anchor token plus a prefix of ``w_r`` of its K drafts, and for
each pad row the same number q of dummy tokens: ``V`` tokens in all (``G·(K+1)`` for the native
cell). The tokens are *packed*: the target's GEMMs run over exactly those tokens (in fixed chunks,
below), while attention scatters them into a ``[G, K+1]`` layout and reads each row's cache. The
packing itself runs on the device, inside the cell's graph, from the rows' windows, cache
lengths, anchors and drafts: the windows come from the host (static K, the host planner) or are
written on the device by the device planner, so a dynamic step needs no host round trip; a fused
planner is captured into the cell's graph itself (:meth:`Engine.prepare_fused`). The
graph then computes, on the device, the accepted length of every row (leading drafts equal to the
target's greedy token), the bonus token, and the drafter's next K drafts and confidence logits
from the hidden state at the last accepted position. One host copy brings back
``(accepted, bonus, drafts, confidence)``. The cache *rewinds* by bookkeeping: a row's length
grows by ``accepted + 1`` (anchor plus accepted drafts); the keys written for rejected drafts stay
behind the length, are masked out and are overwritten by later steps.

**Batch-invariant numerics.** Greedy output must be token-for-token identical whatever cell
verifies a token. A GEMM's rounding depends on the kernel cuBLAS picks, which depends on M, so
every GEMM here runs on chunks of exactly ``gemm_chunk`` tokens (the packed token count is padded
to a multiple); LayerNorm and the attention kernel (memory-efficient SDPA on CUDA, the math one on
CPU, per (row, head) tile) do not mix tokens of different rows. Prefill uses the same chunked
GEMMs. The chunking also gives T(G, V) the staircase a real engine's GEMM tiles give it.

This module imports torch and numpy, not the toolkit; the dynamic policy is injected
(:class:`Policy`) and built in :mod:`pipeline` from the toolkit's planner.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .model import Block, Drafter, TargetLM, apply_rope

__all__ = [
    "CyclePolicy",
    "Engine",
    "EngineConfig",
    "Plan",
    "Policy",
    "RunResult",
    "Slots",
    "StaticPolicy",
    "StepRecord",
    "block_out",
    "block_qkv",
    "grouped_attention",
    "register_engine",
    "rung",
    "serve",
    "sweep_factory",
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Static shape of the engine.

    Attributes:
        k: draft tokens per round (K).
        ladder: rank-local graph batch sizes G, increasing.
        max_len: cache positions per slot (prompt + output + K + 1 must fit).
        gemm_chunk: tokens per GEMM launch (batch-invariant numerics, see module doc).
        use_graphs: capture one CUDA graph per cell (GPU); eager closures otherwise.
        attention: SDPA kernel, ``efficient`` (memory-efficient, CUDA) or ``math``.
    """

    k: int
    ladder: tuple[int, ...]
    max_len: int
    gemm_chunk: int
    use_graphs: bool
    attention: str = "math"

    @property
    def slots(self) -> int:
        """Cache slots: the largest G."""
        return max(self.ladder)

    @property
    def width(self) -> int:
        """Tokens per row of a native step: K + 1."""
        return self.k + 1


def rung(ladder: Sequence[int], n: int) -> int:
    """The smallest graph batch size of ``ladder`` that holds ``n`` rows.

    Raises:
        ValueError: ``n`` exceeds the largest rung.
    """
    for g in ladder:
        if g >= n:
            return g
    raise ValueError(f"{n} rows exceed the largest graph batch size {ladder[-1]}")


def _chunked_linear(x: torch.Tensor, w: torch.Tensor, chunk: int) -> torch.Tensor:
    """``x @ w.T`` computed ``chunk`` rows at a time (same GEMM shape for every launch)."""
    m = x.shape[0]
    if m % chunk:
        raise ValueError(f"{m} rows are not a multiple of the GEMM chunk {chunk}")
    out = x.new_empty(m, w.shape[0])
    wt = w.t()
    for lo in range(0, m, chunk):
        torch.mm(x[lo : lo + chunk], wt, out=out[lo : lo + chunk])
    return out


def block_qkv(
    tgt: TargetLM, blk: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A block's rotated queries and keys and its values for packed tokens ``x`` (chunked GEMM)."""
    q, k, v = tgt.split_qkv(_chunked_linear(blk.ln1(x), blk.wqkv.weight, chunk))
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def block_out(blk: Block, x: torch.Tensor, attn: torch.Tensor, chunk: int) -> torch.Tensor:
    """The block's output: ``x`` plus the projected attention ``attn``, then the MLP residual."""
    x = x + _chunked_linear(attn, blk.wo.weight, chunk)
    up = F.gelu(_chunked_linear(blk.ln2(x), blk.up.weight, chunk), approximate="tanh")
    return x + _chunked_linear(up, blk.down.weight, chunk)


def grouped_attention(
    q: torch.Tensor,
    rows: int,
    width: int,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    m: Any,
) -> torch.Tensor:
    """Attention of ``rows`` query rows of ``width`` tokens each over their own caches.

    Args:
        q: ``[rows · width, heads, head_dim]`` queries, row-major.
        rows, width: the layout.
        keys, values: ``[rows, cache, kv_heads, head_dim]``: each row's cache.
        mask: ``[rows, 1, group · width, cache]`` (True: attend).
        m: the target's model config (heads, key/value heads, group, sizes).

    Returns:
        ``[rows · width, d_model]`` attention outputs, row-major (graph-safe; per (row, head) tile).
    """
    qg = q.view(rows, width, m.n_kv_heads, m.group, m.head_dim).permute(0, 2, 3, 1, 4)
    qg = qg.reshape(rows, m.n_kv_heads, m.group * width, m.head_dim)
    o = F.scaled_dot_product_attention(qg, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask)
    o = o.view(rows, m.n_kv_heads, m.group, width, m.head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(rows * width, m.d_model)


#: Floats a G's output buffer keeps for a fused planner's decision vector: the head and up to 16
#: compact cells of the G (``fused_planner.decision_size``).
DECISION_CAPACITY = 5 + 7 * 16


@dataclass(frozen=True, slots=True)
class _Layout:
    """Offsets of one G's input buffer (int64) and output buffer (fp32).

    Input: the real rows ``n``, then per slot its cache length, anchor token and K drafts (pad
    slots zero), then the fused device planner's inputs: its three ints (rows, committed column,
    use_selected) and the rows' confidence logits as float32 pairs. The windows live in a buffer
    of their own (:meth:`Engine.window_buffer`). Output: accepted, bonus, drafts, confidence, then
    room for a fused planner's decision vector (:data:`DECISION_CAPACITY`).
    """

    g: int
    cap: int  # packed-token capacity: G·(K+1) rounded up to the GEMM chunk
    k: int

    @property
    def rows(self) -> slice:
        return slice(0, 1)

    @property
    def row_len(self) -> slice:
        return slice(1, 1 + self.g)

    @property
    def anchor(self) -> slice:
        return slice(1 + self.g, 1 + 2 * self.g)

    @property
    def draft(self) -> slice:
        return slice(1 + 2 * self.g, 1 + (2 + self.k) * self.g)

    @property
    def plan(self) -> slice:
        base = 1 + (2 + self.k) * self.g
        return slice(base, base + 3)

    @property
    def conf(self) -> slice:
        base = 4 + (2 + self.k) * self.g
        return slice(base, base + -(-self.g * self.k // 2))

    @property
    def in_size(self) -> int:
        return 4 + (2 + self.k) * self.g + -(-self.g * self.k // 2)

    @property
    def conf_out(self) -> slice:
        return slice((2 + self.k) * self.g, (2 + 2 * self.k) * self.g)

    @property
    def decision(self) -> slice:
        return slice((2 + 2 * self.k) * self.g, (2 + 2 * self.k) * self.g + DECISION_CAPACITY)

    @property
    def out_size(self) -> int:
        return (2 + 2 * self.k) * self.g + DECISION_CAPACITY


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one step returns for the real rows (host numpy arrays)."""

    accepted: np.ndarray  # [n] int64
    bonus: np.ndarray  # [n] int64
    drafts: np.ndarray  # [n, K] int64
    confidence: np.ndarray  # [n, K] float32
    decision: np.ndarray | None = None  # a fused planner's decision vector of this step (host copy)


class Engine:
    """Weights, caches, per-G buffers and one step callable per (G, V) cell.

    Args:
        target: the target in its serving dtype (bf16 on CUDA), eval mode.
        drafter: the drafter in the same dtype, eval mode.
        cfg: engine shape.
        device: where everything lives.
    """

    def __init__(self, target: TargetLM, drafter: Drafter, cfg: EngineConfig, device: torch.device) -> None:
        if drafter.cfg.k != cfg.k:
            raise ValueError(
                f"drafter drafts {drafter.cfg.k} tokens but the engine is configured for K={cfg.k}"
            )
        self.target = target
        self.drafter = drafter
        self.cfg = cfg
        self.device = device
        m = target.cfg
        dtype = next(target.parameters()).dtype
        self.cache_k = torch.zeros(
            m.n_layers, cfg.slots, cfg.max_len, m.n_kv_heads, m.head_dim, device=device, dtype=dtype
        )
        self.cache_v = torch.zeros_like(self.cache_k)
        backends = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        if cfg.attention not in backends:
            raise ValueError(f"attention must be one of {sorted(backends)}, got {cfg.attention!r}")
        self.backend = backends[cfg.attention]
        self._layouts: dict[int, _Layout] = {}
        self._in_dev: dict[int, torch.Tensor] = {}
        self._in_host: dict[int, torch.Tensor] = {}
        self._win_dev: dict[int, torch.Tensor] = {}
        self._win_host: dict[int, torch.Tensor] = {}
        self._out_dev: dict[int, torch.Tensor] = {}
        self._out_host: dict[int, torch.Tensor] = {}
        self._cells: dict[tuple[int, int], Callable[[], None]] = {}
        self._fused: dict[tuple[int, int, int], Callable[[], None]] = {}  # (owner, G, V) -> step
        self._side: Any = None  # the stream a fused planner's selection runs on, beside the step
        self._graphs: list[Any] = []
        self._pool: Any = None
        self.debug_logits: dict[int, torch.Tensor] = {}
        pin = device.type == "cuda"
        for g in cfg.ladder:
            full = g * cfg.width
            cap = -(-full // cfg.gemm_chunk) * cfg.gemm_chunk
            lay = _Layout(g, cap, cfg.k)
            self._layouts[g] = lay
            self._in_dev[g] = torch.zeros(lay.in_size, dtype=torch.int64, device=device)
            self._in_host[g] = torch.zeros(lay.in_size, dtype=torch.int64, pin_memory=pin)
            self._win_dev[g] = torch.zeros(g, dtype=torch.int64, device=device)
            self._win_host[g] = torch.zeros(g, dtype=torch.int64, pin_memory=pin)
            self._out_dev[g] = torch.zeros(lay.out_size, dtype=torch.float32, device=device)
            self._out_host[g] = torch.zeros(lay.out_size, dtype=torch.float32, pin_memory=pin)

    # -- the device computation of one cell --------------------------------------------------------
    def _tokens(self, g: int, v: int) -> int:
        return g * self.cfg.width if v == 0 else v

    def window_buffer(self, g: int) -> torch.Tensor:
        """The device buffer of G's verify windows, ``[G]`` int64, that compact cells read.

        The host writes it (through :meth:`step`'s ``windows``) or the device planner does (on the
        current stream, before :meth:`step` with ``windows=None``). Native cells never read it.
        """
        return self._win_dev[g]

    def _device_pack(self, g: int, v: int) -> tuple[torch.Tensor, ...]:
        """Token layout of cell (G, V) from the rows' windows (graph-safe; the host's old packing).

        Real row r takes ``window_r + 1`` tokens, every pad row the same ``q`` (the rest of V over
        the pad rows; the windows' producer guarantees it divides and lies in ``[1, K+1]``).

        Returns:
            ``(tok, pos, flat, slot, window)``: tokens and positions over the packed capacity
            (zero past V), each packed token's index in the ``[G, K+1]`` layout and its slot,
            and the windows of the G rows (pad rows 0).
        """
        cfg, lay = self.cfg, self._layouts[g]
        width, k, dev = cfg.width, cfg.k, self.device
        vt = self._tokens(g, v)
        buf = self._in_dev[g]
        n = buf[lay.rows][0]
        real = torch.arange(g, device=dev) < n
        if v == 0:
            window = torch.where(real, k, 0)
            seg = torch.full((g,), width, dtype=torch.int64, device=dev)
        else:
            window = torch.where(real, self._win_dev[g], 0)
            used = torch.where(real, window + 1, 0).sum()
            q = (vt - used) // (g - n).clamp(min=1)
            seg = torch.where(real, window + 1, q)
        ends = torch.cumsum(seg, 0)
        t = torch.arange(lay.cap, device=dev)
        row = torch.searchsorted(ends, t, right=True).clamp_(max=g - 1)
        j = t - (ends - seg)[row]
        jj = j.clamp(0, width - 1)
        valid = t < vt
        table = torch.cat([buf[lay.anchor][:, None], buf[lay.draft].view(g, k)], dim=1)
        tok = torch.where(valid, table[row, jj], 0)
        pos = torch.where(valid, buf[lay.row_len][row] + j, 0)
        return tok, pos, row * width + jj, row, window

    def _body(self, g: int, v: int, keep_logits: bool = False) -> None:
        """Verify the packed tokens of cell (G, V), accept, and draft the next round (graph-safe)."""
        cfg, m, lay = self.cfg, self.target.cfg, self._layouts[g]
        vt = self._tokens(g, v)
        vp = -(-vt // cfg.gemm_chunk) * cfg.gemm_chunk
        width, chunk = cfg.width, cfg.gemm_chunk
        buf = self._in_dev[g]
        tok_all, pos_all, flat_all, slot_all, window = self._device_pack(g, v)
        tok, pos = tok_all[:vp], pos_all[:vp]
        flat, slot = flat_all[:vt], slot_all[:vt]
        row_len = buf[lay.row_len]
        draft = buf[lay.draft].view(g, cfg.k)
        tgt = self.target
        cos = tgt.rope_cos[pos][:, None, :]
        sin = tgt.rope_sin[pos][:, None, :]
        keys = torch.arange(cfg.max_len, device=self.device)
        qpos = row_len[:, None] + torch.arange(width, device=self.device)[None, :]
        mask = (keys[None, None, :] <= qpos[:, :, None]).repeat(1, m.group, 1)[:, None]  # [G,1,group*T,L]
        x = tgt.embed(tok)
        for layer, blk in enumerate(tgt.blocks):
            assert isinstance(blk, Block)
            q, k_new, v_new = block_qkv(tgt, blk, x, cos, sin, chunk)
            ck, cv = self.cache_k[layer], self.cache_v[layer]
            ck[slot, pos[:vt]] = k_new[:vt]
            cv[slot, pos[:vt]] = v_new[:vt]
            qpad = q.new_zeros(g * width, m.n_heads, m.head_dim)
            qpad.index_copy_(0, flat, q[:vt])
            o = grouped_attention(qpad, g, width, ck[:g], cv[:g], mask, m)
            packed = o.new_zeros(vp, m.d_model)
            packed[:vt] = o.index_select(0, flat)
            x = block_out(blk, x, packed, chunk)
        hid = tgt.ln_f(x)
        logits = _chunked_linear(hid, tgt.lm_head.weight, chunk)
        if keep_logits:
            self.debug_logits[g] = logits[:vt].float().clone()
        pred = logits.argmax(-1)
        pred_pad = torch.zeros(g * width, dtype=torch.int64, device=self.device)
        pred_pad.index_copy_(0, flat, pred[:vt])
        pred_pad = pred_pad.view(g, width)
        hid_pad = hid.new_zeros(g * width, m.d_model)
        hid_pad.index_copy_(0, flat, hid[:vt])
        live = torch.arange(cfg.k, device=self.device)[None, :] < window[:, None]
        match = (draft == pred_pad[:, : cfg.k]) & live
        accepted = torch.cumprod(match.to(torch.int64), dim=1).sum(1)
        bonus = pred_pad.gather(1, accepted[:, None]).squeeze(1)
        h_last = hid_pad.view(g, width, m.d_model)[torch.arange(g, device=self.device), accepted]
        drafts, conf = self.drafter.draft(h_last, bonus)
        out = self._out_dev[g]
        out[:g].copy_(accepted)
        out[g : 2 * g].copy_(bonus)
        out[2 * g : (2 + cfg.k) * g].copy_(drafts.reshape(-1))
        out[lay.conf_out].copy_(conf.reshape(-1))

    def prepare_cells(
        self, cells: Sequence[tuple[int, int]], *, log: Callable[[str], None] | None = None
    ) -> None:
        """Build the step of each cell: a captured CUDA graph, or an eager closure on CPU.

        Cells already prepared are skipped. Input buffers are filled with a valid state first,
        because warm-up runs really execute.
        """
        todo = sorted({c for c in cells if c not in self._cells}, key=lambda c: -self._tokens(*c))
        t0 = time.perf_counter()
        for g, v in todo:
            self._fill_synthetic(g, v, context=min(self.cfg.max_len // 2, self.cfg.max_len - self.cfg.width))
            if not self.cfg.use_graphs:
                self._cells[(g, v)] = self._eager(g, v)
                continue
            self._cells[(g, v)] = self._capture(g, v)
        if log is not None and todo:
            log(
                f"prepared {len(todo)} cell(s) in {time.perf_counter() - t0:.1f}s "
                f"(graphs={self.cfg.use_graphs})"
            )

    def _runner(self, g: int, v: int, hooks: Any) -> Callable[[], None]:
        if hooks is None:
            return lambda: self._body(g, v)
        return lambda: self._fused_body(g, v, hooks)

    def _eager(self, g: int, v: int, hooks: Any = None) -> Callable[[], None]:
        body = self._runner(g, v, hooks)

        def run() -> None:
            with torch.no_grad(), sdpa_kernel([self.backend]):
                body()

        return run

    def _capture(self, g: int, v: int, hooks: Any = None) -> Callable[[], None]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        body = self._runner(g, v, hooks)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), sdpa_kernel([self.backend]):
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up (and, for a compiled planner, its compilation)
                    body()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                body()
        self._graphs.append(graph)
        return graph.replay

    # -- the fused device planner ---------------------------------------------------------------
    def planner_buffers(self, g: int) -> dict[str, Any]:
        """G's buffers a fused planner binds (``FusedServingPlanner.bind``'s arguments) and the
        host view of the logits it reads: ``logits`` ``(1, G, K)`` float32 and ``ints`` ``(3,)``
        int64 device views of the input buffer, ``ints_host``/``logits_host`` the pinned host
        arrays behind them, ``windows`` the window buffer, ``decision`` the output region."""
        lay, k = self._layouts[g], self.cfg.k
        dev_conf = self._in_dev[g][lay.conf].view(torch.float32)[: g * k].view(1, g, k)
        host_conf = self._in_host[g].numpy()[lay.conf].view(np.float32)[: g * k].reshape(g, k)
        return {
            "logits": dev_conf,
            "ints": self._in_dev[g][lay.plan],
            "ints_host": self._in_host[g].numpy()[lay.plan],
            "logits_host": host_conf,
            "windows": self._win_dev[g],
            "decision": self._out_dev[g][lay.decision],
        }

    def prepare_fused(
        self,
        owner: int,
        cells: Sequence[tuple[int, int]],
        hooks: Callable[[int], tuple[Callable[[], None], Callable[[], None]]],
        *,
        log: Callable[[str], None] | None = None,
    ) -> None:
        """Build each cell's step with a fused planner: its ``critical`` hook (survivals, the
        allocation), then the step, with its ``beside`` hook (ranking, selection) on a forked
        stream next to the step, joined before the end; one CUDA graph per cell on CUDA
        (``owner``: the planner's token for :meth:`step`)."""
        t0 = time.perf_counter()
        todo = sorted({c for c in cells if (owner, *c) not in self._fused}, key=lambda c: -self._tokens(*c))
        for g, v in todo:
            # The warm-up and the capture really run: the planner's inputs must agree with the
            # synthetic state (every row real, the native column: full windows, inside the cache).
            lay = self._layouts[g]
            self._in_host[g].numpy()[lay.plan] = (g, -1, 0)
            self._in_host[g].numpy()[lay.conf] = 0
            self._fill_synthetic(g, v, context=min(self.cfg.max_len // 2, self.cfg.max_len - self.cfg.width))
            critical, beside = hooks(g)
            self._fused[(owner, g, v)] = (
                self._capture(g, v, (critical, beside))
                if self.cfg.use_graphs
                else self._eager(g, v, (critical, beside))
            )
        if log is not None and todo:
            log(f"prepared {len(todo)} fused cell(s) in {time.perf_counter() - t0:.1f}s")

    def _fused_body(self, g: int, v: int, hooks: tuple[Callable[[], None], Callable[[], None]]) -> None:
        critical, beside = hooks
        critical()
        if self.device.type != "cuda":
            beside()
            self._body(g, v)
            return
        main = torch.cuda.current_stream(self.device)
        side = self._side_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            beside()
        self._body(g, v)
        main.wait_stream(side)

    def _side_stream(self) -> Any:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    @property
    def cells(self) -> tuple[tuple[int, int], ...]:
        """Prepared cells, sorted."""
        return tuple(sorted(self._cells))

    # -- host side of one step ----------------------------------------------------------------------
    def _pack(
        self,
        g: int,
        v: int,
        n: int,
        windows: np.ndarray | None,
        lengths: np.ndarray,
        anchors: np.ndarray,
        drafts: np.ndarray,
    ) -> bool:
        """Write the step's inputs into G's pinned host buffers; True when windows were written.

        Host windows of a compact cell are checked here (the device packing trusts them).
        """
        cfg, lay = self.cfg, self._layouts[g]
        if v != 0 and windows is not None:
            vt = self._tokens(g, v)
            used = int(windows.sum()) + n
            pad_rows = g - n
            if pad_rows:
                rest = vt - used
                q, r = divmod(rest, pad_rows)
                if r or not 1 <= q <= cfg.width:
                    raise ValueError(
                        f"cell G={g} V={v}: {n} real rows take {used} tokens, leaving {rest} for "
                        f"{pad_rows} pad rows (each pad row needs the same length in [1, {cfg.width}])"
                    )
            elif used != vt:
                raise ValueError(f"cell G={g} V={v}: windows take {used} tokens, expected {vt}")
            wins = self._win_host[g].numpy()
            wins[:n] = windows
            wins[n:] = 0
        host = self._in_host[g].numpy()
        host[lay.rows] = n
        for region, values in ((lay.row_len, lengths), (lay.anchor, anchors)):
            part = host[region]
            part[:n] = values[:n]
            part[n:] = 0
        dr = host[lay.draft].reshape(g, cfg.k)
        dr[:n] = drafts[:n]
        dr[n:] = 0
        return v != 0 and windows is not None

    def step(
        self,
        g: int,
        v: int,
        n: int,
        windows: np.ndarray | None,
        lengths: np.ndarray,
        anchors: np.ndarray,
        drafts: np.ndarray,
        fused: int | None = None,
    ) -> StepOutput:
        """Run one decode step of cell (G, V) over the first ``n`` slots.

        Args:
            g: graph batch size (≥ n).
            v: verifier budget (0 = native: every row verifies all K drafts).
            n: real rows (slots ``0..n-1``).
            windows: drafts verified per real row, ``[n]`` in ``0..K``; None when the device
                planner has written them into :meth:`window_buffer` (ignored for native cells).
            lengths: cache length per slot before the step.
            anchors: anchor token per slot.
            drafts: ``[slots, K]`` drafts per slot.
            fused: run the cell's graph with the fused planner of this owner token
                (:meth:`prepare_fused`); the step output then carries its decision.

        Returns:
            Accepted lengths, bonus tokens, next drafts and confidence logits of the real rows.
        """
        cell = (g, v)
        run = self._cells.get(cell) if fused is None else self._fused.get((fused, g, v))
        if run is None:
            raise KeyError(
                f"cell G={g} V={v} was not prepared{'' if fused is None else ' for this fused planner'}; "
                f"prepared cells: {list(self._cells)}"
            )
        if self._pack(g, v, n, windows, lengths, anchors, drafts):
            self._win_dev[g].copy_(self._win_host[g], non_blocking=True)
        self._in_dev[g].copy_(self._in_host[g], non_blocking=True)
        run()
        out = self._out_host[g]
        out.copy_(self._out_dev[g], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return self._output(g, n, out.numpy(), decision=fused is not None)

    def _output(self, g: int, n: int, arr: np.ndarray, *, decision: bool = False) -> StepOutput:
        k, lay = self.cfg.k, self._layouts[g]
        return StepOutput(
            accepted=arr[:n].astype(np.int64),
            bonus=arr[g : g + n].astype(np.int64),
            drafts=arr[2 * g : (2 + k) * g].reshape(g, k)[:n].astype(np.int64),
            confidence=arr[lay.conf_out].reshape(g, k)[:n].copy(),
            decision=arr[lay.decision].copy() if decision else None,
        )

    def verify_logits(
        self,
        g: int,
        v: int,
        n: int,
        windows: np.ndarray,
        lengths: np.ndarray,
        anchors: np.ndarray,
        drafts: np.ndarray,
    ) -> tuple[StepOutput, torch.Tensor]:
        """Eager step that also returns the packed target logits ``[V, vocab]`` (tests only)."""
        if self._pack(g, v, n, windows, lengths, anchors, drafts):
            self._win_dev[g].copy_(self._win_host[g])
        self._in_dev[g].copy_(self._in_host[g])
        with torch.no_grad(), sdpa_kernel([self.backend]):
            self._body(g, v, keep_logits=True)
        out = self._output(g, n, self._out_dev[g].cpu().numpy())
        return out, self.debug_logits.pop(g)

    def _fill_synthetic(self, g: int, v: int, context: int) -> None:
        """A valid mid-generation state for cell (G, V): every row real, rows as even as V allows."""
        cfg = self.cfg
        vt = self._tokens(g, v)
        q, r = divmod(vt, g)
        windows = np.array([q + (1 if i < r else 0) - 1 for i in range(g)], dtype=np.int64)
        lengths = np.full(cfg.slots, context, dtype=np.int64)
        anchors = np.full(cfg.slots, 32, dtype=np.int64)
        drafts = np.full((cfg.slots, cfg.k), 32, dtype=np.int64)
        if self._pack(g, v, g, windows, lengths, anchors, drafts):
            self._win_dev[g].copy_(self._win_host[g])
        self._in_dev[g].copy_(self._in_host[g])

    def synthetic_step(self, g: int, v: int, context: int) -> Callable[[], None]:
        """A step of cell (G, V) exactly as serving runs it (pack, copy in, replay, copy out, sync),
        over a fixed mid-generation state; what the sweep's ``module`` backend times.

        Note that it writes keys into the cache: run it only between serving runs.
        """
        cfg = self.cfg
        vt = self._tokens(g, v)
        q, r = divmod(vt, g)
        windows = np.array([q + (1 if i < r else 0) - 1 for i in range(g)], dtype=np.int64)
        lengths = np.full(cfg.slots, context, dtype=np.int64)
        rng = np.random.default_rng(g * 100003 + v)
        anchors = rng.integers(32, 127, size=cfg.slots).astype(np.int64)
        drafts = rng.integers(32, 127, size=(cfg.slots, cfg.k)).astype(np.int64)

        def run() -> None:
            self.step(g, v, g, windows, lengths, anchors, drafts)

        return run

    # -- prefill and slot moves -----------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, slots: np.ndarray, prompts: np.ndarray) -> StepOutput:
        """Prefill ``prompts [m, P]`` into ``slots``; returns the first token and first drafts.

        ``accepted`` is 0 and ``bonus`` is the first generated token of each request.
        """
        cfg, m, tgt = self.cfg, self.target.cfg, self.target
        count, plen = prompts.shape
        ntok = count * plen
        npad = -(-ntok // cfg.gemm_chunk) * cfg.gemm_chunk
        tok = torch.zeros(npad, dtype=torch.int64)
        tok[:ntok] = torch.from_numpy(prompts.reshape(-1))
        tok = tok.to(self.device)
        posn = torch.arange(plen, device=self.device).repeat(count)
        slot_t = torch.from_numpy(np.repeat(slots, plen)).to(self.device)
        pos_pad = torch.zeros(npad, dtype=torch.int64, device=self.device)
        pos_pad[:ntok] = posn
        cos = tgt.rope_cos[pos_pad][:, None, :]
        sin = tgt.rope_sin[pos_pad][:, None, :]
        chunk = cfg.gemm_chunk
        x = tgt.embed(tok)
        with sdpa_kernel([self.backend]):
            for layer, blk in enumerate(tgt.blocks):
                assert isinstance(blk, Block)
                q, k_new, v_new = block_qkv(tgt, blk, x, cos, sin, chunk)
                self.cache_k[layer][slot_t, posn] = k_new[:ntok]
                self.cache_v[layer][slot_t, posn] = v_new[:ntok]
                qh = q[:ntok].view(count, plen, m.n_heads, m.head_dim).transpose(1, 2)
                kh = k_new[:ntok].view(count, plen, m.n_kv_heads, m.head_dim).transpose(1, 2)
                vh = v_new[:ntok].view(count, plen, m.n_kv_heads, m.head_dim).transpose(1, 2)
                kh = kh.repeat_interleave(m.group, dim=1)
                vh = vh.repeat_interleave(m.group, dim=1)
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
                packed = o.new_zeros(npad, m.d_model)
                packed[:ntok] = o.transpose(1, 2).reshape(ntok, m.d_model)
                x = block_out(blk, x, packed, chunk)
        hid = tgt.ln_f(x)
        last = torch.arange(count, device=self.device) * plen + plen - 1
        logits = _chunked_linear(hid, tgt.lm_head.weight, chunk)
        first = logits[last].argmax(-1)
        drafts, conf = self.drafter.draft(hid[last], first)
        return StepOutput(
            accepted=np.zeros(count, dtype=np.int64),
            bonus=first.cpu().numpy().astype(np.int64),
            drafts=drafts.cpu().numpy().astype(np.int64),
            confidence=conf.float().cpu().numpy(),
        )

    def move_slots(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Copy the caches of slots ``src`` into slots ``dst`` (all layers)."""
        if src.size == 0:
            return
        s = torch.from_numpy(src).to(self.device)
        d = torch.from_numpy(dst).to(self.device)
        self.cache_k[:, d] = self.cache_k[:, s]
        self.cache_v[:, d] = self.cache_v[:, s]


# -- policies ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    """One step's decision: the cell and each real row's verify window (drafts verified).

    ``windows`` is None when the device planner has written them into the engine's window buffer
    (the policy then reports the verified tokens through ``finish``).
    """

    g: int
    v: int
    windows: np.ndarray | None
    fused: int | None = None  # the fused planner's owner token (Engine.prepare_fused), else None


class Policy(Protocol):
    """Chooses the cell and windows of every step from the rows' confidence logits.

    A policy may also have ``finish() -> dict`` (called once when a run ends: its statistics, with
    ``verified_tokens`` when its plans carry no windows), ``observe(StepOutput)`` (called after
    every step it planned) and ``arm`` (which arm of a :class:`CyclePolicy` planned the last step).
    """

    name: str

    def plan(self, confidence: np.ndarray) -> Plan:
        """Decide for the ``n = len(confidence)`` real rows (``confidence`` is ``[n, K]``)."""
        ...


class StaticPolicy:
    """Static K: the native cell of the smallest rung that holds the rows; every draft verified."""

    def __init__(self, ladder: Sequence[int], k: int, name: str = "static") -> None:
        self.ladder = tuple(ladder)
        self.k = k
        self.name = name

    def plan(self, confidence: np.ndarray) -> Plan:
        """Native cell, full windows."""
        n = confidence.shape[0]
        return Plan(rung(self.ladder, n), 0, np.full(n, self.k, dtype=np.int64))


class CyclePolicy:
    """Arms that take turns step by step: step i runs ``arms[order[i % len(arms)]]``.

    The release bracket's interleaving: every arm sees the same batch states, one step apart, so
    the difference of their step times is paired at the finest grain the loop has. Steps
    ``i // len(arms)`` form one cycle, in which every arm runs once.
    """

    def __init__(
        self, arms: Sequence[Policy], order: Sequence[int] | None = None, name: str = "cycle"
    ) -> None:
        if not arms:
            raise ValueError("a cycle needs at least one arm")
        self.arms = tuple(arms)
        self.order = tuple(range(len(arms))) if order is None else tuple(int(i) for i in order)
        if sorted(self.order) != list(range(len(arms))):
            raise ValueError(f"order must be a permutation of 0..{len(arms) - 1}, got {list(self.order)}")
        self.name = name
        self.arm = -1
        self._i = 0

    def plan(self, confidence: np.ndarray) -> Plan:
        """The plan of this step's arm (``arm`` says which)."""
        self.arm = self.order[self._i % len(self.arms)]
        self._i += 1
        return self.arms[self.arm].plan(confidence)

    def observe(self, out: StepOutput) -> None:
        """Hand the step's output to the arm that planned it (when it observes)."""
        observe = getattr(self.arms[self.arm], "observe", None)
        if observe is not None:
            observe(out)

    def finish(self) -> dict[str, Any]:
        """Every arm's statistics (by name) and their verified tokens together; resets the cycle."""
        out: dict[str, Any] = {"arms": {}, "verified_tokens": 0}
        for a in self.arms:
            finish = getattr(a, "finish", None)
            if finish is not None:
                stats = finish()
                out["arms"][a.name] = stats
                out["verified_tokens"] += int(stats.get("verified_tokens", 0))
        self._i = 0
        return out


# -- the serving loop ---------------------------------------------------------------------------
@dataclass
class Slots:
    """Per-slot serving state: the request in the slot (-1: free), its cache length, anchor, drafts,
    confidence logits, tokens produced and draft rounds."""

    req: np.ndarray
    length: np.ndarray
    anchor: np.ndarray
    drafts: np.ndarray
    conf: np.ndarray
    produced: np.ndarray
    rounds: np.ndarray

    @classmethod
    def empty(cls, slots: int, k: int) -> Slots:
        """Every slot free."""
        zeros = [np.zeros(slots, dtype=np.int64) for _ in range(4)]
        return cls(
            np.full(slots, -1, dtype=np.int64),
            zeros[0],
            zeros[1],
            np.zeros((slots, k), dtype=np.int64),
            np.zeros((slots, k), dtype=np.float32),
            zeros[2],
            zeros[3],
        )

    def state(self) -> tuple[np.ndarray, ...]:
        """Every array but ``req``, for slot moves."""
        return (self.length, self.anchor, self.drafts, self.conf, self.produced, self.rounds)

    def advance(self, out: StepOutput, n: int, max_new: int, flat_out: np.ndarray) -> np.ndarray:
        """Emit the step's tokens of slots ``0..n-1`` into ``flat_out`` (``[requests · max_new]``)
        and move their state on; returns the tokens each row emitted (capped at ``max_new``)."""
        k = self.drafts.shape[1]
        width = k + 1
        acc = out.accepted
        emitted = np.zeros((n, width), dtype=np.int64)
        emitted[:, :k] = self.drafts[:n]
        emitted[np.arange(n), acc] = out.bonus
        count = np.minimum(acc + 1, max_new - self.produced[:n])
        offsets = np.arange(width, dtype=np.int64)
        keep = offsets[None, :] < count[:, None]
        dest = (self.req[:n] * max_new + self.produced[:n])[:, None] + offsets[None, :]
        flat_out[dest[keep]] = emitted[keep]
        self.produced[:n] += count
        self.length[:n] += acc + 1
        self.anchor[:n] = out.bonus
        self.drafts[:n] = out.drafts
        self.conf[:n] = out.confidence
        self.rounds[:n] += 1
        count_out: np.ndarray = count
        return count_out


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One real row of one decode step, for traces and workloads (recorded under any policy)."""

    step: int
    request: int
    round: int
    confidence: np.ndarray  # [K] logits of the draft pass verified in this step
    accepted: int
    verified: int
    output_len: int


@dataclass
class RunResult:
    """One serving run.

    Attributes:
        policy: the policy's name.
        concurrency: maximum concurrent requests.
        outputs: ``[requests, max_new]`` generated tokens.
        decode_tokens: tokens emitted by decode steps (the first token comes from prefill).
        decode_seconds: wall time of decode steps (planning, packing, device, bookkeeping).
        prefill_seconds: wall time of prefills and slot moves.
        wall_seconds: whole run.
        steps: decode steps.
        cells: steps per (G, V).
        cell_seconds: decode wall time per (G, V).
        plan_seconds: time inside ``policy.plan``.
        records: per-row step records when recording.
        step_log: per decode step ``(ms, G, V, arm)`` when logging steps (arm: the policy's ``arm``).
        planner_stats: what the policy's ``finish`` returned (device planner counters).
        step_ms: per decode step, its wall time (ms), when recording (the workload's step times).
        waiting: per decode step, the requests still queued for a slot when it started, when
            recording (the workload's queue depth: what tells a saturated engine from an idle one).
    """

    policy: str
    concurrency: int
    outputs: np.ndarray
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    steps: int = 0
    cells: Counter[tuple[int, int]] = field(default_factory=Counter)
    cell_seconds: dict[tuple[int, int], float] = field(default_factory=lambda: defaultdict(float))
    plan_seconds: float = 0.0
    verified_tokens: int = 0
    records: list[StepRecord] = field(default_factory=list)
    step_log: list[tuple[float, int, int, int]] = field(default_factory=list)
    planner_stats: dict[str, Any] = field(default_factory=dict)
    step_ms: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """Accepted tokens per second of decode (accepted drafts plus bonus tokens)."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready numbers (no outputs, no records)."""
        return {
            "policy": self.policy,
            "concurrency": self.concurrency,
            "requests": int(self.outputs.shape[0]),
            "decode_tokens": self.decode_tokens,
            "decode_seconds": self.decode_seconds,
            "goodput_tok_s": self.goodput,
            "prefill_seconds": self.prefill_seconds,
            "wall_seconds": self.wall_seconds,
            "steps": self.steps,
            "mean_step_ms": 1000.0 * self.decode_seconds / max(self.steps, 1),
            "plan_ms_per_step": 1000.0 * self.plan_seconds / max(self.steps, 1),
            "tokens_per_step": self.decode_tokens / max(self.steps, 1),
            "verified_tokens": self.verified_tokens,
            "cells": {f"{g}/{v}": c for (g, v), c in sorted(self.cells.items())},
            **({"planner": self.planner_stats} if self.planner_stats else {}),
        }


def serve(
    engine: Engine,
    prompts: np.ndarray,
    *,
    concurrency: int,
    max_new: int,
    policy: Policy,
    record: bool = False,
    log_steps: bool = False,
) -> RunResult:
    """Serve every prompt greedily with at most ``concurrency`` requests in flight.

    Requests are admitted in order as slots free up (continuous batching); each produces exactly
    ``max_new`` tokens (tokens past that in its last step are dropped and not counted).

    Args:
        engine: the engine (cells of every rung the policy may pick must be prepared).
        prompts: ``[N, P]`` prompt tokens.
        concurrency: maximum requests in flight (≤ the largest rung).
        max_new: tokens generated per request.
        policy: static or dynamic.
        record: keep a :class:`StepRecord` per real row and step (needs host windows), and each
            step's wall time and queue depth.
        log_steps: keep ``(ms, G, V, arm)`` per decode step.

    Returns:
        Outputs, timings and (optionally) records.
    """
    cfg = engine.cfg
    total, plen = prompts.shape
    if concurrency > cfg.slots:
        raise ValueError(f"concurrency {concurrency} exceeds the engine's {cfg.slots} slots")
    if plen + max_new + cfg.width > cfg.max_len:
        raise ValueError(f"prompt {plen} + {max_new} new tokens + K+1 exceed the cache length {cfg.max_len}")
    st = Slots.empty(cfg.slots, cfg.k)
    req, length, anchor, drafts, conf, produced, rounds = (
        st.req, st.length, st.anchor, st.drafts, st.conf, st.produced, st.rounds,
    )  # fmt: skip
    outputs = np.zeros((total, max_new), dtype=np.int64)
    flat_out = outputs.reshape(-1)
    result = RunResult(policy=policy.name, concurrency=concurrency, outputs=outputs)
    state = {"next": 0, "n": 0}

    def admit(free: list[int]) -> None:
        take = min(len(free), total - state["next"])
        if take <= 0:
            return
        where = np.array(free[:take], dtype=np.int64)
        ids = np.arange(state["next"], state["next"] + take, dtype=np.int64)
        state["next"] += take
        first = engine.prefill(where, prompts[ids])
        req[where] = ids
        length[where] = plen
        anchor[where] = first.bonus
        drafts[where] = first.drafts
        conf[where] = first.confidence
        produced[where] = 1
        rounds[where] = 0
        outputs[ids, 0] = first.bonus

    observe = getattr(policy, "observe", None)
    t_run = time.perf_counter()
    admit(list(range(min(concurrency, total))))
    state["n"] = int((req >= 0).sum())
    result.prefill_seconds += time.perf_counter() - t_run
    while state["n"] > 0:
        n = state["n"]
        waiting = total - state["next"]  # every request is queued from the start: not yet admitted
        t0 = time.perf_counter()
        plan = policy.plan(conf[:n])
        t1 = time.perf_counter()
        if record and plan.windows is None:
            raise ValueError(
                f"policy {policy.name!r} keeps its windows on the device; record needs host windows"
            )
        out = engine.step(plan.g, plan.v, n, plan.windows, length, anchor, drafts, fused=plan.fused)
        if observe is not None:
            observe(out)
        acc = out.accepted
        if record:
            windows = plan.windows
            assert windows is not None  # checked above: a recording policy keeps host windows
            for r in range(n):
                result.records.append(
                    StepRecord(
                        result.steps,
                        int(req[r]),
                        int(rounds[r]),
                        conf[r].copy(),
                        int(acc[r]),
                        int(windows[r]),
                        int(produced[r]),
                    )
                )
        result.decode_tokens += int(st.advance(out, n, max_new, flat_out).sum())
        if plan.windows is not None:
            result.verified_tokens += int(plan.windows.sum()) + n
        result.steps += 1
        result.cells[(plan.g, plan.v)] += 1
        result.plan_seconds += t1 - t0
        elapsed = time.perf_counter() - t0
        result.decode_seconds += elapsed
        result.cell_seconds[(plan.g, plan.v)] += elapsed
        if log_steps:
            result.step_log.append((1000.0 * elapsed, plan.g, plan.v, int(getattr(policy, "arm", 0))))
        if record:
            result.step_ms.append(1000.0 * elapsed)
            result.waiting.append(waiting)
        done = np.flatnonzero(produced[:n] >= max_new)
        if done.size:
            t2 = time.perf_counter()
            req[done] = -1
            admit([int(s) for s in done])
            _compact(engine, req, *st.state())
            state["n"] = int((req >= 0).sum())
            result.prefill_seconds += time.perf_counter() - t2
    finish = getattr(policy, "finish", None)
    if finish is not None:
        result.planner_stats = finish()
        result.verified_tokens += int(result.planner_stats.get("verified_tokens", 0))
    result.wall_seconds = time.perf_counter() - t_run
    return result


def _compact(engine: Engine, req: np.ndarray, *state: np.ndarray) -> None:
    """Move the highest active slots into holes so that active slots are ``0..n-1``."""
    active = np.flatnonzero(req >= 0)
    n = active.size
    holes = np.flatnonzero(req[:n] < 0)
    if holes.size == 0:
        return
    movers = active[active >= n]
    engine.move_slots(movers, holes)
    for arr in (req, *state):
        arr[holes] = arr[movers]
    req[movers] = -1


# -- the sweep's module-backend factory ------------------------------------------------------------
_REGISTRY: dict[str, Any] = {}


def register_engine(engine: Engine, context: int) -> None:
    """Make ``engine`` the one :func:`sweep_factory` builds steps from (same process only)."""
    _REGISTRY["engine"] = engine
    _REGISTRY["context"] = context


def sweep_factory(g: int, v: int, k: int) -> Callable[[], None]:
    """``module`` backend factory: the registered engine's serving step for cell (G, V).

    Raises:
        RuntimeError: no engine registered, or K differs from the engine's.
    """
    engine = _REGISTRY.get("engine")
    if not isinstance(engine, Engine):
        raise RuntimeError("no engine registered; call serving.register_engine(engine, context) first")
    if k != engine.cfg.k:
        raise RuntimeError(f"the sweep asks for K={k} but the engine drafts K={engine.cfg.k}")
    engine.prepare_cells([(g, v)])
    return engine.synthetic_step(g, v, int(_REGISTRY["context"]))
