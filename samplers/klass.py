"""KLASS, KL-adaptive stability sampling (arXiv:2511.05664; shkim0116/KLASS `stable_confident_decode`
with alg "klass" and unmask strategy "all").

LLaDA's schedule (`low_confidence`, docs/samplers.md §2) with an early exit per position. Every
forward scores every masked position of the generation region, in float64: p its softmax, and
KL(p || p_prev) = sum p (log(p + 1e-12) - log(p_prev + 1e-12)) against the same position's p of
the forward before (zeros before the first forward, so the first KL is large). A masked position
of the active block is *ready* when its last `kl_history_length` KL values are all below
`kl_threshold` (checked from step `kl_history_length` - 1 of the block on), and its candidate's
probability is above `conf_threshold` (both strict). A step commits every ready position; when
none is, it commits the schedule's count of the most confident ones (ties to the lower position).
The KL history runs on across blocks, as in the reference.

Where the reference would leave a block with masks after its steps (ready steps that committed
fewer than the schedule's count), the block goes on at the last step's count until it is full.
At temperature > 0 the candidate is the loop's Gumbel-max sample and p stays un-tempered.
Published defaults: conf_threshold 0.9, kl_threshold 0.01, kl_history_length 2 (the code and
ParallelBench); the scripts use gen_length 256, block_length 64, steps 256, temperature 0.

`dream_klass` (`DreamKLASS`) is KLASS's Dream loop (`src/model/dream_klass.py`, alg "klass"): no
blocks and no schedule; every ready mask (KL history below kl_threshold, p(x0) >= conf_threshold)
commits, else the single mask most probable under Dream's `sample_tokens`, with its argmax token.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number, column_index, top_k_mask
from .llada import LowConfidence
from .sampling import check_filters, check_temperature, filtered_draw, sample_at
from .threshold import top1
from dllm.state import Decision


def set_klass_arguments(sampler, conf_threshold, kl_threshold, kl_history_length) -> None:
    """Check KLASS's three arguments, naming `sampler`, and set them and its `_args`."""
    n = sampler.name
    check_number("conf_threshold", conf_threshold, low=0, high=1, sampler=n)
    check_number("kl_threshold", kl_threshold, low=0, sampler=n)
    check_number("kl_history_length", kl_history_length, low=1, integer=True, sampler=n)
    sampler.conf_threshold, sampler.kl_threshold = float(conf_threshold), float(kl_threshold)
    sampler.history = kl_history_length
    sampler._args = dict(conf_threshold=conf_threshold, kl_threshold=kl_threshold,
                         kl_history_length=kl_history_length)


def forget_kl_history(state) -> None:
    """Drop a request's KL state (`kl_history` builds it at the first step)."""
    state.extra.pop("klass_prev", None)
    state.extra.pop("klass_history", None)


def kl_history(state, rows, positions, valid, p: torch.Tensor, length: int) -> torch.Tensor:
    """Append KL(p || p_prev) of the scored columns (B', Q) to their history of `length` values
    and store p (B', Q, V, float64) as their p_prev (zeros before the first step); returns the
    (B', Q, H) history at the scored columns."""
    if "klass_prev" not in state.extra:   # one spare column (G) takes the writes of padding entries
        B, G = state.batch_size, state.gen_length
        state.extra["klass_prev"] = p.new_zeros(B, G + 1, p.shape[-1])
        # a history longer than the canvas never settles (a row has fewer steps): keep at most G
        state.extra["klass_history"] = p.new_zeros(B, G + 1, min(length, G))
    at, cols = column_index(rows, positions, valid, state.gen_start, state.gen_length)   # (B', Q)
    prev_all, hist_all = state.extra["klass_prev"], state.extra["klass_history"]
    prev = prev_all[at, cols]                                                       # (B', Q, V)
    kl = (p * (torch.log(p + 1e-12) - torch.log(prev + 1e-12))).sum(-1)
    hist = torch.cat([hist_all[at, cols][..., 1:], kl[..., None]], dim=-1)          # (B', Q, H)
    prev_all[at, cols] = p
    hist_all[at, cols] = hist
    return hist


class KLASS(LowConfidence):
    """KLASS: every confident mask whose distribution has settled (KL), else the schedule's top-k."""

    name = "klass"
    fixed_schedule = False
    needs_logits = True
    row_state = None     # its KL state is sized by the vocabulary at the first forward

    def __init__(self, *, conf_threshold: float = 0.9, kl_threshold: float = 0.01, kl_history_length: int = 2):
        super().__init__()
        set_klass_arguments(self, conf_threshold, kl_threshold, kl_history_length)

    def setup(self, state) -> None:
        super().setup(state)
        forget_kl_history(state)

    def planned_widths(self, state):
        return None

    def score_mask(self, state, rows):
        """Every masked column of the generation region: their KL history runs across blocks."""
        return state.masked_in_generation(rows)

    def step(self, state, rows, positions, valid, scores):
        p = torch.softmax(scores.logits.double(), dim=-1)                                 # (B', Q, V)
        hist = kl_history(state, rows, positions, valid, p, self.history)
        conf = p.gather(-1, scores.token[..., None]).squeeze(-1)                          # (B', Q)
        in_block = valid & (positions >= state.block_start[rows, None]) & (positions < state.block_end[rows, None])
        settled = (state.step_in_block[rows] >= self.history - 1)[:, None]
        ready = in_block & settled & (hist < self.kl_threshold).all(-1) & (conf > self.conf_threshold)
        k = self.step_counts(state, rows)                                                  # (B',)
        fallback = top_k_mask(conf.masked_fill(~in_block, float("-inf")), k) & in_block
        return Decision(commit=torch.where(ready.any(1, keepdim=True), ready, fallback))


class DreamKLASS(Sampler):
    """KLASS's Dream loop: every confident mask whose distribution has settled, else the single
    most confident one."""

    name = "dream_klass"
    uses_blocks = False
    uses_steps = False
    needs_logits = True
    gumbel_candidates = False
    score_fields = frozenset()     # the tokens and confidences come from the logits, as the reference's
    row_state = None               # its KL state is sized by the vocabulary at the first forward

    def __init__(self, *, conf_threshold: float = 0.9, kl_threshold: float = 0.01, kl_history_length: int = 2,
                 top_p: float | None = None, top_k: int | None = None):
        check_filters(self.name, top_p, top_k)
        set_klass_arguments(self, conf_threshold, kl_threshold, kl_history_length)
        self.top_p, self.top_k = top_p, top_k
        self._args.update(top_p=top_p, top_k=top_k)

    def setup(self, state) -> None:
        check_temperature(self.name, state.temperature)
        forget_kl_history(state)

    def score_mask(self, state, rows):
        return state.masked_in_generation(rows)

    def step(self, state, rows, positions, valid, scores):
        logits = scores.logits                                                            # (B', Q, V)
        tokens = torch.softmax(logits, dim=-1).argmax(-1)                                 # in the logits dtype
        p = torch.softmax(logits.double(), dim=-1)
        hist = kl_history(state, rows, positions, valid, p, self.history)
        conf = p.gather(-1, tokens[..., None]).squeeze(-1)                                # (B', Q)
        ready = valid & (hist < self.kl_threshold).all(-1) & (conf >= self.conf_threshold)
        draw = filtered_draw(state, self.top_p, self.top_k)
        fallback_conf, _ = sample_at(logits, valid, draw, sampled=state.temperature > 0)
        fallback = top1(fallback_conf.double(), valid)
        return Decision(commit=torch.where(ready.any(1, keepdim=True), ready, fallback), tokens=tokens)
