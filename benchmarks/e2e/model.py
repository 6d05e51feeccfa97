"""Target LM and drafter of the end-to-end experiment, and how both are trained in seconds.

The **target** is a pre-norm decoder-only transformer over bytes (vocabulary 256) with grouped-query
attention and rotary positions. It is sized for the physics of dynamic verification, not for
quality (issue 7): the ``h200`` preset has about 0.5 B parameters (width 2048, 12 layers, MLP
8192), so that a verification step over V tokens is dominated by GEMMs that are compute-bound
once V passes a few hundred tokens, and the step time T(G, V) has slope at G ≥ 64. The ``tiny``
preset runs the same code on a CPU in seconds.

The **drafter** proposes K tokens per round from the target's last hidden state h_t and the anchor
token (the target's bonus token): a small residual-MLP recurrence of K steps that feeds each draft
back in. Its **confidence head** scores each position with a logit for "this draft is accepted
given that the previous ones were", from the drafter's detached state and its own top-1 log
probability, top-1/top-2 margin and entropy. Both are distilled from the target's greedy
continuations (rollouts), teacher-forced on those continuations, which is exactly the conditional
the confidence must predict.

Training uses fixed seeds and fixed step counts; a wall-clock cap can end training early, and the
summary then says so. Serving-time execution (packed verification, CUDA graphs) lives in
:mod:`serving`; this module never captures graphs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "PRESETS",
    "Drafter",
    "DrafterConfig",
    "ModelConfig",
    "Preset",
    "TargetLM",
    "TrainSummary",
    "apply_rope",
    "greedy_rollout",
    "train_drafter",
    "train_target",
]

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the target LM.

    Attributes:
        vocab: vocabulary size (256 for bytes).
        d_model: residual width.
        n_layers: transformer blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention).
        d_ff: MLP inner width.
        max_len: longest position (rotary table length; training and serving stay below it).
        rope_base: rotary base.
    """

    vocab: int = 256
    d_model: int = 2048
    n_layers: int = 12
    n_heads: int = 16
    n_kv_heads: int = 4
    d_ff: int = 8192
    max_len: int = 1024
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError("d_model must divide into n_heads, and n_heads into n_kv_heads")

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.d_model // self.n_heads

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values) of one token."""
        return self.n_kv_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    """Shape of the drafter.

    Attributes:
        d_target: the target's width (input hidden state).
        d_draft: the drafter's width.
        k: draft tokens per round (K).
        vocab: vocabulary size.
        n_blocks: residual MLP blocks applied per draft position.
    """

    d_target: int
    d_draft: int = 512
    k: int = 5
    vocab: int = 256
    n_blocks: int = 2


@dataclass(frozen=True, slots=True)
class Preset:
    """Everything that scales between the GPU experiment and the CPU smoke run.

    Attributes:
        name: ``h200`` or ``tiny``.
        model: target shape.
        d_draft: drafter width.
        target_steps: optimiser steps of the target.
        target_batch: sequences per target step.
        target_seq: tokens per training sequence.
        target_lr: peak learning rate of the target.
        rollout_prompts: prompts the target continues greedily to make drafter data.
        rollout_new: tokens generated per rollout.
        drafter_steps: optimiser steps of the drafter.
        drafter_batch: draft rounds per drafter step.
        corpus_bytes: cap on the training corpus.
        time_cap_s: wall-clock cap on each training phase (ends training early if hit).
    """

    name: str
    model: ModelConfig
    d_draft: int
    target_steps: int
    target_batch: int
    target_seq: int
    target_lr: float
    rollout_prompts: int
    rollout_new: int
    drafter_steps: int
    drafter_batch: int
    corpus_bytes: int
    time_cap_s: float


PRESETS: dict[str, Preset] = {
    # About 0.53 B parameters: 12 x (qkv 2048x3072 + o 2048x2048 + MLP 2 x 2048x8192). At 48 x 512
    # tokens per step a bf16 training step is ~8e13 FLOP; 260 steps take about a minute on one H200.
    "h200": Preset(
        name="h200",
        model=ModelConfig(d_model=2048, n_layers=12, n_heads=16, n_kv_heads=4, d_ff=8192, max_len=1024),
        d_draft=512,
        target_steps=260,
        target_batch=48,
        target_seq=512,
        target_lr=6e-4,
        rollout_prompts=1024,
        rollout_new=96,
        drafter_steps=600,
        drafter_batch=4096,
        corpus_bytes=12_000_000,
        time_cap_s=120.0,
    ),
    "tiny": Preset(
        name="tiny",
        model=ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=256, max_len=256),
        d_draft=64,
        target_steps=150,
        target_batch=16,
        target_seq=96,
        target_lr=3e-3,
        rollout_prompts=48,
        rollout_new=32,
        drafter_steps=150,
        drafter_batch=256,
        corpus_bytes=400_000,
        time_cap_s=300.0,
    ),
}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the last dimension of ``x`` (in fp32, cast back).

    Args:
        x: ``[..., heads, head_dim]``.
        cos: ``[..., 1, head_dim // 2]`` broadcastable to ``x``'s halves.
        sin: same shape as ``cos``.
    """
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class Block(nn.Module):
    """One pre-norm transformer block; the forward passes live with their callers."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.ln1 = nn.LayerNorm(d, bias=False)
        self.wqkv = nn.Linear(d, (cfg.n_heads + 2 * cfg.n_kv_heads) * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, d, bias=False)
        self.ln2 = nn.LayerNorm(d, bias=False)
        self.up = nn.Linear(d, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, d, bias=False)


class TargetLM(nn.Module):
    """The target model. LayerNorm (one block per row on CUDA) keeps per-token numerics
    independent of how many tokens share a launch, which the packed verifier relies on."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        half = cfg.head_dim // 2
        inv = 1.0 / (cfg.rope_base ** (torch.arange(half, dtype=torch.float64) / half))
        ang = torch.arange(cfg.max_len, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("rope_cos", ang.cos().float(), persistent=False)
        self.register_buffer("rope_sin", ang.sin().float(), persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        resid = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = resid if name.endswith(("wo.weight", "down.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def n_params(self) -> int:
        """Number of parameters."""
        return sum(p.numel() for p in self.parameters())

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split a fused projection ``[..., (H + 2 Hkv) hd]`` into q, k, v with a head axis."""
        c = self.cfg
        hd = c.head_dim
        q, k, v = qkv.split((c.n_heads * hd, c.kv_dim, c.kv_dim), dim=-1)
        lead = qkv.shape[:-1]
        return (
            q.reshape(*lead, c.n_heads, hd),
            k.reshape(*lead, c.n_kv_heads, hd),
            v.reshape(*lead, c.n_kv_heads, hd),
        )

    def _attend_dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        # q [B, T, H, hd]; k, v [B, S, Hkv, hd] -> [B, T, H*hd]
        g = self.cfg.group
        qh = q.transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(g, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(g, dim=1)
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
        return o.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)

    def forward_train(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal forward over ``[B, T]`` tokens from position 0.

        Returns:
            Final (normed) hidden states ``[B, T, d]`` and logits ``[B, T, vocab]``.
        """
        t = tokens.shape[1]
        cos = self.rope_cos[:t, None, :]
        sin = self.rope_sin[:t, None, :]
        x = self.embed(tokens)
        for blk in self.blocks:
            assert isinstance(blk, Block)
            q, k, v = self.split_qkv(blk.wqkv(blk.ln1(x)))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            x = x + blk.wo(self._attend_dense(q, k, v, causal=True))
            x = x + blk.down(F.gelu(blk.up(blk.ln2(x)), approximate="tanh"))
        h = self.ln_f(x)
        return h, self.lm_head(h)

    def forward_cached(
        self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward of ``[B, t]`` new tokens at positions ``start..start+t-1`` over a dense cache.

        Either a prefill (``start == 0``, causal) or one decode token (``t == 1``). Used for the
        drafter's rollouts; serving uses the packed verifier instead.

        Args:
            tokens: new tokens.
            cache: per layer ``(k, v)`` of shape ``[B, Lmax, Hkv, hd]``, written in place.
            start: position of the first new token.

        Returns:
            Hidden states and logits of the new tokens.
        """
        _bsz, t = tokens.shape
        if not (start == 0 or t == 1):
            raise ValueError("forward_cached handles a prefill from 0 or a single decode token")
        cos = self.rope_cos[start : start + t, None, :]
        sin = self.rope_sin[start : start + t, None, :]
        x = self.embed(tokens)
        for blk, (ck, cv) in zip(self.blocks, cache, strict=True):
            assert isinstance(blk, Block)
            q, k, v = self.split_qkv(blk.wqkv(blk.ln1(x)))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            ck[:, start : start + t] = k
            cv[:, start : start + t] = v
            o = self._attend_dense(q, ck[:, : start + t], cv[:, : start + t], causal=start == 0)
            x = x + blk.wo(o)
            x = x + blk.down(F.gelu(blk.up(blk.ln2(x)), approximate="tanh"))
        h = self.ln_f(x)
        return h, self.lm_head(h)


class _ResMLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d, bias=False)
        self.fc1 = nn.Linear(d, 2 * d, bias=False)
        self.fc2 = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln(x)), approximate="tanh"))
        return out


#: Scalar confidence features per position: top-1 log probability, top-1/top-2 margin, entropy.
_N_STATS = 3


class Drafter(nn.Module):
    """K-step drafter over the target's last hidden state, with a confidence head (see module doc)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_draft
        self.proj_h = nn.Linear(cfg.d_target, d, bias=False)
        self.emb_anchor = nn.Embedding(cfg.vocab, d)
        self.emb_token = nn.Embedding(cfg.vocab, d)
        self.pos = nn.Parameter(torch.zeros(cfg.k, d))
        self.blocks = nn.ModuleList(_ResMLP(d) for _ in range(cfg.n_blocks))
        self.norm = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, cfg.vocab, bias=False)
        self.conf_in = nn.Linear(d + _N_STATS + cfg.k, 64)
        self.conf_out = nn.Linear(64, 1)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def _position(self, s: torch.Tensor, j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = s + self.pos[j]
        for blk in self.blocks:
            z = blk(z)
        zn = self.norm(z)
        return z, zn, self.head(zn)

    def _confidence(self, zn: torch.Tensor, logits: torch.Tensor, j: int) -> torch.Tensor:
        lp = torch.log_softmax(logits.float(), dim=-1)
        top2 = lp.topk(2, dim=-1).values
        entropy = -(lp.exp() * lp).sum(-1, keepdim=True)
        onehot = torch.zeros(zn.shape[0], self.cfg.k, device=zn.device, dtype=torch.float32)
        onehot[:, j] = 1.0
        feats = torch.cat(
            (zn.detach().float(), top2[:, :1], top2[:, :1] - top2[:, 1:], entropy, onehot), dim=-1
        )
        feats = feats.to(self.conf_in.weight.dtype)
        logit: torch.Tensor = self.conf_out(F.gelu(self.conf_in(feats))).squeeze(-1).float()
        return logit

    def _start(self, h: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj_h(h.to(self.proj_h.weight.dtype)) + self.emb_anchor(anchor))

    def forward_teacher(
        self, h: torch.Tensor, anchor: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass: position j is conditioned on ``labels[:, :j]``.

        Returns:
            Draft logits ``[N, K, vocab]`` and confidence logits ``[N, K]``.
        """
        s = self._start(h, anchor)
        logits, conf = [], []
        for j in range(self.cfg.k):
            z, zn, lg = self._position(s, j)
            logits.append(lg)
            conf.append(self._confidence(zn, lg.detach(), j))
            s = z + self.emb_token(labels[:, j])
        return torch.stack(logits, 1), torch.stack(conf, 1)

    def draft(self, h: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy drafts and their confidence logits; no host synchronisation (graph-safe).

        Returns:
            Draft tokens ``[N, K]`` (int64) and confidence logits ``[N, K]`` (fp32).
        """
        s = self._start(h, anchor)
        toks, conf = [], []
        for j in range(self.cfg.k):
            z, zn, lg = self._position(s, j)
            tok = lg.argmax(-1)
            toks.append(tok)
            conf.append(self._confidence(zn, lg, j))
            s = z + self.emb_token(tok)
        return torch.stack(toks, 1), torch.stack(conf, 1)


@dataclass(frozen=True, slots=True)
class TrainSummary:
    """What a training phase did.

    Attributes:
        name: ``target`` or ``drafter``.
        steps: optimiser steps taken.
        planned_steps: steps asked for.
        seconds: wall time.
        tokens: training tokens (target) or draft rounds (drafter) seen.
        final_loss: mean training loss over the last 10 steps.
        eval: held-out metrics.
        stopped_by_time_cap: True when the wall-clock cap ended training early.
        params: trainable parameters.
    """

    name: str
    steps: int
    planned_steps: int
    seconds: float
    tokens: int
    final_loss: float
    eval: dict[str, Any]
    stopped_by_time_cap: bool
    params: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(total - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(frac, 1.0))))


def _optimizer(module: nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in module.parameters() if p.dim() >= 2]
    other = [p for p in module.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def _autocast(device: torch.device) -> Any:
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_target(
    model: TargetLM,
    train: np.ndarray,
    heldout: np.ndarray,
    preset: Preset,
    *,
    seed: int,
    device: torch.device,
    log: Log,
) -> TrainSummary:
    """Train the target on random windows of the byte corpus (next-byte cross-entropy).

    Args:
        model: the target (fp32 master weights, on ``device``).
        train: training bytes.
        heldout: held-out bytes for the final evaluation.
        preset: step count, batch, sequence length, learning rate, time cap.
        seed: seeds the window sampler.
        device: where to train (bf16 autocast on CUDA).
        log: progress sink.

    Returns:
        The training summary (final loss, held-out loss, time).
    """
    rng = np.random.default_rng(seed)
    seq, bsz, steps = preset.target_seq, preset.target_batch, preset.target_steps
    span = np.arange(seq + 1)
    opt = _optimizer(model, preset.target_lr, device)
    model.train()
    losses: list[torch.Tensor] = []
    t0 = time.perf_counter()
    step = 0
    capped = False
    for step in range(steps):
        offsets = rng.integers(0, train.size - seq - 1, size=bsz)
        batch = torch.from_numpy(train[offsets[:, None] + span].astype(np.int64)).to(
            device, non_blocking=True
        )
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, preset.target_lr, warmup=max(steps // 15, 1))
        with _autocast(device):
            _, logits = model.forward_train(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.detach())
        if step % 25 == 0 or step == steps - 1:
            log(f"target step {step + 1}/{steps} loss {loss.item():.3f} ({time.perf_counter() - t0:.1f}s)")
        if time.perf_counter() - t0 > preset.time_cap_s:
            capped = True
            log(f"target training hit its {preset.time_cap_s:.0f}s cap after {step + 1} steps")
            break
    _sync(device)
    seconds = time.perf_counter() - t0
    final = float(torch.stack(losses[-10:]).mean().item())
    model.eval()
    eval_rng = np.random.default_rng(seed + 1)
    with torch.no_grad(), _autocast(device):
        offsets = eval_rng.integers(0, heldout.size - seq - 1, size=min(bsz, 32))
        batch = torch.from_numpy(heldout[offsets[:, None] + span].astype(np.int64)).to(device)
        _, logits = model.forward_train(batch[:, :-1])
        held = float(
            F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()
        )
    return TrainSummary(
        name="target",
        steps=step + 1,
        planned_steps=steps,
        seconds=seconds,
        tokens=(step + 1) * bsz * seq,
        final_loss=final,
        eval={"heldout_loss_nats_per_byte": held},
        stopped_by_time_cap=capped,
        params=model.n_params(),
    )


@torch.no_grad()
def greedy_rollout(
    model: TargetLM, prompts: torch.Tensor, n_new: int, *, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Continue ``prompts`` greedily with a dense KV cache, keeping the hidden states.

    Args:
        model: the target (in its serving dtype).
        prompts: ``[B, P]`` tokens on the model's device.
        n_new: tokens to generate per prompt.
        chunk: prompts per batch.

    Returns:
        ``tokens [B, n_new]`` (the continuation y_P .. y_{P+n_new-1}) and ``hidden [B, n_new, d]``,
        where ``hidden[:, i]`` is the state at position P-1+i, the one that produced ``tokens[:, i]``.
    """
    cfg = model.cfg
    dtype = next(model.parameters()).dtype
    outs, hids = [], []
    for lo in range(0, prompts.shape[0], chunk):
        p = prompts[lo : lo + chunk]
        b, plen = p.shape
        cache = [
            (
                torch.zeros(b, plen + n_new, cfg.n_kv_heads, cfg.head_dim, device=p.device, dtype=dtype),
                torch.zeros(b, plen + n_new, cfg.n_kv_heads, cfg.head_dim, device=p.device, dtype=dtype),
            )
            for _ in range(cfg.n_layers)
        ]
        h, logits = model.forward_cached(p, cache, 0)
        toks, hs = [logits[:, -1].argmax(-1)], [h[:, -1]]
        for i in range(1, n_new):
            h, logits = model.forward_cached(toks[-1][:, None], cache, plen + i - 1)
            toks.append(logits[:, -1].argmax(-1))
            hs.append(h[:, -1])
        outs.append(torch.stack(toks, 1))
        hids.append(torch.stack(hs, 1))
    return torch.cat(outs), torch.cat(hids)


def _drafter_examples(tokens: torch.Tensor, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    # Round i: state h at position P-1+i, anchor y_{P+i}, labels y_{P+i+1 .. P+i+K}.
    n_new = tokens.shape[1]
    rounds = n_new - k - 1
    h = hidden[:, :rounds].reshape(-1, hidden.shape[-1])
    anchor = tokens[:, :rounds].reshape(-1)
    idx = (
        torch.arange(rounds, device=tokens.device)[:, None]
        + 1
        + torch.arange(k, device=tokens.device)[None, :]
    )
    labels = tokens[:, idx].reshape(-1, k)
    return h, anchor, labels


def _drafter_metrics(
    drafter: Drafter, h: torch.Tensor, anchor: torch.Tensor, labels: torch.Tensor
) -> dict[str, Any]:
    with torch.no_grad():
        logits, conf = drafter.forward_teacher(h, anchor, labels)
        correct = (logits.argmax(-1) == labels).float()
        accepted = torch.cumprod(correct, dim=1)
        risk = torch.cat((torch.ones_like(accepted[:, :1]), accepted[:, :-1]), dim=1)
        per_pos = (accepted.sum(0) / risk.sum(0).clamp_min(1)).tolist()
        bce = F.binary_cross_entropy_with_logits(conf, correct, weight=risk, reduction="sum") / risk.sum()
    return {
        "mean_accepted_length": float(accepted.sum(1).mean().item()),
        "conditional_acceptance_per_position": [round(x, 4) for x in per_pos],
        "confidence_bce_on_risk_sets": float(bce.item()),
        "rounds": int(h.shape[0]),
    }


def train_drafter(
    drafter: Drafter,
    target: TargetLM,
    prompts: torch.Tensor,
    preset: Preset,
    *,
    seed: int,
    device: torch.device,
    log: Log,
) -> TrainSummary:
    """Distil the drafter (and its confidence head) from the target's greedy rollouts.

    The last tenth of the rollouts is held out for the summary's acceptance metrics.

    Args:
        drafter: the drafter (fp32 master weights, on ``device``).
        target: the trained target in its serving dtype, eval mode.
        prompts: ``[B, P]`` rollout prompts on ``device``.
        preset: rollout sizes, steps and batch.
        seed: seeds the round sampler.
        device: training device.
        log: progress sink.

    Returns:
        The training summary (draft cross-entropy, confidence BCE, held-out acceptance).
    """
    t0 = time.perf_counter()
    tokens, hidden = greedy_rollout(target, prompts, preset.rollout_new, chunk=512)
    _sync(device)
    log(f"rollouts: {tokens.shape[0]} x {tokens.shape[1]} tokens in {time.perf_counter() - t0:.1f}s")
    k = drafter.cfg.k
    split = max(1, tokens.shape[0] // 10)
    train_h, train_a, train_y = _drafter_examples(tokens[split:], hidden[split:], k)
    test_h, test_a, test_y = _drafter_examples(tokens[:split], hidden[:split], k)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    opt = _optimizer(drafter, 2e-3, device)
    drafter.train()
    steps = preset.drafter_steps
    losses: list[torch.Tensor] = []
    step = 0
    capped = False
    for step in range(steps):
        idx = torch.randint(0, train_h.shape[0], (preset.drafter_batch,), generator=gen).to(device)
        h, a, y = train_h[idx].float(), train_a[idx], train_y[idx]
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, 2e-3, warmup=max(steps // 20, 1))
        with _autocast(device):
            logits, conf = drafter.forward_teacher(h, a, y)
        logits = logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        correct = (logits.detach().argmax(-1) == y).float()
        risk = torch.cat((torch.ones_like(correct[:, :1]), torch.cumprod(correct, 1)[:, :-1]), dim=1)
        bce = F.binary_cross_entropy_with_logits(conf, correct, weight=risk, reduction="sum") / risk.sum()
        loss = ce + bce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        losses.append(ce.detach())
        if step % 100 == 0 or step == steps - 1:
            log(f"drafter step {step + 1}/{steps} ce {ce.item():.3f} conf-bce {bce.item():.3f}")
        if time.perf_counter() - t0 > preset.time_cap_s:
            capped = True
            log(f"drafter training hit its {preset.time_cap_s:.0f}s cap after {step + 1} steps")
            break
    drafter.eval()
    _sync(device)
    metrics = _drafter_metrics(drafter, test_h.float(), test_a, test_y)
    return TrainSummary(
        name="drafter",
        steps=step + 1,
        planned_steps=steps,
        seconds=time.perf_counter() - t0,
        tokens=(step + 1) * preset.drafter_batch,
        final_loss=float(torch.stack(losses[-10:]).mean().item()),
        eval=metrics,
        stopped_by_time_cap=capped,
        params=sum(p.numel() for p in drafter.parameters()),
    )
