"""RCR, running-confidence remasking (MDPO, arXiv:2508.13148; as ParallelBench's
`low_confidence_rcr` runs it: `generate_dlm` with `overtime_conf=True`, linear MaskGIT schedule).

Semi-autoregressive blocks of `block_length`, `steps` split evenly over them (s per block). A block
that opens with N masks keeps floor(N * max(1 - (t + 1) / s, 1e-6)) of them masked after its step
t (the linear MaskGIT schedule). Each step fills every mask up to the block's end, the block's and
those masked again in earlier blocks (the most confident first, as many as the schedule still
owes), and records each written token's confidence at its latest commit (its running confidence,
kept across blocks). Then, unless it is the block's last step, the written tokens with the lowest
running confidence are masked again (`Decision.remask`) down to the schedule's count, wherever
they are in the generated text before the block's end (ties to the lower position). So every
block takes s forwards and ends full.

Confidences are probabilities in the request's `score_dtype` with the mask token suppressed, as
dllm scores every sampler. The reference also counts the prompt and unwritten columns as running
confidence 1.0, so where the schedule asks for more tokens than hold a confidence below 1 it may
mask prompt tokens; here only written generated tokens are masked again. Temperature 0 only, as
in the reference. Published settings: none of its own in ParallelBench's configurations (the paper
reports it did not help); MDPO's code defaults are steps 64, gen_length 128, block_length 32.
"""
from __future__ import annotations

import torch

from .base import Sampler, top_k_mask
from dllm.state import Decision

MIN_RATIO = 1e-6        # the schedule's floor on the masked share (MaskGIT's clip)


def masked_after(n: torch.Tensor, step: torch.Tensor, steps: int) -> torch.Tensor:
    """Masks the linear MaskGIT schedule keeps after block step `step` (0-based) of `steps`, for a
    block that opened with `n` masks: floor(n * max(1 - (step + 1) / steps, 1e-6))."""
    ratio = (1 - (step.double() + 1) / steps).clamp(min=MIN_RATIO, max=1)
    return torch.floor(n.double() * ratio).long()


class RCR(Sampler):
    """RCR: fill every mask each step, then re-mask the lowest running confidences down to a MaskGIT schedule."""

    name = "rcr"
    uses_blocks = True
    fixed_schedule = True
    whole_blocks = True
    remasks = True
    reaches_back = True
    rewrites_tokens = True

    def __init__(self):
        self._args = {}

    def setup(self, state) -> None:
        if state.temperature != 0:
            raise ValueError(f"sampler {self.name!r} decodes greedily (temperature 0), as its reference; got "
                             f"temperature {state.temperature}")
        G, K = state.gen_length, state.block_length
        if G % K:
            raise ValueError(f"sampler {self.name!r}: gen_length {G} must be a multiple of block_length {K}")
        state.extra["rcr_steps"] = max(1, state.steps // (G // K))
        dev = state.x.device
        state.extra["rcr_conf"] = torch.zeros(state.x.shape, dtype=torch.float64, device=dev)   # 0: never written
        state.extra["rcr_opened"] = torch.zeros(state.batch_size, dtype=torch.long, device=dev)
        self.begin_blocks(state, torch.arange(state.batch_size, device=dev),
                          torch.ones(state.batch_size, dtype=torch.bool, device=dev))

    def begin_blocks(self, state, rows, opening) -> None:
        opened = state.extra["rcr_opened"]
        opened[rows] = torch.where(opening, state.masked_in_block(rows).sum(1), opened[rows])

    def score_mask(self, state, rows):
        """Every mask of the generated text up to the block's end."""
        return state.is_mask[rows] & (state.columns()[None, :] < state.block_end[rows, None]) \
            & state.in_generation()[None, :]

    def step(self, state, rows, positions, valid, scores):
        ex = state.extra
        steps, t, n = ex["rcr_steps"], state.step_in_block[rows], ex["rcr_opened"][rows]
        owed = torch.where(t == 0, n, masked_after(n, t - 1, steps))                    # (B',) still to fill
        conf = scores.prob.double().masked_fill(~valid, float("-inf"))
        commit = top_k_mask(conf, owed) & valid
        running = ex["rcr_conf"][rows]
        running = running.scatter(1, positions, torch.where(commit, conf, running.gather(1, positions)))
        again = masked_after(n, t, steps).masked_fill(t >= steps - 1, 0)                # (B',) to mask again
        written = (running > 0) & (state.columns()[None, :] < state.block_end[rows, None])
        written &= ~state.is_mask[rows] | commit_columns(state, rows, positions, commit)
        remask = top_k_mask(torch.where(written, -running, float("-inf")), again) & written
        ex["rcr_conf"][rows] = running
        # The block stays open for its whole schedule, also when the re-masks all fell before it.
        return Decision(commit=commit, remask=remask, hold=t < steps - 1)


def commit_columns(state, rows, positions, commit) -> torch.Tensor:
    """(B', L) bool: the canvas columns of `commit` (B', Q) (padding entries commit nothing)."""
    out = torch.zeros(len(rows), state.length, dtype=torch.long, device=positions.device)
    return out.scatter_add(1, positions, commit.long()) > 0
