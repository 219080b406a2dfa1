"""Attention backends: bidirectional attention of a set of queries against the whole canvas.

Every backend has the same signature::

    attn(q, k, v, key_valid, scale) -> out
        q:         (B, H, P, D)     queries of the recomputed positions
        k, v:      (B, H_kv, L, D)  keys (after RoPE) and values of every canvas position
        key_valid: (B, L) bool or None; False keys (left padding) get no attention
        out:       (B, H, P, D)     in q's dtype

H must be a multiple of H_kv (grouped-query attention). Backends are looked up by name through a
registry of lazy import paths, so an optional backend costs nothing until it is chosen.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", float], torch.Tensor]


def eager_attention(q, k, v, key_valid, scale):
    """Plain math in fp32, the reference every other backend is compared with."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, L, D)
    v = v.repeat_interleave(group, dim=1)  # (B, H, L, D)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, H, P, L)
    if key_valid is not None:
        scores = scores.masked_fill(~key_valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.float()).to(q.dtype)  # (B, H, P, D)


def sdpa_attention(q, k, v, key_valid, scale):
    """torch's fused scaled_dot_product_attention, non-causal."""
    mask = None if key_valid is None else key_valid[:, None, None, :]  # (B, 1, 1, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


@dataclass(frozen=True)
class BackendInfo:
    name: str
    path: str          # "module:attribute", imported on first use
    description: str


_BACKENDS: dict[str, BackendInfo] = {
    "eager": BackendInfo("eager", "dllm.attention:eager_attention", "plain fp32 math (the reference)"),
    "sdpa": BackendInfo("sdpa", "dllm.attention:sdpa_attention", "torch scaled_dot_product_attention"),
}


def register_backend(name: str, path: str, description: str = "") -> None:
    """Register an attention backend under `name`, resolved lazily from `"module:attribute"`."""
    _BACKENDS[name] = BackendInfo(name, path, description)


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str) -> AttentionFn:
    """The attention function registered as `name`; unknown names list the valid ones."""
    if not isinstance(name, str) or name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; valid options: {', '.join(available_backends())}")
    module, attr = _BACKENDS[name].path.split(":")
    return getattr(importlib.import_module(module), attr)
