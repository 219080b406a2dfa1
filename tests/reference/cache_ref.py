"""Fast-dLLM's PrefixCache and DualCache decoding loops, transcribed as plain loops: the oracle for
dllm's `prefix` and `dual` cache policies.

Source: NVlabs/Fast-dLLM ``llada/generate.py`` (``generate_with_prefix_cache``,
``generate_with_dual_cache``, ``get_transfer_index``); docs/caches.md §Policies. Batch size 1, no
padding, temperature 0. For each block [s, e):

1. A full forward over the canvas that returns every layer's keys (after RoPE) and values. Its
   logits are the block's first decoding step (commit within [s, e)).
2. PrefixCache keeps the K/V of the columns < s. Each later step forwards x[:, s:] (the block and
   the whole masked suffix): per layer the keys are the cached prefix followed by the fresh keys,
   queries at columns s..L-1.
   DualCache keeps the K/V of every column. Each later step forwards only x[:, s:e]: per layer the
   cached K/V at [s, e) are replaced by the fresh ones (``replace_position``) and the queries attend
   over the whole length; prefix and suffix stay as the block-start forward left them.
3. Commit within the block; the block ends when it holds no mask.

Commit rule (``get_transfer_index``): the candidate is the argmax, its confidence the float64
softmax probability. With ``threshold``: the most confident masked block position always commits
and every other one whose confidence is >= threshold. Without: LLaDA's fixed per-step counts (the
n masks of the block split over ``steps_per_block``, the first n % steps steps one more), the
most confident ones. Ties go to the lowest column (a stable sort instead of ``torch.topk``).

The mask id is never a candidate (its logit is -inf), as in dllm and the other oracles here.

Dream (``logit_shift``): the hidden state at column j-1 predicts token j. Fast-dLLM's Dream code
commits the block's first position outright at the block's full forward; here (dllm's documented choice,
docs/caches.md §Policies) every window is widened one column to the left, s-1, so the first block
position is predicted by a freshly computed hidden state: PrefixCache keeps the K/V of columns
< s-1 and forwards x[:, s-1:], DualCache replaces [s-1, e). The logits are then shifted.

The transformer arithmetic is written out here from the model's weights (module by module:
norms, projections, MLP), with its own RoPE and attention; only the cache bookkeeping above is
what is being checked.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["canvas_ref", "commit_ref", "counts_ref", "fastdllm_generate_ref", "forward_ref", "vicinity_generate_ref"]


def _rope(x: Tensor, positions: Tensor, theta: float, fp32: bool) -> Tensor:
    """NeoX rotation of x (1, H, P, D) at integer positions (P,)."""
    D = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]         # (P, D/2)
    angles = torch.cat([angles, angles], dim=-1)                               # (P, D)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    if fp32:
        return (x.float() * cos + rot.float() * sin).to(x.dtype)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


def _attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Unmasked attention in fp32; q (1, H, P, D), k/v (1, H_kv, N, D) -> (1, H, P, D)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])  # (1, H, P, N)
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def forward_ref(model, tokens: Tensor, start: int, past: list | None, mode: str, positions: Tensor | None = None):
    """Run `tokens` (1, P), the canvas columns start..start+P-1 (rotary positions `positions` (P,)
    when given, for a canvas with columns left out).

    mode "full":   no past.
    mode "prefix": past holds the K/V of columns < start; keys = past ++ fresh.
    mode "dual":   past holds the K/V of every column; [start, start+P) are replaced in place.
    Returns (raw logits (1, P, V), the fresh per-layer [k, v] (1, H_kv, P, D)).
    """
    cfg = model.config
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    P = tokens.shape[1]
    positions = torch.arange(start, start + P) if positions is None else positions
    h = model.embed(tokens)                                                    # (1, P, d)
    kv = []
    for i, layer in enumerate(model.layers):
        a = layer.attn
        n = layer.attn_norm(h)
        q = a.q(n).view(1, P, H, D).transpose(1, 2)                            # (1, H, P, D)
        k = a.k(n).view(1, P, Hkv, D).transpose(1, 2)                          # (1, H_kv, P, D)
        v = a.v(n).view(1, P, Hkv, D).transpose(1, 2)
        q = _rope(q, positions, cfg.rope_theta, cfg.rope_fp32)
        k = _rope(k, positions, cfg.rope_theta, cfg.rope_fp32)
        kv.append([k, v])
        if mode == "full":
            keys, values = k, v
        elif mode == "prefix":
            keys = torch.cat([past[i][0], k], dim=2)                           # (1, H_kv, start + P, D)
            values = torch.cat([past[i][1], v], dim=2)
        else:  # dual: replace_position
            past[i][0][:, :, start:start + P] = k
            past[i][1][:, :, start:start + P] = v
            keys, values = past[i]
        out = _attend(q, keys, values).transpose(1, 2).reshape(1, P, H * D)
        h = h + a.o(out)
        h = h + layer.mlp(layer.mlp_norm(h))
    h = model.norm(h)
    logits = model.head(h) if model.head is not None else F.linear(h, model.embed.weight)
    return logits, kv


def commit_ref(x: Tensor, logits: Tensor, cols: Tensor, block: tuple[int, int], mask_id: int,
            threshold: float | None, count: int | None) -> None:
    """Commit in place within the block; logits (P, V) aligned to the canvas columns `cols` (P,)."""
    s, e = block
    logits = logits.clone()
    logits[:, mask_id] = float("-inf")
    x0 = logits.argmax(-1)                                                     # (P,)
    conf = torch.softmax(logits.double(), dim=-1).gather(-1, x0[:, None]).squeeze(-1)
    cand = (x[0, cols] == mask_id) & (cols >= s) & (cols < e)
    conf = conf.masked_fill(~cand, float("-inf"))
    n = int(cand.sum())
    order = torch.sort(conf, descending=True, stable=True).indices
    if threshold is not None:
        take = [order[0]] + [j for j in order[1:n] if conf[j] >= threshold]
    else:
        take = order[:count]
    for j in take:
        x[0, cols[j]] = x0[j]


def canvas_ref(prompt: list[int], gen_length: int, block_length: int, mask_id: int,
               steps: int | None) -> tuple[Tensor, list[tuple[int, int]], int | None]:
    """The starting canvas (1, Lp + gen_length), its blocks [(s, e)], and the steps per block of
    `steps` over the whole generation (None without)."""
    Lp = len(prompt)
    x = torch.full((1, Lp + gen_length), mask_id, dtype=torch.long)
    x[0, :Lp] = torch.tensor(prompt)
    n_blocks = gen_length // block_length
    blocks = [(Lp + b * block_length, Lp + (b + 1) * block_length) for b in range(n_blocks)]
    return x, blocks, None if steps is None else steps // n_blocks


def counts_ref(n: int, steps: int) -> list[int]:
    return [n // steps + (1 if i < n % steps else 0) for i in range(steps)]


@torch.no_grad()
def fastdllm_generate_ref(model, prompt: list[int], *, gen_length: int, block_length: int, mode: str,
                          threshold: float | None = 0.9, steps: int | None = None) -> tuple[Tensor, int]:
    """Fast-dLLM cached generation of one prompt.

    mode: "prefix" or "dual". threshold: the confidence threshold (None: LLaDA's fixed counts with
    `steps` over the whole generation). Returns (the canvas (1, Lp + gen_length), forwards).
    """
    assert mode in ("prefix", "dual") and gen_length % block_length == 0
    cfg = model.config
    mask_id, shift = cfg.mask_token_id, int(cfg.logit_shift)
    x, blocks, per_block = canvas_ref(prompt, gen_length, block_length, mask_id, None if threshold is not None else steps)
    L = x.shape[1]
    nfe = 0
    for s, e in blocks:
        counts = None if per_block is None else counts_ref(int((x[0, s:e] == mask_id).sum()), per_block)
        # 1. the block-start forward stores every column's K/V and is the first decoding step
        raw, kv = forward_ref(model, x, 0, None, "full")
        nfe += 1
        logits = torch.cat([raw[:, :1], raw[:, :-1]], dim=1) if shift else raw  # aligned
        commit_ref(x, logits[0], torch.arange(L), (s, e), mask_id, threshold, None if counts is None else counts[0])
        i = 1
        while bool((x[0, s:e] == mask_id).any()):
            # Dream recomputes the column left of the block while the block's first position, which
            # it predicts, is masked; its K/V, re-stored then, are served from the cache after that.
            w = s - int(shift and bool(x[0, s] == mask_id))                     # first recomputed column
            end = L if mode == "prefix" else e
            past = [[k[:, :, :w], v[:, :, :w]] for k, v in kv] if mode == "prefix" else kv
            raw, fresh = forward_ref(model, x[:, w:end], w, past, mode)
            nfe += 1
            if mode == "prefix" and w < s:
                for (k, v), (fk, fv) in zip(kv, fresh):
                    k[:, :, w], v[:, :, w] = fk[:, :, 0], fv[:, :, 0]
            # column c is predicted by the hidden state of column c (LLaDA) or c - 1 (Dream); keep c >= s
            if not shift:
                logits = raw[0, s - w:]
            elif w < s:
                logits = raw[0, :end - s]
            else:       # column s is not predicted here (it is not masked): a placeholder row
                logits = torch.cat([raw[0, :1], raw[0, :end - s - 1]])
            count = None if counts is None else counts[min(i, len(counts) - 1)]
            commit_ref(x, logits, torch.arange(s, end), (s, e), mask_id, threshold, count)
            i += 1
    return x, nfe


@torch.no_grad()
def vicinity_generate_ref(model, prompt: list[int], *, gen_length: int, block_length: int, prefix_look: int,
                          after_look: int, warmup_steps: int, threshold: float) -> tuple[Tensor, int]:
    """dInfer's vicinity-cache loop (`VicinityCacheIteration`) of one prompt on LLaDA, with the
    threshold rule above. The first `warmup_steps` forwards of the request run over the whole canvas
    without a cache; the next forward, and afterwards the first forward of each block, is a full
    forward that stores every column's K/V; the others recompute the window
    [s - prefix_look, e + after_look) (clipped to the canvas) with the cached K/V of the rest.
    Returns (the canvas, forwards)."""
    cfg = model.config
    assert not cfg.logit_shift
    mask_id, Lp = cfg.mask_token_id, len(prompt)
    x = torch.full((1, Lp + gen_length), mask_id, dtype=torch.long, device=model.device)
    x[0, :Lp] = torch.tensor(prompt)
    L = x.shape[1]
    kv, nfe = None, 0
    for s in range(Lp, L, block_length):
        e = min(s + block_length, L)
        opening = True
        while bool((x[0, s:e] == mask_id).any()):
            if nfe < warmup_steps:
                raw, _ = forward_ref(model, x, 0, None, "full")
                cols = torch.arange(L)
            elif kv is None or opening:
                raw, kv = forward_ref(model, x, 0, None, "full")
                cols = torch.arange(L)
            else:
                a, z = max(0, s - prefix_look), min(L, e + after_look)
                raw, _ = forward_ref(model, x[:, a:z], a, kv, "dual")
                cols = torch.arange(a, z)
            nfe += 1
            commit_ref(x, raw[0], cols, (s, e), mask_id, threshold, None)
            opening = False
    return x, nfe

