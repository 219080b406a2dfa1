"""The log-likelihood of a continuation under a masked-diffusion model: LLaDA's Monte-Carlo
estimator (ML-GSAI/LLaDA `get_log_likelihood.py` and `eval_llada.py`; arXiv:2502.09992, Eq. 6),
and Dream's (below).

Only the target (the continuation's tokens) is ever masked. The estimate runs `mc_num / batch_size`
rounds of `batch_size` rows. A round draws k uniformly from 1..L (L the target length); row i of the
round masks m_i = round(k + i * L / batch_size), wrapped into 1..L, target positions picked by a
random permutation; the round's loss is the mean over its rows of (L / m_i) times the summed
cross-entropy of the masked tokens. The estimate is minus the mean of the rounds' losses: an
estimate of the lower bound of log p(target | prefix) (the bound holds for counts spread evenly
over 1..L; the rounding, half to even as in the reference, spreads them not quite evenly for some
L and batch_size), summed over the target's tokens, exact when L = 1 (an empty prefix scores the
target alone). With
`cfg_scale` > 0 the logits are u + (cfg_scale + 1)(c - u), u those of a copy whose prefix is all
masks.

`dream_mc_loglikelihood` is Dream's estimator (its evaluation script, as Fast-dLLM `dream/eval.py`
runs it with `nll_type=mc`, `log_type=ftb`): the target ends with the EOS the evaluation appends to
the joint encoding. A round of `batch_size` rows draws u0 ~ U[0, 1) once; row i masks each target
column with probability p_i = (1 - eps) t_i + eps, t_i = (u0 + i / batch_size) mod 1, except the
sequence's first and last columns (with an empty prefix the target's first token is given); the
round's loss is the mean over its rows of the summed cross-entropy of the masked tokens, each
divided by p_i. The estimate is minus the mean of the rounds' losses. Guidance is as above.

`greedy_matches` is the reference's greedy check: from the target all masked, L steps each give
the single most confident masked position its argmax over the whole vocabulary (the mask token
included, which leaves the position masked); True when the result is the target.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .state import plain_number

DREAM_SAMPLING_EPS = 1e-3        # the smallest masking rate of Dream's estimator (its evaluation's default)


def _logits(model, x: torch.Tensor, at: torch.Tensor, prefix_length: int, cfg_scale: float) -> torch.Tensor:
    """(n, V) float32 logits of the canvases x (B, N) at the n True entries of `at` (B, N), guided
    when cfg_scale > 0; only those rows of the logits are made float32."""
    if cfg_scale <= 0:
        return model(x)[at].float()
    uncond = x.clone()
    uncond[:, :prefix_length] = model.config.mask_token_id
    cond, un = (logits[at].float() for logits in model(torch.cat([x, uncond])).chunk(2))
    return un + (cfg_scale + 1) * (cond - un)


def check_settings(mc_num, batch_size, cfg_scale, names=("batch_size", "cfg_scale")) -> None:
    """The estimator's settings: mc_num a positive multiple of batch_size >= 1, cfg_scale a finite
    number >= 0; otherwise a ValueError naming the value (batch_size and cfg_scale by `names`)."""
    if isinstance(mc_num, bool) or isinstance(batch_size, bool) or not isinstance(mc_num, int) \
            or not isinstance(batch_size, int) or batch_size < 1 or mc_num < batch_size or mc_num % batch_size:
        raise ValueError(f"mc_num must be a positive multiple of {names[0]} >= 1, got mc_num={mc_num!r}, "
                         f"{names[0]}={batch_size!r}")
    if isinstance(cfg_scale, bool) or not isinstance(cfg_scale, (int, float)) or not math.isfinite(cfg_scale) \
            or cfg_scale < 0:
        raise ValueError(f"{names[1]} must be a finite number >= 0 (0: no guidance), got {cfg_scale!r}")


def token_ids(ids, name: str, vocab_size: int) -> list[int]:
    """`ids` (a list or tuple of ints, or a 1-D integer tensor) as a list of token ids of a
    vocabulary of `vocab_size`; else a ValueError naming `name`."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor or a list of token ids, got a tensor of shape "
                             f"{tuple(ids.shape)} and dtype {ids.dtype}")
        ids = ids.tolist()
    if isinstance(ids, (list, tuple)):
        ids = [plain_number(i) for i in ids]              # NumPy integers as ints
    if not isinstance(ids, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"{name} must be a list of token ids (ints) or a 1-D integer tensor, got {ids!r:.80}")
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
        raise ValueError(f"{name} holds token id(s) {outside[:5]} outside the vocabulary (0 .. {vocab_size - 1})")
    return list(ids)


def _check(model, prefix, target, mc_num: int, batch_size: int, cfg_scale,
           generator=None) -> tuple[list[int], list[int]]:
    """The prefix and target as lists of token ids, once they and the settings are checked."""
    prefix = token_ids(prefix, "prefix", model.config.vocab_size)
    target = token_ids(target, "target", model.config.vocab_size)
    mask = model.config.mask_token_id
    for name, ids in (("prefix", prefix), ("target", target)):
        if mask in ids:
            raise ValueError(f"{name} contains the mask token id {mask} at position {ids.index(mask)}; the prefix "
                             f"and target are given tokens (the estimator masks the target itself)")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r:.60} "
                         f"({type(generator).__name__})")
    if not target:
        raise ValueError("the target (continuation) has no tokens; its log-likelihood is not defined")
    longest = model.config.max_seq_len
    if len(prefix) + len(target) > longest:
        raise ValueError(f"prefix ({len(prefix)} tokens) + target ({len(target)}) exceeds the model's maximum sequence "
                         f"length {longest}")
    check_settings(mc_num, batch_size, cfg_scale)
    return prefix, target


