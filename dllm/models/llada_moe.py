"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Base / -Instruct): the config and weight names of the
published checkpoints, mapped onto the shared bidirectional transformer with its MoE MLP.

Architecture (docs/architecture.md §11): pre-norm RMSNorm (eps 1e-5), q/k/v without biases and
a per-head RMSNorm of q and k before the rotation, NeoX RoPE (theta 50000) on the first
`partial_rotary_factor` of each head's dims with cos/sin cast to the activation dtype, attention
never causal; every layer's MLP routes each token to 8 of 64 SwiGLU experts (softmax over the
gate's logits in fp32, the top 8 weights cast to the activation dtype, never renormalised: the
published modelling code ignores `norm_topk_prob`), plus a shared expert when
`shared_expert_intermediate_size` is set; untied `lm_head`, no logit shift.

The published config.json carries no mask id: it is `<|mask|>` of the tokenizer (156895 in the
published vocabulary of 157,184), and the end of text `<|endoftext|>` (156892) when the config has
no `eos_token_id`.
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig, MoEConfig
from .dream import qwen2_names
from .config_json import QWEN2_KEYS, check_required, check_sizes, flag, id_of, integer, number
from .transformer import DiffusionTransformer

PUBLISHED_VOCAB = 157184
PUBLISHED_IDS = {"<|mask|>": 156895, "<|endoftext|>": 156892}
MASK_TOKEN, EOS_TOKEN = "<|mask|>", "<|endoftext|>"

# Keys whose values this implementation does not cover, with the value it needs.
_REQUIRED = {"hidden_act": "silu", "rope_scaling": None, "attention_bias": False,
             "moe_router_enable_expert_bias": None, "use_sliding_window": False}


def special_id(d: dict, key: str, token: str, tokens: dict[str, int] | None, family: str = "LLaDA-MoE") -> int:
    """The id `d[key]`, else the tokenizer's `token`, else its id in the published vocabulary."""
    value = id_of(d, key, family)
    if value is None and tokens:
        value = tokens.get(token)
    if value is None and d.get("vocab_size") == PUBLISHED_VOCAB:
        value = PUBLISHED_IDS[token]
    if value is None:
        raise ValueError(f"{family} config.json has no {key!r} and the tokenizer no {token!r} to take it from")
    return int(value)


def _moe_layers(d: dict) -> None:
    freq = d.get("moe_layer_freq", 1)
    layers = d["num_hidden_layers"]
    one = lambda f: f == 1 and not isinstance(f, bool)   # noqa: E731
    dense = not one(freq) and not (isinstance(freq, list) and len(freq) == layers and all(map(one, freq)))
    if dense:
        raise ValueError(f"LLaDA-MoE config key 'moe_layer_freq' = {freq!r} is not supported (supported: 1, or "
                         f"{layers} ones: every layer mixture-of-experts)")


def _dense_hidden(d: dict[str, Any]) -> int:
    """The unused dense MLP width (every layer is a MoE one): `dense_intermediate_size`, whose
    config class default -1 means unset, else the expert width."""
    dense = d.get("dense_intermediate_size")
    unset = isinstance(dense, bool) or not isinstance(dense, int) or dense <= 0
    return d["expert_intermediate_size"] if unset else dense


