"""Candidates drawn from the tempered, filtered distribution, as Dream's and LLaDA2's own samplers
draw them (the other samplers take the loop's Gumbel-max candidate and its un-tempered probability).

The logits are divided by the temperature, then filtered by nucleus (top_p) and top-k, in the order
the family's reference applies them (Dream: top_p first; LLaDA2: top_k first); at temperature > 0
the token is drawn from the softmax of what is left and its confidence is its probability there,
at temperature 0 it is the argmax of the softmax of the unfiltered logits.
"""
from __future__ import annotations

from typing import Callable

import torch

from .base import check_number

# The smallest positive temperature whose division keeps logits finite in every float dtype
# (float16's largest value is 65504).
MIN_TEMPERATURE = 1e-2


def check_temperature(sampler: str, temperature: float) -> None:
    """Refuse a positive temperature too small to divide the logits by."""
    if 0 < temperature < MIN_TEMPERATURE:
        raise ValueError(f"sampler {sampler!r}: temperature {temperature!r} overflows its logits / temperature; "
                         f"give 0 (greedy) or at least {MIN_TEMPERATURE}")


def _nucleus(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Keep the smallest prefix (by probability) whose mass exceeds top_p, the first token always."""
    if top_p is None or top_p >= 1:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    drop_sorted = torch.cat([torch.zeros_like(cum[..., :1], dtype=torch.bool), cum[..., :-1] > top_p], dim=-1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def _top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Keep the top_k largest logits (and every one equal to the k-th)."""
    if top_k is None:
        return logits
    kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def filter_logits(logits: torch.Tensor, temperature: float, top_p: float | None, top_k: int | None, *,
                  top_k_first: bool = False) -> torch.Tensor:
    """Temperature, then nucleus and top-k (top-k first when `top_k_first`); removed logits become the
    dtype's lowest value. logits: (N, V)."""
    if temperature > 0:
        logits = logits / temperature
    if top_k_first:
        return _nucleus(_top_k(logits, top_k), top_p)
    return _top_k(_nucleus(logits, top_p), top_k)


def sample_filtered(logits: torch.Tensor, temperature: float, top_p: float | None, top_k: int | None,
                    generator: torch.Generator | None, *, top_k_first: bool = False):
    """(probs (N, V), confidence (N,), token (N,)) of logits (N, V): the token drawn from the filtered
    distribution `probs` at temperature > 0 (its argmax at 0) and its probability there."""
    probs = torch.softmax(filter_logits(logits, temperature, top_p, top_k, top_k_first=top_k_first), dim=-1)
    if temperature > 0:
        token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return probs, probs.gather(-1, token[:, None]).squeeze(-1), token
    conf, token = probs.max(dim=-1)
    return probs, conf, token


def sample_at(logits: torch.Tensor, valid: torch.Tensor, draw: Callable, *, sampled: bool):
    """(confidence, token) (B', Q) at the valid positions of logits (B', Q, V) by `draw` (N, V) ->
    (confidence, token); -inf confidence elsewhere. A `sampled` draw runs on the valid positions only,
    in order, as the references draw; a greedy one scores every position (nothing read back)."""
    if sampled:
        conf_flat, tok_flat = draw(logits[valid])                                     # (N,)
        conf = torch.full(valid.shape, float("-inf"), dtype=conf_flat.dtype, device=valid.device)
        tokens = torch.zeros(valid.shape, dtype=torch.long, device=valid.device)
        conf[valid], tokens[valid] = conf_flat, tok_flat
        return conf, tokens
    conf, tokens = draw(logits.reshape(-1, logits.shape[-1]))
    return conf.view(valid.shape).masked_fill(~valid, float("-inf")), tokens.view(valid.shape)


def check_filters(sampler: str, top_p, top_k) -> None:
    """Refuse a `top_p` outside (0, 1] and a `top_k` below 1 (None: no filter), naming `sampler`."""
    check_number("top_p", top_p, low=0, high=1, low_open=True, allow_none=True, sampler=sampler)
    check_number("top_k", top_k, low=1, integer=True, allow_none=True, sampler=sampler)


def filtered_draw(state, top_p: float | None, top_k: int | None) -> Callable:
    """(N, V) logits -> (confidence, token) of `sample_filtered` at the request's temperature, with
    its generator."""
    return lambda logits: sample_filtered(logits, state.temperature, top_p, top_k, state.generator)[1:]
