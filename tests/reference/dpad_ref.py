"""DPad's decoding loops (suffix dropout), re-stated as plain loops: the oracle for dllm's
`suffix_dropout`.

Source: Crys-Chen/DPad ``llada/generate_dropout.py`` (``generate``, ``generate_with_prefix_cache``,
``generate_with_dual_cache``, ``suffix_dropout``); docs/suffix-dropout.md. Batch size 1, no padding,
temperature 0. For each block [s, e):

1. Draw the kept suffix: offsets d of the columns e + d after the block (`kept(b, L - e)`, the
   block's index b and how many columns follow it). The pruned canvas is the columns [0, e) and the
   kept ones, in order; every forward of the block runs on it, each column at its own rotary
   position.
2. No cache: every step forwards the whole pruned canvas.
   Prefix: the block's first forward runs the pruned canvas and keeps the K/V of the columns < s;
   each later step forwards the pruned columns from s on (the block and the kept suffix) against them.
   Dual: the block's first forward keeps every pruned column's K/V; each later step forwards the
   block alone, replacing its K/V, and attends over the whole pruned store.
3. Commit within the block (`commit_ref`: Fast-dLLM's threshold rule, or LLaDA's fixed counts
   over `steps` for the whole generation); the block ends when it holds no mask.

Dream (`logit_shift`, no cache only): the hidden state of the pruned column before a column
predicts it; every block column's left neighbour is in [0, e), so it is the canvas column before.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tests.reference.cache_ref import canvas_ref, commit_ref, counts_ref, forward_ref

__all__ = ["dpad_generate_ref"]


@torch.no_grad()
def dpad_generate_ref(model, prompt: list[int], kept, *, gen_length: int, block_length: int, mode: str = "none",
                      threshold: float | None = None, steps: int | None = None) -> tuple[Tensor, int]:
    """DPad's generation of one prompt. kept(b, remaining) -> the kept offsets (list of ints) of
    block b. mode: "none", "prefix" or "dual". threshold: the confidence threshold (None: fixed
    counts over `steps`). Returns (the canvas (1, Lp + gen_length), forwards)."""
    assert mode in ("none", "prefix", "dual") and gen_length % block_length == 0
    cfg = model.config
    assert mode == "none" or not cfg.logit_shift
    mask_id = cfg.mask_token_id
    x, blocks, per_block = canvas_ref(prompt, gen_length, block_length, mask_id, None if threshold is not None else steps)
    L = x.shape[1]
    nfe = 0
    for b, (s, e) in enumerate(blocks):
        cols = torch.tensor(list(range(e)) + [e + d for d in kept(b, L - e)], dtype=torch.long)
        counts = None if per_block is None else counts_ref(int((x[0, s:e] == mask_id).sum()), per_block)
        kv, i = None, 0
        while bool((x[0, s:e] == mask_id).any()):
            count = None if counts is None else counts[min(i, len(counts) - 1)]
            if mode == "none" or kv is None:
                raw, kv = forward_ref(model, x[:, cols], 0, None, "full", positions=cols)
                if mode == "prefix":
                    kv = [[k[:, :, :s], v[:, :, :s]] for k, v in kv]
                logits, at = raw[0], cols
                if cfg.logit_shift:
                    logits = torch.cat([logits[:1], logits[:-1]])
            elif mode == "prefix":
                raw, _ = forward_ref(model, x[:, cols[s:]], s, kv, "prefix", positions=cols[s:])
                logits, at = raw[0], cols[s:]
            else:
                raw, _ = forward_ref(model, x[:, s:e], s, kv, "dual")
                logits, at = raw[0], torch.arange(s, e)
            nfe += 1
            commit_ref(x, logits, at, (s, e), mask_id, threshold, count)
            i += 1
    return x, nfe
