"""Fast-dLLM's threshold loop without blocks (NVlabs Fast-dLLM `dream/model/generation_utils.py`,
`alg="confidence_threshold"`: the "parallel" runs of its Dream scripts without a cache).

No blocks: every masked position of the generation region is a candidate at every step. Each row
gets a budget of n = gen_length / steps positions per step plus the positions it left unused the
step before. At step i it takes the n + carried most confident masked positions; the first always
commits, each other one when its confidence is >= `threshold`, and the ones below it are carried to
the next step. Before the last step (i = steps - 1) this never asks for more than the masks left (n
per remaining step plus the carried ones is exactly what is left); from the last step on it takes
every mask left, and a row steps until none is (the reference adds one step, with a budget of 0,
each time its last step leaves masks, so that step takes exactly the masks left).

The candidate is drawn as Dream's `sample_tokens` draws it (`sampling.sample_filtered`: temperature,
then top-p and top-k; the argmax at temperature 0) and its confidence is its probability there, in
the logits dtype (the reference compares bf16 probabilities with the threshold, which rounds 0.9 to
0.8984375). Ties go to the lower position (the reference's `torch.topk` leaves their order to the
backend). The reference runs batch 1 and asserts gen_length % steps == 0; here rows are independent
(each its own budget and carry) and such lengths are refused. The forwards are the reference's.
Published settings (Fast-dLLM `dream/eval_gsm8k.sh`): threshold 0.9, steps = gen_length / 32 (8 for
256 tokens), temperature 0.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number, top_k_mask
from .sampling import check_filters, check_temperature, filtered_draw, sample_at
from .threshold import top1
from dllm.state import Decision

_STATE = ("bt_budget", "bt_carry")


class BudgetThreshold(Sampler):
    """Fast-dLLM's loop without blocks: the most confident gen_length/steps masks (plus those left
    over) per step, the first always and the others above `threshold`; the rest carry over."""

    name = "budget_threshold"
    uses_blocks = False
    needs_logits = True
    gumbel_candidates = False
    score_fields = frozenset()        # confidences come from the logits, as Dream's sample_tokens computes them
    row_state = _STATE

    def __init__(self, *, threshold: float = 0.9, top_p: float | None = None, top_k: int | None = None):
        n = self.name
        check_number("threshold", threshold, low=0, high=1, sampler=n)
        check_filters(n, top_p, top_k)
        self.threshold, self.top_p, self.top_k = float(threshold), top_p, top_k
        self._args = dict(threshold=threshold, top_p=top_p, top_k=top_k)

    def setup(self, state) -> None:
        check_temperature(self.name, state.temperature)
        if state.answer_length % state.steps:
            raise ValueError(f"sampler {self.name!r}: steps {state.steps} must divide gen_length "
                             f"{state.answer_length} (each step's budget is gen_length / steps)")
        B, dev = state.batch_size, state.x.device
        full = lambda value: torch.full((B,), value, dtype=torch.long, device=dev)   # noqa: E731
        state.extra.update(bt_budget=full(state.answer_length // state.steps), bt_carry=full(0))

    def score_mask(self, state, rows):
        return state.masked_in_generation(rows)

    def step(self, state, rows, positions, valid, scores):
        ex = state.extra
        draw = filtered_draw(state, self.top_p, self.top_k)
        conf, tokens = sample_at(scores.logits, valid, draw, sampled=state.temperature > 0)
        # From the last step on this is at least the masks left, and every one of them is taken.
        taken = top_k_mask(conf, ex["bt_budget"][rows] + ex["bt_carry"][rows]) & valid
        commit = taken & (top1(conf, valid) | (conf >= self.threshold))
        ex["bt_carry"][rows] = (taken & ~commit).sum(1)
        return Decision(commit=commit, tokens=tokens)
