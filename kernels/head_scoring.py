"""The LM head and the greedy scoring in one pass over the vocabulary: from final hidden states, the
candidate token (argmax, first maximum on ties) and its probability, without writing the (N, V)
logits.

A step of a threshold or low-confidence sampler needs, per scored column, only the argmax of the
logits and its softmax probability. Both follow from an online pass over vocabulary chunks:
per row a running maximum m, the first index reaching it, and S = sum exp(l - m), rescaled when
m grows; then prob = exp(l_argmax - m) / S = 1 / S. Suppressed tokens (the mask id, ...) carry a
-inf bias.

`head_scores_ref` is the torch statement of it: `chunk` vocabulary rows at a time, statistics in
`score_dtype` (float64 reproduces a float64 softmax's confidence up to the order of its sum).
`head_scores_triton` is the Triton kernel `_head_scores_kernel`: each program takes BLOCK_N rows
and one vocabulary range, multiplies them with `tl.dot` in BLOCK_V x BLOCK_D tiles (fp32
accumulation; IEEE products for fp32 inputs; for 16-bit inputs each logit is rounded to the input
dtype, as the unfused product writes it), keeps the online statistics per row in fp32, and writes
one partial per range; the partials are merged in torch. It runs on CUDA tensors, or on CPU tensors under
TRITON_INTERPRET=1 (the tests).

`head_scores` dispatches on `DLLM_HEAD_SCORING` (or `impl=`): "auto" (default: "triton" on CUDA
where triton runs, else "unfused"), "unfused" (the caller computes the logits and scores them),
"torch" (the chunked reference) or "triton". docs/kernels.md §11 has the measurements behind
"auto".
"""
from __future__ import annotations

import torch

from . import (HAS_TRITON, chosen_impl, launching, refuse_interpreter_bf16, require_triton, triton_runs_on,
               writes_as_on_a_gpu)

if HAS_TRITON:
    import triton
    import triton.language as tl

