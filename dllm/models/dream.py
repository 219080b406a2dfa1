"""Dream (Dream-org/Dream-v0-Base-7B / -Instruct-7B): the Qwen2 config and weight names of the
published checkpoints, mapped onto the shared bidirectional transformer.

Architecture (docs/fidelity.md §Architectures): Qwen2 layers with q/k/v biases, GQA (28 heads on
4 KV heads in the 7B model), RMSNorm eps 1e-6, RoPE theta 1e6 whose cos/sin are cast to the
activation dtype before rotating, attention never causal, untied `lm_head`. Dream keeps the
autoregressive alignment: hidden state i-1 predicts token i. That shift is applied inside the
model (`logit_shift`), so samplers always see aligned logits.
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .config_json import QWEN2_KEYS, check_dense_layout, check_sizes, first_of, flag, id_of, integer, number
from .transformer import DiffusionTransformer


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a Dream `config.json` (unsupported values refused by name)."""
    if d.get("rope_scaling") not in (None, {}):
        raise ValueError(f"Dream config key 'rope_scaling' = {d['rope_scaling']!r} is not supported (supported: null)")
    if d.get("use_sliding_window") not in (None, False):
        raise ValueError(f"Dream config key 'use_sliding_window' = {d['use_sliding_window']!r} is not supported "
                         f"(supported: false)")
    if d.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise ValueError(f"Dream config key 'partial_rotary_factor' = {d['partial_rotary_factor']!r} is not "
                         f"supported (supported: 1: Dream rotates every dimension of a head)")
    if first_of(d, "hidden_act", default="silu") != "silu":
        raise ValueError(f"Dream config key 'hidden_act' = {d['hidden_act']!r} is not supported (supported: 'silu')")
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "mask_token_id")
    missing = [k for k in required if d.get(k) is None]
    if missing:
        raise ValueError(f"Dream config.json lacks required keys: {', '.join(missing)}")
    check_sizes(d, required[:5], "Dream")
    n_heads = d["num_attention_heads"]
    if d.get("head_dim") not in (None, d["hidden_size"] // n_heads) or d["hidden_size"] % n_heads:
        raise ValueError(f"Dream config key 'head_dim' = {d.get('head_dim')!r} with {n_heads} heads is not supported "
                         f"(supported: hidden_size {d['hidden_size']} / num_attention_heads)")
    eos = id_of(d, "eos_token_id", "Dream", default=id_of(d, "pad_token_id", "Dream"))
    if eos is None:
        raise ValueError("Dream config.json has neither eos_token_id nor pad_token_id")
    return ModelConfig(
        family="dream",
        vocab_size=d["vocab_size"], d_model=d["hidden_size"], n_layers=d["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=integer(d, "num_key_value_heads", n_heads, "Dream"),
        mlp_hidden=d["intermediate_size"], norm_eps=number(d, "rms_norm_eps", 1e-6, "Dream"),
        rope_theta=number(d, "rope_theta", 10000.0, "Dream"),
        max_seq_len=integer(d, "max_position_embeddings", 32768, "Dream"),
        mask_token_id=id_of(d, "mask_token_id", "Dream"), eos_token_id=eos,
        pad_token_id=id_of(d, "pad_token_id", "Dream", default=eos), bos_token_id=id_of(d, "bos_token_id", "Dream"),
        qkv_bias=True, tie_embeddings=flag(d, "tie_word_embeddings", False, "Dream"),
        rope_fp32=False, logit_shift=True,
    )


def config_to_hf(cfg: ModelConfig, **extra: Any) -> dict[str, Any]:
    """A Dream `config.json` for `cfg`, with the key set of the published Dream-v0 checkpoints
    (less `transformers_version`, which names the library that wrote it)."""
    if cfg.family != "dream" or not cfg.logit_shift or not cfg.qkv_bias or cfg.rope_fp32:
        raise ValueError(f"a Dream config.json describes a Qwen2 model with q/k/v biases and shifted logits; got "
                         f"family {cfg.family!r}, qkv_bias {cfg.qkv_bias}, logit_shift {cfg.logit_shift}, "
                         f"rope_fp32 {cfg.rope_fp32}")
    check_dense_layout(cfg, "Dream")
    return {
        "architectures": ["DreamModel"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "hidden_act": "silu",
        "hidden_size": cfg.d_model, "initializer_range": 0.02, "intermediate_size": cfg.mlp_hidden,
        "mask_token_id": cfg.mask_token_id, "max_position_embeddings": cfg.max_seq_len,
        "max_window_layers": cfg.n_layers, "model_type": "Dream", "num_attention_heads": cfg.n_heads,
        "num_hidden_layers": cfg.n_layers, "num_key_value_heads": cfg.n_kv_heads, "pad_token_id": cfg.pad_token_id,
        "rms_norm_eps": cfg.norm_eps, "rope_scaling": None, "rope_theta": cfg.rope_theta,
        "sliding_window": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings, "use_cache": True,
        "use_sliding_window": False, "vocab_size": cfg.vocab_size, **extra,
    }


def qwen2_names(cfg: ModelConfig) -> dict[str, str]:
    """The names every Qwen2-layout checkpoint shares (Dream, LLaDA-MoE): embedding, final norm,
    LM head and each layer's two norms, checkpoint name -> internal name."""
    names = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    for i in range(cfg.n_layers):
        b, o = f"model.layers.{i}.", f"layers.{i}."
        names[b + "input_layernorm.weight"] = o + "attn_norm.weight"
        names[b + "post_attention_layernorm.weight"] = o + "mlp_norm.weight"
    return names


def hf_names(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint weight name -> internal parameter name, for every weight the checkpoint holds."""
    names = qwen2_names(cfg)
    for i in range(cfg.n_layers):
        b, o = f"model.layers.{i}.", f"layers.{i}."
        names.update({
            b + "self_attn.o_proj.weight": o + "attn.o.weight",
            b + "mlp.gate_proj.weight": o + "mlp.gate.weight", b + "mlp.up_proj.weight": o + "mlp.up.weight",
            b + "mlp.down_proj.weight": o + "mlp.down.weight",
        })
        for proj in ("q", "k", "v"):
            for kind in ("weight", "bias"):
                names[f"{b}self_attn.{proj}_proj.{kind}"] = f"{o}attn.{proj}.{kind}"
    return names


class DreamModel(DiffusionTransformer):
    family = "dream"
    config_from_hf = staticmethod(config_from_hf)
    config_to_hf = staticmethod(config_to_hf)
    config_keys = QWEN2_KEYS
    hf_names = staticmethod(hf_names)
