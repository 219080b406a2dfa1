"""Bidirectional flash attention for the cache layout (forward only), beside its torch reference.

What: the queries of the positions recomputed this step attend to every key of the per-layer
buffers, with no causal mask:

    q (B, H, P, D), k/v (B, H_kv, L, D), key_valid (B, L) -> out (B, H, P, D)
    out[b, h, p] = sum_l softmax_l(scale * q[b, h, p] . k[b, h // G, l]) v[b, h // G, l]

over the keys with key_valid[b, l] True (left padding is False), G = H / H_kv (grouped-query
attention, any ratio). It is the attention backend `triton` of `dllm.attention`.

How: the G query heads sharing a K/V head are packed into one row dimension of G * P rows, so a
program reads each K/V tile once for the whole group (P is small in decoding: a block of 32). The
online softmax runs in base 2 (`exp2`, scale * log2(e) folded into the scores), accumulating in
fp32. When (query tiles x B x H_kv) programs cannot fill the GPU, the keys are split into ranges
handled by separate programs (split-K, as in decoding kernels), each writing a normalised partial
output and its log-sum-exp; a second kernel merges them.

Dtypes: fp16, bf16 and fp32 (q, k, v alike); the output has q's dtype. fp32 inputs use IEEE fp32
dots, not TF32, so results match torch's fp32 attention.
Head dims: any D <= 256; tiles are padded to the next power of two >= 16 with masked loads.
LLaDA-8B and Dream-7B use 128.
Semantics at the edges: a query row with no valid key (a fully padded row, or L == 0) gets zeros,
where softmax would give NaN. Keys with key_valid False are never read as values, so padding
entries of a cache may hold anything, NaN included.

Launch configurations (`CONFIGS`, `_pick_config`, `_pick_splits`) follow the usual flash-attention
forward settings and are not tuned for a particular GPU; `benchmarks/bench_kernels.py --configs`
times each of them at the real models' shapes (timings: docs/kernels.md §Measurements). With
DLLM_ATTENTION_LAUNCH=tuned, each shape's first call times every configuration with 1, 2, 4, ...
key ranges instead and the shape keeps the fastest (`tuned_launch`).
Under TRITON_INTERPRET=1 bf16 tiles are converted to fp32 before the dots, since the interpreter
gets bf16 arithmetic wrong, and the output is written in fp32 and rounded to bf16 by torch (the
interpreter truncates); on a GPU bf16 dots run natively.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch

from . import HAS_TRITON, INTERPRET, chosen_impl, interpreter_bf16, launching, on_device, require_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


# --------------------------------------------------------------------------------------------
# reference
# --------------------------------------------------------------------------------------------
def bidir_attn_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor | None = None,
                   scale: float | None = None, *, upcast: bool = True, reorder_ops: bool = False) -> torch.Tensor:
    """Plain torch bidirectional attention with the kernel's semantics.

    q: (B, H, P, D); k, v: (B, H_kv, L, D) with H a multiple of H_kv; key_valid: (B, L) bool or None.
    scale: None = D ** -0.5.
    upcast: compute in fp32 and return fp32 (the accuracy reference); False computes in the inputs'
        dtype and returns it (what "the same computation in torch" costs in accuracy).
    reorder_ops: scale the keys instead of the queries, to see the error of reordering alone.
    Rows with no valid key give zeros.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                                  # (B, H, L, D)
    v = v.repeat_interleave(group, dim=1)                                  # (B, H, L, D)
    if reorder_ops:
        scores = q @ (k * scale).transpose(-1, -2)                         # (B, H, P, L)
    else:
        scores = (q * scale) @ k.transpose(-1, -2)                         # (B, H, P, L)
    if key_valid is not None:
        scores = scores.masked_fill(~key_valid[:, None, None, :], float("-inf"))
        v = v.masked_fill(~key_valid[:, None, :, None], 0.0)               # padding values are never read
    probs = torch.softmax(scores, dim=-1)
    if key_valid is not None:                                              # rows without keys: 0, not NaN;
        probs = probs.masked_fill(~key_valid.any(-1)[:, None, None, None], 0.0)   # a NaN input stays NaN
    return (probs.to(v.dtype) @ v).to(q.dtype)                             # (B, H, P, D)


