"""ParallelBench's top-k unmasking rules on LLaDA's schedule (furiosa-ai/ParallelBench, its unmasking
registry and LLaDA generation loop; arXiv:2510.04767).

The schedule is LLaDA's (`low_confidence`, docs/samplers.md §2): semi-autoregressive blocks, the
steps split evenly over the blocks, and step j of a block with n masks commits n // s positions plus
one for the first n % s steps. ParallelBench runs its top-k methods with one block (block_length =
gen_length) and steps = gen_length / k, so that every step commits exactly k tokens. What differs is
the score that picks the k positions among the block's masks:

* `margin_topk` (ParallelBench `topk_margin`): the top-1 minus the top-2 softmax probability.
* `entropy_topk` (ParallelBench `entropy_topk`): the negative entropy, sum p log(p + 1e-10).
* `left_to_right` (ParallelBench `left_to_right`): minus the column, so the leftmost masks go first
  (with k = 1 this is autoregressive decoding).

ParallelBench's `confidence_topk` is `low_confidence`. As in ParallelBench's loop (and every dllm
sampler), the mask token's logit is -inf before the candidate is chosen and the scores computed.
Scores are computed in the request's `score_dtype`; ties go to the lower position.
Published defaults: k in {1, 2, 4, 8, 16, 32} on the leaderboard, temperature 0.
"""
from __future__ import annotations

import torch

from .base import sum_p_log_p
from .llada import LowConfidence


class _ParallelBenchTopK(LowConfidence):
    """LLaDA's schedule with a ParallelBench score (`scores_for`); no arguments."""

    row_state = ("counts",)

    def __init__(self):
        super().__init__()
        self._args = {}

    def probabilities(self, state, scores) -> torch.Tensor:
        """(B', Q, V) softmax of the scored logits in the request's score dtype."""
        return torch.softmax(scores.logits.to(state.score_dtype), dim=-1)


class MarginTopK(_ParallelBenchTopK):
    """ParallelBench topk_margin: commit the k masked positions with the largest top-1 minus top-2 probability."""

    name = "margin_topk"
    needs_logits = True

    def scores_for(self, state, rows, positions, valid, scores):
        top2 = self.probabilities(state, scores).topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]


class EntropyTopK(_ParallelBenchTopK):
    """ParallelBench entropy_topk: commit the k masked positions with the lowest entropy."""

    name = "entropy_topk"
    needs_logits = True

    def scores_for(self, state, rows, positions, valid, scores):
        p = self.probabilities(state, scores)
        return sum_p_log_p(p, 1e-10)


class LeftToRight(_ParallelBenchTopK):
    """ParallelBench left_to_right: commit the k leftmost masked positions of the block."""

    name = "left_to_right"

    def scores_for(self, state, rows, positions, valid, scores):
        return -positions.to(torch.float64)
