"""The ``reference`` backend: a torch verifier step shaped by an HF-style ``config.json``.

Random weights, bf16 on GPU and fp32 on CPU. One step verifies the cell's tokens the way a target
model does in a dynamic-verification step:

- packed-token layers over the V verified tokens (cost ∝ V): RMSNorm, attention projections (GQA,
  or DeepSeek MLA with its low-rank q/kv and absorbed up-projections), dense or MoE MLP
  (routed experts with a fixed, balanced token→expert assignment so timing never depends on the
  random values, plus shared experts), final norm and LM head;
- attention of each row's new tokens over a KV cache of ``context_len`` tokens per row, with
  ragged per-row lengths summing to V (pad rows included, :meth:`CellSpec.row_lengths`); each
  row's queries are padded to the longest row, as paged decode kernels pad to their tile;
- under ``torch.distributed`` with more than one rank, tensor parallelism: heads, MLP/expert
  intermediate sizes and vocabulary are sharded and the step all-reduces after attention and MLP.

On CUDA each cell is captured once as a CUDA graph (all graphs share one memory pool; they replay
one at a time) and timed with CUDA events on the backend's stream. On CPU the same forward runs
eagerly and is timed with the host clock: the CPU path is the GPU path without capture.
``--layers`` scales the depth; the dense/MoE mix follows ``first_k_dense_replace``.

A **mixed step** (:meth:`ReferenceBackend.prepare_mixed`, DESIGN §10) runs context chunks and
ragged verification in one forward over the body bucket's capacity: every projection and the MLP
run over ``capacity`` packed tokens (pad tokens included, as a captured body does); each context
chunk attends causally over its cached prefix (its compressed tokens when it has any, else its
position) and itself; the generation rows attend, as one padded batch, over the step's longest
history (shorter histories masked) and causally over their own rows. Prefixes are read from one
shared per-layer KV buffer of ``mixed_max_span`` tokens (their values do not change the cost).
Inputs are fixed per (chunk, token) and (generation, row), so a cell and its native arm compute
the same tokens for the rows both verify: :meth:`ReferenceBackend.check_mixed` compares them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts import JsonError, canonical_json, loads_strict, sha256_hex
from dspark_calibrate.calibrate.measurement.backends import BackendBase
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.mixed import MixedShape, OutputCheck
from dspark_calibrate.calibrate.measurement.telemetry import NullTelemetry, Telemetry, open_telemetry
from dspark_calibrate.calibrate.measurement.timing import CudaEventTimer, HostTimer, Step, Timer
from dspark_calibrate.errors import ConfigError

__all__ = ["BUNDLED_CONFIGS", "ModelShape", "ReferenceBackend", "load_model_config"]

#: Configs shipped with the package: tiny ones for CPU tests, a DeepSeek-V3-shaped one and two
#: dense Llama-3-shaped ones (8B and 70B widths: a few layers make a compute-bound step) for GPUs.
BUNDLED_CONFIGS: Mapping[str, str] = {
    "tiny": "tiny.json",
    "mla-tiny": "mla-tiny.json",
    "deepseek-v3": "deepseek-v3.json",
    "llama-8b": "llama-8b.json",
    "llama-70b": "llama-70b.json",
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The shapes the reference step needs, read from an HF-style config."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    dense_layers: int
    intermediate: int
    vocab: int
    eps: float
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope: int | None = None
    qk_rope: int | None = None
    v_head: int | None = None
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0

    @property
    def mla(self) -> bool:
        """True for DeepSeek multi-head latent attention."""
        return self.kv_lora_rank is not None

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], *, layers: int | None = None) -> ModelShape:
        """Read shapes from a config dict, scaling depth to ``layers``.

        Raises:
            ConfigError: a required field is missing or not a positive integer.
        """

        def need(name: str) -> int:
            value = cfg.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model config: {name} must be a positive integer, got {value!r}")
            return value

        def opt(name: str) -> int | None:
            return need(name) if cfg.get(name) is not None else None

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        total = need("num_hidden_layers")
        n = total if layers is None else layers
        if n < 1:
            raise ConfigError(f"--layers must be >= 1, got {n}")
        experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
        dense = n
        if experts:
            first = int(cfg.get("first_k_dense_replace") or 0)
            dense = min(first, n) if layers is None else round(n * first / total)
        kv_lora = opt("kv_lora_rank")
        return cls(
            hidden=hidden,
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            layers=n,
            dense_layers=dense,
            intermediate=need("intermediate_size"),
            vocab=need("vocab_size"),
            eps=float(cfg.get("rms_norm_eps") or 1e-6),
            q_lora_rank=opt("q_lora_rank") if kv_lora else None,
            kv_lora_rank=kv_lora,
            qk_nope=opt("qk_nope_head_dim") if kv_lora else None,
            qk_rope=opt("qk_rope_head_dim") if kv_lora else None,
            v_head=opt("v_head_dim") if kv_lora else None,
            experts=experts,
            top_k=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate=int(cfg.get("moe_intermediate_size") or 0) if experts else 0,
            shared_experts=int(cfg.get("n_shared_experts") or 0) if experts else 0,
        )


def load_model_config(spec: str | Path) -> tuple[dict[str, Any], str]:
    """Load a bundled config by name (``tiny``, ``mla-tiny``, ``deepseek-v3``, ``llama-8b``,
    ``llama-70b``) or a config.json path.

    Returns:
        The config dict and its digest (SHA-256 of its canonical JSON).

    Raises:
        ConfigError: unreadable file or invalid JSON.
    """
    name = str(spec)
    try:
        if name in BUNDLED_CONFIGS:
            data = (
                resources.files("dspark_calibrate.calibrate.measurement.backends.configs")
                .joinpath(BUNDLED_CONFIGS[name])
                .read_bytes()
            )
        else:
            data = Path(name).read_bytes()
        cfg = loads_strict(data, what=name)
    except OSError as exc:
        raise ConfigError(
            f"--config {name}: cannot read: {exc}; give a config.json or one of {sorted(BUNDLED_CONFIGS)}"
        ) from exc
    except JsonError as exc:
        raise ConfigError(f"--config {name}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"--config {name}: expected a JSON object")
    return cfg, sha256_hex(canonical_json(cfg))


class _Model:
    """Random weights and the forward of one step (shared by every cell)."""

    def __init__(
        self,
        torch: Any,
        shape: ModelShape,
        *,
        device: Any,
        dtype: Any,
        context_len: int,
        max_rows: int,
        max_row_len: int,
        tp_rank: int,
        tp_size: int,
        seed: int,
        lm_head: bool,
        all_reduce: Callable[[Any], None] | None,
        ep: int = 1,
    ) -> None:
        self.t = torch
        self.s = shape
        self.dtype = dtype
        self.device = device
        self.ctx = context_len
        self.max_row_len = max_row_len
        self.tp = tp_size
        self.all_reduce = all_reduce
        self.lm_head = lm_head
        gen = torch.Generator(device="cpu").manual_seed(seed + 7919 * tp_rank)
        self._gen_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        s = shape
        self.ep = ep
        if s.experts and (ep < 1 or s.experts % ep):
            raise ConfigError(f"ep={ep} must be >= 1 and divide n_routed_experts={s.experts}")
        self.local_experts = s.experts // ep if s.experts else 0
        self.h_local = self._shard(s.heads, "num_attention_heads")
        self.kvh_local = max(1, s.kv_heads // tp_size) if not s.mla else 1
        cache_rows = max_rows * (context_len + max_row_len)
        # Every weight draws from its own generator, seeded by its place in this order.
        self._weights_drawn = 0
        self.layers: list[dict[str, Any]] = []
        for i in range(s.layers):
            p: dict[str, Any] = {
                "norm1": torch.ones(s.hidden, device=device, dtype=dtype),
                "norm2": torch.ones(s.hidden, device=device, dtype=dtype),
            }
            self._attention_weights(p, cache_rows)
            self._mlp_weights(p, dense=i < s.dense_layers or not s.experts)
            self.layers.append(p)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.prefix_span = 0  # the shared prefix buffers of mixed steps, allocated on first use
        self.head = self._w(s.hidden, self._shard(s.vocab, "vocab_size")) if lm_head else None

    def _shard(self, n: int, what: str) -> int:
        """This rank's share of ``n`` under tensor parallelism.

        Raises:
            ConfigError: ``n`` does not divide evenly.
        """
        if n % self.tp:
            raise ConfigError(f"{what}={n} is not divisible by the tensor-parallel size {self.tp}")
        return n // self.tp

    def _w(self, *dims: int) -> Any:
        """The next random weight (scaled by 0.02) in the fixed drawing order."""
        torch = self.t
        self._weights_drawn += 1
        g = torch.Generator(device=self.device).manual_seed(self._gen_seed + self._weights_drawn)
        return (torch.randn(*dims, generator=g, device=self.device, dtype=self.dtype) * 0.02).contiguous()

    def _attention_weights(self, p: dict[str, Any], cache_rows: int) -> None:
        """One layer's attention weights and KV cache (MLA's latent cache, or K and V caches)."""
        torch, s, w = self.t, self.s, self._w
        device, dtype = self.device, self.dtype
        if s.mla:
            assert s.q_lora_rank and s.kv_lora_rank and s.qk_nope and s.qk_rope and s.v_head
            p["wq_a"] = w(s.hidden, s.q_lora_rank)
            p["wq_b"] = w(s.q_lora_rank, self.h_local * (s.qk_nope + s.qk_rope))
            p["w_uk"] = w(self.h_local, s.qk_nope, s.kv_lora_rank)
            p["w_uv"] = w(self.h_local, s.kv_lora_rank, s.v_head)
            p["wkv_a"] = w(s.hidden, s.kv_lora_rank + s.qk_rope)
            p["wo"] = w(self.h_local * s.v_head, s.hidden)
            p["cache"] = torch.zeros(cache_rows, s.kv_lora_rank + s.qk_rope, device=device, dtype=dtype)
        else:
            d = s.head_dim
            p["wq"] = w(s.hidden, self.h_local * d)
            p["wkv"] = w(s.hidden, 2 * self.kvh_local * d)
            p["wo"] = w(self.h_local * d, s.hidden)
            p["kcache"] = torch.zeros(cache_rows, self.kvh_local, d, device=device, dtype=dtype)
            p["vcache"] = torch.zeros(cache_rows, self.kvh_local, d, device=device, dtype=dtype)

    def _mlp_weights(self, p: dict[str, Any], *, dense: bool) -> None:
        """One layer's MLP: dense, or the router, this rank's experts and the shared experts."""
        s, w = self.s, self._w
        if dense:
            inter = self._shard(s.intermediate, "intermediate_size")
            p["wg"], p["wu"], p["wd"] = w(s.hidden, inter), w(s.hidden, inter), w(inter, s.hidden)
            return
        inter = self._shard(s.moe_intermediate, "moe_intermediate_size")
        e_local = self.local_experts
        p["router"] = w(s.hidden, s.experts)
        p["eg"], p["eu"] = w(e_local, s.hidden, inter), w(e_local, s.hidden, inter)
        p["ed"] = w(e_local, inter, s.hidden)
        if s.shared_experts:
            sh = inter * s.shared_experts
            p["sg"], p["su"], p["sd"] = w(s.hidden, sh), w(s.hidden, sh), w(sh, s.hidden)

    def cell_buffers(self, cell: CellSpec) -> dict[str, Any]:
        """Static inputs and index tensors of one cell (captured by its graph)."""
        t = self.t
        lengths = cell.row_lengths()
        g, total, qmax = cell.graph_batch_size, cell.tokens, max(lengths)
        L = self.ctx + self.max_row_len
        pad_index, token_slot, cache_pos = [], [], []
        for r, n in enumerate(lengths):
            base = sum(lengths[:r])
            for j in range(qmax):
                pad_index.append(base + j if j < n else total)  # ``total`` names the zero pad row
            for j in range(n):
                token_slot.append(r * qmax + j)
                cache_pos.append(r * L + self.ctx + j)
        s = self.s
        buf: dict[str, Any] = {
            "x": t.randn(total, s.hidden, device=self.device, dtype=self.dtype) * 0.1,
            "pad_index": t.tensor(pad_index, device=self.device, dtype=t.long),
            "token_slot": t.tensor(token_slot, device=self.device, dtype=t.long),
            "cache_pos": t.tensor(cache_pos, device=self.device, dtype=t.long),
            "rows": g,
            "qmax": qmax,
            "total": total,
            "span": self.ctx + qmax,
            "mask": t.triu(
                t.full((qmax, qmax), float("-inf"), device=self.device, dtype=self.dtype), diagonal=1
            ),
        }
        buf.update(self._moe_buffers(total))
        return buf

    def _moe_buffers(self, total: int) -> dict[str, Any]:
        """The fixed, balanced token→expert assignment of ``total`` packed tokens (MoE layers)."""
        s, t = self.s, self.t
        if not s.experts:
            return {}
        # This rank holds experts/ep experts and receives a balanced 1/ep share of the
        # token→expert assignments; the experts that receive any are a contiguous slice.
        assignments = math.ceil(total * s.top_k / self.ep)
        a = min(self.local_experts, assignments)
        per = math.ceil(assignments / a)
        slot_token = [total] * (a * per)
        fill = [0] * a
        for i in range(assignments):
            e = i % a
            slot_token[e * per + fill[e]] = i % total
            fill[e] += 1
        return {"active": a, "per": per, "slot_token": t.tensor(slot_token, device=self.device, dtype=t.long)}

    def _rms(self, x: Any, weight: Any) -> Any:
        t = self.t
        return x * t.rsqrt(x.float().pow(2).mean(-1, keepdim=True).to(x.dtype) + self.s.eps) * weight

    def _pad(self, x: Any, buf: Mapping[str, Any]) -> Any:
        """Packed [T, ...] → [rows * qmax, ...] with a zero row for pad slots."""
        zero = self.t.zeros((1, *x.shape[1:]), device=x.device, dtype=x.dtype)
        return self.t.cat([x, zero]).index_select(0, buf["pad_index"])

    def _attend(self, q: Any, k: Any, v: Any, buf: Mapping[str, Any]) -> Any:
        """q [B, M, d], k [B, S, d], v [B, S, dv] with the causal tail mask → [B, M, dv]."""
        t = self.t
        qmax, span = buf["qmax"], buf["span"]
        scores = t.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(q.shape[-1]))
        b, m, _ = scores.shape
        tail = scores.view(b, m // qmax, qmax, span)[..., self.ctx :]
        tail.add_(buf["mask"])
        return t.matmul(t.softmax(scores.float(), dim=-1).to(v.dtype), v)

    def _attention(self, p: Mapping[str, Any], h: Any, buf: Mapping[str, Any]) -> Any:
        t, s = self.t, self.s
        rows, qmax, span = buf["rows"], buf["qmax"], buf["span"]
        L = self.ctx + self.max_row_len
        if s.mla:
            assert s.qk_nope is not None and s.qk_rope is not None and s.kv_lora_rank is not None
            q = self._rms(h @ p["wq_a"], 1.0) @ p["wq_b"]
            q = q.view(-1, self.h_local, s.qk_nope + s.qk_rope)
            q_lat = t.einsum("thn,hnc->thc", q[..., : s.qk_nope], p["w_uk"])
            q_full = t.cat([q_lat, q[..., s.qk_nope :]], dim=-1)  # [T, H, c + rope]
            p["cache"].index_copy_(0, buf["cache_pos"], h @ p["wkv_a"])
            cache = p["cache"].view(-1, L, s.kv_lora_rank + s.qk_rope)[:rows, :span]
            qp = self._pad(q_full, buf).view(rows, qmax, self.h_local, -1).transpose(1, 2)
            qp = qp.reshape(rows, self.h_local * qmax, -1)
            o = self._attend(qp, cache, cache[..., : s.kv_lora_rank], buf)  # [rows, H*qmax, c]
            o = o.view(rows, self.h_local, qmax, -1).transpose(1, 2).reshape(rows * qmax, self.h_local, -1)
            o = o.index_select(0, buf["token_slot"])
            o = t.einsum("thc,hcv->thv", o, p["w_uv"]).reshape(o.shape[0], -1)
        else:
            d, kvh = s.head_dim, self.kvh_local
            group = self.h_local // kvh
            q = (h @ p["wq"]).view(-1, kvh, group, d)
            kv = (h @ p["wkv"]).view(-1, 2, kvh, d)
            p["kcache"].index_copy_(0, buf["cache_pos"], kv[:, 0])
            p["vcache"].index_copy_(0, buf["cache_pos"], kv[:, 1])
            kc = p["kcache"].view(-1, L, kvh, d)[:rows, :span].transpose(1, 2).reshape(rows * kvh, span, d)
            vc = p["vcache"].view(-1, L, kvh, d)[:rows, :span].transpose(1, 2).reshape(rows * kvh, span, d)
            qp = self._pad(q, buf).view(rows, qmax, kvh, group, d).permute(0, 2, 3, 1, 4)
            qp = qp.reshape(rows * kvh, group * qmax, d)
            o = self._attend(qp, kc, vc, buf)
            o = o.view(rows, kvh, group, qmax, d).permute(0, 3, 1, 2, 4).reshape(rows * qmax, -1)
            o = o.index_select(0, buf["token_slot"])
        out = o @ p["wo"]
        if self.all_reduce is not None:
            self.all_reduce(out)
        return out

    def _mlp(self, p: Mapping[str, Any], h: Any, buf: Mapping[str, Any]) -> Any:
        t = self.t
        if "wg" in p:
            out = (t.nn.functional.silu(h @ p["wg"]) * (h @ p["wu"])) @ p["wd"]
        else:
            a, per, total = buf["active"], buf["per"], buf["total"]
            gate = t.softmax((h @ p["router"]).float(), dim=-1).to(
                h.dtype
            )  # router runs; assignment is fixed
            xs = self._pad_rows(h, buf["slot_token"]).view(a, per, -1)
            y = t.bmm(t.nn.functional.silu(t.bmm(xs, p["eg"][:a])) * t.bmm(xs, p["eu"][:a]), p["ed"][:a])
            weight = t.cat([gate[:, :1], gate[:1, :1]]).index_select(0, buf["slot_token"])
            out = t.zeros(total + 1, h.shape[1], device=h.device, dtype=h.dtype)
            out.index_add_(0, buf["slot_token"], y.reshape(a * per, -1) * weight)
            out = out[:total]
            if "sg" in p:
                out = out + (t.nn.functional.silu(h @ p["sg"]) * (h @ p["su"])) @ p["sd"]
        if self.all_reduce is not None:
            self.all_reduce(out)
        return out

    def _pad_rows(self, h: Any, index: Any) -> Any:
        zero = self.t.zeros((1, h.shape[1]), device=h.device, dtype=h.dtype)
        return self.t.cat([h, zero]).index_select(0, index)

    def forward(self, buf: Mapping[str, Any], *, logits: bool = False) -> Any:
        """One verification step over the cell's packed tokens; returns greedy token ids (or the
        logits with ``logits``). A mixed step's buffers (``mixed`` set) run the mixed attention."""
        x = buf["x"]
        attend = self._mixed_attention if buf.get("mixed") else self._attention
        for p in self.layers:
            x = x + attend(p, self._rms(x, p["norm1"]), buf)
            x = x + self._mlp(p, self._rms(x, p["norm2"]), buf)
        x = self._rms(x, self.final_norm)
        if self.head is None:
            return x
        out = x @ self.head
        return out if logits else out.argmax(dim=-1)

    # -- mixed steps ---------------------------------------------------------------------------

    def _kv_dims(self) -> tuple[int, int, int, int]:
        """(kv heads, query heads per kv head, query/key width, value width) of the local heads."""
        s = self.s
        if s.mla:
            assert s.kv_lora_rank is not None and s.qk_rope is not None
            return 1, self.h_local, s.kv_lora_rank + s.qk_rope, s.kv_lora_rank
        return self.kvh_local, self.h_local // self.kvh_local, s.head_dim, s.head_dim

    def shared_prefix(self, span: int) -> None:
        """Allocate the shared per-layer prefix buffers (once; ``span`` tokens)."""
        if "prefix_k" in self.layers[0]:
            return
        kvh, _, dq, dv = self._kv_dims()
        for i, p in enumerate(self.layers):
            g = self.t.Generator(device=self.device).manual_seed(self._gen_seed + 100_003 + i)
            p["prefix_k"] = (
                self.t.randn(span, kvh, dq, generator=g, device=self.device, dtype=self.dtype) * 0.5
            )
            p["prefix_v"] = (
                self.t.randn(span, kvh, dv, generator=g, device=self.device, dtype=self.dtype) * 0.5
            )
        self.prefix_span = span

    def mixed_buffers(self, shape: MixedShape, seed: int) -> dict[str, Any]:
        """Static inputs and index tensors of one rank's mixed step (captured by its graph).

        Packed token order: context chunks, then generation rows, then pad tokens up to capacity.
        """
        t, s = self.t, self.s
        total = shape.capacity
        dev, dt = self.device, self.dtype
        xs = []
        chunks = []
        offset = 0
        for c, chunk in enumerate(shape.context):
            g = t.Generator(device="cpu").manual_seed(seed * 1_000_003 + 2 * c)
            xs.append(t.randn(chunk.size, s.hidden, generator=g) * 0.1)
            prefix = chunk.compressed or chunk.position
            chunks.append((offset, chunk.size, prefix))
            offset += chunk.size
        rows = list(shape.generation_rows)
        gen_start, gen_used = offset, sum(rows)
        qmax = max(rows, default=1)
        token_slot, pad_index = [], []
        for i, n in enumerate(rows):
            g = t.Generator(device="cpu").manual_seed(seed * 1_000_003 + 2 * i + 1)
            xs.append((t.randn(shape.k + 1, s.hidden, generator=g) * 0.1)[:n])
            rel = offset - gen_start
            for j in range(qmax):
                pad_index.append(rel + j if j < n else gen_used)  # ``gen_used`` names the zero pad row
            for j in range(n):
                token_slot.append(i * qmax + j)
            offset += n
        used = offset
        if used < total:
            xs.append(t.zeros(total - used, s.hidden))
        span = max([p + n for _, n, p in chunks] + [g.history for g in shape.generations] + [1])
        if span > self.prefix_span:
            raise ConfigError(
                f"a mixed step attends over {span} cached tokens; raise --backend-opt mixed_max_span "
                f"(now {self.prefix_span})"
            )
        hist = max((g.history for g in shape.generations), default=0)
        buf: dict[str, Any] = {
            "mixed": True,
            "x": t.cat(xs).to(device=dev, dtype=dt),
            "total": total,
            "chunks": chunks,
            "gens": len(rows),
            "gen_start": gen_start,
            "gen_used": used - gen_start,
            "qmax": qmax,
            "hist": hist,
        }
        if rows:
            b = len(rows)
            hist_mask = t.zeros(b, hist, dtype=dt)
            for i, gen in enumerate(shape.generations):
                hist_mask[i, gen.history :] = float("-inf")
            own = t.full((b, qmax, qmax), float("-inf"), dtype=dt)
            for i, n in enumerate(rows):
                for q in range(qmax):
                    own[i, q, : min(q + 1, n)] = 0.0
            buf.update(
                hist_mask=hist_mask.to(dev)[:, None, None, None, :],
                own_mask=own.to(dev)[:, None, None, :, :],
                pad_index=t.tensor(pad_index, device=dev, dtype=t.long),
                token_slot=t.tensor(token_slot, device=dev, dtype=t.long),
            )
        buf["chunk_masks"] = [
            t.triu(t.full((n, n), float("-inf"), device=dev, dtype=dt), diagonal=1) for _, n, _ in chunks
        ]
        buf.update(self._moe_buffers(total))
        return buf

    def _qkv(self, p: Mapping[str, Any], h: Any) -> tuple[Any, Any, Any]:
        """Per-token queries [T, kvh, group, dq], keys [T, kvh, dq] and values [T, kvh, dv]."""
        s = self.s
        if s.mla:
            assert s.qk_nope is not None and s.qk_rope is not None and s.kv_lora_rank is not None
            q = (self._rms(h @ p["wq_a"], 1.0) @ p["wq_b"]).view(-1, self.h_local, s.qk_nope + s.qk_rope)
            q_lat = self.t.einsum("thn,hnc->thc", q[..., : s.qk_nope], p["w_uk"])
            q_full = self.t.cat([q_lat, q[..., s.qk_nope :]], dim=-1)[:, None]  # [T, 1, H, c + rope]
            latent = (h @ p["wkv_a"])[:, None]  # [T, 1, c + rope]
            return q_full, latent, latent[..., : s.kv_lora_rank]
        kvh, group, d, _ = self._kv_dims()
        kv = (h @ p["wkv"]).view(-1, 2, kvh, d)
        return (h @ p["wq"]).view(-1, kvh, group, d), kv[:, 0], kv[:, 1]

    def _mixed_attention(self, p: Mapping[str, Any], h: Any, buf: Mapping[str, Any]) -> Any:
        t, s = self.t, self.s
        q, k, v = self._qkv(p, h)
        kvh, group, dq, dv = self._kv_dims()
        scale = 1.0 / math.sqrt(dq)
        out = t.zeros(buf["total"] + 1, kvh, group, dv, device=h.device, dtype=h.dtype)
        for (start, n, prefix), mask in zip(buf["chunks"], buf["chunk_masks"], strict=True):
            qc, kc, vc = q[start : start + n], k[start : start + n], v[start : start + n]
            own = t.einsum("qhgd,shd->hgqs", qc, kc) * scale + mask
            if prefix:
                pk, pv = p["prefix_k"][:prefix], p["prefix_v"][:prefix]
                hist = t.einsum("qhgd,shd->hgqs", qc, pk) * scale
                w = t.softmax(t.cat([hist, own], dim=-1).float(), dim=-1).to(h.dtype)
                o = t.einsum("hgqs,shd->qhgd", w[..., :prefix], pv) + t.einsum(
                    "hgqs,shd->qhgd", w[..., prefix:], vc
                )
            else:
                w = t.softmax(own.float(), dim=-1).to(h.dtype)
                o = t.einsum("hgqs,shd->qhgd", w, vc)
            out[start : start + n] = o
        if buf["gens"]:
            b, qmax, start, used = buf["gens"], buf["qmax"], buf["gen_start"], buf["gen_used"]

            def padded(x: Any) -> Any:
                zero = t.zeros((1, *x.shape[1:]), device=x.device, dtype=x.dtype)
                rows = t.cat([x[start : start + used], zero])
                return rows.index_select(0, buf["pad_index"]).view(b, qmax, *x.shape[1:])

            qg, kg, vg = padded(q), padded(k), padded(v)
            own = t.einsum("bqhgd,bshd->bhgqs", qg, kg) * scale + buf["own_mask"]
            parts = [own]
            if buf["hist"]:
                pk, pv = p["prefix_k"][: buf["hist"]], p["prefix_v"][: buf["hist"]]
                parts.insert(0, t.einsum("bqhgd,shd->bhgqs", qg, pk) * scale + buf["hist_mask"])
            w = t.softmax(t.cat(parts, dim=-1).float(), dim=-1).to(h.dtype)
            if buf["hist"]:
                hw = buf["hist"]
                o = t.einsum("bhgqs,shd->bqhgd", w[..., :hw], pv) + t.einsum(
                    "bhgqs,bshd->bqhgd", w[..., hw:], vg
                )
            else:
                o = t.einsum("bhgqs,bshd->bqhgd", w, vg)
            o = o.reshape(b * qmax, kvh, group, dv).index_select(0, buf["token_slot"])
            out[start : start + used] = o
        o_all = out[: buf["total"]]
        if s.mla:
            o_all = t.einsum("thc,hcv->thv", o_all[:, 0], p["w_uv"]).reshape(o_all.shape[0], -1)
        else:
            o_all = o_all.reshape(o_all.shape[0], -1)
        res = o_all @ p["wo"]
        if self.all_reduce is not None:
            self.all_reduce(res)
        return res


