"""Rotary embedding and the K/V cache write of a cached forward's layer in one kernel launch.

A cached step (a recompute plan against stored K/V) rotates the fresh queries and keys and writes
the keys and values into the cache buffers at their columns. In torch that is about eight
operations per rotated tensor (the fp32 cast, the rotate-half copy, the products, the sum, the
cast back) and one indexed write per buffer, each a kernel launch on a GPU. `rope_write_triton`
does it in one launch per layer: each program takes one column of one row, rotates its queries
(every head) into a fresh (B, Q, H, D) tensor and writes its rotated keys and its values into the
buffers at (cache row, every key head, column).

The arithmetic is the torch path's, operation for operation (`dllm.models.transformer.apply_rope`:
x * cos + rotate_half(x) * sin, each product and the sum rounded; in fp32 when `fp32`, else in
the input dtype with cos/sin cast to it), and the kernel is compiled without fused multiply-adds,
so the outputs equal the torch path's bit for bit. Only full rotary (every head dim rotated) is
handled.

`rope_write_impl` reads `DLLM_ROPE_WRITE` (or `impl=`): "torch" (the layer's torch operations),
"triton" (this kernel, on CUDA tensors, or CPU tensors under TRITON_INTERPRET=1) or "auto"
(default): "torch" everywhere (graphed GPU forwards gain from the kernel, eager ones did not in
the one H200 run; docs/kernels.md §12).
"""
from __future__ import annotations

import torch

from . import HAS_TRITON, chosen_impl, launching, refuse_interpreter_bf16, require_triton, writes_as_on_a_gpu

if HAS_TRITON:
    import triton
    import triton.language as tl

