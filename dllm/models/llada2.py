"""LLaDA 2.x (inclusionAI/LLaDA2.0-mini, -flash, LLaDA2.1-mini; architecture `LLaDA2MoeModelLM`):
the config and weight names of the published checkpoints, mapped onto the shared transformer with
its MoE MLP and block-causal attention.

Architecture (docs/architecture.md §11): pre-norm RMSNorm (eps 1e-6); one fused q/k/v projection
without bias (rows: the q heads, then the k heads, then the v heads), a per-head RMSNorm of q and
k, NeoX RoPE on the first `rotary_dim` dims of each head (cos/sin in the activation dtype), GQA;
attention block-causal: a column sees its own block and the earlier ones, blocks of 32 columns
aligned from column 0 (the published decoding's block length); the first `first_k_dense_replace`
layers have a dense SwiGLU MLP, the others route each token to 8 of 256 experts: sigmoid scores
of the gate's fp32 logits, the experts ranked with the `expert_bias` buffer added, within the
best 4 of 8 groups (a group scores its two best experts), weights divided by their sum and
scaled by `routed_scaling_factor`, the weighted outputs summed in fp32, plus a shared expert;
untied `lm_head`, no logit shift.

The published config.json names no mask or end-of-text id: they are the tokenizer's `<|mask|>`
(156895) and `<|endoftext|>` (156892, also the config's `pad_token_id`).
"""
from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig, MoEConfig
from .config_json import QWEN2_KEYS, check_required, check_sizes, check_stated, first_of, flag, id_of, integer, number
from .llada_moe import EOS_TOKEN, MASK_TOKEN, special_id
from .transformer import DiffusionTransformer

ARCHITECTURE = "LLaDA2MoeModelLM"
MODEL_TYPES = ("llada2_moe", "llada21_moe")
ATTENTION_BLOCK = 32     # the block length the published models decode with (and attend in)

_REQUIRED = {"hidden_act": "silu", "rope_scaling": None, "use_qkv_bias": False, "use_bias": False,
             "norm_head": False, "use_sliding_window": False, "score_function": "sigmoid",
             "moe_router_enable_expert_bias": True, "use_qk_norm": True}


