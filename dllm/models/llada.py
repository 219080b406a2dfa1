"""LLaDA (GSAI-ML/LLaDA-8B-Base / -Instruct, LLaDA-1.5): the OLMo-style config and weight names
of the published checkpoints, mapped onto the shared bidirectional transformer.

Architecture (docs/fidelity.md §Architectures): pre-norm RMSNorm (eps 1e-5), NeoX RoPE rotated in
fp32 (theta 5e5), separate q/k/v without biases, SwiGLU with the gate in `ff_proj` and the up
projection in `up_proj` (a Llama habit of reading `up_proj` as the gate loads but is wrong),
untied LM head `ff_out`, no logit shift: position i predicts token i.
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .config_json import check_dense_layout, check_sizes, check_stated, first_of, flag, id_of, integer, number
from .transformer import DiffusionTransformer

# Keys of an OLMo-style config whose values this implementation does not cover, with the value
# it needs; anything else is refused with a message naming the key.
_REQUIRED = {
    "rope": True, "alibi": False, "block_type": "llama", "attention_layer_norm": False,
    "include_bias": False, "input_emb_norm": False, "scale_logits": False, "block_group_size": 1,
    "layer_norm_type": "rms", "activation_type": "silu", "clip_qkv": None, "layer_norm_with_affine": True,
    "bias_for_layer_norm": False,
}
# Of those, the keys whose default in LLaDA's config class is another value (no RoPE, the
# sequential block, mean-centred LayerNorm, SwiGLU's halving activation): a config.json must state them.
_STATED = ("rope", "block_type", "layer_norm_type", "activation_type")


def _kv_heads(d: dict[str, Any], n_heads: int) -> int:
    """The key/value head count as LLaDA's config class derives it from `n_kv_heads` and
    `multi_query_attention` (both set: they must agree)."""
    n_kv, mqa = integer(d, "n_kv_heads", None, "LLaDA"), d.get("multi_query_attention")
    if mqa is None:
        return n_heads if n_kv is None else n_kv
    implied = 1 if mqa else n_heads
    if n_kv is not None and n_kv != implied:
        raise ValueError(f"LLaDA config keys disagree: multi_query_attention = {mqa!r} means {implied} "
                         f"key/value head(s), n_kv_heads = {n_kv!r}; set one of them")
    return implied


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a LLaDA `config.json` (every key read; unsupported values refused)."""
    check_stated(d, _STATED, _REQUIRED, "LLaDA")
    for key, want in _REQUIRED.items():
        # null is the class default: refused where it is not the supported value (false and null alike)
        if key in d and d[key] != want and not (want in (None, False) and d[key] is None):
            raise ValueError(f"LLaDA config key {key!r} = {d[key]!r} is not supported (supported: {want!r})")
    sizes = {"d_model": first_of(d, "d_model", "hidden_size"), "n_layers": first_of(d, "n_layers", "num_hidden_layers"),
             "n_heads": first_of(d, "n_heads", "num_attention_heads"), "vocab_size": d.get("vocab_size")}
    missing = [k for k, v in (*sizes.items(), ("mask_token_id", d.get("mask_token_id")),
                              ("eos_token_id", d.get("eos_token_id")), ("weight_tying", d.get("weight_tying")))
               if v is None]
    if missing:
        raise ValueError(f"LLaDA config.json lacks required keys: {', '.join(missing)}")
    check_sizes(sizes, tuple(sizes), "LLaDA")
    d_model, n_heads = sizes["d_model"], sizes["n_heads"]
    n_kv = _kv_heads(d, n_heads)
    mlp = integer(d, "mlp_hidden_size", None, "LLaDA") or int(number(d, "mlp_ratio", 4, "LLaDA") * d_model)
    embedding = integer(d, "embedding_size", None, "LLaDA")
    if embedding is not None and embedding < sizes["vocab_size"]:
        raise ValueError(f"LLaDA config key 'embedding_size' = {embedding} is smaller than vocab_size "
                         f"{sizes['vocab_size']} (it must be at least as large: the embedding holds every token)")
    eos = id_of(d, "eos_token_id", "LLaDA")
    return ModelConfig(
        family="llada",
        # The logit width is `embedding_size` (the embedding may be padded past the tokenizer vocab).
        vocab_size=first_of(d, "embedding_size", "vocab_size"),
        d_model=d_model, n_layers=sizes["n_layers"], n_heads=n_heads, n_kv_heads=n_kv,
        mlp_hidden=mlp, norm_eps=number(d, "rms_norm_eps", 1e-5, "LLaDA"), rope_theta=number(d, "rope_theta", 10000.0, "LLaDA"),
        max_seq_len=integer(d, "max_sequence_length", None, "LLaDA")
        or integer(d, "max_position_embeddings", 1024, "LLaDA"),   # LLaDAConfig default
        mask_token_id=id_of(d, "mask_token_id", "LLaDA"), eos_token_id=eos,
        pad_token_id=id_of(d, "pad_token_id", "LLaDA", default=eos), bos_token_id=id_of(d, "bos_token_id", "LLaDA"),
        qkv_bias=flag(d, "include_qkv_bias", False, "LLaDA"),
        tie_embeddings=flag(d, "weight_tying", False, "LLaDA"),
        rope_fp32=flag(d, "rope_full_precision", True, "LLaDA"),
        logit_shift=False,
    )


