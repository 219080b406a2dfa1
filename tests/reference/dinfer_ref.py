"""dInfer's block-wise decoding loop with its hierarchy and credit decoders, re-stated from the
algorithm (inclusionAI dInfer, `BlockWiseDiffusionLLM` with `HierarchyDecoder` or
`CreditThresholdParallelDecoder`), as oracles for dllm's `hierarchy` and `credit` samplers
(docs/samplers.md §23).

Batch 1, no KV cache, no early stop at EOS, blocks from the end of the prompt. Every iteration runs
the model over the whole canvas and hands the active block's logits to the decoder, until the block
holds no mask. The mask token's logit is at its dtype's lowest value (dllm's convention). At
temperature > 0 (credit only) the candidate is a Gumbel-max sample of the fused logits drawn from
`generator` at the block's masked columns, in column order, one (masks, V) float64 draw per step:
dllm draws where it scores (dInfer draws at every block column).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .samplers_ref import LogitsFn

__all__ = ["block_loop", "canvas_and_blocks", "credit_ref", "hierarchy_ref"]


def _hierarchy_pick(logits: Tensor, masked: Tensor, tau: float | None, low_tau: float | None) -> tuple[Tensor, Tensor]:
    """(tokens, chosen) over the K block columns of one row: in each run of adjacent masks, its most
    confident column(s) when above low_tau; any mask above tau; always the first most confident."""
    tokens = logits.argmax(-1)
    conf = F.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1).exp()
    conf = torch.where(masked, conf, torch.finfo(conf.dtype).min)
    chosen = torch.zeros_like(masked)
    k = 0
    while k < len(masked):
        if not masked[k]:
            k += 1
            continue
        end = k
        while end < len(masked) and masked[end]:
            end += 1
        best = conf[k:end].max()
        for j in range(k, end):
            if conf[j] == best and (low_tau is None or conf[j] > low_tau):
                chosen[j] = True
        k = end
    if tau is not None:
        chosen |= masked & (conf > tau)
    chosen[int(conf.argmax())] = True
    return tokens, chosen & masked


def _credit_pick(logits: Tensor, masked: Tensor, credit: Tensor, tau: float, alpha: float, gamma: float,
                 beta: float, first: bool, temperature: float, generator) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens, chosen, credit) over the K block columns of one row, `credit` (K, V) float32."""
    if not first:
        credit = credit * beta
    probs = F.softmax(logits.float(), dim=-1)
    top_prob, top_token = probs.max(-1)
    for j in range(len(masked)):
        if masked[j]:
            credit[j, top_token[j]] += top_prob[j] ** gamma
    fused = logits + alpha * torch.log(credit + 1)
    if temperature > 0:
        idx = masked.nonzero().squeeze(1)
        u = torch.rand((len(idx), fused.shape[-1]), dtype=torch.float64, generator=generator)
        tokens = fused.argmax(-1)
        tokens[idx] = (fused[idx].double().exp() / (-torch.log(u)) ** temperature).argmax(-1)
    else:
        tokens = fused.argmax(-1)
    conf = F.softmax(fused.float(), dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    conf = torch.where(masked, conf, -torch.inf)
    floor = (conf.max() - 1e-5).clamp(-1000, tau)            # float32, as the decoder computes it
    return tokens, masked & (conf >= floor), credit


def canvas_and_blocks(prompt: Tensor, gen_length: int, block_length: int, mask_id: int):
    """The canvas (1, P + gen_length) of one prompt, its answer masked, and its blocks' (start, end)
    from the end of the prompt (the last one may be shorter)."""
    assert prompt.shape[0] == 1
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    return x, [(start, min(start + block_length, P + gen_length)) for start in range(P, P + gen_length, block_length)]


def block_loop(logits_fn: LogitsFn, prompt: Tensor, gen_length: int, block_length: int, mask_id: int, pick):
    """Run `pick(block_logits, masked, first_step) -> (tokens, chosen)` over the blocks of one row;
    returns (canvas, forwards)."""
    x, blocks = canvas_and_blocks(prompt, gen_length, block_length, mask_id)
    forwards = 0
    for start, end in blocks:
        first = True
        while (x[0, start:end] == mask_id).any():
            logits = logits_fn(x, None)[0, start:end].clone()
            logits[:, mask_id] = torch.finfo(logits.dtype).min
            forwards += 1
            masked = x[0, start:end] == mask_id
            tokens, chosen = pick(logits, masked, first)
            x[0, start:end] = torch.where(chosen, tokens, x[0, start:end])
            first = False
    return x, forwards


@torch.no_grad()
def hierarchy_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
                  tau: float | None, low_tau: float | None) -> tuple[Tensor, int]:
    """dInfer's loop with `HierarchyDecoder`, temperature 0, confidences exp(log_softmax) in the logits' dtype."""
    return block_loop(logits_fn, prompt, gen_length, block_length, mask_id,
                       lambda logits, masked, first: _hierarchy_pick(logits, masked, tau, low_tau))


@torch.no_grad()
def credit_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
               tau: float, alpha: float, gamma: float, beta: float, temperature: float = 0.0,
               generator: torch.Generator | None = None) -> tuple[Tensor, int]:
    """dInfer's loop with `CreditThresholdParallelDecoder` (a credit per block, reset when it opens)."""
    held = {}

    def pick(logits, masked, first):
        if first:
            held["credit"] = torch.zeros(logits.shape, dtype=torch.float32)
        tokens, chosen, held["credit"] = _credit_pick(logits, masked, held["credit"], tau, alpha, gamma, beta,
                                                      first, temperature, generator)
        return tokens, chosen

    return block_loop(logits_fn, prompt, gen_length, block_length, mask_id, pick)
