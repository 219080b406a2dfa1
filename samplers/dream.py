"""Dream's reference samplers (Dream's `diffusion_generate`; arXiv:2508.15487).

No blocks: every masked position of the generation region is a candidate at every step. Steps use
the timesteps t_i = linspace(1, eps, steps + 1) (float32). At step i (t = t_i, s = t_{i+1}):

* `origin`: each masked position is revealed with probability 1 - s/t (1 at the last step), with
  a token sampled from its distribution (argmax at temperature 0). The count is random, maybe 0.
* `maskgit_plus` / `topk_margin` / `entropy`: commit k = int(n * (1 - s/t)) positions (all the
  rest at the last step), n = masked count, chosen by the highest confidence: the candidate's
  probability, the top-1 minus top-2 probability, or the negative entropy sum p log(p + 1e-10).
  With alg_temp > 0 the k positions are drawn without replacement from softmax(confidence / alg_temp).

The candidate distribution is softmax(logits / temperature) after top-p and top-k filtering, in the
logits dtype; confidences are read from it, as the reference does. The reference computes k from
the batch-averaged mask count; rows of one request always hold equal counts, so k is per row here
(identical for the reference's inputs, and it keeps rows independent). With steps = gen_length the
first step commits nothing, as in the reference.
Published defaults: steps 512, eps 1e-3, alg origin (generation_config), temperature 0; Dream's
README example: alg entropy, temperature 0.2, top_p 0.95, alg_temp 0.
"""
from __future__ import annotations

import struct

import torch

from .base import Sampler, check_number, steps_per_block, sum_p_log_p, top_k_mask
from .sampling import check_filters, check_temperature, sample_at, sample_filtered
from .threshold import FASTDLLM_DREAM_BLOCK_LENGTH
from dllm.state import Decision


# The smallest positive alg_temp whose division keeps the confidences (at most 1) finite, and the
# largest alg_temp (a larger one is a uniform draw anyway).
MIN_ALG_TEMP = 1e-4
MAX_ALG_TEMP = 1e4


def _f32(value: float) -> float:
    """`value` rounded to float32: one float32 operation, done in float64 and rounded, gives the
    float32 result (float64 holds every product of two float32 exactly, and its quotients round
    to the same float32)."""
    return struct.unpack("f", struct.pack("f", value))[0]


class _DreamBase(Sampler):
    uses_blocks = False
    fixed_schedule = True
    needs_logits = True
    gumbel_candidates = False
    score_fields = frozenset()   # confidences come from the logits, as Dream's sample_tokens computes them

    def __init__(self, *, eps: float = 1e-3, top_p: float | None = None, top_k: int | None = None,
                 alg_temp: float | None = None):
        n = self.name
        check_number("eps", eps, low=0, high=1, low_open=True, sampler=n)
        if eps >= 1:
            raise ValueError(f"sampler {n!r}: eps must lie in (0, 1), got {eps!r}")
        check_filters(n, top_p, top_k)
        check_number("alg_temp", alg_temp, low=0, high=MAX_ALG_TEMP, allow_none=True, sampler=n)
        if alg_temp and alg_temp < MIN_ALG_TEMP:
            raise ValueError(f"sampler {n!r}: alg_temp must be 0 (no draw) or >= {MIN_ALG_TEMP} (smaller ones "
                             f"overflow confidence / alg_temp), got {alg_temp!r}")
        self.eps, self.top_p, self.top_k, self.alg_temp = eps, top_p, top_k, alg_temp
        if alg_temp:
            self.row_state = None   # the draw over the batch decides which positions a row commits
            self.draws = True
        self._args = dict(eps=eps, top_p=top_p, top_k=top_k, alg_temp=alg_temp)

    def setup(self, state):
        check_temperature(self.name, state.temperature)
        state.extra["timesteps"] = torch.linspace(1, self.eps, state.steps + 1, device=state.x.device)

    def score_mask(self, state, rows):
        return state.masked_in_generation(rows)

    def _sample(self, state, logits):
        """(confidence, token) of each row of logits (N, V), following the reference's sample_tokens."""
        probs, conf, token = sample_filtered(logits, state.temperature, self.top_p, self.top_k, state.generator)
        return self.confidence(probs, conf), token

    def _sample_at(self, state, logits, valid):
        """(confidence, token) (B', Q) at the valid positions of logits (B', Q, V) (`sample_at`)."""
        return sample_at(logits, valid, lambda flat: self._sample(state, flat), sampled=state.temperature > 0)

    def confidence(self, probs, conf):
        return conf

    def planned_widths(self, state):
        """The masks left at each step: a step commits k = int(n * (1 - s/t)) of the n left, a
        count that depends on n alone, worked out here in the float32 arithmetic of `step` on the
        request's own timesteps (read once). `origin` reveals a random number and has no plan;
        with alg_temp the draw itself reads the device, so it has none either."""
        if type(self).step is not _DreamBase.step or self.alg_temp:
            return None
        ts = state.extra["timesteps"].tolist()                # float32 values, read once
        n, widths = state.gen_length, []
        for i in range(state.steps):
            widths.append(n)
            if i < state.steps - 1:
                n -= int(_f32(float(n) * _f32(1.0 - _f32(ts[i + 1] / ts[i]))))
        return widths

    def _times(self, state, rows):
        i = state.step_in_block[rows]
        ts = state.extra["timesteps"]
        last = i >= state.steps - 1
        i = i.clamp(max=state.steps - 1)
        return ts[i], ts[i + 1], last

    def step(self, state, rows, positions, valid, scores):
        t, s, last = self._times(state, rows)
        conf, tokens = self._sample_at(state, scores.logits, valid)
        n = valid.sum(1)                                                       # (B',)
        k = (n.float() * (1 - s / t)).long()                                   # float32 as the reference
        k = torch.where(last, n, k)
        if not self.alg_temp:
            commit = top_k_mask(conf, k)
        else:
            commit = self._draw_positions(state, positions, valid, conf, k)
        return Decision(commit=commit & valid, tokens=tokens)

    def _draw_positions(self, state, positions, valid, conf, k):
        """k positions per row drawn without replacement from softmax(confidence / alg_temp).

        The draw spans the whole canvas row (zero weight off the masked positions) in one call,
        as the reference makes it, so a seeded run draws the reference's random stream."""
        full = torch.full((valid.shape[0], state.length), float("-inf"), dtype=conf.dtype, device=conf.device)
        r_idx, q_idx = valid.nonzero(as_tuple=True)
        full[r_idx, positions[r_idx, q_idx]] = conf[r_idx, q_idx]
        weights = torch.softmax(full / self.alg_temp, dim=-1)  # (B', L)
        picked = torch.zeros_like(full, dtype=torch.bool)
        if bool((k == k[0]).all()):
            if int(k[0]) > 0:
                idx = torch.multinomial(weights, int(k[0]), replacement=False, generator=state.generator)
                picked.scatter_(1, idx, True)
        else:  # rows of one request hold equal mask counts; differing ones draw row by row
            for r in range(valid.shape[0]):
                if k[r] > 0:
                    idx = torch.multinomial(weights[r], int(k[r]), replacement=False, generator=state.generator)
                    picked[r, idx] = True
        return picked.gather(1, positions)