def config_to_hf(cfg: ModelConfig, **extra: Any) -> dict[str, Any]:
    """A LLaDA `config.json` for `cfg`, with the key set of the published checkpoints."""
    if cfg.family != "llada" or cfg.logit_shift or cfg.n_kv_heads != cfg.n_heads:
        raise ValueError(f"a LLaDA config.json describes an MHA model without logit shift; got family "
                         f"{cfg.family!r}, n_kv_heads {cfg.n_kv_heads} of {cfg.n_heads}, logit_shift {cfg.logit_shift}")
    check_dense_layout(cfg, "LLaDA")
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
        "multi_query_attention": None, "mlp_hidden_size": cfg.mlp_hidden,
        "mlp_ratio": max(1, round(cfg.mlp_hidden / cfg.d_model)), "activation_type": "silu", "block_type": "llama",
        "layer_norm_type": "rms", "rms_norm_eps": cfg.norm_eps, "layer_norm_with_affine": True,
        "attention_layer_norm": False, "attention_layer_norm_with_affine": True, "bias_for_layer_norm": False,
        "include_bias": False, "include_qkv_bias": cfg.qkv_bias, "rope": True, "rope_theta": cfg.rope_theta,
        "rope_full_precision": cfg.rope_fp32, "alibi": False, "alibi_bias_max": 8.0,
        "vocab_size": cfg.vocab_size, "embedding_size": cfg.vocab_size, "weight_tying": cfg.tie_embeddings,
        "input_emb_norm": False, "scale_logits": False, "max_sequence_length": cfg.max_seq_len,
        "mask_token_id": cfg.mask_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "block_group_size": 1, "flash_attention": False, "use_cache": False, "attention_dropout": 0.0,
        "embedding_dropout": 0.0, "residual_dropout": 0.0, "init_device": "meta", "init_fn": "mitchell",
        "init_std": 0.02, "init_cutoff_factor": None, "precision": "amp_bf16", "clip_qkv": None, **extra,
    }


def hf_names(cfg: ModelConfig) -> dict[str, str]:
    """Checkpoint weight name -> internal parameter name, for every weight the checkpoint holds."""
    p = "model.transformer."
    names = {p + "wte.weight": "embed.weight", p + "ln_f.weight": "norm.weight"}
    if not cfg.tie_embeddings:
        names[p + "ff_out.weight"] = "head.weight"
    for i in range(cfg.n_layers):
        b, o = f"{p}blocks.{i}.", f"layers.{i}."
        names.update({
            b + "attn_norm.weight": o + "attn_norm.weight", b + "attn_out.weight": o + "attn.o.weight",
            b + "ff_norm.weight": o + "mlp_norm.weight", b + "ff_proj.weight": o + "mlp.gate.weight",
            b + "up_proj.weight": o + "mlp.up.weight", b + "ff_out.weight": o + "mlp.down.weight",
        })
        for src, dst in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
            names[f"{b}{src}.weight"] = f"{o}attn.{dst}.weight"
            if cfg.qkv_bias:
                names[f"{b}{src}.bias"] = f"{o}attn.{dst}.bias"
    return names


class LLaDAModel(DiffusionTransformer):
    family = "llada"
    config_from_hf = staticmethod(config_from_hf)
    config_to_hf = staticmethod(config_to_hf)
    config_keys = {"vocab_size": "embedding_size", "mlp_hidden": "mlp_hidden_size",
                   "max_seq_len": "max_sequence_length"}
    hf_names = staticmethod(hf_names)
