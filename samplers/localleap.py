"""LocalLeap: local-determinism leap (arXiv:2510.07081, Kong et al.; the authors' LocalLeap
`llada/generate.py`, built on Fast-dLLM).

Principle: the neighbours of a high-confidence anchor are already consistent with the final output
at a moderate confidence (local determinism propagation), within a bounded radius (progressive
spatial consistency decay; the reference uses a flat relaxed threshold inside it).

Each step, over the masked positions of the active block (confidence c = the un-tempered
probability of the candidate):
1. the most confident one commits unconditionally (ties: lowest position);
2. anchors = those with c >= kappa (current predictions, not committed tokens);
3. if tau is set and an anchor exists: N = union of [a - radius, a + radius] over anchors a
   (absolute columns); every other candidate commits iff c >= tau inside N, c >= kappa outside.
   Otherwise the plain Fast-dLLM threshold rule with kappa.
The block is stepped until it holds no mask.

Published defaults (paper/demo): kappa 0.9, tau 0.75, radius 4, block_length 32, temperature 0
(function defaults: kappa and tau off). dlmserve uses kappa 0.5, tau 0.75 for LLaDA-1.5: a tau above
kappa tightens instead, every anchor lying within its own radius. The reference's
optional EOS early stop is not part of this sampler. Confidences are in the request's
`score_dtype` (the reference: float64) and compared with kappa and tau in that dtype, as
`threshold` compares.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Sampler, check_number
from .threshold import masked_confidence, rounded_to, top1
from dllm.state import Decision


def near_anchor(anchor: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, length: int,
                radius: int) -> torch.Tensor:
    """(B, Q) bool: entries within `radius` columns of an anchor of their row.

    anchor/valid (B, Q) bool, positions (B, Q) columns; the anchors are scattered onto the canvas
    (B, L) and dilated by a 1-D max-pool of width 2 * radius + 1."""
    B = anchor.shape[0]
    canvas = torch.zeros(B, length, dtype=torch.float32, device=anchor.device)          # (B, L)
    r_idx, q_idx = (anchor & valid).nonzero(as_tuple=True)
    canvas[r_idx, positions[r_idx, q_idx]] = 1.0
    radius = min(radius, canvas.shape[-1])      # a wider window covers the same columns
    dilated = F.max_pool1d(canvas[:, None, :], kernel_size=2 * radius + 1, stride=1, padding=radius)[:, 0]  # (B, L)
    return dilated.gather(1, positions) > 0


class LocalLeap(Sampler):
    """LocalLeap: anchors at confidence >= kappa; within `radius` of an anchor the threshold relaxes to tau."""

    name = "localleap"
    uses_steps = False
    row_state = ()
    uses_blocks = True
    score_fields = frozenset({"prob"})

    def __init__(self, *, kappa: float = 0.9, tau: float | None = 0.75, radius: int = 4):
        n = self.name
        check_number("kappa", kappa, low=0, high=1, sampler=n)
        check_number("tau", tau, low=0, high=1, allow_none=True, sampler=n)
        check_number("radius", radius, low=0, integer=True, sampler=n)
        self.kappa, self.tau, self.radius = float(kappa), (None if tau is None else float(tau)), radius
        self._args = dict(kappa=kappa, tau=tau, radius=radius)

    def step(self, state, rows, positions, valid, scores):
        conf = masked_confidence(scores, valid)                                  # (B', Q)
        kappa = rounded_to(self.kappa, scores.prob.dtype)
        anchor = valid & (conf >= kappa)
        threshold = torch.full_like(conf, kappa)
        if self.tau is not None:
            near = near_anchor(anchor, positions, valid, state.length, self.radius)
            threshold = threshold.masked_fill(near, rounded_to(self.tau, scores.prob.dtype))
        return Decision(commit=top1(conf, valid) | (valid & (conf >= threshold)))
