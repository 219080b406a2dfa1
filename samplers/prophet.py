"""Prophet: early commit (arXiv:2508.19982, "Diffusion Language Models Know the Answer Before
Decoding", ICLR 2026; the authors' Prophet `generate_earlyexit.py` / `eval_llada.py`).

A stopping rule layered on any sampler (`base`). Each step, before the base sampler's ordinary
commit:
1. g = the mean, over the answer region A, of the raw top-1 minus top-2 logit gap (A may lie
   outside the active block; committed positions of A count too, as the reference reads the
   logits of the whole canvas);
2. progress p = global step / requested steps (`steps` of the request, default gen_length), the
   step counted from 1 as the published loop counts it;
3. tau(p) = thresholds[0] if p < switches[0], thresholds[1] if p < switches[1], else thresholds[2];
4. if g >= tau(p): every remaining mask of the row (future blocks included) is filled with this
   step's candidate tokens, and the row is done;
5. otherwise the base sampler's decision is used unchanged (its commits, tokens, edits, re-masks,
   held blocks, block ends and truncation).

Composition: `base` is a registered sampler name with `base_kwargs`, or a Sampler instance; the
wrapper takes over its block use, schedule and logits needs. Prophet scores every masked position
of the generation region (and the answer region) each step, since a fill-all needs them all; the
base sampler sees only the positions it asked for, so with a base that never triggers the fill the
tokens equal the base's at temperature 0 (for a base that draws nothing then: `random` and
`origin` draw over the scored positions). A base with a shadow block (`wino`) is refused.

Answer region. The reference monitors `answer_length` = 5 positions from an `answer_start_pos`
estimated per task (its GSM8K harness forces "The answer is" at generated positions 200-202 of a
256-token answer and monitors the tokens after it; multiple-choice tasks monitor the choice
token). A generic start is not published, so here `answer_start` (an offset into the generation
region; negative counts from its end) defaults to 0 and `answer_length` (None = to the end of the
region) to None: the gap is averaged over the whole generation region, which stops once the whole
canvas is confidently predicted. Set e.g. `answer_start=0, answer_length=1` for a
multiple-choice answer, or `answer_start=203, answer_length=5` for the GSM8K layout.

Published defaults: thresholds (7.5, 5.0, 2.5) switching at 33% / 67% progress (per task, paper
Table 6: GSM8K/GPQA (8.0, 5.0, 3.5); HumanEval/MBPP (7.5, 5.0, 4.5)); base = LLaDA's
`low_confidence` with steps = gen_length (the paper also composes it with Fast-dLLM:
`base="threshold"`); gen_length 256, block_length 32.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .base import Sampler, check_number
from .registry import get
from dllm.kernels.scoring import TokenScores
from dllm.state import Decision, select_positions


def _numbers(name: str, value, count: int) -> list[float]:
    if isinstance(value, (list, tuple)) and len(value) == count:
        return [float(check_number(f"{name}[{i}]", v, sampler="prophet")) for i, v in enumerate(value)]
    raise ValueError(f"sampler 'prophet': {name} must be a list of {count} numbers, got {value!r}")


def gather_scores(scores: TokenScores, index: torch.Tensor) -> TokenScores:
    """The entries `index` (B, Q') of every statistic of `scores` (B, Q[, V])."""
    out = {}
    for f in dataclasses.fields(scores):
        t = getattr(scores, f.name)
        if t is None:
            out[f.name] = None
        elif t.dim() == 3:
            out[f.name] = t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))
        else:
            out[f.name] = t.gather(1, index)
    return TokenScores(**out)