IMPLS = ("auto", "unfused", "torch", "triton")
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def head_scoring_impl(impl: str | None = None, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> str:
    """The implementation `impl` names, or DLLM_HEAD_SCORING's (default "auto"); checked. "auto"
    resolves to "triton" for a CUDA `device` where triton runs and `dtype` is one the kernel takes,
    else to "unfused"; "triton" falls back to "unfused" where the kernel cannot run (`device`,
    `dtype`) or cannot round the bf16 logits as a GPU does (`interpreter_bf16`)."""
    impl = chosen_impl(impl, "DLLM_HEAD_SCORING", IMPLS, "head scoring")
    if impl == "auto":
        device = torch.device(device) if device is not None else None
        kernel = (device is not None and device.type == "cuda" and dtype in KERNEL_DTYPES
                  and triton_runs_on(device))
        impl = "triton" if kernel else "unfused"
    elif impl == "triton" and device is not None and not writes_as_on_a_gpu(device, dtype, KERNEL_DTYPES):
        impl = "unfused"
    return impl


def _check(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden (N, d) and weight (V, d) must share d, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if weight.shape[0] == 0:
        raise ValueError("weight has no vocabulary rows (V = 0)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have one entry per vocabulary row ({weight.shape[0]},), got {tuple(bias.shape)}")


def suppression_bias(vocab_size: int, suppressed, device, dtype=torch.float32) -> torch.Tensor:
    """(V,) zeros with -inf at the token ids `suppressed`."""
    bias = torch.zeros(vocab_size, dtype=dtype, device=device)
    bias[list(suppressed)] = float("-inf")
    return bias


def head_scores_ref(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                    chunk: int = 8192, score_dtype: torch.dtype = torch.float32):
    """(token (N,), prob (N,) in score_dtype, top (N,)) of the logits hidden @ weight^T + bias, one
    `chunk` of vocabulary rows at a time."""
    _check(hidden, weight, bias)
    N, V = hidden.shape[0], weight.shape[0]
    m = torch.full((N,), float("-inf"), dtype=score_dtype, device=hidden.device)
    s = torch.zeros(N, dtype=score_dtype, device=hidden.device)
    token = torch.zeros(N, dtype=torch.long, device=hidden.device)
    for start in range(0, V, chunk):
        logits = (hidden @ weight[start:start + chunk].t()).to(score_dtype)            # (N, c)
        if bias is not None:
            logits = logits + bias[start:start + chunk].to(score_dtype)
        top, arg = logits.max(dim=1)                                                    # first maximum
        grows = top > m
        new_m = torch.maximum(m, top)
        safe = torch.where(torch.isfinite(new_m), new_m, torch.zeros_like(new_m))
        s = s * torch.exp(m - safe).nan_to_num(0.0) + torch.exp(logits - safe[:, None]).sum(1)
        token = torch.where(grows, arg + start, token)
        m = new_m
    return token, 1.0 / s, m


if HAS_TRITON:

    @triton.jit
    def _head_scores_kernel(H, W, BIAS, PartM, PartS, PartI, N, V, D, vocab_per_split,
                            stride_hn, stride_wv, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
        # One program: BLOCK_N rows against one vocabulary range, BLOCK_V rows of W at a time.
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        n_splits = tl.num_programs(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        m = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
        s = tl.zeros([BLOCK_N], dtype=tl.float32)
        arg = tl.zeros([BLOCK_N], dtype=tl.int32)
        start = pid_s * vocab_per_split
        end = tl.minimum(start + vocab_per_split, V)
        for v0 in range(start, end, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            mask_v = offs_v < end
            acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                mask_d = offs_d < D
                h = tl.load(H + offs_n[:, None].to(tl.int64) * stride_hn + offs_d[None, :],
                            mask=mask_n[:, None] & mask_d[None, :], other=0.0)
                w = tl.load(W + offs_v[:, None].to(tl.int64) * stride_wv + offs_d[None, :],
                            mask=mask_v[:, None] & mask_d[None, :], other=0.0)
                if DOT_F32:
                    acc = tl.dot(h, tl.trans(w), acc, input_precision="ieee")
                else:
                    acc = tl.dot(h, tl.trans(w), acc)
            if not DOT_F32:
                acc = acc.to(H.dtype.element_ty).to(tl.float32)     # the logits' rounding, as unfused
            if HAS_BIAS:
                acc += tl.load(BIAS + offs_v, mask=mask_v, other=0.0)[None, :]
            acc = tl.where(mask_v[None, :], acc, float("-inf"))
            top = tl.max(acc, 1)
            first = tl.min(tl.where(acc == top[:, None], offs_v[None, :], 2147483647), 1)
            new_m = tl.maximum(m, top)
            safe = tl.where(new_m > float("-inf"), new_m, 0.0)
            s = s * tl.exp(m - safe) + tl.sum(tl.exp(acc - safe[:, None]), 1)
            arg = tl.where(top > m, first, arg)
            m = new_m
        at = offs_n * n_splits + pid_s
        tl.store(PartM + at, m, mask=mask_n)
        tl.store(PartS + at, s, mask=mask_n)
        tl.store(PartI + at, arg, mask=mask_n)


def head_scores_triton(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                       num_splits: int | None = None, score_dtype: torch.dtype = torch.float32):
    """`head_scores_ref` as a Triton kernel (fp32 accumulation and statistics); hidden and weight
    of one float dtype, contiguous rows."""
    _check(hidden, weight, bias)
    require_triton(hidden.device, "the fused head scoring kernel")
    if hidden.dtype not in KERNEL_DTYPES or weight.dtype != hidden.dtype:
        raise ValueError(f"the fused head scoring kernel takes hidden and weight of one dtype among float16, "
                         f"bfloat16, float32; got {hidden.dtype} and {weight.dtype}")
    refuse_interpreter_bf16(hidden.device, hidden.dtype, "the fused head scoring kernel cannot round bf16 logits")
    hidden, weight = hidden.contiguous(), weight.contiguous()
    N, D = hidden.shape
    V = weight.shape[0]
    if N == 0:
        empty = hidden.new_empty(0, dtype=torch.float32)
        return empty.long(), empty.to(score_dtype), empty
    block_n = min(64, max(16, triton.next_power_of_2(N)))
    block_v, block_d = 64, min(64, max(16, triton.next_power_of_2(D)))
    tiles = triton.cdiv(V, block_v)
    if num_splits is None:
        programs = triton.cdiv(N, block_n)
        sms = torch.cuda.get_device_properties(hidden.device).multi_processor_count if hidden.is_cuda else 1
        num_splits = max(1, min(triton.cdiv(2 * sms, programs), tiles))
    per_split = triton.cdiv(tiles, max(1, min(num_splits, tiles))) * block_v
    splits = triton.cdiv(V, per_split)
    part_m = torch.empty(N, splits, dtype=torch.float32, device=hidden.device)
    part_s = torch.empty_like(part_m)
    part_i = torch.empty(N, splits, dtype=torch.int32, device=hidden.device)
    bias_arg = bias.float().contiguous() if bias is not None else part_m
    with launching("head_scores", hidden.device):
        _head_scores_kernel[(triton.cdiv(N, block_n), splits)](
            hidden, weight, bias_arg, part_m, part_s, part_i, N, V, D, per_split, hidden.stride(0), weight.stride(0),
            HAS_BIAS=bias is not None, DOT_F32=hidden.dtype == torch.float32, BLOCK_N=block_n, BLOCK_V=block_v,
            BLOCK_D=block_d)
    return merge_partials(part_m, part_s, part_i, score_dtype)


def merge_partials(part_m: torch.Tensor, part_s: torch.Tensor, part_i: torch.Tensor, score_dtype: torch.dtype):
    """Merge per-range (max, sum exp(l - max), first argmax) partials (N, splits), ranges in
    vocabulary order, into (token, prob, top)."""
    top = part_m.max(dim=1).values                                                      # (N,)
    safe = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    s = (part_s * torch.exp(part_m - safe[:, None]).nan_to_num(0.0)).sum(1)
    top = torch.where(s.isnan(), s, top)    # the kernel's maxima skip NaN logits; their sums do not
    first = (part_m == top[:, None]).int().argmax(dim=1)                                # earliest range
    token = part_i.gather(1, first[:, None]).squeeze(1).long()
    return token, (1.0 / s).to(score_dtype), top


def head_scores(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                impl: str | None = None, score_dtype: torch.dtype = torch.float32):
    """(token, prob, top) of hidden @ weight^T + bias with the fused implementation `impl` ("torch"
    or "triton"; "auto" or None, which reads DLLM_HEAD_SCORING, must resolve to one of them)."""
    impl = head_scoring_impl(impl, hidden.device, hidden.dtype)
    if impl == "unfused":
        raise ValueError(f"head_scores needs a fused implementation: impl='torch', or 'triton' where the kernel "
                         f"runs ({hidden.dtype} on {hidden.device} here); DLLM_HEAD_SCORING=unfused, or auto off "
                         f"CUDA, means the caller scores full logits")
    if impl == "triton":
        return head_scores_triton(hidden, weight, bias, score_dtype=score_dtype)
    return head_scores_ref(hidden, weight, bias, score_dtype=score_dtype)
