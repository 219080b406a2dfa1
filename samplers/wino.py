"""WINO, Wide-In Narrow-Out (arXiv:2507.18578; Feng-Hong/WINO-DLLM `decoding_wino`, the released
code and its configurations).

Semi-autoregressive blocks, each stepped until it holds no mask. Every forward also runs a shadow
copy of the active block: copy j is a mask token at the rotary position of block column j that
attends to the whole canvas except that column, and to the other copies; no canvas column attends
to the copies. So one forward gives the canvas logits and, for every token already written in the
block, the probability the model gives it when that token is hidden (its verification score).

* Wide in: among the block's masks, commit every candidate whose confidence is > `threshold`, at
  most `max_accept` = min(max(floor(0.7 n), 5), 20) of them (n: the block's masks before the step;
  the most confident first, ties to the lower position), and the single most confident one when
  none passes.
* Narrow out: when the step commits two or more, the tokens written at earlier steps of the block
  whose verification score is < `threshold_back` are masked again, at most (the previous step's
  commit count - 1) of them, the lowest scores first (30 - 1 at a block's first step). Tokens
  committed at this step are never masked again.

Confidences and verification scores are probabilities in the request's `score_dtype` (the
reference uses a float64 softmax: `score_dtype="float64"`), with the mask token suppressed as in
every dllm sampler. The loop's forward cap (by default three forwards per generated token for this
sampler) ends a block that keeps re-masking: its last forward fills every mask. `steps` is not used. Needs cache "none" and a LLaDA-family model (the reference
has no Dream version). Published settings (its LLaDA configurations): threshold 0.6 (GSM8K; 0.5 to
0.8 by task), threshold_back 0.9, block_length 128, gen_length 256, temperature 0.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number, top_k_mask
from .threshold import masked_confidence, top1
from dllm.state import Decision

ACCEPT_SHARE, MIN_ACCEPT, MAX_ACCEPT = 0.7, 5, 20      # the transfer cap's constants in the reference
FIRST_LAST_ACCEPT = 30                                  # the re-mask cap's start value in each block


class WINO(Sampler):
    """WINO: commit every confident mask (wide in), re-mask written tokens a shadow block doubts (narrow out)."""

    name = "wino"
    uses_steps = False
    uses_blocks = True
    rewrites_tokens = True
    remasks = True
    shadow_block = True

    def __init__(self, *, threshold: float = 0.6, threshold_back: float = 0.9):
        check_number("threshold", threshold, low=0, high=1, sampler=self.name)
        check_number("threshold_back", threshold_back, low=0, high=1, sampler=self.name)
        self.threshold, self.threshold_back = float(threshold), float(threshold_back)
        self._args = dict(threshold=threshold, threshold_back=threshold_back)

    def setup(self, state) -> None:
        B, dev = state.batch_size, state.x.device
        state.extra["wino_last_accept"] = torch.full((B,), FIRST_LAST_ACCEPT, dtype=torch.long, device=dev)
        state.extra["wino_back"] = None

    def begin_blocks(self, state, rows, opening) -> None:
        last = state.extra["wino_last_accept"]
        last[rows] = last[rows].masked_fill(opening, FIRST_LAST_ACCEPT)

    def forward_allowance(self, state) -> int:
        """Re-masked tokens are decoded again: the cap grants two more forwards per token."""
        return 2 * state.gen_length

    def shadow_columns(self, state, rows):
        """Every column of the active block (a row whose block is shorter pads with its start)."""
        start, end = state.block_start[rows], state.block_end[rows]
        columns = start[:, None] + torch.arange(state.block_length, device=start.device)[None, :]
        valid = columns < end[:, None]
        return torch.where(valid, columns, start[:, None]), valid

    def read_shadow(self, state, rows, columns, valid, logits) -> None:
        """The verification score of each written block token: its probability at its copy."""
        written = valid & (state.x[rows].gather(1, columns) != state.ids.mask)
        probs = torch.softmax(logits.to(state.score_dtype), dim=-1)
        score = probs.gather(2, state.x[rows].gather(1, columns)[..., None])[..., 0].double()
        back = torch.full(state.x[rows].shape, float("inf"), dtype=torch.float64, device=logits.device)
        state.extra["wino_back"] = back.scatter(1, columns, score.masked_fill(~written, float("inf")))

    def step(self, state, rows, positions, valid, scores):
        conf = masked_confidence(scores, valid)                                          # (B', Q)
        n = valid.sum(1)
        cap = (n * ACCEPT_SHARE).long().clamp(min=MIN_ACCEPT, max=MAX_ACCEPT)           # (B',)
        above = valid & (conf > self.threshold)
        count = above.sum(1, keepdim=True)
        commit = torch.where(count > cap[:, None], top_k_mask(conf, cap) & valid,
                             torch.where(count == 0, top1(conf, valid), above))
        accepted = commit.sum(1)
        last = state.extra["wino_last_accept"]
        remask = self._narrow_out(state.extra["wino_back"], last[rows], accepted)
        last[rows] = accepted
        return Decision(commit=commit, remask=remask)

    def _narrow_out(self, back, last_accept, accepted):
        """(B', L) bool: the written block tokens to mask again (at most last_accept - 1, the
        lowest verification scores first), only in rows that commit two or more."""
        doubt = back < self.threshold_back
        limit = torch.where(doubt.sum(1) >= last_accept, last_accept - 1, doubt.sum(1))
        lowest = top_k_mask(-back, limit) & doubt
        return lowest & (accepted > 1)[:, None]
