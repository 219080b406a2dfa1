"""dInfer's parallel decoders (inclusionAI dInfer, arXiv:2510.08666; `dinfer/decoding/parallel_strategy.py`).

`hierarchy` (`HierarchyDecoder`): semi-autoregressive blocks, no per-step count. The masked
positions of the active block fall into runs of adjacent masks; each step commits, in every run,
the position(s) of the run's highest confidence when it is above `low_tau`, every masked position
above `tau`, and always the block's most confident mask (the lowest position on ties). Runs apart
from each other are decoded in parallel, neighbours one at a time. A confidence is the exp of the
candidate's log-softmax, as dInfer computes it, in the request's `score_dtype` (dInfer: the logits'
dtype, `score_dtype="logits"`, the default; in bfloat16 it rounds otherwise than a softmax and ties
often), compared strictly with the thresholds rounded to that dtype.
tau or low_tau None drops its test. Published settings: tau 0.9 and low_tau 0.3 (the benchmark
scripts' defaults; its evaluation guide runs 0.92 and 0.62), block_length 64, temperature 0.

`credit` (`CreditThresholdParallelDecoder`, CreditDecoding): dInfer's threshold rule on logits
fused with a per-block credit. Each step, for every masked position of the active block, the
credit of its top-1 token under the step's softmax (float32) grows by that probability to the
power `boost_gamma`, after all the block's credits decayed by `decay_beta`; the credits restart
at zero when a block opens. The step reads the fused logits l + credit_alpha * log(1 + credit):
the candidate is their argmax (their Gumbel-max sample at temperature > 0) and its confidence
its probability under their softmax (float32, float64 when the request's score_dtype is), and
it commits every masked position whose confidence is >= min(tau, c_max - 1e-5), c_max the
block's highest (so the most confident always commits, with any within 1e-5 of it).
credit_alpha 0 is dInfer's plain `ThresholdParallelDecoder`. It keeps a (rows, block_length,
vocab) float32 credit: 32 rows of LLaDA (vocabulary 126,464) at block 64 hold 1 GiB.
Published defaults: tau 0.9, credit_alpha 0.7, boost_gamma 0.2, decay_beta 0.8 (the decoder's
own; the scripts set only tau), block_length 64, temperature 0.

dllm suppresses the mask token's logit before every sampler (docs/samplers.md §1); dInfer keeps it
and leaves a position whose candidate is the mask token masked. Neither decoder carries state
across blocks and each reads only its own row, so rows of either can join a running batch.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number, column_index
from .threshold import rounded_to, top1
from dllm.kernels.scoring import token_scores
from dllm.state import Decision

# How far below the block's highest confidence dInfer's threshold rule still commits.
NEAR_MAX = 1e-5


def mask_runs(positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B', Q) long: the index of the run of adjacent scored columns each valid entry belongs to
    (0, 1, ... in column order), the scored columns in increasing order; padding entries get Q."""
    Q = positions.shape[1]
    follows = torch.zeros_like(valid)
    follows[:, 1:] = valid[:, :-1] & (positions[:, 1:] == positions[:, :-1] + 1)
    starts = valid & ~follows
    return torch.where(valid, starts.long().cumsum(1) - 1, Q)


def run_maxima(conf: torch.Tensor, runs: torch.Tensor) -> torch.Tensor:
    """(B', Q): the highest `conf` of each entry's run (`mask_runs`), -inf on padding entries."""
    B, Q = conf.shape
    best = conf.new_full((B, Q + 1), float("-inf"))
    best = best.scatter_reduce(1, runs, conf, reduce="amax", include_self=True)
    best[:, Q] = float("-inf")
    return best.gather(1, runs)


