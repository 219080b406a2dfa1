"""Attention backends: bidirectional attention of a set of queries against the whole canvas.

Every backend has the same signature::

    attn(q, k, v, key_valid, scale) -> out
        q:         (B, H, P, D)     queries of the recomputed positions
        k, v:      (B, H_kv, L, D)  keys (after RoPE) and values of every canvas position
        key_valid: (B, L) bool or None; False keys (left padding) get no attention. eager and sdpa
                   also take (B, P, L): a mask per query (a block-causal model's, LLaDA2)
        out:       (B, H, P, D)     in q's dtype

H must be a multiple of H_kv (grouped-query attention). Backends are looked up by name through a
registry of lazy import paths, so an optional backend costs nothing until it is chosen:

    eager   plain fp32 math, the reference
    sdpa    torch's scaled_dot_product_attention
    triton  the Triton flash-attention kernel of `dllm.kernels.attention` (CUDA tensors, or CPU
            tensors under TRITON_INTERPRET=1); rows with no valid key give zeros, not NaN
    auto    the backend measured fastest for the device, now `sdpa` on CPU and CUDA (why:
            docs/kernels.md §Attention backends); `default_backend(device)` names it
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", float], torch.Tensor]


def _broadcast_mask(key_valid: torch.Tensor) -> torch.Tensor:
    """(B, L) or (B, P, L) -> (B, 1, 1 or P, L), broadcast over the heads."""
    return key_valid[:, None, None, :] if key_valid.dim() == 2 else key_valid[:, None]


def eager_attention(q, k, v, key_valid, scale):
    """Plain math in fp32, the reference every other backend is compared with."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, L, D)
    v = v.repeat_interleave(group, dim=1)  # (B, H, L, D)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, H, P, L)
    if key_valid is not None:
        scores = scores.masked_fill(~_broadcast_mask(key_valid), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.float()).to(q.dtype)  # (B, H, P, D)


def sdpa_attention(q, k, v, key_valid, scale):
    """torch's fused scaled_dot_product_attention, non-causal."""
    mask = None if key_valid is None else _broadcast_mask(key_valid)  # (B, 1, 1 or P, L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


# `auto`: the backend measured fastest for the device, sdpa on CPU and on CUDA alike (the
# measurements behind the choice: docs/kernels.md §Attention backends and §Measurements).
# `attention="triton"` still selects the kernel. An alias, not a wrapper: it runs once per layer.
auto_attention = sdpa_attention


def default_backend(device: torch.device | str) -> str:
    """The backend `auto` runs for tensors on `device` (sdpa everywhere; see `auto_attention`)."""
    torch.device(device)                                 # a bad device string is still an error
    return "sdpa"


@dataclass(frozen=True)
class BackendInfo:
    name: str
    path: str          # "module:attribute", imported on first use
    description: str
    requires: str = ""  # a package the backend needs, checked when it is looked up
    query_masks: bool = False   # it takes key_valid (B, P, L), a mask per query (block-causal models)


_BACKENDS: dict[str, BackendInfo] = {
    "eager": BackendInfo("eager", "dllm.attention:eager_attention", "plain fp32 math (the reference)",
                         query_masks=True),
    "sdpa": BackendInfo("sdpa", "dllm.attention:sdpa_attention", "torch scaled_dot_product_attention",
                        query_masks=True),
    "triton": BackendInfo("triton", "dllm.kernels.attention:bidir_attn",
                          "Triton flash attention: fp16/bf16/fp32, head dim <= 256, CUDA (or CPU under "
                          "TRITON_INTERPRET=1)", requires="triton"),
    "auto": BackendInfo("auto", "dllm.attention:auto_attention", "the fastest measured for the device: sdpa",
                        query_masks=True),
}


def register_backend(name: str, path: str, description: str = "", requires: str = "",
                     query_masks: bool = False) -> None:
    """Register an attention backend under `name`, resolved lazily from `"module:attribute"`;
    `requires` names a package it cannot run without; `query_masks`: it takes a key mask per query
    (B, P, L), which a block-causal model (LLaDA2) needs."""
    _BACKENDS[name] = BackendInfo(name, path, description, requires, query_masks)


def takes_query_masks(name: str) -> bool:
    """Whether the registered backend `name` takes a key mask per query (block-causal models)."""
    return _BACKENDS[name].query_masks


def available_backends() -> list[str]:
    """Registered names in registration order: the reference and torch backends first."""
    return list(_BACKENDS)


def check_device(name: str, device) -> None:
    """A ValueError saying why backend `name` cannot run on `device` in this process, if it
    cannot (`triton`: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    if name != "triton":
        return
    from dllm.kernels import require_triton
    try:
        require_triton(device, "the triton attention backend")
    except RuntimeError as err:
        raise ValueError(str(err)) from None


def get_backend(name: str) -> AttentionFn:
    """The attention function registered as `name`; unknown names list the valid ones."""
    if not isinstance(name, str) or name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; valid options: {', '.join(available_backends())}")
    info = _BACKENDS[name]
    if info.requires and importlib.util.find_spec(info.requires) is None:
        usable = [n for n, b in _BACKENDS.items() if not b.requires or importlib.util.find_spec(b.requires)]
        raise ValueError(f"attention backend {name!r} needs the {info.requires} package, which is not installed "
                         f"(pip install 'dllm[{info.requires}]'); usable here: {', '.join(usable)}")
    module, attr = info.path.split(":")
    return getattr(importlib.import_module(module), attr)
