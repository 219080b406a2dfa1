"""Fast-dLLM confidence threshold (arXiv:2505.22618, Alg. 1; NVlabs Fast-dLLM `llada/generate.py`).

Semi-autoregressive blocks; no per-step count. Each step, among the masked positions of the active
block, the most confident candidate is committed unconditionally and every other one whose
confidence c_i (the un-tempered probability of the candidate token) is >= tau; the block is stepped
until it holds no mask. Ties for the top position go to the lowest position.

The confidence is computed in the request's `score_dtype` and compared with tau in that dtype, as
a PyTorch `conf >= tau` compares (tau rounded to it: 0.9 is 0.8984375 in bfloat16). Fast-dLLM's
LLaDA reference uses a float64 softmax (`score_dtype="float64"`); its Dream loops compute and
compare in the logits' dtype (`score_dtype="logits"`).

`commit_block_start=True` is Fast-dLLM's block-wise Dream loop (`generation_utils_block.py`, its
cached runs): a block's first step commits the block's first position, whatever its confidence,
and nothing else; the rule runs from the block's second step on. Its blocks are 32 long when the
request gives no block_length (and 32 divides gen_length), as that loop's default.
Published defaults: tau 0.9 (paper and scripts; "explored in the range of 0.5 to 1.0"),
block_length 32 (scripts), temperature 0. tau = 1.0 commits one token per step (unless a
candidate is certain).
"""
from __future__ import annotations

import functools
import math
import struct

import torch

from .base import Sampler, check_number
from dllm.kernels.scoring import TokenScores
from dllm.state import Decision


# The block length of Fast-dLLM's block-wise Dream loop when its caller gives none.
FASTDLLM_DREAM_BLOCK_LENGTH = 32


def masked_confidence(scores: TokenScores, valid: torch.Tensor) -> torch.Tensor:
    """(B, Q) float64 confidence of the scored candidates, -inf on padding entries."""
    return scores.prob.double().masked_fill(~valid, float("-inf"))


def top1(conf: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, Q) bool: the most confident valid entry of each row (lowest index on ties; none in a row
    without valid entries). Scored positions come in increasing column order, so the lowest index
    is the lowest position."""
    best = conf.masked_fill(~valid, float("-inf")).argmax(1, keepdim=True)       # the first of equal maxima
    return (torch.arange(conf.shape[1], device=conf.device) == best) & valid


@functools.lru_cache(maxsize=64)
def rounded_to(value: float, dtype: torch.dtype) -> float:
    """`value` as a tensor of `dtype` holds it: what `tensor >= value` compares with. Worked out on
    the host (a tensor would be an operation the step dispatches and reads back): round to nearest
    even, as torch converts a Python float (float16 and bfloat16 through float32)."""
    value = float(value)
    if dtype == torch.float64:
        return value
    try:
        single = struct.unpack("<f", struct.pack("<f", value))[0]
        if dtype == torch.float16:
            return struct.unpack("<e", struct.pack("<e", single))[0]
    except OverflowError:
        return math.copysign(math.inf, value)
    if dtype == torch.float32:
        return single
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", single))[0]
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    raise ValueError(f"confidences in {dtype} are not supported; score in float16, bfloat16, float32 or float64")


def threshold_commit(conf: torch.Tensor, valid: torch.Tensor, tau: float,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Fast-dLLM's rule: commit the top-1 valid entry and every valid entry with conf >= tau, the
    confidences computed in `dtype` and compared there. conf (B, Q) float (values of `dtype`),
    valid (B, Q) bool -> (B, Q) bool."""
    return top1(conf, valid) | (valid & (conf >= rounded_to(tau, dtype)))


class Threshold(Sampler):
    """Fast-dLLM: commit every masked block position with confidence >= tau, and always the top one."""

    name = "threshold"
    uses_steps = False
    row_state = ()
    uses_blocks = True
    score_fields = frozenset({"prob"})

    def __init__(self, *, tau: float = 0.9, commit_block_start: bool = False):
        check_number("tau", tau, low=0, high=1, sampler=self.name)
        if not isinstance(commit_block_start, bool):
            raise ValueError(f"sampler {self.name!r}: commit_block_start must be true or false, got "
                             f"{commit_block_start!r}")
        self.tau, self.commit_block_start = float(tau), commit_block_start
        self._args = dict(tau=tau, commit_block_start=commit_block_start)

    def block_length_for(self, source):
        """Fast-dLLM's block-wise Dream loop decodes blocks of 32 when given no block length."""
        return FASTDLLM_DREAM_BLOCK_LENGTH if self.commit_block_start else None

    def step(self, state, rows, positions, valid, scores):
        conf = masked_confidence(scores, valid)                                  # (B', Q)
        commit = threshold_commit(conf, valid, self.tau, scores.prob.dtype)
        if self.commit_block_start:
            first_step = (state.step_in_block[rows] == 0)[:, None]                # (B', 1)
            commit = torch.where(first_step, valid & (positions == state.block_start[rows, None]), commit)
        return Decision(commit=commit)
