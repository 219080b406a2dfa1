"""ReMDM revision steps on LLaDA's schedule (arXiv:2503.00307, guanghanwang/ReMDM-LLaDA; as
ParallelBench's `low_confidence_remdm` runs it, `llada_remdm_sample`).

LLaDA's low-confidence schedule (samplers/llada.py: `steps` split evenly over the blocks, each
step commits its count of the most confident masks of the block), with `remdm_steps` revision
steps inserted into every block after its step max(min(int(7/8 block_length), block_length -
1), 1) (at the block's end when it has fewer steps). A revision step first masks again the
`remdm_number` written tokens of the block whose confidence when they were committed is lowest
(ties to the lower position), then commits `remdm_number` of the block's masks by confidence, the
re-masked ones among them. So a block takes its steps plus `remdm_steps` forwards and ends full.

Here the re-masking is decided at the end of the step before the revision step (`Decision.remask`
after its commits), which is the same canvas the reference's revision forward sees. Confidences
are probabilities in the request's `score_dtype` (the reference's softmax is float64:
`score_dtype="float64"`), with the mask token suppressed as dllm scores every sampler. The
reference also requires gen_length % steps == 0 and takes each block's counts from a split of its
masks over all `steps`, which fills the block only when steps == gen_length or there is one block
(elsewhere its final check fails); here each block splits over its own steps (LLaDA's), equal in
those cases. Where a block holds fewer written tokens than `remdm_number` it masks columns that
were never written (the prompt's, say); here only written tokens of the block are masked again.
ReMDM-LLaDA's own loop differs from ParallelBench's (docs/samplers.md §21); this is the latter.
ParallelBench's paper reports one revision step of one token (`remdm_steps` 1, `remdm_number` 1)
as the best setting; neither helped its results much. Temperature 0 is what the tests check; at a
temperature above 0 positions are ranked by the candidate's un-tempered probability (as dllm's
`low_confidence` and LLaDA's own code do), where the ParallelBench code ranks by the tempered one.
"""
from __future__ import annotations

import torch

from .base import check_number, top_k_mask
from .llada import LowConfidence
from dllm.state import Decision

REVISION_AT = 7 / 8      # the share of the block length after which the revision steps come


def revision_start(block_length: int, steps_per_block: int) -> int:
    """The block step at which the revision steps begin (after that many regular steps)."""
    return min(max(min(int(block_length * REVISION_AT), block_length - 1), 1), steps_per_block)


def revision_schedule(block_length: int, steps_per_block: int, remdm_steps: int) -> list[bool]:
    """One entry per forward of a block: True for a revision step."""
    at = revision_start(block_length, steps_per_block)
    return [False] * at + [True] * remdm_steps + [False] * (steps_per_block - at)


class ReMDM(LowConfidence):
    """ReMDM: LLaDA's schedule with revision steps that re-mask and re-decode the least confident tokens."""

    name = "remdm"
    remasks = True
    rewrites_tokens = True
    row_state = None

    def __init__(self, *, remdm_steps: int = 1, remdm_number: int = 1):
        super().__init__()
        check_number("remdm_steps", remdm_steps, low=0, integer=True, sampler=self.name)
        check_number("remdm_number", remdm_number, low=1, integer=True, sampler=self.name)
        self.remdm_steps, self.remdm_number = remdm_steps, remdm_number
        self._args = dict(remdm_steps=remdm_steps, remdm_number=remdm_number)

    def setup(self, state):
        super().setup(state)
        state.extra["remdm_at"] = revision_start(state.block_length, state.extra["steps_per_block"])
        state.extra["remdm_conf"] = torch.full(state.x.shape, float("inf"), dtype=torch.float64, device=state.x.device)

    def forward_allowance(self, state) -> int:
        return self.remdm_steps * (state.gen_length // state.block_length)

    def planned_widths(self, state):
        return None

    def begin_blocks(self, state, rows, opening):
        super().begin_blocks(state, rows, opening)
        conf = state.extra["remdm_conf"]
        conf[rows] = conf[rows].masked_fill(opening[:, None], float("inf"))

    def step(self, state, rows, positions, valid, scores):
        ex = state.extra
        at, last = ex["remdm_at"], ex["steps_per_block"] + self.remdm_steps - 1
        t = state.step_in_block[rows].clamp(max=last)
        revising = (t >= at) & (t < at + self.remdm_steps)                             # (B',)
        regular_index = t - (t - at + 1).clamp(0, self.remdm_steps)                    # regular steps before t
        regular = ex["counts"][rows].gather(1, regular_index.clamp(min=0)[:, None]).squeeze(1)
        k = torch.where(revising, self.remdm_number, regular)                          # (B',)
        score = self.scores_for(state, rows, positions, valid, scores).double().masked_fill(~valid, float("-inf"))
        commit = top_k_mask(score, k) & valid
        conf = ex["remdm_conf"][rows]                                                  # (B', L)
        conf = conf.scatter(1, positions, torch.where(commit, score, conf.gather(1, positions)))
        before = (t + 1 >= at) & (t + 1 < at + self.remdm_steps) & (t < last)         # (B',) next step revises
        remask = top_k_mask(-conf, torch.full_like(k, self.remdm_number)) & conf.isfinite() & before[:, None]
        ex["remdm_conf"][rows] = conf.masked_fill(remask, float("inf"))
        return Decision(commit=commit, remask=remask)