# --------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _bidir_attn_fwd_kernel(
        Q, K, V, KEY_VALID, Out, PartO, PartLse,
        scale_log2, B, P, L, H, H_KV, GROUP, n_rows, keys_per_split,
        stride_qb, stride_qh, stride_qp, stride_qd,
        stride_kb, stride_kh, stride_kl, stride_kd,
        stride_vb, stride_vh, stride_vl, stride_vd,
        stride_mb, stride_ml,
        stride_ob, stride_oh, stride_op, stride_od,
        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_MASK: tl.constexpr, IS_SPLIT: tl.constexpr, DOT_F32: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)          # b * H_kv + kv head
        pid_s = tl.program_id(2)           # key range (split-K)
        b = (pid_bh // H_KV).to(tl.int64)  # b * stride can pass 2**31 in a large batch
        hk = pid_bh % H_KV
        # Packed rows: row r of this K/V head is query head hk * GROUP + r // P at position r % P.
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < n_rows
        h = hk * GROUP + offs_m // P
        p = offs_m % P
        offs_d = tl.arange(0, D_PAD)
        mask_d = offs_d < HEAD_DIM
        q_ptrs = Q + b * stride_qb + h[:, None] * stride_qh + p[:, None] * stride_qp + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        k_base = K + b * stride_kb + hk * stride_kh
        v_base = V + b * stride_vb + hk * stride_vh

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
        n_valid = tl.zeros([BLOCK_M], dtype=tl.int32)  # valid keys in this range (one batch row per program)
        start = pid_s * keys_per_split
        end = tl.minimum(start + keys_per_split, L)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            if HAS_MASK:
                ok = tl.load(KEY_VALID + b * stride_mb + offs_n * stride_ml, mask=mask_n, other=0)
                mask_n = mask_n & (ok != 0)
            n_valid += tl.sum(mask_n.to(tl.int32), 0)
            k = tl.load(k_base + offs_n[:, None] * stride_kl + offs_d[None, :] * stride_kd,
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            if DOT_F32:
                qk = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                qk = tl.dot(q, tl.trans(k))
            s = tl.where(mask_n[None, :], qk * scale_log2, float("-inf"))   # log2 units
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)           # no valid key yet: exp2(-inf) = 0
            alpha = tl.math.exp2(m_i - m_use)
            pr = tl.math.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            # Invalid keys are not read as values: a cache's padding entries may hold NaN.
            v = tl.load(v_base + offs_n[:, None] * stride_vl + offs_d[None, :] * stride_vd,
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            if DOT_F32:
                acc = acc * alpha[:, None] + tl.dot(pr, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v)
            m_i = m_new

        # Rows without keys: zeros. Decided by the mask, not by l_i, so that NaN scores stay NaN.
        has_keys = n_valid > 0
        l_safe = tl.where(has_keys, l_i, 1.0)
        o = tl.where(has_keys[:, None], acc / l_safe[:, None], 0.0)
        if IS_SPLIT:
            # Partial outputs (S, B * H, P, HEAD_DIM) and their log2-sum-exp (S, B * H, P), fp32.
            row = ((pid_s * B + b) * H + h) * P + p
            lse = tl.where(has_keys, m_i + tl.math.log2(l_safe), float("-inf"))
            tl.store(PartLse + row, lse, mask=mask_m)
            tl.store(PartO + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=mask_m[:, None] & mask_d[None, :])
        else:
            o_ptrs = Out + b * stride_ob + h[:, None] * stride_oh + p[:, None] * stride_op + offs_d[None, :] * stride_od
            tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])

    @triton.jit
    def _bidir_attn_combine_kernel(
        PartO, PartLse, Out, n_splits, BH, P, H,
        stride_ob, stride_oh, stride_op, stride_od,
        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_P: tl.constexpr,
    ):
        # out = sum_s 2^(lse_s - lse) o_s, lse = log2 sum_s 2^lse_s: the softmax over all keys.
        pid_p = tl.program_id(0)
        pid_bh = tl.program_id(1)          # b * H + h
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < P
        offs_d = tl.arange(0, D_PAD)
        mask_d = offs_d < HEAD_DIM
        lse_max = tl.full([BLOCK_P], float("-inf"), dtype=tl.float32)
        for s in range(n_splits):
            lse = tl.load(PartLse + (s * BH + pid_bh).to(tl.int64) * P + offs_p, mask=mask_p, other=float("-inf"))
            lse_max = tl.maximum(lse_max, lse, propagate_nan=tl.PropagateNan.ALL)
        m_use = tl.where(lse_max == float("-inf"), 0.0, lse_max)
        acc = tl.zeros([BLOCK_P, D_PAD], dtype=tl.float32)
        den = tl.zeros([BLOCK_P], dtype=tl.float32)
        for s in range(n_splits):
            row = (s * BH + pid_bh).to(tl.int64) * P + offs_p
            w = tl.math.exp2(tl.load(PartLse + row, mask=mask_p, other=float("-inf")) - m_use)
            o = tl.load(PartO + row[:, None] * HEAD_DIM + offs_d[None, :], mask=mask_p[:, None] & mask_d[None, :],
                        other=0.0)
            acc += w[:, None] * o
            den += w
        none = lse_max == float("-inf")                                  # no range held a valid key
        out = tl.where(none[:, None], 0.0, acc / tl.where(none, 1.0, den)[:, None])
        b = (pid_bh // H).to(tl.int64)
        h = pid_bh % H
        o_ptrs = Out + b * stride_ob + h * stride_oh + offs_p[:, None] * stride_op + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask_p[:, None] & mask_d[None, :])


