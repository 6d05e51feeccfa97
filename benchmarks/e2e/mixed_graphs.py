"""Mixed prefill+decode steps at fixed shapes, one per body bucket: CUDA graphs on CUDA.

:func:`mixed_serving.mixed_forward` packs a mixed step on the host and runs it eagerly: its launches
and its shapes follow the step (generation rows, chunks), so on a GPU it costs tens of
milliseconds of host time that varies from step to step, which drowns a few percent of gain.
:class:`MixedSteps` runs the same arithmetic at shapes fixed per body bucket, as an engine's
captured prefill graphs run it:

- **Fixed rows.** Generation attention always runs over ``max_decoding`` rows in the decode
  steps' ``[rows, K+1]`` layout, chunk attention over ``prefill_slots`` chunks; absent rows and
  chunks attend over a scratch cache slot, and their outputs are not read. The GEMMs run over the
  bucket's capacity, as before.
- **Host packing, one copy.** The host writes every index the step needs (tokens, positions, the
  cache slot each row writes, where each row's query goes in the two attention layouts and where
  each attention output goes back) into one pinned buffer per bucket; one copy moves it and the
  bucket's graph replays. Pad rows write their keys into the scratch slot.
- **Same numbers.** Every row's attention is its own (row, head) tile and every GEMM runs in the
  same ``gemm_chunk`` chunks, so each output equals the eager step's (tested on the CPU, where the
  same fixed-shape ops run eagerly).

The scratch slot is the engine's last cache slot: enlarge the caches to ``max_decoding +
prefill_slots + 1`` slots first (:func:`mixed_serving.enlarge_caches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.attention import sdpa_kernel

from .mixed_serving import MixedOut, MixedTraffic
from .model import Block
from .serving import Engine, StepOutput, _chunked_linear, block_out, block_qkv, grouped_attention

__all__ = ["MixedSteps"]


@dataclass(frozen=True, slots=True)
class _Regions:
    """Offsets of one bucket's int64 input buffer."""

    cap: int  # packed rows (the capacity rounded up to the GEMM chunk)
    gen: int  # generation rows x (K+1)
    ctx: int  # chunks x chunk size
    rows: int  # generation rows
    chunks: int
    k: int

    def layout(self) -> dict[str, slice]:
        sizes = {
            "tok": self.cap,
            "pos": self.cap,
            "wslot": self.cap,
            "src": self.cap,  # where each packed row's attention output comes from
            "qg": self.gen,  # the packed row whose query fills each generation layout place
            "qc": self.ctx,  # the packed row of each chunk token
            "glen": self.rows,
            "win": self.rows,
            "drafts": self.rows * self.k,
            "cslot": self.chunks,
            "cpos": self.chunks,
            "fidx": self.chunks,  # the packed row of each chunk's last token
        }
        out, at = {}, 0
        for name, size in sizes.items():
            out[name] = slice(at, at + size)
            at += size
        return out