class Hierarchy(Sampler):
    """dInfer hierarchy: the most confident mask of every run of adjacent masks, above a floor."""

    name = "hierarchy"
    uses_steps = False
    row_state = ()
    uses_blocks = True
    needs_logits = True        # its confidence is exp(log_softmax), as dInfer computes it
    score_fields = frozenset()

    def __init__(self, *, tau: float | None = 0.9, low_tau: float | None = 0.3):
        check_number("tau", tau, low=0, high=1, allow_none=True, sampler=self.name)
        check_number("low_tau", low_tau, low=0, high=1, allow_none=True, sampler=self.name)
        self.tau, self.low_tau = tau, low_tau
        self._args = dict(tau=tau, low_tau=low_tau)

    def step(self, state, rows, positions, valid, scores):
        log_probs = torch.log_softmax(scores.logits.to(state.score_dtype), dim=-1)       # (B', Q, V)
        conf = log_probs.gather(-1, scores.token[..., None]).squeeze(-1).exp()
        conf = conf.masked_fill(~valid, float("-inf"))                                  # (B', Q)
        runs = mask_runs(positions, valid)
        commit = valid & (conf == run_maxima(conf, runs))
        if self.low_tau is not None:
            commit &= conf > rounded_to(self.low_tau, conf.dtype)
        if self.tau is not None:
            commit |= valid & (conf > rounded_to(self.tau, conf.dtype))
        return Decision(commit=commit | top1(conf, valid))


class Credit(Sampler):
    """dInfer CreditDecoding: the threshold rule on logits raised by each position's decaying credit."""

    name = "credit"
    uses_steps = False
    row_state = ("credit",)
    uses_blocks = True
    needs_logits = True
    gumbel_candidates = False  # it draws its candidate from the fused logits
    score_fields = frozenset()

    def __init__(self, *, tau: float = 0.9, credit_alpha: float = 0.7, boost_gamma: float = 0.2,
                 decay_beta: float = 0.8):
        check_number("tau", tau, low=0, high=1, sampler=self.name)
        check_number("credit_alpha", credit_alpha, low=0, sampler=self.name)
        check_number("boost_gamma", boost_gamma, low=0, sampler=self.name)
        check_number("decay_beta", decay_beta, low=0, high=1, sampler=self.name)
        self.tau, self.alpha = float(tau), float(credit_alpha)
        self.gamma, self.beta = float(boost_gamma), float(decay_beta)
        self._args = dict(tau=tau, credit_alpha=credit_alpha, boost_gamma=boost_gamma, decay_beta=decay_beta)

    def setup(self, state) -> None:
        state.extra.pop("credit", None)

    def step(self, state, rows, positions, valid, scores):
        logits = scores.logits                                                          # (B', Q, V)
        if self.alpha:
            fused = self.updated_credit(state, rows, positions, valid, logits)          # float32, in place:
            fused = fused.add_(1).log_().mul_(self.alpha).add_(logits)                  # log1p rounds otherwise
        else:
            fused = logits.float()
        score_dtype = torch.promote_types(torch.float32, state.score_dtype)
        fused_scores = token_scores(fused, temperature=state.temperature, generator=state.generator,
                                    score_dtype=score_dtype, fields={"prob"}, check_finite=False,  # the loop checks
                                    impl="torch" if score_dtype == torch.float64 else None)        # (kernel: fp32)
        conf = fused_scores.prob.masked_fill(~valid, float("-inf"))
        floor = (conf.max(1, keepdim=True).values - NEAR_MAX).clamp(-1000, rounded_to(self.tau, conf.dtype))
        return Decision(commit=valid & (conf >= floor), tokens=fused_scores.token)

    def updated_credit(self, state, rows, positions, valid, logits: torch.Tensor) -> torch.Tensor:
        """The (B', Q, V) float32 credit of the scored columns after this step's decay and boost,
        stored by column of the block (zero at a block's first step); a copy the caller may reuse."""
        if "credit" not in state.extra:     # one spare column (K) takes the writes of padding entries
            K = state.block_length
            state.extra["credit"] = logits.new_zeros(state.batch_size, K + 1, logits.shape[-1], dtype=torch.float32)
        store = state.extra["credit"]
        at, cols = column_index(rows, positions, valid, state.block_start[rows, None], store.shape[1] - 1)
        opening = (state.step_in_block[rows] == 0)[:, None, None]
        credit = store[at, cols].masked_fill_(opening, 0.0).mul_(self.beta)             # (B', Q, V)
        top_prob, top_token = torch.softmax(logits.float(), dim=-1).max(-1)             # (B', Q)
        credit.scatter_add_(-1, top_token[..., None], top_prob.pow(self.gamma)[..., None])
        store[at, cols] = credit
        return credit