# --------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttnConfig:
    """One launch configuration: tile sizes and the GPU scheduling hints (ignored when interpreting)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


# Small row counts (LLaDA: 32 queries of one head) want short query tiles; packed GQA groups
# (Dream: 7 heads x 32 queries) fill 64- or 128-row tiles; D = 256 halves the key tile. Two
# pipeline stages keep the largest (128 rows, D = 128, fp16) under 100 KB of shared memory, which
# consumer GPUs have; a GPU short of it for a configuration gets a retry with one stage.
CONFIGS = (
    AttnConfig(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
    AttnConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
    AttnConfig(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    AttnConfig(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
)


def _pick_config(n_rows: int, d_pad: int) -> AttnConfig:
    if d_pad > 128:
        return CONFIGS[3]
    if n_rows <= 32:
        return CONFIGS[0]
    return CONFIGS[1] if n_rows <= 128 else CONFIGS[2]


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pick_splits(programs: int, key_tiles: int, device: torch.device) -> int:
    """Key ranges per (query tile, row, K/V head): enough programs for one wave of the GPU, each
    range at least 4 key tiles long. One on the CPU (the interpreter runs programs in turn)."""
    if device.type != "cuda":
        return 1
    return max(1, min(_sm_count(device) // max(programs, 1), key_tiles // 4))


# -- launches tuned per shape ---------------------------------------------------------------------
LAUNCH_CHOICES = ("auto", "fixed", "tuned")


@dataclass(frozen=True)
class Launch:
    """A launch configuration and its number of key ranges (1: no split-K)."""

    config: AttnConfig
    splits: int


def launch_choice(choice: str | None = None) -> str:
    """How `bidir_attn` picks its launches: `choice`, else DLLM_ATTENTION_LAUNCH (default "auto").
    "fixed": `_pick_config` and `_pick_splits`; "tuned": each shape's fastest candidate, timed at
    the shape's first call (`tuned_launch`); "auto" is "fixed" (sdpa, the attention backend's
    `auto`, is faster than tuned launches at 512-1024 keys; docs/kernels.md §7)."""
    name = chosen_impl(choice, "DLLM_ATTENTION_LAUNCH", LAUNCH_CHOICES, "attention launch")
    return "fixed" if name == "auto" else name


def launch_candidates(head_dim: int, keys: int) -> list[Launch]:
    """Every configuration of `CONFIGS` for head dim `head_dim` (above 128 only those with 32-key
    tiles, as `_pick_config`), each with 1, 2, 4, ... key ranges while a range keeps at least two
    key tiles of the `keys`."""
    d_pad = max(16, 1 << (head_dim - 1).bit_length())
    configs = [c for c in CONFIGS if d_pad <= 128 or c.BLOCK_N <= 32]
    out = []
    for cfg in configs:
        key_tiles, splits = -(-keys // cfg.BLOCK_N), 1
        while True:
            out.append(Launch(cfg, splits))
            splits *= 2
            if key_tiles < 2 * splits:
                break
    return out


def shape_key(q: torch.Tensor, k: torch.Tensor, key_valid: torch.Tensor | None) -> tuple:
    """What a tuned launch is remembered by: device, dtype, H, H_kv, D, whether keys are masked,
    and the batch rows, queries and keys each rounded up to a power of two (the queries a step
    recomputes and the rows of a served batch change from step to step; a bucket keeps the launch
    its first shape was tuned with, and the number of tuned shapes stays small)."""
    B, H, P, D = q.shape
    return (q.device, q.dtype, H, k.shape[1], D, key_valid is not None,
            triton.next_power_of_2(B), triton.next_power_of_2(P), triton.next_power_of_2(k.shape[2]))


_TUNED: dict[tuple, Launch] = {}


def tuned_launches() -> dict[tuple, Launch]:
    """A copy of the launches tuned so far in this process, by `shape_key`."""
    return dict(_TUNED)


def clear_tuned_launches() -> None:
    """Forget every tuned launch (the next call of each shape tunes it again)."""
    _TUNED.clear()


def time_launch(fn, device: torch.device) -> float:
    """Milliseconds of one call of `fn` running on `device`: Triton's `do_bench` median on CUDA (5 ms
    of warm-up, 20 ms of repeats); elsewhere (the interpreter) the fastest of three timed calls."""
    if device.type == "cuda":
        import triton.testing
        with on_device(device):   # do_bench times on the current device's stream
            return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def tuned_launch(q, k, v, key_valid, scale, *, timer=None) -> Launch:
    """The fastest of `launch_candidates` for this call's shape: timed once per `shape_key`
    (`timer(fn) -> ms`, default `time_launch` on q's device; each candidate runs the real inputs
    into a scratch output) and remembered for later calls. Ties go to the earlier candidate (the
    order of `CONFIGS`, then fewer splits); a candidate the GPU lacks shared memory for is skipped."""
    key = shape_key(q, k, key_valid)
    known = _TUNED.get(key)
    if known is not None:
        return known
    timer = timer or functools.partial(time_launch, device=q.device)
    candidates = launch_candidates(q.shape[3], k.shape[2])
    times = []
    for c in candidates:
        try:
            times.append(timer(lambda c=c: bidir_attn_fwd(q, k, v, key_valid, scale, config=c.config,
                                                          num_splits=c.splits)))
        except triton.runtime.errors.OutOfResources:
            times.append(float("inf"))
    best = candidates[min(range(len(candidates)), key=times.__getitem__)]
    _TUNED[key] = best
    return best


def _launch_for(q, k, v, key_valid, scale) -> Launch | None:
    """The tuned launch of this shape under DLLM_ATTENTION_LAUNCH=tuned, tuning it first unless a
    CUDA graph is being captured or torch.compile traces (then a shape not tuned yet runs with the
    fixed picks); None for the fixed picks."""
    if launch_choice() != "tuned":
        return None
    known = _TUNED.get(shape_key(q, k, key_valid))
    if known is not None or torch.compiler.is_compiling():
        return known
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    return tuned_launch(q, k, v, key_valid, scale)


def _validate(q, k, v, key_valid, scale, out):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor ({'(B, H, P, D)' if name == 'q' else '(B, H_kv, L, D)'}), "
                             f"got {shape}")
    if q.dtype not in DTYPES:
        raise ValueError(f"q dtype {q.dtype} is not supported; allowed: float16, bfloat16, float32")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    B, H, P, D = q.shape
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not fit q shape {tuple(q.shape)}: "
                         f"expected (B={B}, H_kv, L, D={D})")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} is not supported; allowed: 1..{MAX_HEAD_DIM} (64 and 128 are the fast paths)")
    H_kv = k.shape[1]
    if H_kv == 0 or H % H_kv:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads H_kv={H_kv}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if key_valid is not None:
        if not isinstance(key_valid, torch.Tensor) or key_valid.dtype != torch.bool:
            raise ValueError(f"key_valid must be a bool tensor (B, L), got "
                             f"{key_valid.dtype if isinstance(key_valid, torch.Tensor) else type(key_valid).__name__}")
        if tuple(key_valid.shape) != (B, k.shape[2]):
            raise ValueError(f"key_valid shape {tuple(key_valid.shape)} != (B, L) = {(B, k.shape[2])} (a mask per "
                             f"query, as a block-causal model uses, needs the sdpa or eager backend)")
        if key_valid.device != q.device:
            raise ValueError(f"key_valid is on {key_valid.device}, q on {q.device}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            desc = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
                    else type(out).__name__)
            raise ValueError(f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
                             f"{q.device}; got {desc}")


def bidir_attn_fwd(q, k, v, key_valid, scale, *, out=None, config: AttnConfig | None = None,
                   num_splits: int | None = None) -> torch.Tensor:
    """Launch the kernel on validated inputs. config / num_splits override the heuristics
    (benchmarks and tests); num_splits > 1 goes through the split-K partials and the merge."""
    B, H, P, D = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    if interpreter_bf16(q.device, q.dtype) and (out is None or out.dtype == q.dtype):
        # The interpreter truncates float32 to bf16 where a GPU rounds: write float32, let torch round.
        wide = torch.empty(B, P, H, D, dtype=torch.float32, device=q.device).transpose(1, 2)
        wide = bidir_attn_fwd(q, k, v, key_valid, scale, out=wide, config=config, num_splits=num_splits)
        return out.copy_(wide) if out is not None else wide.to(q.dtype)
    if out is None:
        # (B, P, H, D) storage seen as (B, H, P, D): the model's out.transpose(1, 2).reshape(B, P, H * D)
        # is then a view, not a copy.
        out = torch.empty(B, P, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)
    if B * H * P * D == 0:
        return out.zero_() if out.numel() else out
    group = H // H_kv
    n_rows = group * P
    d_pad = max(16, triton.next_power_of_2(D))
    cfg = config or _pick_config(n_rows, d_pad)
    for name in ("BLOCK_M", "BLOCK_N"):
        size = getattr(cfg, name)
        if size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot tiles), got {size}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    m_tiles = triton.cdiv(n_rows, cfg.BLOCK_M)
    key_tiles = triton.cdiv(L, cfg.BLOCK_N)
    splits = num_splits if num_splits is not None else _pick_splits(m_tiles * B * H_kv, key_tiles, q.device)
    splits = max(1, min(splits, max(key_tiles, 1)))
    keys_per_split = triton.cdiv(max(key_tiles, 1), splits) * cfg.BLOCK_N
    splits = max(1, triton.cdiv(L, keys_per_split))               # no empty trailing range
    if splits > 1:
        part_o = torch.empty(splits, B * H, P, D, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits, B * H, P, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out                                    # unused
    mask = key_valid.view(torch.uint8) if key_valid is not None else q   # q: an unused placeholder pointer
    stride_mb, stride_ml = key_valid.stride() if key_valid is not None else (0, 0)
    dot_f32 = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and INTERPRET)

    def launch(stages):
        with launching("bidir_attn", q.device):
            _bidir_attn_fwd_kernel[(m_tiles, B * H_kv, splits)](
                q, k, v, mask, out, part_o, part_lse,
                float(scale) * math.log2(math.e), B, P, L, H, H_kv, group, n_rows, keys_per_split,
                *q.stride(), *k.stride(), *v.stride(), stride_mb, stride_ml, *out.stride(),
                HEAD_DIM=D, D_PAD=d_pad, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                HAS_MASK=key_valid is not None, IS_SPLIT=splits > 1, DOT_F32=dot_f32,
                num_warps=cfg.num_warps, num_stages=stages,
            )

    try:
        launch(cfg.num_stages)
    except triton.runtime.errors.OutOfResources:
        if cfg.num_stages == 1:
            raise
        launch(1)                                                  # less shared memory, same result
    if splits > 1:
        block_p = min(64, max(16, triton.next_power_of_2(P)))
        with launching("bidir_attn_combine", q.device):
            _bidir_attn_combine_kernel[(triton.cdiv(P, block_p), B * H)](
                part_o, part_lse, out, splits, B * H, P, H, *out.stride(),
                HEAD_DIM=D, D_PAD=d_pad, BLOCK_P=block_p, num_warps=4,
            )
    return out


def bidir_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor | None = None,
               scale: float | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Bidirectional attention of the recomputed queries against the whole canvas (Triton).

    q: (B, H, P, D); k, v: (B, H_kv, L, D), H a multiple of H_kv; key_valid: (B, L) bool or None
    (False: a padding key, never attended to). fp16, bf16 or fp32, one dtype for all; D <= 256.
    scale: None = D ** -0.5.
    out: optional (B, H, P, D) tensor of q's dtype to write into (any strides); it is returned.
    Returns (B, H, P, D) in q's dtype; a row with no valid key gets zeros.
    Runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1. Same call signature as the
    other attention backends (`dllm.attention`), under the name `triton`.

    Example::

        out = bidir_attn(q, k_cache, v_cache, key_valid)   # (B, H, P, D)
    """
    scale = q.shape[-1] ** -0.5 if scale is None and isinstance(q, torch.Tensor) else scale
    _validate(q, k, v, key_valid, scale, out)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("the triton attention backend runs forward only and its output has no gradient; "
                           "run it under torch.no_grad() / inference_mode, or train with attention='sdpa'")
    require_triton(q.device, "the triton attention backend")
    pick = _launch_for(q, k, v, key_valid, scale)
    if pick is None:
        return bidir_attn_fwd(q, k, v, key_valid, scale, out=out)
    return bidir_attn_fwd(q, k, v, key_valid, scale, out=out, config=pick.config, num_splits=pick.splits)