class MixedSteps:
    """The mixed steps of every body bucket at fixed shapes (module docstring).

    Args:
        engine: the engine (caches already enlarged, scratch slot last).
        traffic: the prefill traffic's shape (chunk size, prefill slots, decoding rows, buckets).
        graphs: capture one CUDA graph per bucket (default: on CUDA).

    Raises:
        ValueError: the caches have no scratch slot above the decoding and prefill slots.
    """

    def __init__(self, engine: Engine, traffic: MixedTraffic, *, graphs: bool | None = None) -> None:
        slots = int(engine.cache_k.shape[1])
        need = traffic.max_decoding + traffic.prefill_slots + 1
        if slots < need:
            raise ValueError(
                f"the caches hold {slots} slots; fixed mixed steps need {need} (a scratch slot last)"
            )
        self.engine = engine
        self.traffic = traffic
        self.scratch = slots - 1
        self.graphs = engine.device.type == "cuda" if graphs is None else bool(graphs)
        cfg = engine.cfg
        self._n, self._m, self._size = traffic.max_decoding, traffic.prefill_slots, traffic.chunk
        self._steps: dict[int, dict[str, Any]] = {}
        self._pool: Any = None
        self._regions = {
            b: _Regions(
                -(-b // cfg.gemm_chunk) * cfg.gemm_chunk,
                self._n * cfg.width,
                self._m * self._size,
                self._n,
                self._m,
                cfg.k,
            )
            for b in traffic.buckets
        }

    # -- set-up ---------------------------------------------------------------------------------
    def prepare(self, capacities: Sequence[int] | None = None) -> None:
        """Build (capture) the step of every bucket in ``capacities`` (default: all)."""
        for b in capacities or self.traffic.buckets:
            if b not in self._steps:
                self._steps[b] = self._build(int(b))

    def _build(self, capacity: int) -> dict[str, Any]:
        reg = self._regions[capacity]
        lay = reg.layout()
        size = max(s.stop for s in lay.values())
        dev, cfg = self.engine.device, self.engine.cfg
        pin = dev.type == "cuda"
        step: dict[str, Any] = {
            "lay": lay,
            "reg": reg,
            "host": torch.zeros(size, dtype=torch.int64, pin_memory=pin),
            "dev": torch.zeros(size, dtype=torch.int64, device=dev),
        }
        width, k = cfg.width, cfg.k
        out_size = 2 * reg.rows + 2 * reg.rows * k + reg.chunks * (1 + 2 * k) + reg.rows * width
        step["out_dev"] = torch.zeros(out_size, dtype=torch.float32, device=dev)
        step["out_host"] = torch.zeros(out_size, dtype=torch.float32, pin_memory=pin)
        self._pack_idle(step)
        step["dev"].copy_(step["host"])
        if self.graphs:
            step["run"] = self._capture(step)
        else:
            step["run"] = lambda: self._body(step)
        return step

    def _capture(self, step: dict[str, Any]) -> Any:
        dev = self.engine.device
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._body(step)
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._body(step)
        step["graph"] = graph
        return graph.replay

    # -- host packing ---------------------------------------------------------------------------
    def _pack_idle(self, step: dict[str, Any]) -> None:
        """A step with no row: every index points at the scratch slot or the zero rows."""
        reg, lay = step["reg"], step["lay"]
        h = step["host"].numpy()
        h[:] = 0
        h[lay["wslot"]] = self.scratch
        h[lay["src"]] = reg.gen + reg.ctx  # the zero row
        h[lay["qg"]] = reg.cap
        h[lay["qc"]] = reg.cap
        h[lay["cslot"]] = self.scratch
        h[lay["fidx"]] = reg.cap

    def _pack(self, step: dict[str, Any], a: dict[str, Any]) -> None:
        """Write one step's indices (``a``: :meth:`forward`'s arguments) into its host buffer."""
        reg, lay = step["reg"], step["lay"]
        n, windows, lengths, anchors, drafts = a["n"], a["windows"], a["lengths"], a["anchors"], a["drafts"]
        chunk_slots, chunk_pos, chunk_tokens = a["chunk_slots"], a["chunk_pos"], a["chunk_tokens"]
        width, k = self.engine.cfg.width, self.engine.cfg.k
        m, size = int(chunk_slots.shape[0]), self._size
        w1 = windows[:n].astype(np.int64) + 1
        tg = int(w1.sum())
        total = tg + m * size
        if n > reg.rows or m > reg.chunks or total > reg.cap:
            raise ValueError(
                f"{n} generation rows ({tg} tokens) and {m} chunks do not fit the fixed step "
                f"({reg.rows} rows, {reg.chunks} chunks, {reg.cap} packed rows)"
            )
        self._pack_idle(step)
        h = step["host"].numpy()
        row = np.repeat(np.arange(n, dtype=np.int64), w1)
        j = np.arange(tg, dtype=np.int64) - np.repeat(np.cumsum(w1) - w1, w1)
        table = (
            np.concatenate([anchors[:n, None], drafts[:n]], axis=1) if n else np.zeros((0, width), np.int64)
        )
        tok, pos, wslot, src = (h[lay[r]] for r in ("tok", "pos", "wslot", "src"))
        tok[:tg], pos[:tg], wslot[:tg] = table[row, j], lengths[row] + j, row
        src[:tg] = row * width + j
        h[lay["qg"]][row * width + j] = np.arange(tg)
        if m:
            ctok = slice(tg, total)
            tok[ctok] = chunk_tokens.reshape(-1)
            pos[ctok] = (chunk_pos[:, None] + np.arange(size)[None, :]).reshape(-1)
            wslot[ctok] = np.repeat(chunk_slots, size)
            src[ctok] = reg.gen + np.arange(m * size)
            h[lay["qc"]][: m * size] = tg + np.arange(m * size)
            h[lay["cslot"]][:m] = chunk_slots
            h[lay["cpos"]][:m] = chunk_pos
            h[lay["fidx"]][:m] = tg + np.arange(m) * size + size - 1
        h[lay["glen"]][:n] = lengths[:n]
        h[lay["win"]][:n] = windows[:n]
        h[lay["drafts"]].reshape(reg.rows, k)[:n] = drafts[:n]

    # -- the device computation ---------------------------------------------------------------------
    def _body(self, step: dict[str, Any]) -> None:
        eng = self.engine
        cfg, mc, tgt, dev = eng.cfg, eng.target.cfg, eng.target, eng.device
        reg, lay, buf = step["reg"], step["lay"], step["dev"]
        width, k, chunk, size = cfg.width, cfg.k, cfg.gemm_chunk, self._size
        n_rows, m_rows = reg.rows, reg.chunks
        tok, pos, wslot, src = (buf[lay[r]] for r in ("tok", "pos", "wslot", "src"))
        qg, qc, glen, cslot, cpos = (buf[lay[r]] for r in ("qg", "qc", "glen", "cslot", "cpos"))
        keys = torch.arange(cfg.max_len, device=dev)
        qpos = glen[:, None] + torch.arange(width, device=dev)[None, :]
        gmask = (keys[None, None, :] <= qpos[:, :, None]).repeat(1, mc.group, 1)[:, None]
        cq = cpos[:, None] + torch.arange(size, device=dev)[None, :]
        cmask = (keys[None, None, :] <= cq[:, :, None]).repeat(1, mc.group, 1)[:, None]
        cos, sin = tgt.rope_cos[pos][:, None, :], tgt.rope_sin[pos][:, None, :]
        with torch.no_grad(), sdpa_kernel([eng.backend]):
            x = tgt.embed(tok)
            for layer, blk in enumerate(tgt.blocks):
                assert isinstance(blk, Block)
                q, k_new, v_new = block_qkv(tgt, blk, x, cos, sin, chunk)
                ck, cv = eng.cache_k[layer], eng.cache_v[layer]
                ck[wslot, pos] = k_new
                cv[wslot, pos] = v_new
                qz = torch.cat([q, q.new_zeros(1, mc.n_heads, mc.head_dim)])
                o = grouped_attention(qz[qg], n_rows, width, ck[:n_rows], cv[:n_rows], gmask, mc)
                kc, vc = ck.index_select(0, cslot), cv.index_select(0, cslot)
                oc = grouped_attention(qz[qc], m_rows, size, kc, vc, cmask, mc)
                x = block_out(blk, x, torch.cat([o, oc, o.new_zeros(1, mc.d_model)])[src], chunk)
            hid = tgt.ln_f(x)
            pred = _chunked_linear(hid, tgt.lm_head.weight, chunk).argmax(-1)
            predz = torch.cat([pred, pred.new_full((1,), -1)])
            hidz = torch.cat([hid, hid.new_zeros(1, mc.d_model)])
            pred_pad = predz[qg].view(n_rows, width)
            hid_pad = hidz[qg].view(n_rows, width, mc.d_model)
            win = buf[lay["win"]]
            dr = buf[lay["drafts"]].view(n_rows, k)
            live = torch.arange(k, device=dev)[None, :] < win[:, None]
            acc = torch.cumprod(((dr == pred_pad[:, :k]) & live).to(torch.int64), dim=1).sum(1)
            bon = pred_pad.gather(1, acc[:, None]).squeeze(1)
            # Absent rows and chunks carry token -1 (nothing verified); they draft from token 0,
            # and nothing reads what they draft.
            nd, nc = eng.drafter.draft(hid_pad[torch.arange(n_rows, device=dev), acc], bon.clamp(min=0))
            fidx = buf[lay["fidx"]]
            ft = predz[fidx]
            fd, fc = eng.drafter.draft(hidz[fidx], ft.clamp(min=0))
            parts = [
                acc,
                bon,
                nd.reshape(-1),
                nc.reshape(-1),
                ft,
                fd.reshape(-1),
                fc.reshape(-1),
                pred_pad.reshape(-1),
            ]
            torch.cat([p.to(torch.float32) for p in parts], out=step["out_dev"])

    # -- a step -----------------------------------------------------------------------------------
    def forward(
        self,
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
        """One mixed step, as :func:`mixed_serving.mixed_forward` (same arguments, same outputs).

        Raises:
            KeyError: ``capacity`` is not a bucket of the traffic.
            ValueError: the rows do not fit.
        """
        if capacity not in self._regions:
            raise KeyError(f"capacity {capacity} is not a body bucket {list(self.traffic.buckets)}")
        self.prepare([capacity])
        step = self._steps[capacity]
        self._pack(step, locals())
        step["dev"].copy_(step["host"], non_blocking=True)
        step["run"]()
        out = step["out_host"]
        out.copy_(step["out_dev"], non_blocking=True)
        if self.engine.device.type == "cuda":
            torch.cuda.current_stream(self.engine.device).synchronize()
        return self._unpack(step["reg"], out.numpy(), n, last, keep_pred)

    def _unpack(self, reg: _Regions, a: np.ndarray, n: int, last: np.ndarray, keep_pred: bool) -> MixedOut:
        k, width = self.engine.cfg.k, self.engine.cfg.width
        r, c = reg.rows, reg.chunks
        at = [0]

        def take(count: int) -> np.ndarray:
            part = a[at[0] : at[0] + count]
            at[0] += count
            return part

        acc, bon = take(r).astype(np.int64), take(r).astype(np.int64)
        nd, nc = take(r * k).reshape(r, k).astype(np.int64), take(r * k).reshape(r, k).copy()
        ft, fd, fc = (
            take(c).astype(np.int64),
            take(c * k).reshape(c, k).astype(np.int64),
            take(c * k).reshape(c, k).copy(),
        )
        pred = take(r * width).reshape(r, width).astype(np.int64)
        ends = np.flatnonzero(last)
        gen = StepOutput(acc[:n], bon[:n], nd[:n], nc[:n])
        return MixedOut(gen, ft[ends], fd[ends], fc[ends], pred[:n] if keep_pred else None)