class Origin(_DreamBase):
    """Dream `origin`: reveal each masked position with probability 1 - s/t."""

    name = "origin"
    draws = True

    def __init__(self, *, eps: float = 1e-3, top_p: float | None = None, top_k: int | None = None):
        super().__init__(eps=eps, top_p=top_p, top_k=top_k)
        self._args.pop("alg_temp")

    def step(self, state, rows, positions, valid, scores):
        t, s, last = self._times(state, rows)
        p = torch.where(last, torch.ones_like(t), 1 - s / t)                    # (B',)
        p_flat = p[:, None].expand_as(valid)[valid]
        reveal = torch.rand(p_flat.shape, generator=state.generator, device=valid.device) < p_flat   # (N,)
        tokens = torch.zeros(valid.shape, dtype=torch.long, device=valid.device)
        flat_tokens = torch.zeros(p_flat.shape, dtype=torch.long, device=valid.device)
        if reveal.any():
            flat_tokens[reveal] = self._sample(state, scores.logits[valid][reveal])[1]
        commit = torch.zeros_like(valid)
        commit[valid] = reveal
        tokens[valid] = flat_tokens
        return Decision(commit=commit, tokens=tokens)


class MaskGitPlus(_DreamBase):
    """Dream `maskgit_plus`: commit the k masked positions whose candidate is most probable."""

    name = "maskgit_plus"
    row_state = ()


class TopKMargin(_DreamBase):
    """Dream `topk_margin`: commit the k masked positions with the largest top-1 minus top-2 probability."""

    name = "topk_margin"
    row_state = ()

    def confidence(self, probs, conf):
        top2 = probs.topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1]


class Entropy(_DreamBase):
    """Dream `entropy`: commit the k masked positions with the lowest entropy."""

    name = "entropy"
    row_state = ()

    def confidence(self, probs, conf):
        return sum_p_log_p(probs, 1e-10)


class BlockEntropy(Entropy):
    """Fast-dLLM's block-wise Dream loop (`generation_utils_block.py`, its cached runs with an
    algorithm other than confidence_threshold, which it scores by negative entropy): per block, a
    step that writes the block's first position, then Dream's entropy schedule over the block."""

    name = "block_entropy"
    uses_blocks = True
    whole_blocks = True

    score_mask = Sampler.score_mask      # the masked positions of the active block

    def __init__(self, *, eps: float = 1e-3, top_p: float | None = None, top_k: int | None = None):
        super().__init__(eps=eps, top_p=top_p, top_k=top_k)
        self._args.pop("alg_temp")

    def block_length_for(self, source):
        """Blocks of 32 when the request gives no block length, as Fast-dLLM's loop."""
        return FASTDLLM_DREAM_BLOCK_LENGTH

    def setup(self, state):
        check_temperature(self.name, state.temperature)
        per_block = steps_per_block(self.name, state, at_least=2)
        state.extra["steps_per_block"] = per_block
        state.extra["timesteps"] = torch.linspace(1, self.eps, per_block + 1, device=state.x.device)

    def _times(self, state, rows):
        """(t, s, last) of the rows' steps j >= 1 of their blocks: (t_j, t_{j+1}) of the block's
        timesteps, the last one at j = steps_per_block - 1."""
        per_block = state.extra["steps_per_block"]
        j = state.step_in_block[rows].clamp(min=1, max=per_block - 1)
        ts = state.extra["timesteps"]
        return ts[j], ts[j + 1], j >= per_block - 1

    def step(self, state, rows, positions, valid, scores):
        conf, tokens = self._sample_at(state, scores.logits, valid)
        t, s, last = self._times(state, rows)
        n = valid.sum(1)                                                       # (B',) masks left in the block
        k = torch.where(last, n, (n.float() * (1 - s / t)).long())            # float32 as the reference
        opening = (state.step_in_block[rows] == 0)[:, None]                    # (B', 1)
        commit = torch.where(opening, positions == state.block_start[rows, None], top_k_mask(conf, k))
        return Decision(commit=commit & valid, tokens=tokens)
