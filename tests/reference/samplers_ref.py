"""Literal re-transcriptions of the published decoding loops, used as oracles for dllm's samplers.

* :func:`llada_generate_ref`: ML-GSAI/LLaDA ``generate.py`` at HEAD b7e6c35
  (docs/samplers.md §2).
* :func:`dream_generate_ref`: Dream's ``diffusion_generate`` / ``_sample`` from the HF model repo's
  ``generation_utils.py`` (docs/samplers.md §3).
* :func:`llada2_generate_ref`: LLaDA2.0's ``generate`` of ``modeling_llada2_moe.py`` at temperature 0
  (batch 1), as redistributed by the dllm training library (docs/samplers.md §11).
* :func:`llada21_generate_ref`: LLaDA2.1's editing ``generate`` (``modeling_llada21_moe.py``) at
  temperature 0, batch 1 (docs/samplers.md §11).
* :func:`budget_threshold_ref`: Fast-dLLM's Dream loop without blocks (``generation_utils.py``,
  ``alg="confidence_threshold"``) at temperature 0, batch 1 (docs/samplers.md §4).
* :func:`block_threshold_ref`: Fast-dLLM's block-wise Dream loop (``generation_utils_block.py``,
  ``alg="confidence_threshold"``) at temperature 0, batch 1, every forward over the whole canvas.

Both loops are re-written from the algorithms, step for step in the reference order, with three
deliberate, documented differences:

1. Every random draw takes an explicit ``torch.Generator`` (``generator=None`` = torch's global RNG,
   as in the originals). Draw order and shapes follow the references:
   LLaDA, per step: (B, L, V) float64 uniforms for Gumbel-max when temperature > 0, then (B, L)
   float32 uniforms for ``remasking="random"``.
   Dream, per step: ``origin`` draws one float32 uniform per masked position (row-major), then
   categorical samples for the revealed ones; other algs draw categorical samples for every masked
   position, then (``alg_temp`` > 0) ``multinomial`` without replacement over the positions.
2. Categorical sampling at temperature > 0 uses ``torch.multinomial(probs, 1, generator=...)``
   instead of ``torch.distributions.Categorical(probs).sample()`` (which cannot take a generator).
   The distribution is the same, the random stream is not; when there is nothing to sample no
   draw is made.
3. ``torch.topk``'s order among equal values is backend-defined. Every top-k selection here is a
   stable descending sort, so ties go to the LOWEST position (and, in Dream's top-p filter, to the
   lowest token id).

The model is a callable ``logits_fn(x, attention_mask) -> logits``: x (B, L) long; attention_mask
the 2-D (B, L) 0/1 mask extended over the generation region, exactly what the reference hands to
the model, or None; logits (B, L, V). LLaDA expects aligned logits; Dream expects RAW (unshifted)
logits and the loop applies the shift itself, as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["dream_generate_ref", "llada21_generate_ref", "llada2_generate_ref", "llada_generate_ref", "llada_transfer_counts"]

LogitsFn = Callable[[Tensor, "Tensor | None"], Tensor]


def _topk_lowest_first(scores: Tensor, k: int) -> Tensor:
    """Indices of the k largest entries of each row of ``scores`` (..., N); ties -> lowest index.

    A stable descending sort keeps equal values in index order, replacing ``torch.topk`` whose tie
    order is backend-defined.
    """
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


# ---------------------------------------------------------------------------------------------
# LLaDA generate.py
# ---------------------------------------------------------------------------------------------


def llada_transfer_counts(block_mask: Tensor, steps: int) -> Tensor:
    """Per-row, per-step commit counts of a block (``get_num_transfer_tokens``).

    block_mask (B, K) bool -> (B, steps) int64: with n masks in the row, every step gets n // steps
    and the first n % steps steps one more.
    """
    n = block_mask.sum(dim=1, keepdim=True)  # (B, 1)
    counts = torch.zeros(block_mask.shape[0], steps, dtype=torch.int64, device=block_mask.device) + n // steps
    for row in range(block_mask.shape[0]):
        counts[row, : int(n[row] % steps)] += 1
    return counts


def counted_block_loop(logits_fn: LogitsFn, prompt: Tensor, gen_length: int, block_length: int, steps: int,
                       mask_id: int, commit: Callable[[Tensor, Tensor, int, int, int], None]) -> tuple[Tensor, int]:
    """LLaDA's blocks and per-step counts at batch 1, no cache: each step of a block that still holds
    a mask runs the model over the whole canvas and calls `commit(logits (L, V), x (L,), start, end,
    k)`, which writes x in place. Returns (canvas (1, Lp + gen_length), forwards)."""
    Lp = prompt.shape[1]
    x = torch.full((1, Lp + gen_length), mask_id, dtype=torch.long)
    x[:, :Lp] = prompt
    per_block, forwards = steps // (gen_length // block_length), 0
    for start in range(Lp, Lp + gen_length, block_length):
        end = start + block_length
        counts = llada_transfer_counts(x[:, start:end] == mask_id, per_block)[0]
        for i in range(per_block):
            if not (x[0, start:end] == mask_id).any():        # a sampler that commits more emptied it early
                break
            commit(logits_fn(x, None)[0], x[0], start, end, int(counts[i]))
            forwards += 1
    return x, forwards


def _add_gumbel_noise(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """Gumbel-max in float64: argmax of exp(l) / (-log u)^T samples softmax(l / T).

    At T == 0 the SAME tensor is returned (no draw), which matters for ``confidence_eos_eot_inf``.
    """
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)  # (B, L, V)
    return logits.exp() / (-torch.log(u)) ** temperature


@torch.no_grad()
def llada_generate_ref(
    logits_fn: LogitsFn,
    prompt: Tensor,
    attention_mask: Tensor | None = None,
    *,
    steps: int,
    gen_length: int,
    block_length: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    mask_id: int,
    generator: torch.Generator | None = None,
    cfg_scale: float = 0.0,
    logits_eos_inf: bool = False,
    confidence_eos_eot_inf: bool = False,
    eos_id: int | None = None,
    eot_id: int | None = None,
) -> Tensor:
    """LLaDA's semi-autoregressive low-confidence / random remasking loop (``generate.py``).

    Args:
        logits_fn: ``(x (B, L), attention_mask (B, L) | None) -> aligned logits (B, L, V)``.
        prompt: (B, Lp) long, left-padded when rows differ in length (pad must not be ``mask_id``).
        attention_mask: (B, Lp) 0/1 or None; if given it is extended with ones over the generation
            region and passed on every call (with CFG, duplicated to 2B rows).
        steps, gen_length, block_length: ``gen_length % block_length == 0`` and ``steps`` divisible
            by the number of blocks; each block gets ``steps / num_blocks`` steps.
        temperature: 0 = argmax; > 0 = Gumbel-max in float64.
        remasking: ``"low_confidence"`` (softmax of the raw logits, in the logits dtype, at x0) or
            ``"random"`` (U(0, 1) float32 scores).
        mask_id: id of the mask token (126336 for LLaDA-8B).
        generator: used for every random draw.
        cfg_scale: unsupervised classifier-free guidance; the unconditional copy masks every
            position that was not a mask in the initial canvas (pads included).
        logits_eos_inf: set the ``eos_id`` logit column to -inf before the argmax.
        confidence_eos_eot_inf: the literal reference quirk (docs/samplers.md §2): after the argmax, -inf goes
            into the ``eos_id`` column of the noised logits and the ``eot_id`` column of the raw
            logits; at T == 0 they are one tensor, so EOS/EOT predictions get confidence 0.
        eos_id, eot_id: required by the two flags above (LLaDA-8B: 126081, 126348).

    Returns:
        The final canvas (B, Lp + gen_length), prompt included.
    """
    if remasking not in ("low_confidence", "random"):
        raise ValueError(f"remasking must be 'low_confidence' or 'random', got {remasking!r}")
    if (logits_eos_inf or confidence_eos_eot_inf) and eos_id is None:
        raise ValueError("logits_eos_inf / confidence_eos_eot_inf need eos_id")
    if confidence_eos_eot_inf and eot_id is None:
        raise ValueError("confidence_eos_eot_inf needs eot_id")
    B, Lp = prompt.shape
    x = torch.full((B, Lp + gen_length), mask_id, dtype=torch.long, device=prompt.device)  # (B, L)
    x[:, :Lp] = prompt.clone()
    if attention_mask is not None:
        ones = torch.ones((B, gen_length), dtype=attention_mask.dtype, device=attention_mask.device)
        attention_mask = torch.cat([attention_mask, ones], dim=-1)  # (B, L)
    prompt_index = x != mask_id  # (B, L), computed once: pads count as prompt

    if gen_length % block_length != 0:
        raise ValueError(f"gen_length {gen_length} is not a multiple of block_length {block_length}")
    num_blocks = gen_length // block_length
    if steps % num_blocks != 0:
        raise ValueError(f"steps {steps} is not a multiple of the number of blocks {num_blocks}")
    steps_per_block = steps // num_blocks

    for block in range(num_blocks):
        start, end = Lp + block * block_length, Lp + (block + 1) * block_length
        counts = llada_transfer_counts(x[:, start:end] == mask_id, steps_per_block)  # (B, s)
        for i in range(steps_per_block):
            mask_index = x == mask_id  # (B, L)
            if cfg_scale > 0.0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                both = torch.cat([x, un_x], dim=0)  # (2B, L)
                mask2 = None if attention_mask is None else torch.cat([attention_mask, attention_mask], dim=0)
                cond, uncond = torch.chunk(logits_fn(both, mask2), 2, dim=0)
                logits = uncond + (cfg_scale + 1) * (cond - uncond)  # (B, L, V)
            else:
                logits = logits_fn(x, attention_mask).clone()  # (B, L, V); clone: edited in place below

            if logits_eos_inf:
                logits[:, :, eos_id] = -torch.inf

            logits_with_noise = _add_gumbel_noise(logits, temperature, generator)
            x0 = torch.argmax(logits_with_noise, dim=-1)  # (B, L)

            if confidence_eos_eot_inf:
                logits_with_noise[:, :, eos_id] = -torch.inf
                logits[:, :, eot_id] = -torch.inf

            if remasking == "low_confidence":
                p = F.softmax(logits, dim=-1)  # (B, L, V), logits dtype, raw (un-noised) logits
                x0_p = torch.gather(p, dim=-1, index=x0.unsqueeze(-1)).squeeze(-1)  # (B, L)
            else:
                x0_p = torch.rand(x0.shape, device=x0.device, generator=generator)  # (B, L) float32

            x0_p[:, end:] = -torch.inf  # never beyond the current block
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -torch.inf)  # (B, L)

            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for row in range(B):
                # torch.topk in the reference; ties -> lowest position here (module docstring).
                chosen = _topk_lowest_first(confidence[row], int(counts[row, i]))
                transfer[row, chosen] = True
            x[transfer] = x0[transfer]
    return x


# ---------------------------------------------------------------------------------------------
# Dream diffusion_generate
# ---------------------------------------------------------------------------------------------


def _top_p_logits(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus filter: drop tokens once the cumulative softmax (descending) exceeds top_p, always
    keeping the first; dropped logits become finfo.min. Sort is stable (ties -> lower token id)."""
    sorted_logits, sorted_idx = torch.sort(logits, descending=True, stable=True)
    cum = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cum > top_p
    remove[..., 1:] = remove[..., :-1].clone()  # shift right: keep the token that crosses top_p
    remove[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_idx, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _top_k_logits(logits: Tensor, top_k: int) -> Tensor:
    """Keep logits >= the k-th largest (ties at the threshold survive); others -> finfo.min."""
    top_k = min(top_k, logits.size(-1))
    kth = torch.topk(logits, top_k)[0][..., -1, None]  # values only: tie order irrelevant
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def _sample_tokens(
    logits: Tensor,
    *,
    temperature: float,
    top_p: float | None,
    top_k: int | None,
    kind: str,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """Dream's ``sample_tokens`` on (N, V) logits, all in the logits dtype -> (confidence (N,), x0 (N,)).

    kind: ``"prob"`` (probability of x0), ``"margin"`` (top1 - top2 probability) or
    ``"neg_entropy"`` (sum p log(p + 1e-10)). x0 is sampled at temperature > 0 (multinomial from the
    tempered, filtered softmax), else the argmax (first maximum).
    """
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = _top_p_logits(logits, top_p)
    if top_k is not None:
        logits = _top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)  # (N, V)

    if temperature > 0:
        x0 = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (N,)
        confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        confidence, x0 = probs.max(dim=-1)

    if kind == "margin":
        sorted_probs = torch.sort(probs, dim=-1, descending=True).values
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    elif kind == "neg_entropy":
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


_DREAM_ALG_KIND = {"maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}


@torch.no_grad()
def dream_generate_ref(
    logits_fn: LogitsFn,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: int,
    steps: int,
    eps: float = 1e-3,
    alg: str = "origin",
    alg_temp: float | None = None,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    mask_id: int,
    generator: torch.Generator | None = None,
    logits_hook: Callable[[int, Tensor, Tensor], Tensor] | None = None,
    tokens_hook: Callable[[int | None, Tensor, Tensor | None], Tensor] | None = None,
) -> Tensor:
    """Dream's global (no blocks) masked-diffusion loop (``diffusion_generate`` / ``_sample``).

    Args:
        logits_fn: ``(x (B, L), attention_mask (B, L) | None) -> RAW logits (B, L, V)``; shifted here.
        input_ids: (B, Lp) long, left-padded when rows differ (Dream pads with <|endoftext|>).
        attention_mask: (B, Lp) 0/1 or None. Only if it contains a zero is it extended with ones
            over the generation region and passed on (the callee derives position ids
            cumsum - 1, pads -> 1, and the query AND key mask); otherwise None is passed.
        max_new_tokens, steps: canvas = input_ids right-padded with ``max_new_tokens`` masks;
            timesteps = linspace(1, eps, steps + 1) in float32.
        alg: ``"origin"`` (each masked position revealed with probability 1 - s/t, all at the last
            step) or ``"maskgit_plus"`` / ``"topk_margin"`` / ``"entropy"`` (commit
            k = int(n_bar * (1 - s/t)), int(n_bar) at the last step, n_bar = masked count averaged
            over the batch, chosen per row over the whole canvas).
        alg_temp: None/0 -> top-k confidences; > 0 -> k positions drawn without replacement from
            softmax(confidence / alg_temp).
        temperature, top_p, top_k: token sampling in ``sample_tokens``.
        mask_id: mask token id (151666 for Dream-v0).
        generator: used for every random draw.
        logits_hook: ``(step, x, logits) -> logits`` after the shift (reference hook).
        tokens_hook: ``(step | None, x, logits | None) -> x``, called once before the loop with
            step None and after every step (reference hook).

    Returns:
        The final canvas (B, Lp + max_new_tokens).

    Reference quirk kept: k is one number for the whole batch; a row with fewer than k masked
    positions would have unmasked positions (confidence -inf) selected and overwritten with the
    mask id. Rows without masks in the prompt stay in lockstep, so this does not arise for them.
    """
    if alg != "origin" and alg not in _DREAM_ALG_KIND:
        raise ValueError(f"alg must be one of {['origin', *_DREAM_ALG_KIND]}, got {alg!r}")
    B, Lp = input_ids.shape
    max_length = Lp + max_new_tokens
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)  # (B, L)

    if attention_mask is not None and bool((attention_mask == 0).any()):
        attention_mask = F.pad(attention_mask, (0, max_length - attention_mask.shape[1]), value=1)  # (B, L)
    else:
        attention_mask = None  # the reference's "full": no mask, positions 0..L-1

    timesteps = torch.linspace(1, eps, steps + 1, device=x.device)  # float32
    if tokens_hook is not None:
        x = tokens_hook(None, x, None)

    for i in range(steps):
        mask_index = x == mask_id  # (B, L)
        logits = logits_fn(x, attention_mask)  # (B, L, V) raw
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # shift: row i predicts token i
        if logits_hook is not None:
            logits = logits_hook(i, x, logits)
        mask_logits = logits[mask_index]  # (n, V), masked positions in row-major order
        t, s = timesteps[i], timesteps[i + 1]

        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.full_like(x[mask_index], mask_id)  # (n,)
            reveal = torch.rand(x0.shape, device=x.device, generator=generator) < p_transfer  # (n,)
            if bool(reveal.any()):
                _, x0[reveal] = _sample_tokens(
                    mask_logits[reveal], temperature=temperature, top_p=top_p, top_k=top_k,
                    kind="prob", generator=generator,
                )
            x[mask_index] = x0
        elif bool(mask_index.any()):
            confidence, x0 = _sample_tokens(
                mask_logits, temperature=temperature, top_p=top_p, top_k=top_k,
                kind=_DREAM_ALG_KIND[alg], generator=generator,
            )
            n_bar = mask_index.sum() / mask_index.shape[0]  # float32 tensor, batch average
            k = int(n_bar * (1 - s / t)) if i < steps - 1 else int(n_bar)
            full_confidence = torch.full(x.shape, -torch.inf, dtype=logits.dtype, device=x.device)  # (B, L)
            full_confidence[mask_index] = confidence
            if k > 0:
                if alg_temp is None or alg_temp == 0:
                    chosen = _topk_lowest_first(full_confidence, k)  # (B, k); reference: torch.topk
                else:
                    weights = F.softmax(full_confidence / alg_temp, dim=-1)  # (B, L)
                    chosen = torch.multinomial(weights, num_samples=k, generator=generator)  # (B, k)
                x_ = torch.full_like(x, mask_id)
                x_[mask_index] = x0
                rows = torch.arange(B, device=x.device).unsqueeze(1).expand_as(chosen)  # (B, k)
                x[rows, chosen] = x_[rows, chosen]

        if tokens_hook is not None:
            x = tokens_hook(i, x, logits)
    return x


def llada2_generate_ref(
    logits_fn: Callable[[Tensor], Tensor],
    prompt: list[int],
    *,
    gen_length: int,
    mask_id: int,
    eos_id: int,
    block_length: int = 32,
    steps: int = 32,
    threshold: float = 0.95,
    eos_early_stop: bool = False,
) -> Tensor:
    """LLaDA2.0's block loop at temperature 0 for one prompt; returns the (1, Lp + G) canvas as it
    stands when the loop ends (masks may remain after an EOS stop).

    ``logits_fn(x)`` -> (1, W, V) aligned logits of the canvas prefix x (1, W) with LLaDA2's
    block-causal attention. The canvas is padded with masks to whole blocks of ``block_length``
    columns from column 0 (those past Lp + G are decoded like the others and dropped at the end);
    decoding starts at the block holding the prompt's end, and each block runs the window up to
    its end. Each of at
    most ``steps`` steps: candidates = argmax, confidence = their softmax probability in fp32,
    masked block positions only; if at least n_i of them exceed ``threshold`` (strictly) they are
    all committed, else the n_i most confident (n_i: block_length // steps, + 1 for the first
    block_length % steps steps, at most the masks left). After a block, an EOS anywhere in the
    generation so far stops the loop; with ``eos_early_stop`` a step that commits an EOS while no
    mask is left before the first EOS stops it at once.
    """
    Lp = len(prompt)
    blocks = -(-(Lp + gen_length) // block_length)
    x = torch.full((1, blocks * block_length), mask_id, dtype=torch.long)
    x[0, :Lp] = torch.tensor(prompt, dtype=torch.long)
    steps = min(steps, gen_length)
    schedule = [block_length // steps + (1 if i < block_length % steps else 0) for i in range(steps)]
    for nb in range(Lp // block_length, blocks):
        start, end = nb * block_length, (nb + 1) * block_length
        for i in range(steps):
            active = x[0, start:end] == mask_id
            if not bool(active.any()):
                break
            logits = logits_fn(x[:, :end])[0, start:end].float()
            probs = torch.softmax(logits, dim=-1)
            conf, token = probs.max(dim=-1)
            conf = torch.where(active, conf, torch.full_like(conf, float("-inf")))
            n = min(schedule[i], int(active.sum()))
            high = conf > threshold
            if int(high.sum()) >= n:
                chosen = high
            else:
                order = torch.sort(conf, descending=True, stable=True).indices[:n]
                chosen = torch.zeros_like(active)
                chosen[order] = True
            x[0, start:end] = torch.where(chosen, token, x[0, start:end])
            if eos_early_stop and bool((token[chosen] == eos_id).any()):
                gen = x[0, Lp:]
                first = int((gen == eos_id).nonzero()[0, 0])
                if not bool((gen[:first] == mask_id).any()):
                    return x[:, :Lp + gen_length]
        if bool((x[0, Lp:end] == eos_id).any()):
            break
    return x[:, :Lp + gen_length]


def llada21_generate_ref(
    logits_fn: Callable[[Tensor], Tensor],
    prompt: list[int],
    *,
    gen_length: int,
    mask_id: int,
    eos_id: int,
    block_length: int = 32,
    threshold: float = 0.95,
    editing_threshold: float = 0.9,
    max_post_steps: int = 16,
    eos_early_stop: bool = False,
) -> tuple[Tensor, int]:
    """LLaDA2.1's editing loop at temperature 0 for one prompt: (the (1, Lp + G) canvas when the
    loop ends, the number of forwards).

    Blocks (and the canvas padded to whole blocks) as in :func:`llada2_generate_ref`. Each iteration
    of a block: when the block holds no mask, count a post step and leave the block past
    ``max_post_steps`` of them; run the window; candidates = argmax, confidence = softmax
    probability in fp32; commit the block's masks above ``threshold`` (strictly), or the most
    confident one if none is; at the same time rewrite every written generated block token whose
    candidate differs with confidence above ``editing_threshold``; leave the block after a mask-free
    iteration that edited nothing. With ``eos_early_stop``, a finished block leaving no mask and an
    EOS in the generation up to its end stops the loop.
    """
    Lp = len(prompt)
    blocks = -(-(Lp + gen_length) // block_length)
    x = torch.full((1, blocks * block_length), mask_id, dtype=torch.long)
    x[0, :Lp] = torch.tensor(prompt, dtype=torch.long)
    forwards = 0
    for nb in range(Lp // block_length, blocks):
        start, end = nb * block_length, (nb + 1) * block_length
        generated = torch.arange(start, end) >= Lp
        post = 0
        while True:
            masked = x[0, start:end] == mask_id
            no_mask = not bool(masked.any())
            if no_mask:
                post += 1
                if post > max_post_steps:
                    break
            probs = torch.softmax(logits_fn(x[:, :end])[0, start:end].float(), dim=-1)
            forwards += 1
            conf, token = probs.max(dim=-1)
            commit = torch.zeros_like(masked)
            if not no_mask:
                masked_conf = torch.where(masked, conf, torch.full_like(conf, float("-inf")))
                commit = masked & (masked_conf > threshold)
                if not bool(commit.any()):
                    commit[int(torch.sort(masked_conf, descending=True, stable=True).indices[0])] = True
            edit = generated & ~masked & (conf > editing_threshold) & (token != x[0, start:end])
            x[0, start:end] = torch.where(commit | edit, token, x[0, start:end])
            if no_mask and not bool(edit.any()):
                break
        upto = x[0, Lp:end]
        if eos_early_stop and not bool((upto == mask_id).any()) and bool((upto == eos_id).any()):
            break
    return x[:, :Lp + gen_length], forwards


@torch.no_grad()
def budget_threshold_ref(logits_fn: LogitsFn, input_ids: Tensor, *, max_new_tokens: int, steps: int,
                         threshold: float, mask_id: int) -> tuple[Tensor, int]:
    """Fast-dLLM's ``confidence_threshold`` loop of Dream's ``_sample`` at temperature 0, batch 1.

    ``logits_fn(x, None)`` gives ALIGNED logits (B, L, V). Returns the final canvas and the forwards
    (the last step's first reject adds one step; its other rejects are carried into it).
    """
    assert input_ids.shape[0] == 1, "batch size must be 1"
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    assert int((x == mask_id).sum()) % steps == 0
    number_transfer_tokens = int((x == mask_id).sum()) // steps
    left_tokens_last_step = 0
    i, forwards = 0, 0
    while i < steps:
        mask_index = x == mask_id
        logits = logits_fn(x, None)
        forwards += 1
        confidence, x0 = _sample_tokens(logits[mask_index], temperature=0.0, top_p=None, top_k=None, kind="prob",
                                        generator=None)
        x_ = torch.full_like(x, mask_id)
        x_[mask_index] = x0
        full_confidence = torch.full(x.shape, -torch.inf, dtype=logits.dtype)
        full_confidence[mask_index] = confidence
        current_transfer_tokens = number_transfer_tokens + left_tokens_last_step
        left_tokens_last_step = 0
        select_index = _topk_lowest_first(full_confidence, current_transfer_tokens)     # (1, k)
        selected_confidence = full_confidence.gather(1, select_index)
        transfer_index = torch.zeros_like(x, dtype=torch.bool)
        transfer_index[0, select_index[0]] = True
        for k in range(1, current_transfer_tokens):
            if selected_confidence[0, k] < threshold:
                if i < steps - 1:
                    left_tokens_last_step += 1
                    transfer_index[0, select_index[0, k]] = False
                else:
                    number_transfer_tokens = 0
                    steps += 1
                    left_tokens_last_step += 1
                    transfer_index[0, select_index[0, k]] = False
        x[transfer_index] = x_[transfer_index]
        i += 1
    return x, forwards


@torch.no_grad()
def block_threshold_ref(logits_fn: LogitsFn, input_ids: Tensor, *, max_new_tokens: int, block_length: int,
                        threshold: float, mask_id: int) -> tuple[Tensor, int]:
    """Fast-dLLM's block-wise ``confidence_threshold`` loop of Dream's ``_sample`` at temperature 0,
    batch 1, its cached forwards replaced by full ones. ``logits_fn(x, None)`` gives ALIGNED logits.

    Per block: a forward whose candidate at the block's first position is written outright, then
    forwards that each commit the block's most confident mask and every other one >= threshold, until
    the block holds no mask (checked after each of these forwards). Returns the canvas and the forwards.
    """
    assert input_ids.shape[0] == 1, "batch size must be 1"
    Lp = input_ids.shape[1]
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    forwards = 0
    for num_block in range(max_new_tokens // block_length):
        start, end = Lp + num_block * block_length, Lp + (num_block + 1) * block_length
        logits = logits_fn(x, None)
        forwards += 1
        _, x0 = _sample_tokens(logits[0], temperature=0.0, top_p=None, top_k=None, kind="prob", generator=None)
        x[0, start] = x0[start]
        while True:
            mask_index = x[:, start:end] == mask_id
            logits = logits_fn(x, None)[:, start:end]
            forwards += 1
            confidence, x0 = _sample_tokens(logits[mask_index], temperature=0.0, top_p=None, top_k=None,
                                            kind="prob", generator=None)
            x_ = torch.full_like(x[:, start:end], mask_id)
            full_confidence = torch.full(x_.shape, -torch.inf, dtype=logits.dtype)
            x_[mask_index] = x0
            full_confidence[mask_index] = confidence
            count = int(mask_index.sum())
            select_index = _topk_lowest_first(full_confidence, count)
            selected_confidence = full_confidence.gather(1, select_index)
            transfer_index = torch.zeros_like(x_, dtype=torch.bool)
            transfer_index[0, select_index[0]] = True
            for k in range(1, count):
                if selected_confidence[0, k] < threshold:
                    transfer_index[0, select_index[0, k]] = False
            x[:, start:end][transfer_index] = x_[transfer_index]
            if not bool((x[:, start:end] == mask_id).any()):
                break
    return x, forwards


@torch.no_grad()
def block_entropy_ref(logits_fn: LogitsFn, input_ids: Tensor, *, max_new_tokens: int, block_length: int,
                      steps: int, mask_id: int, eps: float = 1e-3) -> tuple[Tensor, int]:
    """Fast-dLLM's block-wise loop of Dream's ``_sample`` for an algorithm other than
    ``confidence_threshold`` (scored by negative entropy) at temperature 0, batch 1, its cached
    forwards replaced by full ones. ``logits_fn(x, None)`` gives ALIGNED logits.

    steps_per_block = steps / blocks and timesteps linspace(1, eps, steps_per_block + 1). Per block:
    a forward whose candidate at the block's first position is written outright; then forwards
    i = 1, 2, ...: each first runs the model, then stops the block at i = steps_per_block, else
    commits k = int(n * (1 - t_{i+1} / t_i)) of the block's n masks (all of them at i =
    steps_per_block - 1) by the highest negative entropy, and stops the block once it holds no
    mask. Returns the canvas and the forwards.
    """
    assert input_ids.shape[0] == 1, "batch size must be 1"
    Lp = input_ids.shape[1]
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    num_blocks = max_new_tokens // block_length
    per_block = steps // num_blocks
    timesteps = torch.linspace(1, eps, per_block + 1)
    forwards = 0
    for num_block in range(num_blocks):
        start, end = Lp + num_block * block_length, Lp + (num_block + 1) * block_length
        logits = logits_fn(x, None)
        forwards += 1
        _, x0 = _sample_tokens(logits[0], temperature=0.0, top_p=None, top_k=None, kind="prob", generator=None)
        x[0, start] = x0[start]
        i = 1
        while True:
            mask_index = x[:, start:end] == mask_id
            logits = logits_fn(x, None)[:, start:end]
            forwards += 1
            if i == per_block:
                break
            t, s = timesteps[i], timesteps[i + 1]
            confidence, x0 = _sample_tokens(logits[mask_index], temperature=0.0, top_p=None, top_k=None,
                                            kind="neg_entropy", generator=None)
            num_mask_token = mask_index.sum() / mask_index.shape[0]
            k = int(num_mask_token * (1 - s / t)) if i < per_block - 1 else int(num_mask_token)
            full_confidence = torch.full(mask_index.shape, -torch.inf, dtype=logits.dtype)
            full_confidence[mask_index] = confidence
            if k > 0:
                x_ = torch.full_like(x[:, start:end], mask_id)
                x_[mask_index] = x0
                chosen = _topk_lowest_first(full_confidence, k)[0]
                x[0, start + chosen] = x_[0, chosen]
            i += 1
            if not bool((x[:, start:end] == mask_id).any()):
                break
    return x, forwards


@torch.no_grad()
def dream_klass_ref(logits_fn: LogitsFn, input_ids: Tensor, *, max_new_tokens: int, steps: int,
                    conf_threshold: float, kl_threshold: float, kl_history_length: int,
                    mask_id: int) -> tuple[Tensor, int]:
    """KLASS's Dream ``_sample`` (shkim0116/KLASS ``src/model/dream_klass.py``) with alg "klass" and
    unmask strategy "all" at temperature 0 without top-p / top-k, batch 1. ``logits_fn(x, None)``
    gives ALIGNED logits.

    Each of at most ``steps`` forwards (none once no mask is left): x0 = the argmax of the softmax in
    the logits dtype; p = the float64 softmax of every canvas column, KL(p || p_prev) (eps 1e-12,
    p_prev zeros at first) rolled into each column's history; the masks whose history is all below
    kl_threshold and whose p(x0) >= conf_threshold are ready and all commit; when none is, the most
    probable mask (first of equal maxima) commits. Returns the canvas and the forwards.
    """
    assert input_ids.shape[0] == 1, "batch size must be 1"
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    history = torch.zeros((1, x.shape[1], kl_history_length), dtype=torch.float64)
    p_prev, forwards = None, 0
    for _ in range(steps):
        mask_index = x == mask_id
        if not bool(mask_index.any()):
            break
        logits = logits_fn(x, None)
        forwards += 1
        if p_prev is None:
            p_prev = torch.zeros((1, x.shape[1], logits.shape[-1]), dtype=torch.float64)
        mask_logits = logits[mask_index]
        x0 = torch.zeros_like(x)
        x0[mask_index] = torch.softmax(mask_logits, dim=-1).to(torch.float64).argmax(-1)
        p_curr = F.softmax(logits.to(torch.float64), dim=-1)
        curr_conf = p_curr.gather(-1, x0[..., None]).squeeze(-1)
        kl = (p_curr * (torch.log(p_curr + 1e-12) - torch.log(p_prev + 1e-12))).sum(-1)
        history = torch.roll(history, shifts=-1, dims=-1)
        history[..., -1] = kl
        p_prev = p_curr
        ready = (history < kl_threshold).all(-1) & (curr_conf >= conf_threshold) & mask_index
        if bool(ready.any()):
            transfer = ready
        else:
            conf_fb, _ = _sample_tokens(mask_logits, temperature=0.0, top_p=None, top_k=None, kind="prob",
                                        generator=None)
            transfer = torch.zeros_like(mask_index)
            transfer[0, torch.where(mask_index[0])[0][torch.argmax(conf_fb)]] = True
        x[transfer] = x0[transfer]
    return x, forwards