def _resolve_device(torch: Any, device: str | None) -> Any:
    """The torch device to build on: CUDA when available unless told; a bare "cuda" is pinned
    to the current index.

    Raises:
        ConfigError: CUDA asked for, but torch sees none.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for, but torch sees no CUDA device")
    if dev.type == "cuda" and ":" not in str(device or "cuda"):  # pin "cuda" to the current index
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _tensor_parallel() -> tuple[int, int, Callable[[Any], None] | None]:
    """(rank, size, all-reduce) of tensor parallelism: the initialised process group's, else one rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:

        def all_reduce(x: Any) -> None:
            dist.all_reduce(x)

        return dist.get_rank(), dist.get_world_size(), all_reduce
    return 0, 1, None


class ReferenceBackend(BackendBase):
    """Torch reference verifier; see the module docstring.

    Args:
        config: bundled config name or path to an HF-style ``config.json``.
        layers: layers to build (default: the config's, which is large for real models).
        context_len: KV-cache tokens per row.
        device: ``cpu``, ``cuda`` or ``cuda:<i>`` (default: CUDA when available).
        dtype: ``bfloat16`` (GPU default) or ``float32`` (CPU default).
        max_rows: largest G the KV cache is sized for.
        max_row_len: longest row (K+1 at most); sizes the cache tail.
        lm_head: include the final LM head.
        seed: weight seed.
        graphs: capture CUDA graphs (GPU only; tests may turn it off).
        ep: expert-parallel degree simulated on this rank: it holds ``n_routed_experts / ep``
            experts and receives ``1/ep`` of the token→expert assignments (8 for a DEP8 rank).
        mixed_max_span: cached tokens a mixed step's chunks and generations may attend over (the
            shared prefix buffer's length; allocated on the first mixed step).
    """

    name = "reference"
    synthetic = False

    def __init__(
        self,
        config: str = "tiny",
        layers: int | None = None,
        context_len: int = 256,
        device: str | None = None,
        dtype: str | None = None,
        max_rows: int = 256,
        max_row_len: int = 16,
        lm_head: bool = True,
        seed: int = 0,
        graphs: bool = True,
        ep: int = 1,
        mixed_max_span: int = 4096,
    ) -> None:
        try:
            import torch
        except ImportError as exc:
            raise ConfigError("the reference backend needs torch; install the 'torch' extra") from exc
        self._torch = torch
        self._cfg, self._cfg_digest = load_model_config(config)
        self._config_name = config if config in BUNDLED_CONFIGS else Path(config).name
        self.shape = ModelShape.from_config(self._cfg, layers=layers)
        if context_len < 1 or max_rows < 1 or max_row_len < 1:
            raise ConfigError("context_len, max_rows and max_row_len must be >= 1")
        self._device = dev = _resolve_device(torch, device)
        dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
        if dtype not in ("bfloat16", "float16", "float32"):
            raise ConfigError(f"--backend-opt dtype={dtype!r} is unknown; use bfloat16, float16 or float32")
        self._dtype_name = dtype
        self._graphs = graphs and dev.type == "cuda"
        tp_rank, tp_size, all_reduce = _tensor_parallel()
        self._tp_size = tp_size
        self.context_len = context_len
        self._max_rows = max_rows
        self._max_row_len = max_row_len
        self._lm_head = lm_head
        self._seed = seed
        self._ep = ep
        # torch's stubs leave Stream.__new__ untyped.
        self._stream = (
            torch.cuda.Stream(device=dev)  # type: ignore[no-untyped-call]
            if dev.type == "cuda"
            else None
        )
        self._pool = torch.cuda.graph_pool_handle() if self._graphs else None
        with torch.inference_mode(), self._on_stream():
            self.model = _Model(
                torch,
                self.shape,
                device=dev,
                dtype=getattr(torch, dtype),
                context_len=context_len,
                max_rows=max_rows,
                max_row_len=max_row_len,
                tp_rank=tp_rank,
                tp_size=tp_size,
                seed=seed,
                lm_head=lm_head,
                all_reduce=all_reduce,
                ep=ep,
            )
        if self._stream is not None:
            self._stream.synchronize()
        self._graph_refs: dict[CellSpec | MixedShape, Any] = {}
        if mixed_max_span < 1:
            raise ConfigError(f"mixed_max_span must be >= 1, got {mixed_max_span}")
        self._mixed_max_span = mixed_max_span

    def _on_stream(self) -> Any:
        import contextlib

        if self._stream is None:
            return contextlib.nullcontext()
        return self._torch.cuda.stream(self._stream)

    def prepare(self, cell: CellSpec) -> Step:
        """Build the cell's buffers and, on CUDA, capture its graph.

        Raises:
            ConfigError: the cell does not fit the cache (G > max_rows or a row longer than max_row_len).
        """
        torch = self._torch
        if cell.graph_batch_size > self._max_rows or max(cell.row_lengths()) > self._max_row_len:
            raise ConfigError(
                f"{cell.label()} does not fit the reference KV cache (max_rows={self._max_rows}, "
                f"max_row_len={self._max_row_len}); raise them with --backend-opt"
            )
        with torch.inference_mode(), self._on_stream():
            buf = self.model.cell_buffers(cell)
            if not self._graphs:
                model = self.model

                def eager() -> None:
                    with torch.inference_mode():
                        model.forward(buf)

                return eager
            assert self._stream is not None
            for _ in range(2):  # warm-up on the capture stream: kernel selection, allocator growth
                self.model.forward(buf)
            self._stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                self.model.forward(buf)
        self._graph_refs[cell] = (graph, buf)
        return graph.replay  # type: ignore[no-any-return]  # CUDAGraph.replay is a bound method

    def release(self, cell: CellSpec) -> None:
        """Drop the cell's graph and buffers before it is captured again (a new capture epoch)."""
        self._graph_refs.pop(cell, None)

    def _mixed_seed(self, shape: MixedShape) -> int:
        # Inputs depend on the step's chunks and generations, never on the capacity or the rows,
        # so a cell and its native arm feed the same tokens into the rows both verify.
        key = canonical_json(
            {
                "context": [c.to_dict() for c in shape.context],
                "generations": [g.to_dict() for g in shape.generations],
                "seed": self._seed,
            }
        )
        return int(sha256_hex(key)[:8], 16)

    def prepare_mixed(self, shape: MixedShape) -> Step:
        """Build one rank's mixed step and, on CUDA, capture its graph (see the module docstring).

        Raises:
            ConfigError: a row longer than K+1 or a prefix beyond ``mixed_max_span``.
        """
        torch = self._torch
        with torch.inference_mode(), self._on_stream():
            self.model.shared_prefix(self._mixed_max_span)
            buf = self.model.mixed_buffers(shape, self._mixed_seed(shape))
            if not self._graphs:
                model = self.model

                def eager() -> None:
                    with torch.inference_mode():
                        model.forward(buf)

                return eager
            assert self._stream is not None
            for _ in range(2):
                self.model.forward(buf)
            self._stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                self.model.forward(buf)
        self._graph_refs[shape] = (graph, buf)
        return graph.replay  # type: ignore[no-any-return]  # CUDAGraph.replay is a bound method

    def release_mixed(self, shape: MixedShape) -> None:
        """Drop a mixed step's graph and buffers (a new capture epoch)."""
        self._graph_refs.pop(shape, None)

    def check_mixed(self, native: MixedShape, candidate: MixedShape) -> OutputCheck:
        """Greedy tokens of every generation row the candidate verifies, against the native arm's.

        Rows whose native top-two logits lie within the dtype's rounding of each other are not
        counted as disagreements (they are reported in the detail): two shapes may round a tie
        either way.
        """
        torch = self._torch
        if self.model.head is None:
            return OutputCheck(0, 0, "no LM head (lm_head=False): nothing to compare")
        with torch.inference_mode(), self._on_stream():
            self.model.shared_prefix(self._mixed_max_span)
            outs = []
            for shape in (native, candidate):
                buf = self.model.mixed_buffers(shape, self._mixed_seed(shape))
                outs.append(self.model.forward(buf, logits=True).float())
        if self._stream is not None:
            self._stream.synchronize()
        ctx = sum(c.size for c in native.context)
        rtol = 1e-4 if self._dtype_name == "float32" else 3e-2
        rows = mismatches = ties = 0
        n_off = c_off = ctx
        for n_rows, c_rows in zip(native.generation_rows, candidate.generation_rows, strict=True):
            for j in range(c_rows):
                a, b = outs[0][n_off + j], outs[1][c_off + j]
                top = torch.topk(a, 2).values
                rows += 1
                if int(a.argmax()) != int(b.argmax()):
                    if float(top[0] - top[1]) <= rtol * max(1.0, float(top[0].abs())):
                        ties += 1
                    else:
                        mismatches += 1
            n_off += n_rows
            c_off += c_rows
        return OutputCheck(
            rows,
            mismatches,
            f"greedy tokens of {rows} rows compared ({ties} near-ties within {rtol:g} not counted)",
        )

    def timer(self) -> Timer:
        """CUDA events on the backend stream on GPU; the host clock on CPU."""
        if self._stream is not None:
            return CudaEventTimer(self._stream)
        return HostTimer()

    def telemetry(self) -> Telemetry:
        """NVML readings of this GPU (none on CPU)."""
        if self._device.type != "cuda":
            return NullTelemetry()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        index = self._device.index or 0
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if entries and index < len(entries) and entries[index].isdigit():
            index = int(entries[index])
        return open_telemetry(index)

    def describe(self) -> dict[str, Any]:
        """Config, shapes, depth, context, device kind, dtype, tensor-parallel size."""
        return {
            "name": self.name,
            "config": self._config_name,
            "config_sha256": self._cfg_digest,
            "shape": asdict(self.shape),
            "context_len": self.context_len,
            "device": self._device.type,
            "dtype": self._dtype_name,
            "tp_size": self._tp_size,
            "graphs": self._graphs,
            "lm_head": self._lm_head,
            "max_rows": self._max_rows,
            "max_row_len": self._max_row_len,
            "seed": self._seed,
            "ep": self._ep,
            "mixed_max_span": self._mixed_max_span,
        }

    def fingerprint_fields(self) -> dict[str, Any]:
        """GPU name, model config digest, context length, KV dtype, kernel backends."""
        gpu = "cpu"
        if self._device.type == "cuda":
            gpu = self._torch.cuda.get_device_name(self._device).removeprefix("NVIDIA ").strip()
        return {
            "gpu": gpu,
            "model_config_sha256": self._cfg_digest,
            "context_len": self.context_len,
            "kv_dtype": self._dtype_name,
            "attention_backend": "reference-matmul",
            "moe_backend": "reference-bmm",
        }

    def close(self) -> None:
        """Drop graphs and weights."""
        self._graph_refs.clear()