class Prophet(Sampler):
    """Prophet: fill every remaining mask once the answer region's mean top-2 logit gap clears a staged threshold."""

    name = "prophet"

    def __init__(self, *, base: str | Sampler = "low_confidence", base_kwargs: dict[str, Any] | None = None,
                 thresholds=(7.5, 5.0, 2.5), switches=(0.33, 0.67), answer_start: int = 0,
                 answer_length: int | None = None):
        n = self.name
        if base_kwargs is not None and not isinstance(base_kwargs, dict):
            raise ValueError(f"sampler {n!r}: base_kwargs must be a dict, got {base_kwargs!r}")
        if isinstance(base, Sampler):
            if base_kwargs:
                raise ValueError(f"sampler {n!r}: base_kwargs are only used with a base sampler given by name")
            self.base = base
        elif isinstance(base, str):
            if base == n:
                raise ValueError(f"sampler {n!r}: the base sampler cannot be prophet itself")
            self.base = get(base, **(base_kwargs or {}))
        else:
            raise ValueError(f"sampler {n!r}: base must be a registered sampler name or a Sampler instance, "
                             f"got {base!r}")
        self.thresholds = _numbers("thresholds", thresholds, 3)
        self.switches = _numbers("switches", switches, 2)
        if not 0 <= self.switches[0] <= self.switches[1] <= 1:
            raise ValueError(f"sampler {n!r}: switches must satisfy 0 <= first <= second <= 1, got {switches!r}")
        check_number("answer_start", answer_start, integer=True, sampler=n)
        check_number("answer_length", answer_length, low=1, integer=True, allow_none=True, sampler=n)
        self.answer_start, self.answer_length = answer_start, answer_length
        # The wrapper decodes as its base does, except that it always uses `steps`: its progress is
        # the global step over the requested steps, whatever the base's schedule.
        b = self.base
        if b.shadow_block:
            raise ValueError(f"sampler {n!r}: base {b.name!r} runs shadow copies of its block, which a fill of "
                             f"every mask cannot take part in; use another base")
        if b.drafts:
            raise ValueError(f"sampler {n!r}: base {b.name!r} runs drafts beside the canvas, which a fill of every "
                             f"mask cannot take part in; use another base")
        self.uses_blocks, self.fixed_schedule, self.whole_blocks = b.uses_blocks, b.fixed_schedule, b.whole_blocks
        self.needs_logits, self.gumbel_candidates = b.needs_logits, b.gumbel_candidates
        self.rewrites_tokens, self.remasks, self.reaches_back = b.rewrites_tokens, b.remasks, b.reaches_back
        self.draws = b.draws
        self.score_fields = frozenset(b.score_fields) | {"logit_gap"}
        self._args = dict(base=b.name, base_kwargs=b.arguments(), thresholds=list(self.thresholds),
                          switches=list(self.switches), answer_start=answer_start, answer_length=answer_length)

    # -- answer region ---------------------------------------------------------------------------
    def answer_columns(self, state) -> tuple[int, int]:
        """[first, end) canvas columns of the answer region."""
        G = state.answer_length
        start = self.answer_start + (G if self.answer_start < 0 else 0)
        if not 0 <= start < G:
            raise ValueError(f"sampler {self.name!r}: answer_start {self.answer_start} lies outside the generation "
                             f"region of {G} tokens (allowed: {-G} .. {G - 1})")
        end = G if self.answer_length is None else min(start + self.answer_length, G)
        return state.gen_start + start, state.gen_start + end

    def threshold_at(self, state) -> float:
        p = (state.global_step + 1) / max(state.steps, 1)       # the published loop counts this step first
        hi, mid, lo = self.thresholds
        return hi if p < self.switches[0] else mid if p < self.switches[1] else lo

    # -- delegation ------------------------------------------------------------------------------
    def setup(self, state):
        self.answer_columns(state)  # validate against this request
        self.base.setup(state)

    def resolved_arguments(self, state):
        """Prophet resolves nothing of its own: what its base resolved goes in `base_kwargs`."""
        args = self.arguments()
        args["base_kwargs"] = self.base.resolved_arguments(state)
        return args

    def logits_needed(self, state):
        return self.base.logits_needed(state)

    def block_length_for(self, source):
        return self.base.block_length_for(source)

    def begin_block(self, state, rows):
        self.base.begin_block(state, rows)

    def begin_blocks(self, state, rows, opening):
        self.base.begin_blocks(state, rows, opening)

    def key_end(self, state, rows):
        return self.base.key_end(state, rows)

    def forward_allowance(self, state) -> int:
        return self.base.forward_allowance(state)

    @property
    def edits_logits(self) -> bool:
        return self.base.edits_logits

    def process_logits(self, state, rows, logits):
        return self.base.process_logits(state, rows, logits)

    def score_mask(self, state, rows):
        a0, a1 = self.answer_columns(state)
        cols = state.columns()
        region = (cols >= a0) & (cols < a1)
        every_mask = state.masked_in_generation(rows)
        return self.base.score_mask(state, rows) | every_mask | region[None, :]

    def step(self, state, rows, positions, valid, scores):
        a0, a1 = self.answer_columns(state)
        in_answer = valid & (positions >= a0) & (positions < a1)                         # (B', Q)
        gap = scores.logit_gap.double().masked_fill(~in_answer, 0).sum(1) / in_answer.sum(1).clamp(min=1)
        fill = in_answer.any(1) & (gap >= self.threshold_at(state))                      # (B',)

        # The base decides on the columns it asked for, compacted as the loop would hand them over.
        B, L = rows.shape[0], state.length
        scored = torch.zeros(B, L, dtype=torch.bool, device=valid.device)
        r_idx, q_idx = valid.nonzero(as_tuple=True)
        scored[r_idx, positions[r_idx, q_idx]] = True
        base_pos, base_valid = select_positions(self.base.score_mask(state, rows) & scored)   # (B', Q')
        q_of_col = torch.zeros(B, L, dtype=torch.long, device=valid.device)
        q_of_col[r_idx, positions[r_idx, q_idx]] = q_idx
        index = q_of_col.gather(1, base_pos)                                             # (B', Q') -> Q
        dec = self.base.step(state, rows, base_pos, base_valid, gather_scores(scores, index))

        # Back onto this step's columns; a row that fills takes the fill alone.
        br, bq = base_valid.nonzero(as_tuple=True)

        def on_columns(per_base: torch.Tensor, default: torch.Tensor) -> torch.Tensor:
            out = default.clone()
            out[br, index[br, bq]] = per_base[br, bq]
            return out

        commit = on_columns(dec.commit, torch.zeros_like(valid))
        tokens = None if dec.tokens is None else on_columns(dec.tokens, scores.token)
        if dec.fill_all is not None:
            fill = fill | dec.fill_all
        commit = torch.where(fill[:, None], valid, commit)
        if tokens is not None:
            tokens = torch.where(fill[:, None], scores.token, tokens)
        kept = lambda t: None if t is None else t & ~fill.view(-1, *[1] * (t.dim() - 1))   # noqa: E731
        edit = None if dec.edit is None else kept(on_columns(dec.edit, torch.zeros_like(valid)))
        return Decision(commit=commit, tokens=tokens, fill_all=fill, block_end=dec.block_end,
                        truncate_at=dec.truncate_at, edit=edit, hold=kept(dec.hold), remask=kept(dec.remask))