def config_from_hf(d: dict[str, Any], tokens: dict[str, int] | None = None) -> ModelConfig:
    """ModelConfig from a LLaDA2 `config.json`; `tokens` maps the tokenizer's added tokens to ids."""
    check_stated(d, ("use_bias",), _REQUIRED, "LLaDA2")   # the config class defaults it to true
    check_required(d, _REQUIRED, "LLaDA2")
    first_dense = integer(d, "first_k_dense_replace", 0, "LLaDA2", low=0)
    check_sizes(d, ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "moe_intermediate_size",
                    "num_experts", "num_experts_per_tok") + (("intermediate_size",) if first_dense else ()), "LLaDA2")
    if d.get("head_dim") is not None:
        check_sizes(d, ("head_dim",), "LLaDA2")
    n_heads = d["num_attention_heads"]
    head_dim = d.get("head_dim") or d["hidden_size"] // n_heads
    if head_dim * n_heads != d["hidden_size"]:
        raise ValueError(f"LLaDA2 config key 'head_dim' = {head_dim} with {n_heads} heads is not hidden_size "
                         f"{d['hidden_size']} / num_attention_heads (supported)")
    factor = first_of(d, "partial_rotary_factor", default=0.5)   # the published rotary width; rotary_dim is unread
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"LLaDA2 config key 'partial_rotary_factor' = {factor!r} must lie in (0, 1]")
    rotary = int(head_dim * factor)
    k = d["num_experts_per_tok"]
    moe = MoEConfig(n_experts=d["num_experts"], experts_per_token=k, expert_hidden=d["moe_intermediate_size"],
                    score="sigmoid", norm_topk=k > 1, n_groups=integer(d, "n_group", 8, "LLaDA2"),
                    topk_groups=integer(d, "topk_group", 4, "LLaDA2"), routed_scale=number(d, "routed_scaling_factor", 2.5, "LLaDA2"),
                    expert_bias=True, router_fp32=True, sum_fp32=True,
                    shared_hidden=d["moe_intermediate_size"] * integer(d, "num_shared_experts", 0, "LLaDA2", low=0),
                    first_dense=first_dense)
    eos = special_id(d, "eos_token_id", EOS_TOKEN, tokens, "LLaDA2")
    return ModelConfig(
        family="llada2", vocab_size=d["vocab_size"], d_model=d["hidden_size"], n_layers=d["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=integer(d, "num_key_value_heads", n_heads, "LLaDA2"),
        mlp_hidden=d["intermediate_size"] if first_dense else d["moe_intermediate_size"],   # dense layers' width
        norm_eps=number(d, "rms_norm_eps", 1e-5, "LLaDA2"), rope_theta=number(d, "rope_theta", 10000.0, "LLaDA2"),
        max_seq_len=integer(d, "max_position_embeddings", 16384, "LLaDA2"),
        mask_token_id=special_id(d, "mask_token_id", MASK_TOKEN, tokens, "LLaDA2"), eos_token_id=eos,
        pad_token_id=id_of(d, "pad_token_id", "LLaDA2", default=eos), bos_token_id=id_of(d, "bos_token_id", "LLaDA2"),
        tie_embeddings=flag(d, "tie_word_embeddings", False, "LLaDA2"),
        rope_fp32=False, logit_shift=False, qk_norm=True, rotary_dim=rotary, moe=moe,
        attention_block=ATTENTION_BLOCK,
    )


def hf_names(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint weight name -> internal name; `attn.qkv` is split by `adapt_weights`, `name@j`
    is slot j of a stacked parameter."""
    names = {"model.word_embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    for i in range(cfg.n_layers):
        b, o = f"model.layers.{i}.", f"layers.{i}."
        names.update({
            b + "input_layernorm.weight": o + "attn_norm.weight",
            b + "post_attention_layernorm.weight": o + "mlp_norm.weight",
            b + "attention.query_key_value.weight": o + "attn.qkv",
            b + "attention.dense.weight": o + "attn.o.weight",
            b + "attention.query_layernorm.weight": o + "attn.q_norm.weight",
            b + "attention.key_layernorm.weight": o + "attn.k_norm.weight",
        })
        projections = (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))
        if not cfg.is_moe_layer(i):
            names.update({f"{b}mlp.{src}.weight": f"{o}mlp.{dst}.weight" for src, dst in projections})
            continue
        names[b + "mlp.gate.weight"] = o + "mlp.router.weight"
        names[b + "mlp.gate.expert_bias"] = o + "mlp.router.expert_bias"
        for j in range(cfg.moe.n_experts):
            names.update({f"{b}mlp.experts.{j}.{src}.weight": f"{o}mlp.experts.{dst}@{j}" for src, dst in projections})
        if cfg.moe.shared_hidden:
            names.update({f"{b}mlp.shared_experts.{src}.weight": f"{o}mlp.shared.{dst}.weight"
                          for src, dst in projections})
    return names


def adapt_weights(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Split each fused `attn.qkv` (rows: q heads, k heads, v heads) into q, k and v."""
    sizes = [cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim]
    out = {}
    for name, t in tensors.items():
        if not name.endswith("attn.qkv"):
            out[name] = t
            continue
        if t.shape[0] != sum(sizes):
            stored = f"model.{name[:-len('attn.qkv')]}attention.query_key_value.weight"
            raise ValueError(f"fused q/k/v weight {stored} has {t.shape[0]} rows; the config needs {sum(sizes)} "
                             f"({cfg.n_heads} q and 2 x {cfg.n_kv_heads} k/v heads of {cfg.head_dim})")
        for part, piece in zip("qkv", t.split(sizes)):
            out[f"{name[:-3]}{part}.weight"] = piece.contiguous()
    return out


class LLaDA2Model(DiffusionTransformer):
    family = "llada2"
    config_from_hf = staticmethod(config_from_hf)
    hf_names = staticmethod(hf_names)
    adapt_weights = staticmethod(adapt_weights)
    config_reads_tokens = True
    config_keys = {**QWEN2_KEYS, "expert_hidden": "moe_intermediate_size", "shared_hidden": "num_shared_experts"}
