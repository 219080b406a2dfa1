"""The mixture-of-experts MLP (LLaDA-MoE): a router that picks `experts_per_token` experts per token,
and SwiGLU experts that each run once on the tokens routed to them.

The experts' weights are stacked, (E, out, in) per projection. A forward sorts the (token, expert)
pairs by expert, so every expert's tokens are one contiguous slice, and runs each projection as one
grouped product over those slices (`grouped_linear`): torch's grouped GEMM where it takes the
inputs (any float dtype on CPU, bfloat16 on CUDA, rows of a multiple of 16 bytes), else a loop
over the experts with tokens, which reads the group sizes on the host. No
expert computes tokens it was not given, and nothing is read back to the host on the grouped
path, so a MoE forward can be captured in a CUDA graph and compiled.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ModelConfig, MoEConfig

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
_GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def grouped_mm_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether torch's grouped GEMM takes `x` (A, in) and `weight` (E, out, in): one dtype,
    float32, bfloat16 or float16 on CPU and bfloat16 on CUDA, with rows of `in` and `out` elements a
    multiple of 16 bytes."""
    if _GROUPED_MM is None or x.dtype != weight.dtype or x.dtype not in _GROUPED_DTYPES:
        return False
    if any(n * x.element_size() % 16 for n in weight.shape[1:]):
        return False
    return x.device.type == "cpu" or (x.device.type == "cuda" and x.dtype == torch.bfloat16)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows of `x` (A, in) in groups, group e being rows ends[e-1]:ends[e] (int32 (E,), the last one
    A), each times weight[e]^T (weight (E, out, in)): (A, out). Under torch.compile, inputs other
    than bfloat16 (which the compiler's grouped GEMM does not take) run eagerly."""
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        return _eager_grouped_linear(x, weight, ends)
    return _grouped_linear(x, weight, ends)


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    if grouped_mm_runs(x, weight):
        return _GROUPED_MM(x, weight.transpose(1, 2), offs=ends)
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError(f"the MoE experts in {x.dtype} on CUDA read their token counts on the host, which a CUDA "
                         f"graph cannot capture; load the model in bfloat16 or turn CUDA graphs off")
    out = x.new_empty(x.shape[0], weight.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):      # the loop reads the group sizes on the host
        if end > start:
            out[start:end] = F.linear(x[start:end], weight[e])
        start = end
    return out


_eager_grouped_linear = torch.compiler.disable(_grouped_linear)


def limit_groups(choice: torch.Tensor, n_groups: int, topk_groups: int) -> torch.Tensor:
    """choice (T, E) with the experts outside each token's best `topk_groups` of `n_groups` equal
    groups set to -inf; a group scores the sum of its two best experts."""
    T, E = choice.shape
    grouped = choice.view(T, n_groups, E // n_groups)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)                       # (T, G)
    kept = torch.zeros_like(group_scores, dtype=torch.bool)
    kept.scatter_(1, group_scores.topk(topk_groups, dim=-1).indices, True)
    return grouped.masked_fill(~kept[..., None], float("-inf")).view(T, E)


class Router(nn.Module):
    """Per token, the experts to run and their weights (module docstring of `MoEConfig`)."""

    def __init__(self, d_model: int, moe: MoEConfig):
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.n_experts, d_model))
        if moe.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(moe.n_experts, dtype=torch.float32))
        else:
            self.expert_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, d) -> weights (T, k) fp32, experts (T, k) long."""
        moe = self.moe
        logits = F.linear(x.float(), self.weight.float()) if moe.router_fp32 else F.linear(x, self.weight)
        scores = logits.float().softmax(-1) if moe.score == "softmax" else logits.float().sigmoid()
        choice = scores if self.expert_bias is None else scores + self.expert_bias.float()
        if moe.n_groups > 1:
            choice = limit_groups(choice, moe.n_groups, moe.topk_groups)
        experts = choice.topk(moe.experts_per_token, dim=-1).indices
        weights = scores.gather(-1, experts)
        if moe.norm_topk:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * moe.routed_scale, experts


class Experts(nn.Module):
    """E SwiGLU experts, down(silu(gate(x)) * up(x)), with stacked weights."""

    def __init__(self, n_experts: int, d_model: int, hidden: int):
        super().__init__()
        self.gate = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.up = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.down = nn.Parameter(torch.empty(n_experts, d_model, hidden))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, sum_fp32: bool) -> torch.Tensor:
        """x (T, d), weights and experts (T, k) -> sum over the k of weight * expert(x): (T, d)."""
        T, k = experts.shape
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)                       # the pairs, grouped by expert
        token = order // k
        ids = torch.arange(self.gate.shape[0], device=x.device, dtype=flat.dtype)
        ends = torch.searchsorted(flat[order], ids, right=True).to(torch.int32)
        rows = x[token]                                         # (T * k, d)
        act = F.silu(grouped_linear(rows, self.gate, ends)) * grouped_linear(rows, self.up, ends)
        out = grouped_linear(act, self.down, ends)              # (T * k, d)
        w = weights.reshape(-1)[order, None]
        if sum_fp32:
            total = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
            return total.index_add_(0, token, out.float() * w).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, token, out * w.to(x.dtype))


class MoE(nn.Module):
    """Router + experts (+ a shared expert): (B, P, d) -> (B, P, d)."""

    def __init__(self, cfg: ModelConfig, dense_mlp: type[nn.Module]):
        super().__init__()
        moe = cfg.moe
        self.sum_fp32 = moe.sum_fp32
        self.router = Router(cfg.d_model, moe)
        self.experts = Experts(moe.n_experts, cfg.d_model, moe.expert_hidden)
        self.shared = dense_mlp(cfg.d_model, moe.shared_hidden) if moe.shared_hidden else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = h.reshape(-1, h.shape[-1])
        weights, experts = self.router(x)
        out = self.experts(x, weights, experts, self.sum_fp32)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view_as(h)
