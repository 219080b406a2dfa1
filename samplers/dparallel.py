"""dParallel's entropy-threshold rule (arXiv:2509.26488; czg1225/dParallel `LLaDA/generate.py`,
`Dream/model/generation_utils_semiar.py`), the decoding rule its certainty-forced distilled models
(dParallel-LLaDA-8B-instruct, dParallel_Dream_7B_Instruct) are run with.

`dparallel`: Fast-dLLM's block loop with entropy in place of confidence. Semi-autoregressive
blocks, no per-step count. Each step scores the masked positions of the active block by the
entropy H = -sum p log(p + 1e-12) of their softmax, computed in the request's `score_dtype`
(dParallel: float64, `score_dtype="float64"`); it commits the lowest-entropy position
unconditionally (ties to the lowest position) and every other one with H <= `threshold` (in nats,
rounded to the score dtype as a tensor compares), and steps the block until it holds no mask. At
temperature > 0 the candidate is the loop's Gumbel-max sample; H stays un-tempered.

`dream_dparallel`: the same rule in dParallel's Dream loop, which differs in three details: the
entropy is -sum p log(p + 1e-8) in the logits' dtype, the other positions commit when H <
`threshold` (strictly), and the candidate is the argmax of the logits at temperature 0, else drawn
from their tempered softmax (no top-p or top-k). Its blocks are 32 long when the request gives no
block_length (and 32 divides gen_length), that loop's default.

Published settings: threshold 0.5 (both scripts), block_length 32, temperature 0. Both rules read
one row at a time and keep nothing between steps, so rows can join a running batch.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number, sum_p_log_p
from .sampling import check_temperature, sample_at, sample_filtered
from .threshold import rounded_to, top1
from dllm.state import Decision

# The block length of dParallel's Dream loop when its caller gives none.
DREAM_BLOCK_LENGTH = 32


def entropy_with_floor(logits: torch.Tensor, floor: float) -> torch.Tensor:
    """-sum p log(p + floor) of softmax(logits) over the last dimension, in the logits' dtype (a
    term of p = 0 counts 0)."""
    return -sum_p_log_p(torch.softmax(logits, dim=-1), floor)


def lowest_entropy_commit(entropy: torch.Tensor, valid: torch.Tensor, threshold: float, *,
                          strict: bool) -> torch.Tensor:
    """dParallel's rule: the valid entry of lowest entropy (the first on ties) and every valid entry
    whose entropy is below `threshold` (or equal to it unless `strict`), compared in the entropy's
    dtype. entropy, valid (B, Q) -> (B, Q) bool."""
    bound = rounded_to(threshold, entropy.dtype)
    below = entropy < bound if strict else entropy <= bound
    return top1(-entropy.masked_fill(~valid, float("inf")), valid) | (valid & below)


class DParallel(Sampler):
    """dParallel (LLaDA): commit every masked block position with entropy <= threshold, and always the lowest."""

    name = "dparallel"
    uses_steps = False
    row_state = ()
    uses_blocks = True
    needs_logits = True        # its entropy carries the reference's 1e-12 inside the log
    score_fields = frozenset()
    floor, strict = 1e-12, False

    def __init__(self, *, threshold: float = 0.5):
        check_number("threshold", threshold, low=0, sampler=self.name)
        self.threshold = float(threshold)
        self._args = dict(threshold=threshold)

    def entropy(self, state, logits: torch.Tensor) -> torch.Tensor:
        return entropy_with_floor(logits.to(state.score_dtype), self.floor)

    def step(self, state, rows, positions, valid, scores):
        entropy = self.entropy(state, scores.logits)                                    # (B', Q)
        return Decision(commit=lowest_entropy_commit(entropy, valid, self.threshold, strict=self.strict))


class DreamDParallel(DParallel):
    """dParallel's Dream loop: entropy < threshold in the logits' dtype, Dream's candidates."""

    name = "dream_dparallel"
    gumbel_candidates = False  # the argmax of the logits, or a draw from their tempered softmax
    floor, strict = 1e-8, True

    def setup(self, state) -> None:
        check_temperature(self.name, state.temperature)

    def block_length_for(self, source):
        """dParallel's Dream loop decodes blocks of 32 when given no block length."""
        return DREAM_BLOCK_LENGTH

    def entropy(self, state, logits):
        return entropy_with_floor(logits, self.floor)

    def step(self, state, rows, positions, valid, scores):
        logits = scores.logits                                                          # (B', Q, V)
        if state.temperature > 0:
            draw = lambda flat: sample_filtered(flat, state.temperature, None, None, state.generator)[1:]  # noqa: E731
            tokens = sample_at(logits, valid, draw, sampled=True)[1]
        else:
            tokens = logits.argmax(-1)
        decision = super().step(state, rows, positions, valid, scores)
        return Decision(commit=decision.commit, tokens=tokens)
