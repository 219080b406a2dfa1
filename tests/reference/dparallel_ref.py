"""dParallel's entropy-threshold loops re-stated from the algorithm (czg1225/dParallel: `generate` of
`LLaDA/generate.py` with a threshold, and `_sample` of `Dream/model/generation_utils_semiar.py` with
alg "entropy_threshold"), as oracles for dllm's `dparallel` and `dream_dparallel` samplers
(docs/samplers.md §24).

Batch 1, no KV cache, blocks from the end of the prompt (the last one may be shorter), the block loop
of `dinfer_ref.py`. Every step runs the model over the whole canvas and looks at the masked columns
of the active block: it sorts them by entropy (ascending; ties to the lower column, where
`torch.topk` leaves the order open), commits the first, and every other one below the threshold
(LLaDA: `H <= threshold`, as the reference drops `H > threshold`; Dream: `H < threshold`), until the
block holds no mask (checked after each forward). `logits_fn(x, None)` gives the logits aligned with the canvas columns, the
mask token's at its dtype's lowest value (dllm's convention).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .dinfer_ref import block_loop
from .samplers_ref import LogitsFn

__all__ = ["dparallel_ref", "dream_dparallel_ref", "entropy_pick"]


def entropy_pick(entropy: Tensor, masked: Tensor, threshold: float, strict: bool) -> Tensor:
    """(K,) bool over the block's columns: the lowest-entropy mask and every other mask below the threshold."""
    order = torch.sort(torch.where(masked, entropy, torch.inf), stable=True).indices[: int(masked.sum())]
    chosen = torch.zeros_like(masked)
    chosen[order[0]] = True
    for k in order[1:].tolist():
        chosen[k] = bool(entropy[k] < threshold) if strict else not bool(entropy[k] > threshold)
    return chosen


@torch.no_grad()
def dparallel_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
                  threshold: float, dtype: torch.dtype = torch.float64, temperature: float = 0.0,
                  generator: torch.Generator | None = None) -> tuple[Tensor, int]:
    """dParallel's LLaDA loop: entropy -sum p log(p + 1e-12) of a softmax in `dtype`; the candidate the
    argmax of the logits, or at temperature > 0 the Gumbel-max argmax(l - T log(-log u)) with u drawn
    as (masks, V) float64 uniforms at the block's masked columns in order (the reference draws over
    the whole canvas: the same distribution, another stream)."""
    def step(logits, masked, first):
        p = F.softmax(logits.to(dtype), dim=-1)
        entropy = -torch.sum(p * torch.log(p + 1e-12), dim=-1)
        tokens = logits.argmax(-1)
        if temperature > 0:
            u = torch.rand((int(masked.sum()), logits.shape[-1]), dtype=torch.float64, generator=generator)
            tokens[masked] = (logits[masked].double() - temperature * torch.log(-torch.log(u))).argmax(-1)
        return tokens, entropy_pick(entropy, masked, threshold, strict=False)

    return block_loop(logits_fn, prompt, gen_length, block_length, mask_id, step)


@torch.no_grad()
def dream_dparallel_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
                        threshold: float, temperature: float = 0.0,
                        generator: torch.Generator | None = None) -> tuple[Tensor, int]:
    """dParallel's Dream loop: entropy -sum p log(p + 1e-8) in the logits' dtype; the candidate the
    argmax of the logits, or at temperature > 0 a multinomial draw from softmax(logits / T) at the
    block's masked columns in order."""
    def step(logits, masked, first):
        p = F.softmax(logits, dim=-1)
        entropy = -torch.sum(p * torch.log(p + 1e-8), dim=-1)
        tokens = logits.argmax(-1)
        if temperature > 0:
            probs = F.softmax(logits[masked] / temperature, dim=-1)
            tokens[masked] = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
        return tokens, entropy_pick(entropy, masked, threshold, strict=True)

    return block_loop(logits_fn, prompt, gen_length, block_length, mask_id, step)
