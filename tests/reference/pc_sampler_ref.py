"""PC-Sampler's loop re-stated from the algorithm (NEUIR/PC-Sampler `src/generate.py`,
`generate_with_pc_sampler`), the oracle for dllm's `pc_sampler` (docs/samplers.md §26).

Batch 1, no KV cache, LLaDA's blocks and per-step counts (`llada_transfer_counts`). Every step runs
the model over the whole canvas; the candidate is the argmax of the logits (Gumbel-max in float64 at
temperature > 0, (masks, V) float64 uniforms at the block's masked columns in order: the reference
draws over the whole canvas, the same distribution, another stream) and p its softmax probability
under the raw logits in `dtype`. Over the active block's columns (offset d from its first column):
score = exp(-lambd * d) * min(alpha, -p * log(f[x] + 1e-9)) with f the float32 frequency table
(`frequency=None`: score = exp(-lambd * d) * p); the block's masked columns with the k highest
scores are committed, ties to the lower column (`torch.topk` leaves their order open).
`logits_fn(x, None)` gives the logits aligned with the canvas columns.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .samplers_ref import LogitsFn, counted_block_loop

__all__ = ["pc_sampler_ref"]


@torch.no_grad()
def pc_sampler_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, steps: int,
                   mask_id: int, lambd: float, alpha: float, frequency: Tensor | None,
                   dtype: torch.dtype = torch.float32, temperature: float = 0.0,
                   generator: torch.Generator | None = None, weighting: str = "exponential") -> tuple[Tensor, int]:
    """(canvas (1, Lp + gen_length), forwards). `weighting="linear"`: the linear-position baseline
    (`generate_with_linear_position`): every block column's calibrated confidence (a written column
    with its own token and the probability of its argmax), min-max normalised over the block (the
    spread at least 1e-9), mixed as (1 - lambd) * normalised + lambd * (K - d) / K."""
    def commit(logits, x, start, end, k):
        logits = logits[start:end]                                                         # (K, V)
        masked = x[start:end] == mask_id
        x0 = logits.argmax(-1)                                                            # (K,)
        if temperature > 0:
            u = torch.rand((int(masked.sum()), logits.shape[-1]), dtype=torch.float64, generator=generator)
            x0[masked] = (logits[masked].double() - temperature * torch.log(-torch.log(u))).argmax(-1)
        p = F.softmax(logits.to(dtype), dim=-1).gather(-1, x0[:, None])[:, 0]
        tokens = torch.where(masked, x0, x[start:end])
        if frequency is not None:
            p = torch.clamp(-p * torch.log(frequency[tokens] + 1e-9), max=alpha)
        d = torch.arange(end - start, dtype=torch.float32)
        if weighting == "linear":
            spread = (p.max() - p.min()).clamp(min=1e-9)
            score = (1 - lambd) * (p - p.min()) / spread + lambd * (end - start - d) / (end - start)
        else:
            score = torch.exp(-lambd * d) * p
        score = torch.where(masked, score, -torch.inf)
        chosen = torch.sort(score.double(), descending=True, stable=True).indices[:k]
        x[start + chosen] = x0[chosen]

    return counted_block_loop(logits_fn, prompt, gen_length, block_length, steps, mask_id, commit)
