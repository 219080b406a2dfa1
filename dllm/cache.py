"""KV storage at absolute canvas positions, and the cache policies that choose what to recompute.

Keys are stored after RoPE at their canvas column in preallocated per-layer buffers
`(B, H_kv, L, D)`. A step recomputes the columns of its plan, scatters their fresh K/V into the
buffers and lets those queries attend over the whole canvas. Because columns never move, no cached
key is ever re-rotated. Every cache of the literature is a policy choosing the recomputed set;
`none` recomputes everything each step (and then needs no storage at all).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch


class KVCache:
    """Per-layer key/value buffers of shape (B, H_kv, L, D).

    `update(layer, rows, positions, k, v)` writes the fresh K/V of `positions` (B', P) for the
    batch rows `rows` (B',) and returns the full K/V of those rows (B', H_kv, L, D) for attention.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (batch, n_kv_heads, length, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = length

    @classmethod
    def for_model(cls, model, batch: int, length: int) -> "KVCache":
        cfg = model.config
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, length, cfg.head_dim, model.dtype, model.device)

    def update(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        kb, vb = self.k[layer], self.v[layer]
        if positions.shape[1] == self.length and rows.shape[0] == kb.shape[0] and bool(
                (positions == torch.arange(self.length, device=positions.device)).all()):
            kb.copy_(k)
            vb.copy_(v)
            return k, v
        r = rows[:, None]                               # (B', 1) broadcasts against (B', P)
        kb[r, :, positions] = k.transpose(1, 2)         # indexed view: (B', P, H_kv, D)
        vb[r, :, positions] = v.transpose(1, 2)
        if rows.shape[0] == kb.shape[0] and bool((rows == torch.arange(kb.shape[0], device=rows.device)).all()):
            return kb, vb
        return kb[rows], vb[rows]                       # (B', H_kv, L, D)


class CachePolicy:
    """Chooses which canvas columns to recompute at each step.

    `plan(state, rows)` returns (B', P) columns for the batch rows `rows`, or None to recompute
    everything. `needs_storage` says whether the forward must keep K/V between steps.
    """

    name = "base"
    needs_storage = False

    def plan(self, state, rows: torch.Tensor):
        raise NotImplementedError


class NoCache(CachePolicy):
    """Recompute every position at every step (the reference behaviour)."""

    name = "none"
    needs_storage = False

    def plan(self, state, rows):
        return None


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    path: str
    description: str


_POLICIES: dict[str, PolicyInfo] = {
    "none": PolicyInfo("none", "dllm.cache:NoCache", "recompute everything every step"),
}


def available_policies() -> list[str]:
    return sorted(_POLICIES)


def get_policy(name: str = "none", **kwargs) -> CachePolicy:
    """A cache policy by registered name; unknown names list the valid ones."""
    if isinstance(name, CachePolicy):
        return name
    if not isinstance(name, str) or name not in _POLICIES:
        raise ValueError(f"unknown cache policy {name!r}; valid options: {', '.join(available_policies())}")
    module, attr = _POLICIES[name].path.split(":")
    cls = getattr(importlib.import_module(module), attr)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ValueError(f"bad arguments {kwargs!r} for cache policy {name!r}: {err}") from None
