"""LLaDA 2.0's block decoding (inclusionAI LLaDA2.0 `generate`; the model card's settings).

Blocks follow the model's attention blocks: `block_length` columns counted from the row's first
real token, so the first block is the one holding the prompt's tail (`DecodeState.aligned_blocks`).
Each block takes at most `steps` steps (at most gen_length, as the reference caps it). Step i of a block commits, among the block's masked
positions, every one whose confidence (the candidate's probability) exceeds `threshold`, and at
least the n_i most confident, n_i = block_length // steps plus one for the first
block_length % steps steps (LLaDA2's `get_num_transfer_tokens`), capped by the masks left. A step
past the schedule commits every mask left.

End of text, as the reference stops: when a block is complete and the generation so far holds an
EOS, the row stops after that block (the rest is thrown away, `Decision.truncate_at`). With
`eos_early_stop`, a row stops as soon as it commits an EOS with no mask left before its first EOS.

At temperature > 0 the candidate is drawn from softmax(logits / temperature) after top-k, then
top-p filtering, and its confidence is its probability there, as the reference's sampling computes
both (`dllm.samplers.sampling`); at temperature 0 it is the argmax and its plain probability.

Published defaults: threshold 0.95, block_length 32, steps 32 per block, temperature 0, no top-k
or top-p; the model card decodes with eos_early_stop.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number, top_k_mask
from .sampling import check_filters, check_temperature, sample_at, sample_filtered
from dllm.state import Decision


def written_canvas(state, rows, positions, write, token) -> torch.Tensor:
    """(B', L) the rows' canvas as this step's decision leaves it: `token` where `write` (B', Q)."""
    canvas = state.x[rows]
    return canvas.scatter(1, positions, torch.where(write, token, canvas.gather(1, positions)))


class _LLaDA2Sampling(Sampler):
    """LLaDA2's candidates: drawn by the sampler itself at temperature > 0 (module docstring)."""

    gumbel_candidates = False
    score_fields = frozenset({"prob"})

    def _check_filters(self, top_p, top_k) -> None:
        check_filters(self.name, top_p, top_k)
        self.top_p, self.top_k = top_p, top_k

    def logits_needed(self, state) -> bool:
        return state.temperature > 0

    def setup(self, state) -> None:
        check_temperature(self.name, state.temperature)

    def candidates(self, state, valid, scores) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(float64 confidence (B', Q), -inf off `valid`; the candidate tokens; the drawn tokens,
        None at temperature 0, where the candidates are the loop's)."""
        if state.temperature == 0:
            return scores.prob.double().masked_fill(~valid, float("-inf")), scores.token, None

        def draw(logits):
            _, conf, token = sample_filtered(logits.to(state.score_dtype), state.temperature, self.top_p,
                                             self.top_k, state.generator, top_k_first=True)
            return conf, token
        conf, token = sample_at(scores.logits, valid, draw, sampled=True)
        return conf.double(), token, token


class LLaDA2Block(_LLaDA2Sampling):
    """LLaDA2.0: per block step, every mask above the threshold and at least the schedule's count."""

    name = "llada2"
    uses_steps = False
    uses_blocks = True

    def __init__(self, *, threshold: float = 0.95, steps: int | None = None, eos_early_stop: bool = False,
                 top_p: float | None = None, top_k: int | None = None):
        check_number("threshold", threshold, low=0, high=1, sampler=self.name)
        check_number("steps", steps, low=1, integer=True, allow_none=True, sampler=self.name)
        if not isinstance(eos_early_stop, bool):
            raise ValueError(f"sampler {self.name!r}: eos_early_stop must be True or False, got {eos_early_stop!r}")
        self._check_filters(top_p, top_k)
        self.threshold, self.steps, self.eos_early_stop = float(threshold), steps, eos_early_stop
        self._args = dict(threshold=threshold, steps=steps, eos_early_stop=eos_early_stop, top_p=top_p, top_k=top_k)

    def setup(self, state) -> None:
        super().setup(state)
        if self.steps is not None and self.steps > state.block_length:
            raise ValueError(f"sampler {self.name!r}: steps {self.steps} per block exceeds block_length "
                             f"{state.block_length}")

    def counts(self, state, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(B',) the least number of commits of this step in each row's block."""
        steps = min(self.steps or state.block_length, state.answer_length)   # as the reference caps it
        base, extra = divmod(state.block_length, steps)
        step = state.step_in_block[rows]
        n = base + (step < extra).long()
        left = valid.sum(1)
        return torch.where(step >= steps, left, torch.minimum(n, left))

    def step(self, state, rows, positions, valid, scores):
        conf, token, drawn = self.candidates(state, valid, scores)                    # (B', Q)
        commit = (top_k_mask(conf, self.counts(state, rows, valid)) | (conf > self.threshold)) & valid
        return Decision(commit=commit, tokens=drawn,
                        truncate_at=self._stop(state, rows, positions, valid, commit, token))

    def _stop(self, state, rows, positions, valid, commit, token) -> torch.Tensor:
        """(B',) the last column each row keeps, -1 where it goes on (module docstring)."""
        canvas = written_canvas(state, rows, positions, commit, token)
        gen = canvas[:, state.gen_start:state.gen_end]                                 # (B', G) after this step
        eos = (gen == state.ids.eos) & state.writable(rows)[:, state.gen_start:state.gen_end]   # before row_end
        G = gen.shape[1]
        first = torch.where(eos.any(1), eos.int().argmax(1), torch.full_like(eos[:, 0], G, dtype=torch.long))
        keep_going = torch.full_like(first, -1)
        block_done = (valid & ~commit).sum(1) == 0
        cut = torch.where(block_done & eos.any(1), state.block_end[rows] - 1, keep_going)
        if self.eos_early_stop:
            before = torch.arange(G, device=gen.device)[None, :] < first[:, None]
            settled = ~(before & (gen == state.ids.mask)).any(1)
            fresh = (commit & (token == state.ids.eos)).any(1)
            cut = torch.where(fresh & settled & eos.any(1), state.gen_start + first, cut)
        return cut


class LLaDA21Edit(_LLaDA2Sampling):
    """LLaDA2.1: masks above `threshold` (at least one), and written block tokens replaced where the
    model prefers another one above `editing_threshold`; a full block stays open while edits go on."""

    name = "llada21"
    uses_steps = False
    rewrites_tokens = True
    uses_blocks = True

    def __init__(self, *, threshold: float = 0.95, editing_threshold: float = 0.9, max_post_steps: int = 16,
                 eos_early_stop: bool = False, top_p: float | None = None, top_k: int | None = None):
        check_number("threshold", threshold, low=0, high=1, sampler=self.name)
        check_number("editing_threshold", editing_threshold, low=0, high=1, sampler=self.name)
        check_number("max_post_steps", max_post_steps, low=0, integer=True, sampler=self.name)
        if not isinstance(eos_early_stop, bool):
            raise ValueError(f"sampler {self.name!r}: eos_early_stop must be True or False, got {eos_early_stop!r}")
        self._check_filters(top_p, top_k)
        self.threshold, self.editing_threshold = float(threshold), float(editing_threshold)
        self.max_post_steps, self.eos_early_stop = max_post_steps, eos_early_stop
        self._args = dict(threshold=threshold, editing_threshold=editing_threshold, max_post_steps=max_post_steps,
                          eos_early_stop=eos_early_stop, top_p=top_p, top_k=top_k)

    def forward_allowance(self, state) -> int:
        """max_post_steps per block (the first block may be a partial one)."""
        return (-(-state.gen_length // state.block_length) + 1) * self.max_post_steps

    def setup(self, state) -> None:
        super().setup(state)
        state.extra["post_steps"] = torch.zeros(state.batch_size, dtype=torch.long, device=state.x.device)

    def begin_blocks(self, state, rows, opening) -> None:
        post = state.extra["post_steps"]
        post[rows] = post[rows].masked_fill(opening, 0)

    def score_mask(self, state, rows):
        """Every generated column of the active block, written or masked."""
        cols = state.columns()[None, :]
        return state.in_block(rows) & (cols >= state.gen_start) & (cols < state.row_end[rows, None])

    def step(self, state, rows, positions, valid, scores):
        current = state.x[rows].gather(1, positions)
        masked = valid & (current == state.ids.mask)
        prob, token, drawn = self.candidates(state, valid, scores)                   # (B', Q)
        conf = prob.masked_fill(~masked, float("-inf"))
        commit = masked & ((conf > self.threshold) | top_k_mask(conf, masked.any(1).long()))
        written = valid & ~masked
        edit = written & (prob > self.editing_threshold) & (token != current)
        had_masks, edited = masked.any(1), edit.any(1)
        post = state.extra["post_steps"]
        # The reference goes on after a step that filled the block or edited it, for at most
        # max_post_steps steps without a mask; this step's commits may leave masks (then no hold).
        hold = (had_masks | edited) & (post[rows] < self.max_post_steps)
        post[rows] += (hold & ~(had_masks & (valid & ~commit & masked).any(1))).long()
        return Decision(commit=commit, edit=edit, hold=hold, tokens=drawn,
                        truncate_at=self._stop(state, rows, positions, commit | edit, token, hold, masked))

    def _stop(self, state, rows, positions, write, token, hold, masked) -> torch.Tensor:
        """With `eos_early_stop`, (B',) the block's last column where a finished block (no mask, not
        held) leaves an EOS in the generation up to it; -1 elsewhere."""
        keep_going = torch.full((len(rows),), -1, dtype=torch.long, device=state.x.device)
        if not self.eos_early_stop:
            return keep_going
        canvas = written_canvas(state, rows, positions, write, token)
        cols = state.columns()[None, :]
        upto = (cols >= state.gen_start) & (cols < state.block_end[rows, None])
        eos = (upto & (canvas == state.ids.eos)).any(1)
        done = ~(upto & (canvas == state.ids.mask)).any(1) & ~hold
        return torch.where(done & eos, state.block_end[rows] - 1, keep_going)