IMPLS = ("auto", "torch", "triton")
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def rope_write_impl(impl: str | None = None, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> str:
    """The implementation `impl` names, or DLLM_ROPE_WRITE's (default "auto"); checked. "auto" is
    "torch"; "triton" falls back to "torch" where the kernel cannot run (`device`, `dtype`) or
    cannot round as a GPU does (`interpreter_bf16`)."""
    impl = chosen_impl(impl, "DLLM_ROPE_WRITE", IMPLS, "rotary + K/V write")
    if impl == "triton" and device is not None and not writes_as_on_a_gpu(device, dtype, KERNEL_DTYPES):
        return "torch"
    return "torch" if impl == "auto" else impl


if HAS_TRITON:

    @triton.jit
    def _rotate(x1, x2, c1, c2, s1, s2, FP32: tl.constexpr):
        # x * cos + rotate_half(x) * sin on the two halves, rotate_half(x) = (-x2, x1)
        if FP32:
            a1 = x1.to(tl.float32)
            a2 = x2.to(tl.float32)
            o1 = a1 * c1 + (-a2) * s1
            o2 = a2 * c2 + a1 * s2
        else:
            dt = x1.dtype
            c1 = c1.to(dt)
            c2 = c2.to(dt)
            s1 = s1.to(dt)
            s2 = s2.to(dt)
            o1 = (x1 * c1).to(dt) + ((-x2) * s1).to(dt)
            o2 = (x2 * c2).to(dt) + (x1 * s2).to(dt)
        return o1.to(x1.dtype), o2.to(x1.dtype)

    @triton.jit
    def _load_rotated(x, c, s, m, in_d, HALF: tl.constexpr, FP32: tl.constexpr):
        # the two rotated halves of the (heads, half) tile at x, by the cos/sin row at c, s
        return _rotate(tl.load(x, mask=m), tl.load(x + HALF, mask=m), tl.load(c, mask=in_d),
                       tl.load(c + HALF, mask=in_d), tl.load(s, mask=in_d), tl.load(s + HALF, mask=in_d), FP32)

    @triton.jit
    def _rope_write_kernel(Q, K, V, CQ, SQ, CK, SK, KB, VB, ROWS, POS, QO,
                           n_q, n_p, H, H_KV, N_ROWS, L,
                           sq_b, sq_p, sq_h, sk_b, sk_p, sk_h, sv_b, sv_p, sv_h,
                           scq_b, scq_p, sck_b, sck_p, sb_b, sb_h, sb_l, srow, spos_b,
                           HALF: tl.constexpr, BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK_HKV: tl.constexpr, FP32: tl.constexpr):
        # One program: every head of column p of row b, as (heads, half head dim) tiles.
        b = tl.program_id(0).to(tl.int64)
        p = tl.program_id(1)
        d = tl.arange(0, BLOCK)[None, :]
        in_d = d < HALF
        if p < n_q:  # the queries (b, p, :) -> QO[b, p, :]
            h = tl.arange(0, BLOCK_H)[:, None]
            m = (h < H) & in_d
            o1, o2 = _load_rotated(Q + b * sq_b + p * sq_p + h * sq_h + d, CQ + b * scq_b + p * scq_p + d,
                                   SQ + b * scq_b + p * scq_p + d, m, in_d, HALF, FP32)
            out = QO + ((b * n_q + p) * H + h) * (2 * HALF) + d
            tl.store(out, o1, mask=m)
            tl.store(out + HALF, o2, mask=m)
        if p < n_p:  # the keys and values (b, p, :) -> buffers[rows[b], :, positions[b, p]]
            h = tl.arange(0, BLOCK_HKV)[:, None]
            m = (h < H_KV) & in_d
            o1, o2 = _load_rotated(K + b * sk_b + p * sk_p + h * sk_h + d, CK + b * sck_b + p * sck_p + d,
                                   SK + b * sck_b + p * sck_p + d, m, in_d, HALF, FP32)
            row = tl.load(ROWS + b * srow).to(tl.int64)
            col = tl.load(POS + b * spos_b + p).to(tl.int64)
            dst = row * sb_b + h * sb_h + col * sb_l + d
            inside = (row >= 0) & (row < N_ROWS) & (col >= 0) & (col < L)   # outside the buffers: not written
            m = tl.where(inside, m, False)
            tl.store(KB + dst, o1, mask=m)
            tl.store(KB + dst + HALF, o2, mask=m)
            y = V + b * sv_b + p * sv_p + h * sv_h + d
            tl.store(VB + dst, tl.load(y, mask=m), mask=m)
            tl.store(VB + dst + HALF, tl.load(y + HALF, mask=m), mask=m)


def _check(q, k, v, cos_q, sin_q, cos_k, sin_k, kb, vb, rows, positions) -> None:
    B, Q, H, D = q.shape
    P, H_kv = k.shape[1], k.shape[2]
    problems = []
    if tuple(k.shape) != (B, P, H_kv, D) or tuple(v.shape) != tuple(k.shape):
        problems.append(f"k and v must be (B, P, H_kv, D) = (B, P, H_kv, {D}) with B = {B}, got "
                        f"{tuple(k.shape)} and {tuple(v.shape)}")
    if D % 2 or H_kv == 0 or H % H_kv:
        problems.append(f"the head dim must be even and H a multiple of H_kv, got D {D}, H {H}, H_kv {H_kv}")
    for name, t, cols in (("cos_q", cos_q, Q), ("sin_q", sin_q, Q), ("cos_k", cos_k, P), ("sin_k", sin_k, P)):
        if tuple(t.shape) != (B, 1, cols, D) or t.stride(-1) != 1 or t.dtype != torch.float32:
            problems.append(f"{name} must be float32 (B, 1, {cols}, {D}) with unit last stride, got {t.dtype} "
                            f"{tuple(t.shape)}")
    if cos_q.stride() != sin_q.stride() or cos_k.stride() != sin_k.stride():
        problems.append("cos and sin must share their strides")
    if kb.shape != vb.shape or kb.stride() != vb.stride() or kb.shape[1] != H_kv or kb.shape[3] != D \
            or kb.stride(-1) != 1 or {kb.dtype, vb.dtype, v.dtype, q.dtype} != {k.dtype}:
        problems.append(f"kb and vb must be alike (rows, {H_kv}, L, {D}) buffers of k's {k.dtype} (as q and v) "
                        f"with unit last stride, got {tuple(kb.shape)} {kb.dtype} and {tuple(vb.shape)} {vb.dtype} "
                        f"(q {q.dtype}, v {v.dtype})")
    if tuple(rows.shape) != (B,) or tuple(positions.shape) != (B, P) or positions.stride(-1) != 1:
        problems.append(f"rows must be ({B},) and positions ({B}, {P}) with unit last stride, got "
                        f"{tuple(rows.shape)} and {tuple(positions.shape)}")
    if rows.dtype not in (torch.int32, torch.int64) or positions.dtype not in (torch.int32, torch.int64):
        problems.append(f"rows and positions must be int32 or int64, got {rows.dtype} and {positions.dtype}")
    others = {name: t.device for name, t in (("k", k), ("v", v), ("cos_q", cos_q), ("sin_q", sin_q),
              ("cos_k", cos_k), ("sin_k", sin_k), ("kb", kb), ("vb", vb), ("rows", rows), ("positions", positions))
              if t.device != q.device}
    if others:
        problems.append(f"every tensor must be on q's device {q.device}, got " +
                        ", ".join(f"{name} on {device}" for name, device in others.items()))
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        problems.append("q, k and v need a unit last stride")
    if problems:
        raise ValueError("rope_write: " + "; ".join(problems))


def rope_write_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_q: torch.Tensor, sin_q: torch.Tensor,
                      cos_k: torch.Tensor, sin_k: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                      rows: torch.Tensor, positions: torch.Tensor, fp32: bool) -> torch.Tensor:
    """Rotate q (B, Q, H, D) by cos_q/sin_q (B, 1, Q, D) and k (B, P, H_kv, D) by cos_k/sin_k
    (B, 1, P, D); write the rotated k and v (B, P, H_kv, D) into kb, vb (rows, H_kv, L, D) at
    [rows[b], h, positions[b, p]] (a row or column outside the buffers, negative ones included, is
    not written: no host read checks them; the torch path's indexed write raises for one past the
    end and counts a negative one from the end). Returns the rotated queries (B, H, Q, D), a transposed view of
    a (B, Q, H, D) tensor as the torch path's queries are."""
    require_triton(q.device, "the rotary + K/V write kernel")
    _check(q, k, v, cos_q, sin_q, cos_k, sin_k, kb, vb, rows, positions)
    refuse_interpreter_bf16(q.device, q.dtype, "the rotary + K/V write kernel cannot write bf16")
    B, Q, H, D = q.shape
    P, H_kv = k.shape[1], k.shape[2]
    out = torch.empty(B, Q, H, D, dtype=q.dtype, device=q.device)
    grid = (B, max(Q, P))
    if B * max(Q, P) == 0:
        return out.transpose(1, 2)
    with launching("rope_write", q.device):
        _rope_write_kernel[grid](
            q, k, v, cos_q, sin_q, cos_k, sin_k, kb, vb, rows, positions, out, Q, P, H, H_kv, kb.shape[0], kb.shape[2],
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), cos_q.stride(0), cos_q.stride(2), cos_k.stride(0),
            cos_k.stride(2), kb.stride(0), kb.stride(1), kb.stride(2), rows.stride(0), positions.stride(0),
            HALF=D // 2, BLOCK=triton.next_power_of_2(D // 2), BLOCK_H=triton.next_power_of_2(H),
            BLOCK_HKV=triton.next_power_of_2(H_kv), FP32=fp32, num_warps=4, enable_fp_fusion=False)
    return out.transpose(1, 2)
