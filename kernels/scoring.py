"""Token scoring: from logits at the positions a sampler asked for, the candidate token and the
statistics parallel-decoding rules read (its probability, top-2 margin, entropy, raw top-2 logit
gap).

`token_scores_ref` is the plain torch reference, used on every device until a fused kernel is
registered for CUDA. It materialises the softmax of only the asked-for positions, in `score_dtype`
(float32 by default; float64 for the Fast-dLLM-style float64 confidence), and computes the
optional statistics only when a sampler asks for them.

Temperature > 0 picks the candidate by Gumbel-max in float64 as the LLaDA reference does:
argmax(exp(l) / (-log u)^T), computed in the equivalent log form argmax(l - T log(-log u)) so large
logits cannot overflow. The confidence is read from the un-tempered distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

OPTIONAL_FIELDS = frozenset({"prob", "margin", "entropy", "logit_gap"})


@dataclass
class TokenScores:
    """Per-position statistics, each (B, Q); optional ones are None unless asked for.

    token:     candidate token (argmax, first maximum on ties; or the Gumbel-max sample)
    prob:      softmax probability of `token` (un-tempered)
    margin:    top-1 minus top-2 probability
    entropy:   entropy of the softmax, in nats
    logit_gap: raw top-1 minus top-2 logit
    logits:    (B, Q, V) the aligned logits, only when asked for
    """

    token: torch.Tensor
    prob: torch.Tensor | None = None
    margin: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    logit_gap: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def _raise_not_finite(top: torch.Tensor) -> None:
    bad = (~torch.isfinite(top)).nonzero()[0].tolist()
    raise FloatingPointError(f"model produced NaN/inf logits (first bad position {bad}, or every logit -inf); "
                             f"check the dtype (float16 can overflow) and the checkpoint weights")


def token_scores_ref(logits: torch.Tensor, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                     score_dtype: torch.dtype = torch.float32, fields=OPTIONAL_FIELDS,
                     keep_logits: bool = False) -> TokenScores:
    """Reference scoring. logits: (B, Q, V) in any float dtype; -inf marks a suppressed token.

    fields: which statistics besides the token to compute ("prob", "margin", "entropy", "logit_gap");
        the softmax is materialised only when one of them needs it.
    NaN or +inf logits (or a position whose every logit is -inf) raise FloatingPointError.
    """
    fields = frozenset(fields)
    unknown = fields - OPTIONAL_FIELDS
    if unknown:
        raise ValueError(f"unknown score field(s) {sorted(unknown)}; valid: {sorted(OPTIONAL_FIELDS)}")
    lf = logits.to(score_dtype)                                           # (B, Q, V)
    top1, argmax = lf.max(dim=-1)                                         # NaN propagates into top1
    if lf.numel() and not bool(torch.isfinite(top1).all()):
        _raise_not_finite(top1)
    if temperature > 0:
        u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
        token = (logits.double() - temperature * torch.log(-torch.log(u))).argmax(-1)  # (B, Q)
    else:
        token = argmax                                                    # first maximum on ties
    out = TokenScores(token=token, logits=logits if keep_logits else None)
    probs = torch.softmax(lf, dim=-1) if fields & {"prob", "margin", "entropy"} else None  # (B, Q, V)
    if "prob" in fields:
        out.prob = probs.gather(-1, token[..., None]).squeeze(-1)
    if "margin" in fields:
        top_p = probs.topk(min(2, probs.shape[-1]), dim=-1).values
        out.margin = top_p[..., 0] - (top_p[..., 1] if top_p.shape[-1] > 1 else 0)
    if "logit_gap" in fields:
        top_l = lf.topk(min(2, lf.shape[-1]), dim=-1).values
        out.logit_gap = top_l[..., 0] - (top_l[..., 1] if top_l.shape[-1] > 1 else top_l[..., 0])
    if "entropy" in fields:
        out.entropy = torch.special.entr(probs).sum(-1)                   # -sum p log p, 0 log 0 = 0
    return out


def token_scores(logits: torch.Tensor, **kwargs) -> TokenScores:
    """Score `logits` (B, Q, V) with the fastest available implementation (currently the reference)."""
    return token_scores_ref(logits, **kwargs)
