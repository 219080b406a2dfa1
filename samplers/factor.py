"""Fast-dLLM factor rule (arXiv:2505.22618, Theorem 1; NVlabs Fast-dLLM `llada/generate.py`,
`get_transfer_index_dynamic`).

Semi-autoregressive blocks. Each step the masked positions of the active block are sorted by
confidence, c_(1) >= ... >= c_(n) (the un-tempered probability of the candidate; ties go to the
lower position). Rank 1 always commits; rank r >= 2 passes when c_(r) >= 1 - f / (r + 1), i.e.
(r + 1)(1 - c_(r)) <= f. At the first failing rank r* the ranks 1 .. r* - 1 commit.

Motivation (Theorem 1): if every marginal exceeds 1 - eps and (n + 1) eps <= 1, greedy parallel
decoding equals greedy sequential decoding.

`last_rank_quirk` (default True, as the reference): when the first failing rank is the LAST one
(r* = n >= 2), the reference commits all n positions, the failing one included. False applies the
plain rule (commit n - 1).

The confidence is computed in the request's `score_dtype`; the reference uses a float64 softmax
(`score_dtype="float64"`). ParallelBench (arXiv:2510.04767) writes the condition with `< f`; the
code's `<=` (as c >= 1 - f/(r+1)) is used here.
Published defaults: f = 1 (function default; not stated in the paper; ParallelBench sweeps 0.7-1.9),
block_length 32.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number
from .threshold import masked_confidence
from dllm.state import Decision


def factor_count(sorted_conf: torch.Tensor, n: torch.Tensor, f: float, last_rank_quirk: bool) -> torch.Tensor:
    """(B,) number of ranks to commit. sorted_conf (B, Q) descending (padding -inf at the end),
    n (B,) valid entries per row."""
    Q = sorted_conf.shape[1]
    rank = torch.arange(1, Q + 1, device=sorted_conf.device, dtype=torch.float64)     # (Q,)
    thresh = 1 - f / (rank + 1)
    thresh[0] = float("-inf")                                                          # rank 1 forced
    in_row = rank[None, :] <= n[:, None]                                               # (B, Q)
    fail = in_row & (sorted_conf < thresh[None, :])
    # 0-based index of the first failing rank, or n when none fails.
    first = torch.where(fail.any(1), fail.long().argmax(1), n)
    if last_rank_quirk:
        first = torch.where(first == n - 1, n, first)
    return first.clamp(min=1) * (n > 0)


class Factor(Sampler):
    """Fast-dLLM factor rule: commit the longest confidence-sorted prefix with (r+1)(1-c_(r)) <= f."""

    name = "factor"
    uses_steps = False
    row_state = ()
    uses_blocks = True
    score_fields = frozenset({"prob"})

    def __init__(self, *, f: float = 1.0, last_rank_quirk: bool = True):
        check_number("f", f, low=0, low_open=True, sampler=self.name)
        if not isinstance(last_rank_quirk, bool):
            raise ValueError(f"sampler {self.name!r}: last_rank_quirk must be True or False, got {last_rank_quirk!r}")
        self.f = float(f)
        self.last_rank_quirk = last_rank_quirk
        self._args = dict(f=f, last_rank_quirk=last_rank_quirk)

    def step(self, state, rows, positions, valid, scores):
        conf = masked_confidence(scores, valid)                                 # (B', Q)
        sorted_conf, order = torch.sort(conf, dim=1, descending=True, stable=True)
        k = factor_count(sorted_conf, valid.sum(1), self.f, self.last_rank_quirk)   # (B',)
        take_sorted = torch.arange(conf.shape[1], device=conf.device)[None, :] < k[:, None]
        commit = torch.zeros_like(valid).scatter(1, order, take_sorted)
        return Decision(commit=commit & valid)
