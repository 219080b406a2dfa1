"""FreeDave's draft-and-verify loop re-stated from the algorithm (cychomatica/FreeDave,
`block_decode_with_full_attention_FreeDave` with one token per step, temperature 0, no early exit,
no eager acceptance, the drafts forwarded one at a time as its debug mode does), as the oracle for
dllm's `freedave` sampler (docs/samplers.md §25).

Batch 1, no KV cache, blocks from the end of the prompt (the last one may be shorter). Each block
opens with a forward of the canvas. Then, while the block holds more than one mask: the drafts
`d_k` (k = 0 .. K-1, K = min(drafts, masks)) write the k + 1 most confident masks of the last
scores into the canvas (ties to the lower column, where `torch.topk` leaves the order open); one
round of forwards (counted as one batched forward) scores every draft; the target `t_k` writes the
most confident mask of `d_k`'s own scores into `d_k`; the accepted draft is found by the subset
rule (start at 0; repeatedly move to the last `j` after the current one whose written tokens all
appear in the current one's target; stop when nothing moves); the canvas becomes the accepted draft
and its scores the last scores. A block with one mask left takes the best of the last scores
without a forward. With `commit_block_start` (its loop for AR-adapted models, Dream) the block's
first column takes its candidate from the block's opening forward, and the first round's drafts are
the canvas itself and the canvas with its k most confident masks written (k = 1 .. K-1). (For a
block of two columns that loop stops with one mask left; here a round of drafts scores it, as the
one-token step of the canvas needs the canvas's own scores.) `logits_fn(x, None)` gives the logits aligned with the
canvas columns, the mask token's at its dtype's lowest value.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .dinfer_ref import canvas_and_blocks
from .samplers_ref import LogitsFn

__all__ = ["freedave_ref"]


def _scores(logits_fn: LogitsFn, x: Tensor, start: int, end: int, mask_id: int, dtype) -> tuple[Tensor, Tensor]:
    """(tokens, confidences) over the block's columns of canvas x (1, L): argmax and its softmax
    probability in `dtype`, -inf on columns already written."""
    logits = logits_fn(x, None)[0, start:end]
    tokens = logits.argmax(-1)
    conf = F.softmax(logits.to(dtype), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, torch.where(x[0, start:end] == mask_id, conf, -torch.inf)


def _write_top(x: Tensor, start: int, tokens: Tensor, conf: Tensor, n: int) -> Tensor:
    """x with its n most confident block masks written."""
    out = x.clone()
    order = torch.sort(conf, descending=True, stable=True).indices[:n]
    out[0, start + order] = tokens[order]
    return out


def _accepted(drafts: list[Tensor], targets: list[Tensor], mask_id: int) -> int:
    best = 0
    while best < len(drafts) - 1:
        ref = best
        for j in range(best + 1, len(drafts)):
            written = drafts[j] != mask_id
            if bool((drafts[j][written] == targets[ref][written]).all()):
                best = j
        if best == ref:
            break
    return best


@torch.no_grad()
def freedave_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
                 drafts: int, dtype: torch.dtype = torch.float64,
                 commit_block_start: bool = False) -> tuple[Tensor, int]:
    x, blocks = canvas_and_blocks(prompt, gen_length, block_length, mask_id)
    forwards = 0
    for start, end in blocks:
        tokens, conf = _scores(logits_fn, x, start, end, mask_id, dtype)
        forwards += 1
        opening = commit_block_start
        if opening:
            x = x.clone()
            x[0, start] = tokens[0]
            conf[0] = -torch.inf
        while True:
            masks = int((x[0, start:end] == mask_id).sum())
            if masks == 0 or (masks == 1 and not opening):
                x = _write_top(x, start, tokens, conf, masks)
                break
            written = range(min(drafts, masks)) if opening else range(1, min(drafts, masks) + 1)
            canvases = [_write_top(x, start, tokens, conf, k) for k in written]
            opening = False
            scored = [_scores(logits_fn, d, start, end, mask_id, dtype) for d in canvases]
            forwards += 1
            targets = [_write_top(d, start, t, c, 1) for d, (t, c) in zip(canvases, scored)]
            best = _accepted(canvases, targets, mask_id)
            x, (tokens, conf) = canvases[best], scored[best]
            if not bool((x[0, start:end] == mask_id).any()):
                break
    return x, forwards
