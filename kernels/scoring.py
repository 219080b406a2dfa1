"""Token scoring: from logits at the positions a sampler asked for, the candidate token and the
statistics parallel-decoding rules read (its probability, top-2 margin, entropy, raw top-2 logit
gap).

`token_scores_ref` is the plain torch reference. It materialises the softmax of only the asked-for
positions, in `score_dtype` (float32 by default; float64 for the Fast-dLLM-style float64
confidence), and computes the optional statistics only when a sampler asks for them.

Temperature > 0 picks the candidate by Gumbel-max in float64 as the LLaDA reference does:
argmax(exp(l) / (-log u)^T), computed in the equivalent log form argmax(l - T log(-log u)) so large
logits cannot overflow. The confidence is read from the un-tempered distribution.

`token_scores_triton` computes the same statistics in one pass over the vocabulary per position
(Triton kernel `_token_scores_fwd_kernel`), keeping per lane a running maximum, the first index
reaching it, the second-best logit, S = sum exp(l - max) and W = sum exp(l - max) (l - max), from
which prob = exp(l_token - max) / S, margin = (1 - exp(second - max)) / S, entropy = log S - W / S
and the logit gap follow; no softmax of (positions, vocab) is ever materialised. It reads fp16,
bf16 or fp32 logits, computes in fp32 and returns the statistics in `score_dtype` (so a float64
request gets fp32 precision; ties that only float64 would separate may resolve differently). Long
vocabularies are split into ranges handled by separate programs and merged by a second kernel.

Its Gumbel-max sampling draws one 32-bit Philox number per logit from (seed, row * V + column)
(`tl.randint`), with the seed itself drawn from the request's torch.Generator. The sampled tokens
therefore differ from the reference's torch.Generator stream, but follow the same distribution,
softmax(l / T), and depend only on the seed and the logits (not on the launch configuration). The
noise is g = -log(-log1p(-u)) in fp32 with u = (n + 1/2) 2^-32 (n the 32-bit draw), capped at
1 - 2^-24: g spans about [-2.8, 22.9] (the float64 reference: [-3.6, 36.7]). The Gumbel mass
below -2.8 (6e-8) is clipped onto it and the mass above 22.9 (1e-10) is missing; the sampled
distribution is otherwise exact up to fp32 rounding of l - T log E.

`token_scores` dispatches: the kernel on CUDA tensors when triton is installed, the reference
elsewhere; `DLLM_SCORING=torch|triton|auto` (or `impl=`) overrides. See docs/kernels.md §Token scoring.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import HAS_TRITON, chosen_impl, launching, require_triton, triton_runs_on

if HAS_TRITON:
    import triton
    import triton.language as tl

OPTIONAL_FIELDS = frozenset({"prob", "margin", "entropy", "logit_gap"})


@dataclass
class TokenScores:
    """Per-position statistics, each (B, Q); optional ones are None unless asked for.

    token:     candidate token (argmax, first maximum on ties; or the Gumbel-max sample)
    prob:      softmax probability of `token` (un-tempered)
    margin:    top-1 minus top-2 probability
    entropy:   entropy of the softmax, in nats
    logit_gap: raw top-1 minus top-2 logit
    logits:    (B, Q, V) the aligned logits, only when asked for
    top:       the largest logit in `score_dtype` (NaN where a logit is NaN); `finite()` checks it
    """

    token: torch.Tensor
    prob: torch.Tensor | None = None
    margin: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    logit_gap: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    top: torch.Tensor | None = None

    def finite(self) -> torch.Tensor:
        """A 0-dim bool tensor, False when a position had a NaN or +inf logit or no finite one
        (for a caller that asked the scoring not to check and reads it later)."""
        return (self.top.abs() < float("inf")).all()     # NaN compares False, as +-inf does


def _raise_not_finite(top: torch.Tensor) -> None:
    bad = (~torch.isfinite(top)).nonzero()[0].tolist()
    raise FloatingPointError(f"model produced NaN/inf logits (first bad position {bad}, or every logit -inf); "
                             f"check the dtype (float16 can overflow) and the checkpoint weights")


def token_scores_ref(logits: torch.Tensor, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                     score_dtype: torch.dtype = torch.float32, fields=OPTIONAL_FIELDS,
                     keep_logits: bool = False, check_finite: bool = True) -> TokenScores:
    """Reference scoring. logits: (B, Q, V) in any float dtype; -inf marks a suppressed token.

    fields: which statistics besides the token to compute ("prob", "margin", "entropy", "logit_gap");
        the softmax is materialised only when one of them needs it.
    NaN or +inf logits (or a position whose every logit is -inf) raise FloatingPointError, read
    on the host; with check_finite=False the caller checks `TokenScores.finite()` when it reads
    the device anyway.
    """
    fields = frozenset(fields)
    unknown = fields - OPTIONAL_FIELDS
    if unknown:
        raise ValueError(f"unknown score field(s) {sorted(unknown)}; valid: {sorted(OPTIONAL_FIELDS)}")
    if logits.shape[-1] == 0:
        raise ValueError("logits have an empty vocabulary dimension (V = 0)")
    lf = logits.to(score_dtype)                                           # (B, Q, V)
    top1, argmax = lf.max(dim=-1)                                         # NaN propagates into top1
    if check_finite and lf.numel() and not bool(torch.isfinite(top1).all()):
        _raise_not_finite(top1)
    if temperature > 0:
        u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
        token = (logits.double() - temperature * torch.log(-torch.log(u))).argmax(-1)  # (B, Q)
    else:
        token = argmax                                                    # first maximum on ties
    out = TokenScores(token=token, logits=logits if keep_logits else None, top=top1)
    probs = torch.softmax(lf, dim=-1) if fields & {"prob", "margin", "entropy"} else None  # (B, Q, V)
    if "prob" in fields:
        out.prob = probs.gather(-1, token[..., None]).squeeze(-1)
    if "margin" in fields:
        top_p = probs.topk(min(2, probs.shape[-1]), dim=-1).values
        out.margin = top_p[..., 0] - (top_p[..., 1] if top_p.shape[-1] > 1 else 0)
    if "logit_gap" in fields:
        top_l = lf.topk(min(2, lf.shape[-1]), dim=-1).values
        out.logit_gap = top_l[..., 0] - (top_l[..., 1] if top_l.shape[-1] > 1 else top_l[..., 0])
    if "entropy" in fields:
        out.entropy = torch.special.entr(probs).sum(-1)                   # -sum p log p, 0 log 0 = 0
    return out


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
IMPLS = ("auto", "torch", "triton")

if HAS_TRITON:

    @triton.jit
    def _top_merge(m, i1, m2, s, t, nan, gsc, gtok, gx, BIG: tl.constexpr):
        """Reduce per-lane (or per-split) online statistics along axis 1 (one row per axis-0 entry)."""
        top = tl.max(m, 1)
        first = tl.min(tl.where(m == top[:, None], i1, BIG), 1)               # first maximum on ties
        chosen = (i1 == first[:, None]) & (m == top[:, None])
        second = tl.maximum(tl.max(m2, 1), tl.max(tl.where(chosen, float("-inf"), m), 1))
        top_use = tl.where(top == float("-inf"), 0.0, top)
        live = m > float("-inf")
        diff = tl.where(live, m, top_use[:, None]) - top_use[:, None]          # 0 for empty lanes, no -inf - -inf
        diff = tl.maximum(diff, -3.0e38)                                       # finite where m - top overflows
        w = tl.where(live, tl.math.exp2(diff * 1.4426950408889634), 0.0)
        s_all = tl.sum(s * w, 1)
        t_all = tl.sum(w * t + (w * diff) * s, 1)
        g_best = tl.max(gsc, 1)
        g_tok = tl.min(tl.where(gsc == g_best[:, None], gtok, BIG), 1)
        g_x = tl.max(tl.where((gtok == g_tok[:, None]) & (gsc == g_best[:, None]), gx, float("-inf")), 1)
        return top, first, second, s_all, t_all, tl.sum(nan, 1), g_best, g_tok, g_x

    @triton.jit
    def _token_scores_fwd_kernel(
        X, SEED, PartF, PartI,
        R, Q, V, vocab_per_split, n_splits, temperature,
        stride_xb, stride_xq, stride_xv,
        BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, SAMPLE: tl.constexpr,
    ):
        # One pass over a vocabulary range of BLOCK_R positions. Every lane keeps its own online
        # state (max m, its first index, second best m2, s = sum e^(l-m), t = sum e^(l-m)(l-m),
        # NaN count, Gumbel best), so the loop needs one exp per logit and no cross-lane work:
        #   l <= m:  s += e^(l-m), t += e^(l-m)(l-m)
        #   l >  m:  s' = s e^(m-l) + 1, t' = e^(m-l)(t - (l-m) s), m' = l
        pid_r = tl.program_id(0)
        pid_s = tl.program_id(1)
        offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        mask_r = offs_r < R
        row_ptr = X + (offs_r // Q).to(tl.int64) * stride_xb + (offs_r % Q).to(tl.int64) * stride_xq
        m = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
        m2 = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
        i1 = tl.full([BLOCK_R, BLOCK_V], 2147483647, dtype=tl.int32)
        s = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
        t = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
        nan = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.int32)
        gsc = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
        gtok = tl.full([BLOCK_R, BLOCK_V], 2147483647, dtype=tl.int32)
        gx = tl.full([BLOCK_R, BLOCK_V], float("-inf"), dtype=tl.float32)
        if SAMPLE:
            seed = tl.load(SEED)
        start = pid_s * vocab_per_split
        end = tl.minimum(start + vocab_per_split, V)
        for v0 in range(start, end, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            mask = mask_r[:, None] & (offs_v < end)[None, :]
            x = tl.load(row_ptr[:, None] + offs_v[None, :].to(tl.int64) * stride_xv, mask=mask,
                        other=float("-inf")).to(tl.float32)
            nan += (x != x).to(tl.int32)
            valid = x > float("-inf")                                         # False for NaN too
            up = x > m
            # d = x - m, made finite where either side is -inf (those entries are masked out below).
            m_safe = tl.where(m > float("-inf"), m, tl.where(valid, x, 0.0))
            # Finite even where x - m overflows (logits near the float32 limits of both signs), so
            # that e * d is 0, not NaN, where e underflows.
            d = tl.minimum(tl.maximum(tl.where(valid, x, m_safe) - m_safe, -3.0e38), 3.0e38)
            e = tl.math.exp2(-tl.abs(d) * 1.4426950408889634)
            t = tl.where(up, e * t - tl.where(s > 0.0, (e * d) * s, 0.0), tl.where(valid, t + e * d, t))
            s = tl.where(up, s * e + 1.0, tl.where(valid, s + e, s))
            m2 = tl.where(up, m, tl.where(x > m2, x, m2))
            i1 = tl.where(up, offs_v[None, :], i1)
            m = tl.where(up, x, m)
            if SAMPLE:
                # Gumbel noise g = -log(E), E = -log(1 - u) ~ Exp(1); for small u the series of
                # -log1p(-u) keeps E accurate where 1 - u would round to 1.
                n = tl.randint(seed, offs_r.to(tl.int64)[:, None] * V + offs_v[None, :])
                u = tl.minimum((n.to(tl.float32) + 0.5) * 2.3283064365386963e-10, 0.99999994)
                series = u * (1.0 + u * (0.5 + u * (0.3333333333333333 + u * 0.25)))
                ex = tl.where(u < 0.0078125, series, -tl.log(1.0 - u))
                score = tl.where(valid, x - temperature * tl.log(ex), float("-inf"))
                better = score > gsc
                gsc = tl.where(better, score, gsc)
                gtok = tl.where(better, offs_v[None, :], gtok)
                gx = tl.where(better, x, gx)
        top, first, second, s_all, t_all, nan_all, g_best, g_tok, g_x = _top_merge(
            m, i1, m2, s, t, nan, gsc, gtok, gx, 2147483647)
        # Partials: PartF (6, R, S) = top, second, s, t, Gumbel best score, its logit; PartI (3, R, S)
        # = first index, NaN count, Gumbel token.
        at = offs_r * n_splits + pid_s
        plane = R * n_splits
        tl.store(PartF + at, top, mask=mask_r)
        tl.store(PartF + plane + at, second, mask=mask_r)
        tl.store(PartF + 2 * plane + at, s_all, mask=mask_r)
        tl.store(PartF + 3 * plane + at, t_all, mask=mask_r)
        tl.store(PartF + 4 * plane + at, g_best, mask=mask_r)
        tl.store(PartF + 5 * plane + at, g_x, mask=mask_r)
        tl.store(PartI + at, first, mask=mask_r)
        tl.store(PartI + plane + at, nan_all, mask=mask_r)
        tl.store(PartI + 2 * plane + at, g_tok, mask=mask_r)

    @triton.jit
    def _token_scores_merge_kernel(
        PartF, PartI, Token, Prob, Margin, Entropy, Gap, Top,
        R, n_splits,
        BLOCK_R: tl.constexpr, SPLITS: tl.constexpr, SAMPLE: tl.constexpr, HAS_SECOND: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        mask_r = offs_r < R
        offs_s = tl.arange(0, SPLITS)
        mask = mask_r[:, None] & (offs_s < n_splits)[None, :]
        at = offs_r[:, None] * n_splits + offs_s[None, :]
        plane = R * n_splits
        m = tl.load(PartF + at, mask=mask, other=float("-inf"))
        m2 = tl.load(PartF + plane + at, mask=mask, other=float("-inf"))
        s = tl.load(PartF + 2 * plane + at, mask=mask, other=0.0)
        t = tl.load(PartF + 3 * plane + at, mask=mask, other=0.0)
        gsc = tl.load(PartF + 4 * plane + at, mask=mask, other=float("-inf"))
        gx = tl.load(PartF + 5 * plane + at, mask=mask, other=float("-inf"))
        i1 = tl.load(PartI + at, mask=mask, other=2147483647)
        nan = tl.load(PartI + plane + at, mask=mask, other=0)
        gtok = tl.load(PartI + 2 * plane + at, mask=mask, other=2147483647)
        top, first, second, s_all, t_all, nan_all, g_best, g_tok, g_x = _top_merge(
            m, i1, m2, s, t, nan, gsc, gtok, gx, 2147483647)
        if SAMPLE:
            token = g_tok
            x_token = g_x
        else:
            token = first
            x_token = top
        token = tl.where(token == 2147483647, 0, token)     # no finite logit: token 0, as torch's argmax
        s_safe = tl.where(s_all > 0.0, s_all, 1.0)
        top_use = tl.where(top > float("-inf"), top, 0.0)                    # rows with no finite logit fail later
        prob = tl.math.exp2((x_token - top_use) * 1.4426950408889634) / s_safe
        margin = (1.0 - tl.math.exp2((second - top_use) * 1.4426950408889634)) / s_safe
        entropy = tl.math.log2(s_safe) * 0.6931471805599453 - t_all / s_safe
        if HAS_SECOND:
            gap = top_use - second
        else:
            gap = top_use * 0.0
        tl.store(Token + offs_r, token.to(tl.int64), mask=mask_r)
        tl.store(Prob + offs_r, prob, mask=mask_r)
        tl.store(Margin + offs_r, margin, mask=mask_r)
        tl.store(Entropy + offs_r, entropy, mask=mask_r)
        tl.store(Gap + offs_r, gap, mask=mask_r)
        tl.store(Top + offs_r, tl.where(nan_all > 0, float("nan"), top), mask=mask_r)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pick_launch(R: int, V: int, device: torch.device, num_splits: int | None, block_v: int | None):
    """(BLOCK_R, BLOCK_V, splits, vocabulary per split): 1024-logit tiles over long
    vocabularies, up to 2048 logits of several rows per program over short ones; on a GPU, enough
    vocabulary ranges for two programs per SM, each at least 4 tiles long."""
    bv = block_v or min(1024, max(16, triton.next_power_of_2(V)))
    br = min(max(1, 2048 // bv) if bv < 1024 else 1, triton.next_power_of_2(R))
    tiles = triton.cdiv(V, bv)
    if num_splits is None:
        row_programs = triton.cdiv(R, br)
        num_splits = 1
        if device.type == "cuda":
            num_splits = max(1, min(triton.cdiv(2 * _sm_count(device), row_programs), tiles // 4))
    splits = max(1, min(num_splits, tiles))
    per_split = triton.cdiv(tiles, splits) * bv
    splits = triton.cdiv(V, per_split)                    # no empty trailing range
    return br, bv, splits, per_split


def token_scores_fwd(logits: torch.Tensor, *, temperature: float = 0.0, seed: torch.Tensor | None = None,
                     out: tuple[torch.Tensor, ...] | None = None, num_splits: int | None = None,
                     block_v: int | None = None) -> tuple[torch.Tensor, ...]:
    """Launch the scoring kernels on validated (B, Q, V) logits.

    seed: int64 tensor of one element on the logits' device (needed when temperature > 0).
    out: optional (token int64, prob, margin, entropy, logit_gap, top fp32), each (B, Q), written in place.
    num_splits / block_v override the launch heuristics (tests, benchmarks).
    Returns (token, prob, margin, entropy, logit_gap, top); `top` is the largest logit, NaN when the
    position holds a NaN (the caller checks it is finite).
    """
    B, Q, V = logits.shape
    R = B * Q
    dev = logits.device
    if out is None:
        out = (torch.empty(B, Q, dtype=torch.long, device=dev),
               *(torch.empty(B, Q, dtype=torch.float32, device=dev) for _ in range(5)))
    if R == 0:
        return out
    sample = temperature > 0
    if sample and (not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64 or seed.numel() != 1
                   or seed.device != dev):
        raise ValueError(f"temperature {temperature} > 0 needs `seed`: an int64 tensor of one element on {dev}, "
                         f"got {seed!r}")
    if block_v is not None and (block_v < 16 or block_v & (block_v - 1)):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    br, bv, splits, per_split = _pick_launch(R, V, dev, num_splits, block_v)
    part_f = torch.empty(6, R, splits, dtype=torch.float32, device=dev)
    part_i = torch.empty(3, R, splits, dtype=torch.int32, device=dev)
    seed_arg = seed if sample else part_i
    with launching("token_scores", dev):
        _token_scores_fwd_kernel[(triton.cdiv(R, br), splits)](
            logits, seed_arg, part_f, part_i, R, Q, V, per_split, splits, float(temperature), *logits.stride(),
            BLOCK_R=br, BLOCK_V=bv, SAMPLE=sample, num_warps=4,
        )
    mbr = min(64, triton.next_power_of_2(R))
    with launching("token_scores_merge", dev):
        _token_scores_merge_kernel[(triton.cdiv(R, mbr),)](
            part_f, part_i, *out, R, splits,
            BLOCK_R=mbr, SPLITS=triton.next_power_of_2(splits), SAMPLE=sample, HAS_SECOND=V > 1, num_warps=4,
        )
    return out


def _draw_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    # One int64 from the request's generator (on its own device), so the run stays reproducible
    # from its seed without a host-device synchronisation.
    gdev = generator.device if generator is not None else device
    seed = torch.randint(0, 2 ** 62, (1,), generator=generator, device=gdev, dtype=torch.int64)
    return seed.to(device)


def _check_fields(fields) -> frozenset:
    fields = frozenset(fields)
    unknown = fields - OPTIONAL_FIELDS
    if unknown:
        raise ValueError(f"unknown score field(s) {sorted(unknown)}; valid: {sorted(OPTIONAL_FIELDS)}")
    return fields


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0 \
            or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    return float(temperature)


def token_scores_triton(logits: torch.Tensor, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                        seed: int | None = None, score_dtype: torch.dtype = torch.float32, fields=OPTIONAL_FIELDS,
                        keep_logits: bool = False, check_finite: bool = True) -> TokenScores:
    """`token_scores_ref` in one fused pass over the vocabulary (Triton).

    logits: (B, Q, V) float16, bfloat16 or float32, any strides; -inf marks a suppressed token.
    temperature > 0 samples by Gumbel-max with Philox noise seeded by `seed` (an int) or, without
        one, by an int64 drawn from `generator` (the default generator of the logits' device when
        None); the tokens follow softmax(l / T) but differ from the reference's draws.
    score_dtype: dtype of the returned statistics (computed in fp32 whatever it is).
    fields / keep_logits: as in `token_scores_ref`; statistics not asked for are None.
    NaN or +inf logits (or a position whose every logit is -inf) raise FloatingPointError (with
    check_finite=False the caller checks `TokenScores.finite()`, as for the reference).
    Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1.
    """
    fields = _check_fields(fields)
    temperature = _check_temperature(temperature)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a 3-D tensor (B, Q, V), got {got}")
    if logits.dtype not in KERNEL_DTYPES:
        raise ValueError(f"logits dtype {logits.dtype} is not supported by the scoring kernel; allowed: float16, "
                         f"bfloat16, float32")
    if logits.shape[-1] == 0:
        raise ValueError("logits have an empty vocabulary dimension (V = 0)")
    if not isinstance(score_dtype, torch.dtype) or not score_dtype.is_floating_point:
        raise ValueError(f"score_dtype must be a floating torch.dtype, got {score_dtype!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63):
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
    require_triton(logits.device, "the token scoring kernel")
    seed_t = None
    if temperature > 0:
        seed_t = (torch.tensor([seed], dtype=torch.int64, device=logits.device) if seed is not None
                  else _draw_seed(generator, logits.device))
    token, prob, margin, entropy, gap, top = token_scores_fwd(logits, temperature=temperature, seed=seed_t)
    if check_finite and top.numel() and not bool(torch.isfinite(top).all()):
        _raise_not_finite(top)
    out = TokenScores(token=token, logits=logits if keep_logits else None, top=top.to(score_dtype))
    for name, value in (("prob", prob), ("margin", margin), ("entropy", entropy), ("logit_gap", gap)):
        if name in fields:
            setattr(out, name, value.to(score_dtype))
    return out


def token_scores(logits: torch.Tensor, *, impl: str | None = None, **kwargs) -> TokenScores:
    """Score `logits` (B, Q, V) with the fastest available implementation; returns `TokenScores`.

    impl: "auto" (the Triton kernel for fp16/bf16/fp32 CUDA tensors when triton is installed, the
        torch reference otherwise), "torch", or "triton" (the kernel, e.g. on CPU tensors under
        TRITON_INTERPRET=1; an error where it cannot run). None reads DLLM_SCORING (default "auto").
    Other keyword arguments are those of `token_scores_ref` (temperature, generator, score_dtype,
    fields, keep_logits, check_finite). The kernel's sampled tokens differ from the reference's (module docstring).
    """
    impl = chosen_impl(impl, "DLLM_SCORING", IMPLS, "scoring")
    _check_temperature(kwargs.get("temperature", 0.0))
    if impl == "auto":
        use_kernel = (isinstance(logits, torch.Tensor) and logits.is_cuda and logits.dtype in KERNEL_DTYPES
                      and triton_runs_on(logits.device))
        impl = "triton" if use_kernel else "torch"
    if impl == "triton":
        return token_scores_triton(logits, **kwargs)
    return token_scores_ref(logits, **kwargs)
