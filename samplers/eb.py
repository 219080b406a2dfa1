"""EB-Sampler: entropy-bounded unmasking (arXiv:2505.24857, Ben-Hamu et al., NeurIPS 2025; no
official code; re-implemented in the DUS repository's `generate_eb_sampler` and in diffusers'
`EntropyBoundScheduler`).

Semi-autoregressive blocks. Each step the masked positions of the active block are sorted by an
error proxy (`order`: entropy ascending, the default; or confidence / top-2 margin descending;
ties go to the lower position). With H the entropy in bits, the largest prefix U with

    sum_{l in U} H_l - max_{l in U} H_l <= gamma

commits (it bounds the dependence error of sampling U independently); at least one position
always commits. The block is stepped until it holds no mask (unlike the DUS version, which caps
the steps per block and moves on with masks left).

Published defaults: gamma = 1.0 bit (DUS; "typical range 0.01-4.0"); diffusers uses 0.1 for a
uniform-noise model; the paper's own default is unconfirmed. Entropies are in the request's
`score_dtype` (DUS: float64).
"""
from __future__ import annotations

import math

import torch

from .base import Sampler, check_number
from dllm.state import Decision

ORDERS = ("entropy", "confidence", "margin")


def entropy_bound_count(h_sorted: torch.Tensor, valid_sorted: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B,) length of the longest prefix with cumsum(H) - cummax(H) <= gamma, at least 1 where a
    row has a valid entry. h_sorted (B, Q) in the commit order, valid_sorted (B, Q) bool (a prefix)."""
    h = h_sorted.masked_fill(~valid_sorted, 0.0)
    excess = torch.cumsum(h, dim=1) - torch.cummax(h, dim=1).values                      # (B, Q)
    ok = (excess <= gamma) & valid_sorted
    k = ok.long().cumprod(dim=1).sum(1)                                                  # longest passing prefix
    return torch.where(valid_sorted.any(1), k.clamp(min=1), torch.zeros_like(k))


class EntropyBound(Sampler):
    """EB-Sampler: commit the largest low-entropy set whose entropy sum minus its maximum is <= gamma bits."""

    name = "eb"
    uses_steps = False
    row_state = ()
    uses_blocks = True
    score_fields = frozenset({"entropy"})   # plus the ordering's statistic, per instance

    def __init__(self, *, gamma: float = 1.0, order: str = "entropy"):
        check_number("gamma", gamma, low=0, sampler=self.name)
        if order not in ORDERS:
            raise ValueError(f"sampler {self.name!r}: order must be one of {', '.join(ORDERS)}, got {order!r}")
        self.gamma, self.order = float(gamma), order
        self.score_fields = frozenset({"entropy"} | ({"prob"} if order == "confidence" else set())
                                      | ({"margin"} if order == "margin" else set()))
        self._args = dict(gamma=gamma, order=order)

    def step(self, state, rows, positions, valid, scores):
        h = scores.entropy.double().clamp(min=0) / math.log(2)                  # (B', Q) bits
        if self.order == "entropy":
            key = -h
        else:
            key = (scores.prob if self.order == "confidence" else scores.margin).double()
        key = key.masked_fill(~valid, float("-inf"))
        order = torch.sort(key, dim=1, descending=True, stable=True).indices   # (B', Q)
        valid_sorted = valid.gather(1, order)
        k = entropy_bound_count(h.gather(1, order), valid_sorted, self.gamma)   # (B',)
        take_sorted = torch.arange(valid.shape[1], device=valid.device)[None, :] < k[:, None]
        commit = torch.zeros_like(valid).scatter(1, order, take_sorted)
        return Decision(commit=commit & valid)