@torch.no_grad()
def mc_loglikelihood(model, prefix: list[int], target: list[int], *, mc_num: int = 128, batch_size: int = 32,
                     cfg_scale: float = 0.0, generator: torch.Generator | None = None) -> float:
    """LLaDA's Monte-Carlo estimate of log p(target | prefix) (module docstring); prefix and target
    are token-id lists or 1-D integer tensors."""
    prefix, target = _check(model, prefix, target, mc_num, batch_size, cfg_scale, generator)
    device = model.device
    seq = torch.tensor(prefix + target, dtype=torch.long, device=device).repeat(batch_size, 1)   # (b, P + L)
    P, L = len(prefix), len(target)
    losses = []
    for _ in range(mc_num // batch_size):
        k = int(torch.randint(1, L + 1, (), generator=generator))
        counts = torch.round(torch.linspace(float(k), k + (batch_size - 1) * (L / batch_size), batch_size)).long()
        counts = (counts - 1) % L + 1                                                          # (b,) in 1..L
        masked = torch.zeros(batch_size, P + L, dtype=torch.bool)
        for i in range(batch_size):
            masked[i, P + torch.randperm(L, generator=generator)[:int(counts[i])]] = True
        weight = L / counts.to(dtype=torch.float32)                                          # (b,)
        losses.append(_weighted_loss(model, seq, masked.to(device), weight.to(device), P, cfg_scale))
    return -sum(losses) / len(losses)


@torch.no_grad()
def dream_mc_loglikelihood(model, prefix: list[int], target: list[int], *, mc_num: int = 128, batch_size: int = 32,
                           cfg_scale: float = 0.0, sampling_eps: float = DREAM_SAMPLING_EPS,
                           generator: torch.Generator | None = None) -> float:
    """Dream's Monte-Carlo estimate of log p(target | prefix) (module docstring); `target` ends with
    the EOS Dream's evaluation appends, which is never masked."""
    prefix, target = _check(model, prefix, target, mc_num, batch_size, cfg_scale, generator)
    if isinstance(sampling_eps, bool) or not isinstance(sampling_eps, (int, float)) or not 0 <= sampling_eps < 1:
        raise ValueError(f"sampling_eps must be a number in [0, 1), got {sampling_eps!r}")
    P, L = len(prefix), len(target)
    seq = torch.tensor(prefix + target, dtype=torch.long, device=model.device).repeat(batch_size, 1)
    losses = []
    for _ in range(mc_num // batch_size):
        u0 = torch.rand(1, generator=generator)
        t = (u0 + torch.arange(batch_size, dtype=torch.float32) / batch_size) % 1                # (b,) stratified
        p_mask = (1 - sampling_eps) * t + sampling_eps
        masked = torch.rand(batch_size, P + L, generator=generator) < p_mask[:, None]
        masked[:, :max(P, 1)] = False                   # the prefix and the first column are never masked,
        masked[:, -1] = False                           # nor the last (the EOS)
        losses.append(_weighted_loss(model, seq, masked.to(model.device), (1 / p_mask).to(model.device), P,
                                     cfg_scale))
    return -sum(losses) / len(losses)


def _weighted_loss(model, seq: torch.Tensor, masked: torch.Tensor, weight: torch.Tensor, prefix_length: int,
                   cfg_scale: float) -> float:
    """The summed cross-entropy of the masked tokens of `seq` (b, N), row i's weighted by weight[i],
    over the b rows."""
    noisy = torch.where(masked, model.config.mask_token_id, seq)
    ce = F.cross_entropy(_logits(model, noisy, masked, prefix_length, cfg_scale), seq[masked],
                         reduction="none")                                                      # (masked,)
    return float((ce * weight[:, None].expand_as(masked)[masked]).sum()) / seq.shape[0]


@torch.no_grad()
def greedy_matches(model, prefix: list[int], target: list[int], *, cfg_scale: float = 0.0) -> bool:
    """Whether one-token-per-step confidence decoding of the masked target gives the target
    (module docstring: the mask token is a candidate, as in the reference)."""
    prefix, target = _check(model, prefix, target, 1, 1, cfg_scale)
    P, L = len(prefix), len(target)
    mask = model.config.mask_token_id
    x = torch.tensor([prefix + [mask] * L], dtype=torch.long, device=model.device)
    target_columns = torch.arange(P + L, device=model.device)[None] >= P                        # (1, P + L)
    for _ in range(L):
        logits = _logits(model, x, target_columns, P, cfg_scale)                                # (L, V)
        prob, token = torch.softmax(logits, dim=-1).max(dim=-1)
        still = x[0, P:] == mask
        pick = int(prob.masked_fill(~still, -1.0).argmax())
        x[0, P + pick] = token[pick]
    return x[0, P:].tolist() == list(target)
