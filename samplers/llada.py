"""LLaDA's reference samplers (ML-GSAI/LLaDA `generate.py`; arXiv:2502.09992, App. B).

Semi-autoregressive blocks of `block_length`; `steps` are split evenly over the blocks. At the
start of a block with n masked positions and s steps per block, step j commits n // s tokens, plus
one more for the first n % s steps (the linear noise schedule gives uniform counts). Each step the
candidate token of every masked in-block position is the argmax (Gumbel-max at temperature > 0)
and the positions with the highest score are committed:

* `low_confidence`: score = softmax probability of the candidate under the raw logits ("low
  confidence remasking": the least confident positions stay masked).
* `random`: score = a fresh uniform draw per position.

Options (LLaDA commit 8e01df8, used per task in its EVAL.md):
* `logits_eos_inf`: the EOS logit is set to -inf before the candidate is chosen (EOS never
  predicted).
* `confidence_eos_eot_inf`: the reference's literal behaviour: after the candidate is chosen, the
  EOS column of the (noised) logits and the EOT column of the raw logits become -inf; at
  temperature 0 these are one tensor, so a position predicting EOS or EOT gets confidence 0 (it is
  postponed, not forbidden) and the other confidences are renormalised without those two columns;
  at temperature > 0 only EOT is affected.
Classifier-free guidance is `cfg_scale` of the request (it applies to every sampler).

Requirements: gen_length % block_length == 0 and steps % (gen_length / block_length) == 0, as in
the reference, and steps <= gen_length (the reference spends more steps on forwards that commit
nothing). Ties between equal scores go to the lower position.
Published defaults: steps = gen_length = block_length = 128 (chat demo: block 32), temperature 0,
both options off.
"""
from __future__ import annotations

import torch

from .base import Sampler, block_region, steps_per_block, top_k_mask
from dllm.state import Decision


class LowConfidence(Sampler):
    """LLaDA: commit the k most confident masked positions of the block (fixed per-step counts)."""

    name = "low_confidence"
    uses_blocks = True
    fixed_schedule = True
    whole_blocks = True
    row_state = ("counts",)

    def __init__(self, *, logits_eos_inf: bool = False, confidence_eos_eot_inf: bool = False):
        for name, value in (("logits_eos_inf", logits_eos_inf), ("confidence_eos_eot_inf", confidence_eos_eot_inf)):
            if not isinstance(value, bool):
                raise ValueError(f"sampler {self.name!r}: {name} must be True or False, got {value!r}")
        self.logits_eos_inf = logits_eos_inf
        self.confidence_eos_eot_inf = confidence_eos_eot_inf
        if confidence_eos_eot_inf:      # a subclass that needs logits anyway keeps its class value
            self.needs_logits = True
        self._args = dict(logits_eos_inf=logits_eos_inf, confidence_eos_eot_inf=confidence_eos_eot_inf)

    def check_options(self, state) -> None:
        """Refuse `confidence_eos_eot_inf` on a model without an end-of-turn token."""
        if self.confidence_eos_eot_inf and state.ids.eot is None:
            raise ValueError(f"sampler {self.name!r}: confidence_eos_eot_inf needs an end-of-turn token id, and this "
                             f"model's tokenizer has none (<|eot_id|>)")

    def setup(self, state):
        self.check_options(state)
        per_block = steps_per_block(self.name, state)
        if state.steps > state.gen_length:
            region, note = block_region(state)
            raise ValueError(f"sampler {self.name!r}: steps {state.steps} must be <= {region} (at least one token per "
                             f"step{note})")
        state.extra["steps_per_block"] = per_block
        state.extra["counts"] = torch.zeros(state.batch_size, per_block, dtype=torch.long, device=state.x.device)

    def block_counts(self, state, rows) -> torch.Tensor:
        """(B', steps per block): the tokens each step of the rows' active blocks commits, their
        masks spread evenly with the remainder on the first steps (LLaDA's get_num_transfer_tokens)."""
        per_block = state.extra["steps_per_block"]
        n = state.masked_in_block(rows).sum(1)                                       # (B',)
        j = torch.arange(per_block, device=n.device)
        return n[:, None] // per_block + (j[None, :] < (n % per_block)[:, None]).long()

    def planned_widths(self, state):
        """Each block opens with its block_length masks (nothing outside the active block is ever
        committed) and commits `block_counts` of them per step, so the masks left at each step are
        known; a block that opened with fewer masks has at most as many left at every step."""
        per_block = state.extra["steps_per_block"]
        K = state.block_length
        counts = [K // per_block + (j < K % per_block) for j in range(per_block)]
        left = [K - sum(counts[:j]) for j in range(per_block)]
        return left * (state.gen_length // K)

    def begin_block(self, state, rows):
        state.extra["counts"][rows] = self.block_counts(state, rows)

    def begin_blocks(self, state, rows, opening):
        counts = state.extra["counts"]
        counts[rows] = torch.where(opening[:, None], self.block_counts(state, rows), counts[rows])

    @property
    def edits_logits(self) -> bool:
        return self.logits_eos_inf

    def process_logits(self, state, rows, logits):
        if self.logits_eos_inf:
            logits[..., state.ids.eos] = float("-inf")
        return logits

    def scores_for(self, state, rows, positions, valid, scores):
        if not self.confidence_eos_eot_inf:
            return scores.prob
        logits = scores.logits.to(state.score_dtype, copy=True)                    # (B', Q, V)
        logits[..., state.ids.eot] = float("-inf")
        if state.temperature == 0:
            logits[..., state.ids.eos] = float("-inf")
        return torch.softmax(logits, dim=-1).gather(-1, scores.token[..., None]).squeeze(-1)

    def step_counts(self, state, rows) -> torch.Tensor:
        """(B',) the tokens this step of each row's block commits."""
        step = state.step_in_block[rows].clamp(max=state.extra["steps_per_block"] - 1)
        return state.extra["counts"][rows].gather(1, step[:, None]).squeeze(1)

    def step(self, state, rows, positions, valid, scores):
        score = self.scores_for(state, rows, positions, valid, scores).double()
        score = score.masked_fill(~valid, float("-inf"))
        return Decision(commit=top_k_mask(score, self.step_counts(state, rows)) & valid)


class RandomRemasking(LowConfidence):
    """LLaDA: commit k random masked positions of the block (fixed per-step counts)."""

    name = "random"
    row_state = None     # its random draw covers the whole batch
    draws = True

    def scores_for(self, state, rows, positions, valid, scores):
        # One (B, L) float32 draw per step over the whole canvas, as the reference draws it, so a
        # seeded run reproduces the reference's choice of positions.
        u = torch.rand(state.x.shape, generator=state.generator, device=state.x.device)
        return u[rows].gather(1, positions)
