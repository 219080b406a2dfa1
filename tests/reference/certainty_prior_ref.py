"""d2Cache's certainty-prior decoding re-stated (Kamichanw/d2Cache: `generate_step` and
`confidence_unmasking` of `src/generation/vanilla.py`, `certainty_density` of `src/utils/common.py`),
the oracle for dllm's `certainty_prior` (docs/samplers.md §27).

* `density_sum_ref`: the density written out as Python sums, one column at a time.
* `density_fft_ref`: the density as d2Cache computes it: the region's decoded mask padded to 3G
  columns (G ones on the left; on the right G copies of the region's last entry), convolved with the
  Gaussian kernel by FFTs over 6G points, divided by the kernel's sum over all 6G offsets (float64
  here).
* `certainty_prior_ref`: batch 1, no KV cache, LLaDA's blocks and per-step counts; every step runs
  the model over the whole canvas; a block mask's score is the softmax probability of its argmax
  candidate (in `dtype`) times the density of its column; the step commits the k highest scores (ties
  to the lower column, where `torch.topk` leaves the order open), or with a threshold every score
  >= threshold when there are at least k of them, else the k highest; a block is left once it holds no
  mask (with a threshold, before its steps run out).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .samplers_ref import LogitsFn, counted_block_loop

__all__ = ["certainty_prior_ref", "density_fft_ref", "density_sum_ref"]


def density_sum_ref(decoded: list[bool], sigma: float) -> list[float]:
    G = len(decoded)
    w = lambda d: math.exp(-d * d / (2 * sigma * sigma))              # noqa: E731
    norm = sum(w(d) for d in range(-3 * G, 3 * G))

    def m(j):
        if j < 0:
            return 1.0
        if j >= G:
            return float(decoded[-1])
        return float(decoded[j])
    return [sum(m(j) * w(i - j) for j in range(-G, 2 * G)) / norm for i in range(G)]


def density_fft_ref(decoded: Tensor, sigma: float) -> Tensor:
    """(B, G) bool -> (B, G) float64."""
    B, G = decoded.shape
    padded = F.pad(decoded.double(), (G, G), value=1.0)
    padded[~decoded[:, -1], 2 * G:] = 0.0
    n = 6 * G
    dist = torch.cat([torch.arange(3 * G), torch.arange(-3 * G, 0)]).double()
    kernel = torch.fft.fft(torch.exp(-dist ** 2 / (2 * sigma ** 2)), n=n)
    weighted = torch.fft.ifft(torch.fft.fft(F.pad(padded, (0, 3 * G)), n=n) * kernel, n=n).real
    total = torch.fft.ifft(torch.fft.fft(torch.ones(B, n, dtype=torch.float64), n=n) * kernel, n=n).real
    return weighted[:, G:2 * G] / total[:, G:2 * G]


@torch.no_grad()
def certainty_prior_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, steps: int,
                        mask_id: int, sigma: float, threshold: float | None = None,
                        dtype: torch.dtype = torch.float32) -> tuple[Tensor, int]:
    """(canvas (1, Lp + gen_length), forwards)."""
    Lp = prompt.shape[1]

    def commit(logits, x, start, end, k):
        x0 = logits.argmax(-1)
        p = F.softmax(logits.to(dtype), dim=-1).gather(-1, x0[:, None])[:, 0]
        density = torch.tensor(density_sum_ref((x[Lp:] != mask_id).tolist(), sigma), dtype=torch.float64)
        columns = torch.arange(x.shape[0])
        masked = (x == mask_id) & (columns >= start) & (columns < end)
        score = torch.full((x.shape[0],), -torch.inf, dtype=torch.float64)
        score[masked] = p[masked].double() * density[masked[Lp:]]
        chosen = torch.sort(score, descending=True, stable=True).indices[:min(k, int(masked.sum()))]
        if threshold is not None and int((score >= threshold).sum()) >= k:
            chosen = (score >= threshold).nonzero()[:, 0]
        x[chosen] = x0[chosen]

    return counted_block_loop(logits_fn, prompt, gen_length, block_length, steps, mask_id, commit)
