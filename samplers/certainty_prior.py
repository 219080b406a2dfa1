"""d2Cache's certainty-prior decoding (arXiv:2509.23094, "d2Cache: Accelerating Diffusion-Based LLMs
via Dual Adaptive Caching"; Kamichanw/d2Cache, Apache-2.0: `generate_step` and `confidence_unmasking`
of `src/generation/vanilla.py`, `certainty_density` of `src/utils/common.py`).

LLaDA's schedule (`low_confidence`, docs/samplers.md §2) with a score that prefers masks next to
decoded text. Over the G columns of the generation region, with m(j) = 1 where column j holds a token
(the region's columns j in [0, G)), m(j) = 1 left of the region (the prompt) and, right of it, m(j) =
m(G - 1) (decoded when the region's last column is), the certainty density of column i is

    density(i) = sum_{j = -G}^{2G - 1} m(j) w(i - j) / sum_{d = -3G}^{3G - 1} w(d),   w(d) = exp(-d^2 / (2 sigma^2))

and a masked position's score is its confidence c (the un-tempered probability of its candidate)
times density(i): the order runs roughly left to right, from the prompt on, without committing the
end of the answer early. Each step commits, among the block's masks, those with the highest scores:
LLaDA's count for the step (`steps` / `tokens_per_step`), or with `threshold` every mask whose score
reaches it and at least that count (d2Cache's threshold rule on the weighted scores).

The density is computed in float64 as a convolution over the columns within 39 sigma (beyond them every
term is 0 in float64; d2Cache convolves in float32 with FFTs: the same sums up to rounding); c is in the
request's `score_dtype`. Ties go to the lower position.

Published settings (d2Cache's `d2cache` configuration): sigma 10, one token per step, blocks of 32,
temperature 0; `threshold` off.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import check_number, top_k_mask
from .llada import LowConfidence
from dllm.state import Decision


# sigma's range: its square and the kernel's sums stay finite and non-zero in float64.
MIN_SIGMA, MAX_SIGMA = 1e-6, 1e6
# exp(-x) is 0 in float64 for x > 745: kernel terms farther than this many sigmas add exactly 0.
REACH_IN_SIGMAS = 39


def density_kernel(length: int, sigma: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(kernel w(d) for d = -R .. R, the normaliser sum_{d=-3G}^{3G-1} w(d)) as float64 tensors on
    `device` (nothing read back), R = min(3G, 39 sigma) (beyond it every w(d) is 0 in float64)."""
    reach = min(3 * length, math.ceil(REACH_IN_SIGMAS * sigma))
    w = lambda d: torch.exp(-d ** 2 / (2 * sigma ** 2))          # noqa: E731
    kernel = w(torch.arange(-reach, reach + 1, dtype=torch.float64, device=device))
    norm = w(torch.arange(-3 * length, 3 * length, dtype=torch.float64, device=device)).sum()
    return kernel, norm


def certainty_density(decoded: torch.Tensor, kernel: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """(B, G) bool decoded columns of the generation region -> (B, G) float64 density: the extended
    mask (B, 3G) convolved with the kernel, read at the region's columns, over the normaliser."""
    B, G = decoded.shape
    reach = (kernel.shape[0] - 1) // 2
    m = decoded.to(torch.float64)
    extended = torch.cat([m.new_ones(B, G), m, m[:, -1:].expand(B, G)], dim=1)      # (B, 3G): j = -G .. 2G-1
    window = F.pad(extended, (reach, reach))[:, G:2 * G + 2 * reach]                # j = i - R .. i + R per i
    return F.conv1d(window[:, None], kernel.flip(0)[None, None])[:, 0] / norm


class CertaintyPrior(LowConfidence):
    """d2Cache: LLaDA's schedule, positions by confidence times the density of decoded columns nearby."""

    name = "certainty_prior"
    row_state = ("counts",)

    def __init__(self, *, sigma: float = 10.0, threshold: float | None = None):
        super().__init__()
        check_number("sigma", sigma, low=MIN_SIGMA, high=MAX_SIGMA, sampler=self.name)
        check_number("threshold", threshold, low=0, high=1, allow_none=True, sampler=self.name)
        self.sigma = float(sigma)
        self.threshold = None if threshold is None else float(threshold)
        self._args = dict(sigma=sigma, threshold=threshold)

    def setup(self, state):
        super().setup(state)
        state.extra["density_kernel"] = density_kernel(state.gen_length, self.sigma, state.x.device)

    def planned_widths(self, state):
        """LLaDA's widths when every step commits its count; a threshold may commit more."""
        return None if self.threshold is not None else super().planned_widths(state)

    def scores_for(self, state, rows, positions, valid, scores):
        region = state.x[rows, state.gen_start:state.gen_start + state.gen_length]           # (B', G)
        density = certainty_density(region != state.ids.mask, *state.extra["density_kernel"])
        column = (positions - state.gen_start).clamp(0, state.gen_length - 1)
        return scores.prob * density.gather(1, column)

    def step(self, state, rows, positions, valid, scores):
        score = self.scores_for(state, rows, positions, valid, scores).double().masked_fill(~valid, float("-inf"))
        commit = top_k_mask(score, self.step_counts(state, rows)) & valid
        if self.threshold is not None:
            commit |= valid & (score >= self.threshold)
        return Decision(commit=commit)