def config_from_hf(d: dict[str, Any], tokens: dict[str, int] | None = None) -> ModelConfig:
    """ModelConfig from a LLaDA-MoE `config.json`; `tokens` maps the tokenizer's added tokens to
    their ids (for the mask id, which the published config lacks)."""
    check_required(d, _REQUIRED, "LLaDA-MoE")
    if "qk_layernorm" not in d:
        # Copies of the config class default it to true and to null (no q/k norm): it must be stated.
        raise ValueError("LLaDA-MoE config.json lacks 'qk_layernorm' (true: a per-head RMSNorm of q and k, as in "
                         "the published checkpoints; false or null: none)")
    unstated = [key for key in ("partial_rotary_factor", "rope_theta") if d.get(key) is None]
    if unstated:
        # Copies of the config class default both to -1, which leaves the published model without rotation.
        raise ValueError(f"LLaDA-MoE config.json lacks {', '.join(unstated)} (the config class's default -1 means no "
                         f"rotary embedding, which dllm does not run); state them, as the published checkpoints do")
    check_sizes(d, ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_experts",
                    "num_experts_per_tok", "expert_intermediate_size"), "LLaDA-MoE")
    _moe_layers(d)
    n_heads = d["num_attention_heads"]
    head_dim = d["hidden_size"] // n_heads
    factor = number(d, "partial_rotary_factor", 1.0, "LLaDA-MoE")
    if factor > 1:
        raise ValueError(f"LLaDA-MoE config key 'partial_rotary_factor' = {factor!r} must lie in (0, 1]")
    shared = integer(d, "shared_expert_intermediate_size", None, "LLaDA-MoE", low=0)
    moe = MoEConfig(n_experts=d["num_experts"], experts_per_token=d["num_experts_per_tok"],
                    expert_hidden=d["expert_intermediate_size"], score="softmax", norm_topk=False,
                    shared_hidden=shared if shared and shared > 0 else 0)
    eos = special_id(d, "eos_token_id", EOS_TOKEN, tokens)
    return ModelConfig(
        family="llada-moe", vocab_size=d["vocab_size"], d_model=d["hidden_size"], n_layers=d["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=integer(d, "num_key_value_heads", n_heads, "LLaDA-MoE"),
        mlp_hidden=_dense_hidden(d),
        norm_eps=number(d, "rms_norm_eps", 1e-5, "LLaDA-MoE"), rope_theta=number(d, "rope_theta", 10000.0, "LLaDA-MoE"),
        max_seq_len=integer(d, "max_position_embeddings", 4096, "LLaDA-MoE"),   # the config class default
        mask_token_id=special_id(d, "mask_token_id", MASK_TOKEN, tokens), eos_token_id=eos,
        pad_token_id=id_of(d, "pad_token_id", "LLaDA-MoE", default=eos),
        bos_token_id=id_of(d, "bos_token_id", "LLaDA-MoE"),
        tie_embeddings=flag(d, "tie_word_embeddings", False, "LLaDA-MoE"),
        rope_fp32=False, logit_shift=False, qk_norm=flag(d, "qk_layernorm", False, "LLaDA-MoE"),
        rotary_dim=int(head_dim * factor), moe=moe,
        clip_qkv=None if d.get("clip_qkv") is None else number(d, "clip_qkv", 0, "LLaDA-MoE"),
    )


def hf_names(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint weight name -> internal parameter name; `name@j` is slot j of a stacked
    parameter (expert j's projection)."""
    names = qwen2_names(cfg)
    for i in range(cfg.n_layers):
        b, o = f"model.layers.{i}.", f"layers.{i}."
        names[b + "mlp.gate.weight"] = o + "mlp.router.weight"
        for proj in ("q", "k", "v", "o"):
            names[f"{b}self_attn.{proj}_proj.weight"] = f"{o}attn.{proj}.weight"
        if cfg.qk_norm:
            names[b + "self_attn.q_norm.weight"] = o + "attn.q_norm.weight"
            names[b + "self_attn.k_norm.weight"] = o + "attn.k_norm.weight"
        for j in range(cfg.moe.n_experts):
            for src, dst in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                names[f"{b}mlp.experts.{j}.{src}.weight"] = f"{o}mlp.experts.{dst}@{j}"
        if cfg.moe.shared_hidden:
            for src, dst in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                names[f"{b}shared_expert.{src}.weight"] = f"{o}mlp.shared.{dst}.weight"
    return names


class LLaDAMoEModel(DiffusionTransformer):
    family = "llada-moe"
    config_from_hf = staticmethod(config_from_hf)
    hf_names = staticmethod(hf_names)
    config_reads_tokens = True
    config_keys = {**QWEN2_KEYS, "expert_hidden": "expert_intermediate_size",
                   "shared_hidden": "shared_expert_intermediate_size", "mlp_hidden": "dense_intermediate_size"}
