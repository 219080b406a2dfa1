"""SlowFast sampling (arXiv:2506.10848; LiangrunFlora/Slow-Fast-Sampling
`generate_slow_fast_sampling`, the released code and evaluation settings).

Semi-autoregressive blocks, each decoded in sub-cycles. `last` is the end of the span decoded so
far (block-relative, 0 at the block start) and `cur` the end of the next span.

* Slow phase: exactly `explore_steps` forwards. Each one first estimates the span end (until it is
  settled): among the block's masked positions from `last` on, the farthest whose confidence is
  >= `span_threshold` gives est = last + its offset + 1 (last + 1 when there is none), clamped to
  1..block_length; the last `window` estimates are kept, and once there are `window` of them, a
  population standard deviation below `std_threshold` settles cur = est, otherwise cur = the floor
  of their mean (settled at the phase's last step). Then it commits, among the block's masks from
  `last` on, every one with confidence >= `high_threshold` when there are at least two, else the
  most confident one.
* Fast phase: until the span [last, cur) has no mask, one forward each, committing among the
  span's masks the same way. From the phase's second forward on, the keys after the span are
  hidden (the reference runs those forwards on the canvas cut after the span).
* Then last = cur and the next sub-cycle begins; a block ends when it has no mask.

Where a block fills up during an exploration phase, the reference still runs the phase's remaining
forwards (they commit nothing); here the block ends. Confidence is the candidate's probability in
the request's `score_dtype`, compared with the thresholds in that dtype (the reference compares
bf16 probabilities, which rounds 0.9 to 0.8984375: `score_dtype="logits"` on bf16 does the same);
ties go to the lower position. `steps` is not used. Published defaults (the code and its scripts): explore_steps 6,
span_threshold 0.3, high_threshold 0.9, window 2, std_threshold 1.0, block_length = gen_length
(256), temperature 0. The paper's text gives 0.1, 0.85 and 8 exploration steps.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number
from .threshold import masked_confidence, rounded_to, top1
from dllm.state import Decision

_STATE = ("sf_last", "sf_cur", "sf_slow", "sf_settled", "sf_fast", "sf_history", "sf_count")


class SlowFast(Sampler):
    """SlowFast: explore for a few steps to find a span, then fill the span fast, cycle by cycle."""

    name = "slowfast"
    uses_steps = False
    uses_blocks = True
    row_state = _STATE

    def __init__(self, *, explore_steps: int = 6, span_threshold: float = 0.3, high_threshold: float = 0.9,
                 window: int = 2, std_threshold: float = 1.0):
        n = self.name
        check_number("explore_steps", explore_steps, low=1, integer=True, sampler=n)
        check_number("span_threshold", span_threshold, low=0, high=1, sampler=n)
        check_number("high_threshold", high_threshold, low=0, high=1, sampler=n)
        check_number("window", window, low=1, integer=True, sampler=n)
        check_number("std_threshold", std_threshold, low=0, sampler=n)
        if window > explore_steps:
            raise ValueError(f"sampler {n!r}: window {window} must be <= explore_steps {explore_steps} (the span "
                             f"is settled from the last `window` estimates of the exploration steps)")
        self.explore_steps, self.window = explore_steps, window
        self.span_threshold, self.high_threshold = span_threshold, high_threshold
        self.std_threshold = float(std_threshold)       # compared with a tensor: an int past int64 is a float here
        self._args = dict(explore_steps=explore_steps, span_threshold=span_threshold,
                          high_threshold=high_threshold, window=window, std_threshold=std_threshold)

    def setup(self, state) -> None:
        B, dev = state.batch_size, state.x.device
        zeros = lambda: torch.zeros(B, dtype=torch.long, device=dev)  # noqa: E731
        state.extra.update(sf_last=zeros(), sf_cur=zeros(), sf_slow=zeros(), sf_fast=zeros(), sf_count=zeros(),
                           sf_settled=torch.zeros(B, dtype=torch.bool, device=dev),
                           sf_history=torch.zeros(B, self._history_width(state), dtype=torch.float64, device=dev))
        self.begin_blocks(state, torch.arange(B, device=dev), torch.ones(B, dtype=torch.bool, device=dev))

    def _history_width(self, state) -> int:
        """The estimates kept: the last `window`. A sub-cycle stays in one block and commits a token
        per step, so it counts at most the canvas's length of estimates; a longer window never fills
        (never settles early) and keeps no more than that."""
        return min(self.window, state.length)

    def begin_blocks(self, state, rows, opening) -> None:
        """A new block: last 0, cur the block length, a fresh sub-cycle."""
        ex = state.extra
        length = state.block_end[rows] - state.block_start[rows]
        ex["sf_last"][rows] = ex["sf_last"][rows].masked_fill(opening, 0)
        ex["sf_cur"][rows] = torch.where(opening, length, ex["sf_cur"][rows])
        self._new_cycle(state, rows, opening)

    def _new_cycle(self, state, rows, where) -> None:
        ex = state.extra
        for key in ("sf_slow", "sf_fast", "sf_count"):
            ex[key][rows] = ex[key][rows].masked_fill(where, 0)
        ex["sf_settled"][rows] = ex["sf_settled"][rows] & ~where

    def _fast(self, state, rows) -> torch.Tensor:
        return state.extra["sf_slow"][rows] >= self.explore_steps

    def _span(self, state, rows) -> torch.Tensor:
        """(B', L) bool: the columns of each row's span [last, cur) of the active block."""
        start = state.block_start[rows, None]
        cols = state.columns()[None, :]
        return (cols >= start + state.extra["sf_last"][rows, None]) & (cols < start + state.extra["sf_cur"][rows, None])

    def score_mask(self, state, rows):
        """Slow phase: the block's masks; fast phase: the span's."""
        masked = state.masked_in_block(rows)
        return torch.where(self._fast(state, rows)[:, None], masked & self._span(state, rows), masked)

    def key_end(self, state, rows):
        """From a fast phase's second forward on, the keys after the span are hidden."""
        fast_again = self._fast(state, rows) & (state.extra["sf_fast"][rows] >= 1)
        end = state.block_start[rows] + state.extra["sf_cur"][rows]
        return torch.where(fast_again, end, torch.full_like(end, state.length))

    def _estimate(self, state, rows, positions, valid, conf, slow, dtype) -> None:
        """The span estimate of the rows in their slow phase (`slow`) and the settling test; the
        confidences were computed in `dtype`."""
        ex = state.extra
        start, last = state.block_start[rows], ex["sf_last"][rows]
        length = state.block_end[rows] - start
        hit = valid & (conf >= rounded_to(self.span_threshold, dtype))
        offset = positions - (start + last)[:, None]                                      # (B', Q)
        far = torch.where(hit, offset, -1).amax(1)                                        # (B',) -1: none
        est = torch.minimum(torch.maximum(last + torch.where(far >= 0, far + 1, 1), torch.ones_like(last)), length)
        hist = torch.cat([ex["sf_history"][rows][:, 1:], est[:, None].double()], dim=1)   # (B', W)
        count = ex["sf_count"][rows] + 1
        full = count >= self.window
        std = hist.std(dim=1, correction=0)
        mean_floor = hist.mean(dim=1).floor().long().clamp(min=1)
        mean_floor = torch.minimum(mean_floor, length)
        settle = full & (std < self.std_threshold)
        cur = torch.where(settle, est, torch.where(full, mean_floor, ex["sf_cur"][rows]))
        last_step = ex["sf_slow"][rows] == self.explore_steps - 1
        open_ = slow & ~ex["sf_settled"][rows]
        ex["sf_cur"][rows] = torch.where(open_, cur, ex["sf_cur"][rows])
        ex["sf_history"][rows] = torch.where(open_[:, None], hist, ex["sf_history"][rows])
        ex["sf_count"][rows] = torch.where(open_, count, ex["sf_count"][rows])
        ex["sf_settled"][rows] = ex["sf_settled"][rows] | (open_ & (settle | (full & last_step)))

    def step(self, state, rows, positions, valid, scores):
        conf = masked_confidence(scores, valid)                                           # (B', Q)
        fast = self._fast(state, rows)
        self._estimate(state, rows, positions, valid, conf, ~fast, scores.prob.dtype)
        high = valid & (conf >= rounded_to(self.high_threshold, scores.prob.dtype))
        commit = torch.where((high.sum(1) > 1)[:, None], high, top1(conf, valid))
        self._advance(state, rows, positions, valid, commit, fast)
        return Decision(commit=commit)

    def _advance(self, state, rows, positions, valid, commit, fast) -> None:
        """Count the step; a span left without masks after this step's commits ends the sub-cycle."""
        ex = state.extra
        ex["sf_slow"][rows] += (~fast).long()
        ex["sf_fast"][rows] += fast.long()
        masked = state.masked_in_block(rows)
        committed = torch.zeros_like(masked, dtype=torch.long).scatter_add(1, positions, (commit & valid).long()) > 0
        span_done = ~(masked & ~committed & self._span(state, rows)).any(1)
        done = self._fast(state, rows) & span_done
        ex["sf_last"][rows] = torch.where(done, ex["sf_cur"][rows], ex["sf_last"][rows])
        self._new_cycle(state, rows, done)
