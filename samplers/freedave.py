"""FreeDave, free draft-and-verification (arXiv:2510.00294; cychomatica/FreeDave, its decoding loop for
full-attention models and its evaluation settings).

Lossless parallel decoding: the tokens are those of `low_confidence` with one token per step (the
most confident mask of the active block each step, ties to the lower column), in fewer forwards, up
to rounding that depends on the batch (docs/fidelity.md §3: a near-tie of two confidences can fall
the other way when a canvas runs beside its drafts).

A forward gives the scores of the current canvas `d0`; ordering its block's masks by confidence
gives the drafts of the next forward: `d_k` is `d0` with its k most confident masks after the
first written (k = 1 .. drafts - 1), the tokens read from the same forward. After writing the
first, the next forward runs the canvas and its drafts as one batch (each draft a row of its own,
so it computes what a forward of that canvas alone computes). The one-token step of `d_k`
(its most confident mask) is checked against the draft's next token, in order: while the step of
`d_k` writes the token `d_{k+1}` adds, `d_{k+1}` is the canvas one-token decoding reaches. The
step commits the verified tokens of the longest such chain `d_b` and the one-token step of `d_b`,
and the next drafts come from `d_b`'s scores: between 1 and `drafts` tokens per forward, each
forward `drafts` canvases wide.

`commit_block_start=True` is its loop for AR-adapted models (Dream): a block's first forward
commits the block's first column, whatever its confidence, and nothing else, and the next forward's
drafts write the block's other masks in the order of that forward's confidences.

Confidences are the candidate's softmax probability in the request's `score_dtype`, as
`low_confidence` computes them (its `logits_eos_inf` and `confidence_eos_eot_inf` options apply;
FreeDave computes them in the logits' dtype: `score_dtype="logits"`).
With a storing cache policy the canvas and its drafts run with the canvas's recomputed columns
through copies of its stored K/V (the canvas's copy written back), so each draft reads what the
canvas reads: with `prefix` or `dual` (and no `refresh`, `guard` or `twins`) the tokens are those
of `low_confidence` one token per step with that cache; on Dream a row's drafts verify nothing while its block's first column is masked (the
column left of it is recomputed then, docs/samplers.md §25). Greedy only (temperature 0); no
classifier-free guidance. `steps` is not used. Published
settings (its evaluation scripts): drafts 4 (LLaDA; 8 for Dream and TraDo), block_length 32,
gen_length = steps (one token per step), temperature 0.
"""
from __future__ import annotations

import torch

from .base import check_number
from .llada import LowConfidence
from dllm.state import Decision

DRAFTS_MAX = 16


