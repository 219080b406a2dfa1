"""Token scoring: from logits at the positions a sampler asked for, the candidate token and the
statistics parallel-decoding rules read (its probability, top-2 margin, entropy, raw top-2 logit
gap).

`token_scores_ref` is the plain torch reference, used on every device until a fused kernel is
registered for CUDA. It materialises the softmax of only the asked-for positions, in `score_dtype`
(float32 by default; float64 for the Fast-dLLM-style float64 confidence).

Temperature > 0 picks the candidate by Gumbel-max in float64 as the LLaDA reference does:
argmax(exp(l) / (-log u)^T), computed in the equivalent log form argmax(l - T log(-log u)) so large
logits cannot overflow. The confidence is read from the un-tempered distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenScores:
    """Per-position statistics, each (B, Q) unless noted.

    token:     candidate token (argmax, or the Gumbel-max sample at temperature > 0)
    prob:      softmax probability of `token` (un-tempered)
    margin:    top-1 minus top-2 probability
    entropy:   entropy of the softmax, in nats
    logit_gap: raw top-1 minus top-2 logit
    logits:    (B, Q, V) the aligned logits, only when asked for
    """

    token: torch.Tensor
    prob: torch.Tensor
    margin: torch.Tensor
    entropy: torch.Tensor
    logit_gap: torch.Tensor
    logits: torch.Tensor | None = None


def check_finite(logits: torch.Tensor) -> None:
    """NaN or +inf logits stop the run (-inf is a legitimate suppressed token)."""
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        bad = torch.isnan(logits) | torch.isposinf(logits)
        where = bad.nonzero()[0].tolist()
        raise FloatingPointError(f"model produced NaN/inf logits (first at index {where}); check the dtype "
                                 f"(float16 can overflow) and the checkpoint weights")


def token_scores_ref(logits: torch.Tensor, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                     score_dtype: torch.dtype = torch.float32, keep_logits: bool = False) -> TokenScores:
    """Reference scoring. logits: (B, Q, V) in any float dtype."""
    check_finite(logits)
    lf = logits.to(score_dtype)                                           # (B, Q, V)
    probs = torch.softmax(lf, dim=-1)                                     # (B, Q, V)
    if temperature > 0:
        u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
        token = (logits.double() - temperature * torch.log(-torch.log(u))).argmax(-1)  # (B, Q)
    else:
        token = lf.argmax(-1)                                             # first maximum on ties
    prob = probs.gather(-1, token[..., None]).squeeze(-1)                # (B, Q)
    top_p = probs.topk(2, dim=-1).values if probs.shape[-1] > 1 else torch.cat([probs, probs * 0], -1)
    top_l = lf.topk(2, dim=-1).values if lf.shape[-1] > 1 else torch.cat([lf, lf], -1)
    entropy = torch.special.entr(probs).sum(-1)                           # -sum p log p, 0 log 0 = 0
    return TokenScores(token=token, prob=prob, margin=top_p[..., 0] - top_p[..., 1], entropy=entropy,
                       logit_gap=top_l[..., 0] - top_l[..., 1], logits=logits if keep_logits else None)


def token_scores(logits: torch.Tensor, **kwargs) -> TokenScores:
    """Score `logits` (B, Q, V) with the fastest available implementation (currently the reference)."""
    return token_scores_ref(logits, **kwargs)
