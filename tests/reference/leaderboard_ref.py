"""Literal re-transcriptions of the decoding loops of methods on the ParallelBench leaderboard, used
as oracles for dllm's samplers (docs/samplers.md §16-§21).

* :func:`parallelbench_topk_ref`: ParallelBench's LLaDA generation loop with its top-k scorers
  (``confidence_topk``, ``topk_margin``, ``entropy_topk``, ``left_to_right``).
* :func:`dus_ref`: DUS ``generate_scheduled`` with the dilated scheduler, no re-masking, no early
  stop (omerlux/DUS).
* :func:`klass_ref`: KLASS ``stable_confident_decode`` with alg "klass" and strategy "all"
  (shkim0116/KLASS).
* :func:`slowfast_ref`: SlowFast ``generate_slow_fast_sampling`` (LiangrunFlora/Slow-Fast-Sampling).
* :func:`wino_ref`: WINO ``decoding_wino`` with its shadow block (Feng-Hong/WINO-DLLM), on a
  forward that takes WINO's 4-D attention mask and position ids.
* :func:`remdm_ref`: ParallelBench's ``llada_remdm_sample`` (ReMDM revision steps on LLaDA's
  schedule).

Each is written from the published algorithm, step for step in the reference order, batch 1 as the
DUS and KLASS references are and batched with left padding as ParallelBench's loop is. As in samplers_ref.py,
``torch.topk``'s backend-defined order among equal values is replaced by a stable descending sort
(ties go to the lowest position), and the model is a callable ``logits_fn(x, attention_mask) ->
aligned logits (B, L, V)``. Temperature 0 only.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .samplers_ref import LogitsFn, _topk_lowest_first, llada_transfer_counts

__all__ = ["dus_levels_ref", "dus_ref", "klass_ref", "parallelbench_topk_ref", "rcr_ref", "remdm_ref", "slowfast_ref",
           "wino_ref"]


@torch.no_grad()
def parallelbench_topk_ref(logits_fn: LogitsFn, prompt: Tensor, attention_mask: Tensor | None = None, *,
                           steps: int, gen_length: int, block_length: int, score: str, mask_id: int) -> Tensor:
    """ParallelBench's LLaDA loop at temperature 0: blocks, LLaDA's per-step counts, the mask logit at
    -inf, x0 the argmax, and the k masked in-block positions of highest ``score`` committed, with
    score one of "confidence", "margin", "entropy", "left_to_right". Returns the final canvas."""
    if score not in ("confidence", "margin", "entropy", "left_to_right"):
        raise ValueError(f"unknown score {score!r}")
    B, Lp = prompt.shape
    x = torch.full((B, Lp + gen_length), mask_id, dtype=torch.long)
    x[:, :Lp] = prompt
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, torch.ones(B, gen_length, dtype=attention_mask.dtype)], dim=1)
    num_blocks = gen_length // block_length
    assert gen_length % block_length == 0 and steps % num_blocks == 0
    per_block = steps // num_blocks
    for block in range(num_blocks):
        start, end = Lp + block * block_length, Lp + (block + 1) * block_length
        counts = llada_transfer_counts(x[:, start:end] == mask_id, per_block)
        for i in range(per_block):
            mask_index = x == mask_id
            logits = logits_fn(x, attention_mask).clone()
            logits[:, :, mask_id] = -torch.inf
            p = F.softmax(logits, dim=-1)
            x0 = p.argmax(dim=-1)
            if score == "confidence":
                s = p.gather(-1, x0[..., None]).squeeze(-1)
            elif score == "margin":
                ordered = p.sort(dim=-1, descending=True).values
                s = ordered[..., 0] - ordered[..., 1]
            elif score == "entropy":
                s = (p * torch.log(p + 1e-10)).sum(-1)
            else:
                s = -torch.arange(x.shape[1], dtype=torch.float32).expand(B, -1).clone()
            s = s.to(torch.float64)
            s[:, end:] = -torch.inf
            s = torch.where(mask_index, s, -torch.inf)
            x0 = torch.where(mask_index, x0, x)
            for row in range(B):
                chosen = _topk_lowest_first(s[row], int(counts[row, i]))
                x[row, chosen] = x0[row, chosen]
    return x


def dus_levels_ref(start: int, end: int, base: int, skip: int) -> list[list[int]]:
    """The dilated groups of the block [start, end] (inclusive, absolute positions), in order."""
    size = end - start + 1
    if base == 1:
        return [list(range(start, end + 1))]
    revealed: set[int] = set()
    levels = []
    stride = size // (base ** skip)
    while stride >= 1:
        level = [i for i in range(start, end + 1) if (i - start) % stride == 0 and i not in revealed]
        if level:
            levels.append(level)
            revealed.update(level)
        stride //= base
    leftover = [i for i in range(start, end + 1) if i not in revealed]
    if leftover:
        levels.append(leftover)
    if len(levels) >= 2 and len(levels[-1]) < len(levels[-2]):
        last = levels.pop()
        levels[-1] = levels[-1] + last
    return levels


@torch.no_grad()
def dus_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
            base: int = 2, skip: int = 1) -> tuple[Tensor, int]:
    """DUS at temperature 0, batch 1: per block, per level, one forward over the whole canvas and
    every position of the level set to the argmax. Returns (canvas (1, L), forwards)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    Lp = prompt.shape[1]
    x = torch.full((1, Lp + gen_length), mask_id, dtype=torch.long)
    x[:, :Lp] = prompt
    forwards = 0
    for block in range(gen_length // block_length):
        start = Lp + block * block_length
        for level in dus_levels_ref(start, start + block_length - 1, base, skip):
            if not (x == mask_id).any():
                break
            x0 = logits_fn(x, None).argmax(dim=-1)
            forwards += 1
            for pos in level:
                if x[0, pos] == mask_id:
                    x[0, pos] = x0[0, pos]
    return x, forwards


@torch.no_grad()
def klass_ref(logits_fn: LogitsFn, prompt: Tensor, *, steps: int, gen_length: int, block_length: int,
              mask_id: int, conf_threshold: float = 0.9, kl_threshold: float = 0.01,
              history: int = 2) -> tuple[Tensor, int]:
    """KLASS (``stable_confident_decode``, alg "klass", strategy "all") at temperature 0, batch 1:
    per block LLaDA's step counts; every forward, float64 p over the whole canvas, KL(p || p_prev)
    with 1e-12 in both logs appended to a per-position history that runs across blocks; ready =
    all of the last ``history`` KLs below ``kl_threshold`` (from step ``history`` - 1 of the block)
    and top-1 probability above ``conf_threshold``, masked and inside the block; commit every
    ready position, or else the step's count of the most confident masked block positions.
    Returns (canvas (1, L), forwards)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    Lp = prompt.shape[1]
    x = torch.full((1, Lp + gen_length), mask_id, dtype=torch.long)
    x[:, :Lp] = prompt
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    per_block = steps // num_blocks
    kl_hist = p_prev = None
    forwards = 0
    for block in range(num_blocks):
        start, end = Lp + block * block_length, Lp + (block + 1) * block_length
        counts = llada_transfer_counts(x[:, start:end] == mask_id, per_block)
        for t in range(per_block):
            mask_index = x == mask_id
            mask_index[:, :start] = False
            mask_index[:, end:] = False
            if not mask_index.any():
                break
            logits = logits_fn(x, None)
            forwards += 1
            p = F.softmax(logits.to(torch.float64), dim=-1)
            if p_prev is None:
                p_prev = torch.zeros_like(p)
                kl_hist = torch.zeros(*p.shape[:2], history, dtype=torch.float64)
            x0 = p.argmax(dim=-1)
            conf = p.gather(-1, x0[..., None]).squeeze(-1)
            kl = (p * (torch.log(p + 1e-12) - torch.log(p_prev + 1e-12))).sum(-1)
            kl_hist = torch.roll(kl_hist, shifts=-1, dims=-1)
            kl_hist[..., -1] = kl
            p_prev = p.clone()
            stable = (kl_hist < kl_threshold).all(-1) if t >= history - 1 else torch.zeros_like(mask_index)
            ready = stable & (conf > conf_threshold) & mask_index
            if ready.any():
                chosen = ready[0].nonzero().flatten()
            else:
                # at most the masks left: the published top-k would also write columns that hold no mask
                chosen = _topk_lowest_first(torch.where(mask_index, conf, -torch.inf)[0],
                                            min(int(counts[0, t]), int(mask_index.sum())))
            x[0, chosen] = x0[0, chosen]
    return x, forwards


@torch.no_grad()
def slowfast_ref(logits_fn: LogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
                 explore: int = 6, tau_min: float = 0.3, tau_high: float = 0.9, window: int = 2,
                 std_max: float = 1.0) -> tuple[Tensor, int]:
    """SlowFast (``generate_slow_fast_sampling``) at temperature 0, batch 1, in the logits' dtype:
    per block, sub-cycles of ``explore`` exploration forwards (span estimate from the farthest mask
    at >= ``tau_min``, settled by the population std of the last ``window`` estimates, else the
    floor of their mean; commits: every mask >= ``tau_high`` of the rest of the block when two or
    more, else the top one), then fast forwards over the span, the second on run on the canvas cut
    after the span. Returns (canvas (1, L), forwards, idle), idle counting the exploration forwards
    run on a block with no mask left (the reference finishes an exploration phase regardless)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    forwards = idle = 0

    def scores(length=None):
        nonlocal forwards
        forwards += 1
        logits = logits_fn(x if length is None else x[:, :length], None)[0]
        p = F.softmax(logits, dim=-1)
        x0 = p.argmax(-1)
        conf = p.gather(-1, x0[:, None]).squeeze(-1)
        return x0, torch.where(x[0, :logits.shape[0]] == mask_id, conf, -torch.inf)

    def commit(x0, conf, lo, hi):
        window_conf = conf[lo:hi]
        masked = x[0, lo:hi] == mask_id
        if not masked.any():
            return
        high = masked & (window_conf >= tau_high)
        chosen = high.nonzero().flatten() if int(high.sum()) > 1 else _topk_lowest_first(window_conf, 1)
        x[0, lo + chosen] = x0[lo + chosen]

    for b in range(gen_length // block_length):
        bs = P + b * block_length
        be = bs + block_length
        last, cur = 0, block_length
        while (x[0, bs:be] == mask_id).any():
            settled, hist = False, []
            for k in range(explore):
                idle += not (x[0, bs:be] == mask_id).any()
                x0, conf = scores()
                if not settled:
                    lo = bs + last
                    hits = ((conf[lo:be] >= tau_min) & (x[0, lo:be] == mask_id)).nonzero().flatten()
                    inc = (int(hits[-1]) + 1 if len(hits) else 1) if be > lo else 0
                    est = min(max(last + inc, 1), block_length)
                    hist = (hist + [est])[-window:]
                    if len(hist) >= window:
                        mean = sum(hist) / len(hist)
                        std = (sum((h - mean) ** 2 for h in hist) / len(hist)) ** 0.5
                        if std < std_max:
                            cur, settled = est, True
                        else:
                            cur, settled = min(max(int(mean), 1), block_length), k == explore - 1
                commit(x0, conf, bs + last, be)
            n = 0
            while (x[0, bs + last:bs + cur] == mask_id).any():
                n += 1
                x0, conf = scores(None if n == 1 else bs + cur)
                commit(x0, conf, bs + last, bs + cur)
            last = cur
    return x, forwards, idle


ShadowLogitsFn = Callable[[Tensor, Tensor, Tensor], Tensor]


@torch.no_grad()
def wino_ref(logits_fn: ShadowLogitsFn, prompt: Tensor, *, gen_length: int, block_length: int, mask_id: int,
             threshold: float = 0.6, threshold_back: float = 0.9, max_forwards: int = 10_000) -> tuple[Tensor, int, int]:
    """WINO (``decoding_wino``) at temperature 0, batch 1, float64 probabilities. The canvas is the
    prompt, the generation region and a shadow block of ``block_length`` masks; ``logits_fn(x,
    attention_mask (1, 1, L, L) bool, position_ids (L,))`` is the patched LLaDA forward. The mask
    token's logit is set to -inf before every argmax and softmax (dllm's scoring convention; the
    reference leaves it, which a trained LLaDA never picks). Returns (canvas without the shadow
    (1, P + G), forwards, tokens masked again)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    P, G, B = prompt.shape[1], gen_length, block_length
    L = P + G + B
    x = torch.full((1, L), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    forwards = remasked = 0
    for k in range(G // B):
        s, e = P + k * B, P + (k + 1) * B
        position_ids = torch.cat([torch.arange(P + G), torch.arange(s, e)])
        mask = torch.ones(1, 1, L, L, dtype=torch.bool)
        mask[:, :, :, P + G:] = False
        mask[:, :, P + G:, P + G:] = True
        mask[:, :, P + G:, s:e] = ~torch.eye(B, dtype=torch.bool)
        M = x == mask_id
        M[:, e:] = False
        U = torch.zeros(1, L, dtype=torch.bool)
        U[:, P + G:] = ~M[:, s:e]
        last_accept = 30
        while M.any():
            assert forwards < max_forwards, "no end"
            max_accept = min(max(int(int(M.sum()) * 0.7), 5), 20)
            logits = logits_fn(x, mask, position_ids).double()
            logits[..., mask_id] = -torch.inf
            forwards += 1
            x0 = logits.argmax(-1)
            x0[:, P + G:][U[:, P + G:]] = x[:, s:e][U[:, P + G:]]
            p = F.softmax(logits, dim=-1)
            x0_p = p.gather(-1, x0[..., None]).squeeze(-1)
            x0 = torch.where(M, x0, x)
            conf = torch.where(M, x0_p, -torch.inf)
            conf_back = torch.where(U, x0_p, torch.inf)
            T = conf > threshold
            if int(T.sum()) > max_accept:
                T = torch.zeros_like(T)
                T.view(-1)[_topk_lowest_first(conf.view(-1), max_accept)] = True
            elif not T.any():
                T = torch.zeros_like(T)
                T.view(-1)[conf.view(-1).argmax()] = True
            x[T] = x0[T]
            n_acc = int(T.sum())
            R = torch.zeros_like(U)
            if n_acc > 1:
                R = conf_back < threshold_back
                if int(R.sum()) >= last_accept:
                    R = torch.zeros_like(U)
                    R.view(-1)[_topk_lowest_first(-conf_back.view(-1), last_accept - 1)] = True
            Rr = torch.zeros_like(M)
            Rr[:, s:e] = R[:, P + G:]
            x[Rr] = mask_id
            remasked += int(Rr.sum())
            M[T] = False
            M[Rr] = True
            U[:, P + G:] |= T[:, s:e]
            U[R] = False
            last_accept = n_acc
    return x[:, :P + G], forwards, remasked


@torch.no_grad()
def remdm_ref(logits_fn: LogitsFn, prompt: Tensor, *, steps: int, gen_length: int, block_length: int, mask_id: int,
              remdm_steps: int = 1, remdm_number: int = 1) -> tuple[Tensor, int, int]:
    """ParallelBench's ``llada_remdm_sample`` at temperature 0, batch 1, float64 probabilities, the
    mask token's logit set to -inf (dllm's convention). Per block: LLaDA's even split of the block's
    masks over steps / blocks, with ``remdm_steps`` revision steps inserted after step
    max(min(int(7/8 block_length), block_length - 1), 1); a revision step masks the
    ``remdm_number`` lowest cached confidences of the block's written tokens and re-decodes that
    many. Returns (canvas, forwards, tokens masked again)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    n_blocks = gen_length // block_length
    assert steps % n_blocks == 0
    per_block = steps // n_blocks
    at = max(min(int(block_length * 7 / 8), block_length - 1), 1)
    kinds = [False] * per_block
    kinds[at:at] = [True] * remdm_steps
    forwards = remasked = 0
    for b in range(n_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        cache = torch.full((1, x.shape[1]), torch.inf, dtype=torch.float64)
        counts = llada_transfer_counts(x[:, s:e] == mask_id, per_block)[0].tolist()
        for revise in kinds:
            if revise:
                written = torch.isfinite(cache[0])
                idx = _topk_lowest_first(-cache[0], min(remdm_number, int(written.sum())))
                x[0, idx] = mask_id
                cache[0, idx] = torch.inf
                remasked += len(idx)
                k = remdm_number
            else:
                k = counts.pop(0)
            masked = x == mask_id
            logits = logits_fn(x, None).double()
            logits[..., mask_id] = -torch.inf
            forwards += 1
            p = F.softmax(logits, dim=-1)
            x0 = p.argmax(-1)
            x0_p = p.gather(-1, x0[..., None]).squeeze(-1)
            x0_p[:, e:] = -torch.inf
            x0 = torch.where(masked, x0, x)
            conf = torch.where(masked, x0_p, -torch.inf)
            chosen = _topk_lowest_first(conf[0], k)
            x[0, chosen] = x0[0, chosen]
            cache[0, chosen] = conf[0, chosen]
    return x, forwards, remasked


@torch.no_grad()
def rcr_ref(logits_fn: LogitsFn, prompt: Tensor, *, steps: int, gen_length: int, block_length: int,
            mask_id: int) -> tuple[Tensor, int, int]:
    """ParallelBench's ``generate_dlm`` with ``overtime_conf=True`` and the linear MaskGIT schedule,
    temperature 0, batch 1, the mask token's logit set to -inf (dllm's convention), probabilities in
    the logits' dtype. Returns (canvas, forwards, tokens masked again)."""
    assert prompt.shape[0] == 1 and gen_length % block_length == 0
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    n_blocks = gen_length // block_length
    per_block = max(1, steps // n_blocks)
    overtime = torch.zeros(x.shape, dtype=torch.float64)
    forwards = remasked = 0
    for b in range(n_blocks):
        e = P + (b + 1) * block_length
        total = int((x[:, e - block_length:e] == mask_id).sum())
        ratios = [min(max(1 - (t + 1) / per_block, 1e-6), 1.0) for t in range(per_block)]
        cumulative = [total - int(torch.floor(torch.tensor(total * r, dtype=torch.float64))) for r in ratios]
        counts = [cumulative[0]] + [cumulative[t] - cumulative[t - 1] for t in range(1, per_block)]
        for i in range(per_block):
            masked = x == mask_id
            logits = logits_fn(x, None)
            logits[..., mask_id] = -torch.inf
            forwards += 1
            x0 = logits.argmax(-1)
            x0_p = F.softmax(logits, dim=-1).gather(-1, x0[..., None]).squeeze(-1).double()
            x0_p[:, e:] = -torch.inf
            x0 = torch.where(masked, x0, x)
            conf = torch.where(masked, x0_p, -torch.inf)
            chosen = _topk_lowest_first(conf[0], sum(counts[i:]))
            x[0, chosen] = x0[0, chosen]
            overtime[0, chosen] = conf[0, chosen]
            if i != per_block - 1:
                running = torch.where(overtime[0] == 0.0, 1.0, overtime[0])
                again = _topk_lowest_first(-running, sum(counts[i + 1:]))
                remasked += int((x[0, again] != mask_id).sum())
                x[0, again] = mask_id
    return x, forwards, remasked