class FreeDave(LowConfidence):
    """FreeDave: low_confidence one token per step, several verified tokens per forward from batched drafts."""

    name = "freedave"
    fixed_schedule = False
    whole_blocks = False
    uses_steps = False
    drafts = True
    row_state = ("freedave_cols", "freedave_tokens", "freedave_count")

    def __init__(self, *, drafts: int = 4, commit_block_start: bool = False, logits_eos_inf: bool = False,
                 confidence_eos_eot_inf: bool = False):
        check_number("drafts", drafts, low=1, high=DRAFTS_MAX, integer=True, sampler=self.name)
        if not isinstance(commit_block_start, bool):
            raise ValueError(f"sampler {self.name!r}: commit_block_start must be true or false, got "
                             f"{commit_block_start!r}")
        super().__init__(logits_eos_inf=logits_eos_inf, confidence_eos_eot_inf=confidence_eos_eot_inf)
        self.draft_count, self.commit_block_start = int(drafts), commit_block_start
        self._args = dict(drafts=self.draft_count, commit_block_start=commit_block_start, **self._args)

    def setup(self, state) -> None:
        self.check_options(state)
        if state.temperature != 0:
            raise ValueError(f"sampler {self.name!r} decodes greedily and needs temperature 0, got {state.temperature}")
        B, D, dev = state.batch_size, self.draft_count - 1, state.x.device
        # the next drafts' columns (counted from the generation start), tokens, and how many are real
        state.extra["freedave_cols"] = torch.zeros(B, D, dtype=torch.long, device=dev)
        state.extra["freedave_tokens"] = torch.zeros(B, D, dtype=torch.long, device=dev)
        state.extra["freedave_count"] = torch.zeros(B, dtype=torch.long, device=dev)

    # Nothing is set up per block: drafts never cross one (a block ends once its masks are
    # written, drafts included), so a row opens each block without candidates.
    def begin_block(self, state, rows) -> None:
        pass

    def begin_blocks(self, state, rows, opening) -> None:
        pass

    def planned_widths(self, state):
        return None

    def draft_canvases(self, state, rows):
        """(B', drafts - 1, L): draft k (from 1) is the canvas with the first k stored candidates
        written; a row with fewer candidates repeats its last draft (its extra rows verify nothing)."""
        x = state.x[rows]                                                   # (B', L)
        cols, tokens = state.gen_start + state.extra["freedave_cols"][rows], state.extra["freedave_tokens"][rows]
        count = state.extra["freedave_count"][rows]
        B, L, D = x.shape[0], x.shape[1], self.draft_count - 1
        canvases = x[:, None, :].expand(B, D, L).clone()
        for j in range(D):
            value = torch.where(j < count, tokens[:, j], x.gather(1, cols[:, j:j + 1]).squeeze(1))
            index = cols[:, j, None, None].expand(B, D - j, 1)
            canvases[:, j:].scatter_(2, index, value[:, None, None].expand(B, D - j, 1))
        return canvases

    def drafting(self, state, rows):
        """Whether some row has a candidate to draft (a block's first forward has none)."""
        return (state.extra["freedave_count"][rows] > 0).any()

    def read_drafts(self, state, rows, scores, usable=None) -> None:
        """Kept for `step`."""
        state.extra["freedave_read"] = scores, usable

    def step(self, state, rows, positions, valid, scores):
        D = self.draft_count - 1
        conf, token, open_, usable = self._chain_scores(state, rows, positions, valid, scores)  # (B', D+1, Q)
        pick = conf.argmax(2)                                                             # first maximum
        has_pick = open_.any(2)
        pick_col, pick_token = positions.gather(1, pick), token.gather(2, pick[..., None]).squeeze(2)
        cols, tokens = state.gen_start + state.extra["freedave_cols"][rows], state.extra["freedave_tokens"][rows]
        within = _first(state.extra["freedave_count"][rows], D)
        verified = within & has_pick[:, :D] & (pick_col[:, :D] == cols) & (pick_token[:, :D] == tokens)
        if usable is not None:
            verified = verified & usable[:, None]
        best = verified.long().cumprod(1).sum(1)                                          # (B',) in [0, D]
        # the commits: the verified candidates, then the one-token step of the accepted draft
        at_candidate = (positions[:, :, None] == cols[:, None, :]) & _first(best, D)[:, None, :]   # (B', Q, D)
        at_pick = (torch.arange(positions.shape[1], device=pick.device)[None, :] == _at(pick, best)[:, None]) \
            & _at(has_pick, best)[:, None]
        candidate = at_candidate.any(2)
        out = torch.where(candidate, (at_candidate.long() * tokens[:, None, :]).sum(2), _row(token, best))
        kept_conf, kept_open, skip = _row(conf, best), _row(open_, best), torch.ones_like(best)
        if self.commit_block_start:     # a block's first forward commits its first column alone
            first = state.step_in_block[rows] == 0                                        # (B',): best is 0
            at_first = valid & (positions == state.block_start[rows, None])
            at_pick = torch.where(first[:, None], at_first, at_pick)
            kept_conf = torch.where(first[:, None], kept_conf.masked_fill(at_first, float("-inf")), kept_conf)
            kept_open = torch.where(first[:, None], kept_open & ~at_first, kept_open)
            skip = torch.where(first, 0, skip)
        self._keep_candidates(state, rows, positions, kept_conf, _row(token, best), kept_open, skip)
        return Decision(commit=(candidate | at_pick) & valid, tokens=out)

    def _chain_scores(self, state, rows, positions, valid, scores):
        """Confidences (-inf where closed), candidate tokens and open columns, each (B', drafts, Q):
        index 0 the canvas, index k its draft k, whose open columns are the canvas's masks but
        those it wrote; and the rows whose drafts are usable (`read_drafts`; None: all)."""
        D = self.draft_count - 1
        B, Q = positions.shape
        conf = self.scores_for(state, rows, positions, valid, scores).double()[:, None]
        token, open_ = scores.token[:, None], valid[:, None]
        read, usable = state.extra.pop("freedave_read", (None, None))
        if D and read is None:          # no drafts ran (no row had a candidate): none verifies
            conf, token, open_ = (t.expand(B, D + 1, Q) for t in (conf, token, open_))
            usable = torch.zeros_like(valid[:, 0])
        elif D:
            conf_d = self.scores_for(state, rows.repeat_interleave(D), positions.repeat_interleave(D, 0),
                                     valid.repeat_interleave(D, 0), read).double().view(B, D, Q)
            cols = state.gen_start + state.extra["freedave_cols"][rows]
            within = _first(state.extra["freedave_count"][rows], D)                     # (B', D): j < count
            upto = torch.ones(D, D, dtype=torch.bool, device=cols.device).tril()            # (k, j): j <= k
            written = ((positions[:, None, :, None] == cols[:, None, None, :])
                       & within[:, None, None, :] & upto[None, :, None, :]).any(3)         # (B', D, Q)
            conf = torch.cat([conf, conf_d], 1)
            token = torch.cat([token, read.token.view(B, D, Q)], 1)
            open_ = torch.cat([open_, valid[:, None] & ~written], 1)
        return conf.masked_fill(~open_, float("-inf")), token, open_, usable

    def _keep_candidates(self, state, rows, positions, conf, token, open_, skip) -> None:
        """The next forward's drafts: the accepted draft's open columns by confidence (ties to the
        lower column), after the `skip` (B',) first ones, which its step commits, with their tokens."""
        D = self.draft_count - 1
        if D == 0:
            return
        order = torch.sort(conf, dim=1, descending=True, stable=True).indices                  # (B', Q)
        order = order.gather(1, (skip[:, None] + torch.arange(D, device=skip.device)).clamp(max=order.shape[1] - 1))
        state.extra["freedave_cols"][rows] = positions.gather(1, order) - state.gen_start
        state.extra["freedave_tokens"][rows] = token.gather(1, order)
        state.extra["freedave_count"][rows] = (open_.sum(1) - skip).clamp(min=0, max=D)


def _first(count: torch.Tensor, n: int) -> torch.Tensor:
    """(B', n) bool: index j < count[b]."""
    return torch.arange(n, device=count.device)[None, :] < count[:, None]


def _at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b]] of a (B', K) tensor."""
    return values.gather(1, index[:, None]).squeeze(1)


def _row(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[b, index[b]] of a (B', K, Q) tensor: (B', Q)."""
    return values.gather(1, index[:, None, None].expand(-1, 1, values.shape[2])).squeeze(1)
