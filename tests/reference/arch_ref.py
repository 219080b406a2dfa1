"""Plain-torch reference forwards of LLaDA-8B, LLaDA-MoE-7B-A1B and Dream-v0-7B, from the real
state-dict layout.

Written from the published architectures (docs/fidelity.md §Architectures); independent of
`dllm`. Functions take the checkpoint's ``state_dict`` (real HF names) and its ``config.json`` dict.

Numerics, per model (these are the points where the two families differ):

* RMSNorm (both): upcast to fp32, x * rsqrt(mean(x^2) + eps), cast back, then ``weight * x`` in the
  activation dtype. eps from the config (LLaDA ``rms_norm_eps`` 1e-5, Dream 1e-6).
* RoPE (both NeoX / rotate-half, angles = outer(position, inv_freq) in fp32, concatenated with
  themselves). LLaDA (``rope_full_precision``) rotates q and k in fp32 and casts back; Dream casts
  cos/sin to the activation dtype and rotates in that dtype.
* Attention (both bidirectional, scale 1/sqrt(head_dim), GQA by ``repeat_interleave`` over heads):
  written out as matmul + softmax, computed in fp32 and cast back to the activation dtype (the
  "upcast" reference; in fp32 it equals SDPA up to summation order).
* Masks. LLaDA: absolute positions 0..L-1 always; a (B, L) mask with a zero becomes the additive
  key-only bias (1 - m) * finfo(float32).min of shape (B, 1, 1, L); pad queries still see real keys.
  Dream: without zeros positions are 0..L-1 and no mask; with zeros position ids are cumsum(m) - 1
  with pads set to 1, and the mask is query_valid AND key_valid. That boolean mask leaves pad query
  rows with no admissible key; here it is applied as an additive finfo(float32).min bias, so such
  rows attend uniformly (finite, never NaN). Logits at pad positions are therefore unspecified and
  must not be compared; real positions never see pad keys, so they are unaffected.
* LLaDA-MoE: LLaDA's mask convention; q and k each get an RMSNorm over head_dim before the
  rotation, which covers the first ``partial_rotary_factor`` of each head's dims with cos/sin cast
  to the activation dtype. Its MLP is written as the published modelling code runs it: softmax of
  the gate's logits in fp32, top-k, the k weights cast to the activation dtype (no renormalisation),
  then expert by expert: the expert's tokens, down(silu(gate) * up), times their weight, added into
  the output with ``index_add_``.
* LLaDA2: one fused q/k/v product split by heads, LLaDA-MoE's per-head QK norm and partial
  rotation (int(head_dim * partial_rotary_factor) dims; the config's ``rotary_dim`` is not read), GQA, and block-causal attention: the published ``generate`` passes the additive mask
  log(tril(ones(blocks, blocks))) expanded to blocks of 32 columns from column 0. The first
  ``first_k_dense_replace`` layers are dense; the others score experts with the sigmoid of the
  gate's fp32 logits, rank them with ``expert_bias`` added inside the best ``topk_group`` of
  ``n_group`` groups (a group scores its two best), divide the unbiased weights by their sum (+1e-20)
  when more than one expert is chosen, scale them by ``routed_scaling_factor`` and sum the weighted expert outputs in fp32; the shared
  expert is added after the cast back.
* Heads: LLaDA, LLaDA-MoE and LLaDA2 logits are aligned (row i predicts token i) with width ``embedding_size``; Dream
  returns RAW logits (row i predicts token i + 1). :func:`dream_shift` aligns them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["dream_forward_ref", "dream_shift", "llada2_forward_ref", "llada_forward_ref", "lladamoe_forward_ref"]


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """fp32 normalisation, cast back, then the weight multiply in the activation dtype."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rope_angles(positions: Tensor, head_dim: int, theta: float) -> Tensor:
    """positions (B|1, L) integer -> angles (B|1, 1, L, D) in fp32, halves repeated (NeoX layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, L, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, L, D)
    return angles[:, None]  # (B, 1, L, D): broadcast over heads


def _rotate_half(x: Tensor) -> Tensor:
    """[x1, x2] (halves of the last dim) -> [-x2, x1]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """Bidirectional attention in fp32. q (B, H, L, D); k, v (B, H, L, D); bias broadcastable to
    (B, H, L, L), additive, fp32. Returns (B, H, L, D) in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)) * scale  # (B, H, L, L)
    if bias is not None:
        scores = scores + bias
    scores = scores - scores.amax(dim=-1, keepdim=True)  # stable softmax, written out
    weights = scores.exp()
    weights = weights / weights.sum(dim=-1, keepdim=True)  # (B, H, L, L)
    return (weights @ v.to(torch.float32)).to(q.dtype)  # (B, H, L, D)


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    B, L, _ = x.shape
    return x.view(B, L, n_heads, -1).transpose(1, 2)  # (B, H, L, D)


def _merge_heads(x: Tensor) -> Tensor:
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B, L, H*D)


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, L, D) -> (B, H_kv * n_rep, L, D); kv head j serves query heads j*n_rep ... (j+1)*n_rep-1."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


# ---------------------------------------------------------------------------------------------
# LLaDA
# ---------------------------------------------------------------------------------------------


def _check_llada_config(config: Mapping) -> None:
    expected = {
        "rope": True,
        "alibi": False,
        "block_type": "llama",
        "block_group_size": 1,
        "activation_type": "silu",
        "layer_norm_type": "rms",
        "include_bias": False,
        "include_qkv_bias": False,
        "attention_layer_norm": False,
        "scale_logits": False,
        "input_emb_norm": False,
    }
    bad = {k: config.get(k) for k, v in expected.items() if config.get(k, v) != v}
    if bad:
        raise ValueError(f"llada_forward_ref models only {expected}; config has {bad}")


def llada_forward_ref(
    state_dict: Mapping[str, Tensor],
    config: Mapping,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
) -> Tensor:
    """LLaDA forward: ``input_ids`` (B, L) -> aligned logits (B, L, embedding_size).

    ``state_dict`` uses the real names (``model.transformer.wte.weight`` ...); ``config`` is the
    ``config.json`` dict. ``attention_mask`` (B, L), 1 = real token, is used only when it contains a
    zero (additive key-only bias); or a bool (B, 1, L, L), True where the query row attends to the
    key column, as WINO's patched LLaDA takes it. Positions are the absolute columns 0..L-1, or
    ``position_ids`` (L,) when given (WINO's). Runs in the dtype of the weights; row i predicts
    token i (no shift).
    """
    _check_llada_config(config)
    p = "model.transformer."
    d, n_heads = config["d_model"], config["n_heads"]
    n_kv = config["n_kv_heads"] or (1 if config["multi_query_attention"] else n_heads)
    head_dim = d // n_heads
    eps = config["rms_norm_eps"]
    B, L = input_ids.shape

    x = F.embedding(input_ids, state_dict[p + "wte.weight"])  # (B, L, d)

    bias = None
    if attention_mask is not None and attention_mask.dim() == 4:
        bias = torch.zeros(attention_mask.shape, dtype=torch.float32, device=input_ids.device)
        bias = bias.masked_fill(~attention_mask, torch.finfo(torch.float32).min)  # (B, 1, L, L)
    elif attention_mask is not None and bool((attention_mask == 0).any()):
        m = attention_mask.to(torch.float32).view(B, L)
        bias = ((1.0 - m) * torch.finfo(torch.float32).min)[:, None, None, :]  # (B, 1, 1, L), keys only

    positions = torch.arange(L, device=input_ids.device) if position_ids is None else position_ids
    angles = _rope_angles(positions[None], head_dim, config["rope_theta"])
    cos, sin = angles.cos(), angles.sin()  # (1, 1, L, D) fp32

    for i in range(config["n_layers"]):
        b = f"{p}blocks.{i}."
        h = _rms_norm(x, state_dict[b + "attn_norm.weight"], eps)
        q = _split_heads(F.linear(h, state_dict[b + "q_proj.weight"]), n_heads)  # (B, H, L, D)
        k = _split_heads(F.linear(h, state_dict[b + "k_proj.weight"]), n_kv)  # (B, H_kv, L, D)
        v = _split_heads(F.linear(h, state_dict[b + "v_proj.weight"]), n_kv)  # (B, H_kv, L, D)
        # rope_full_precision: rotate in fp32, cast back.
        qf, kf = q.to(torch.float32), k.to(torch.float32)
        q = (qf * cos + _rotate_half(qf) * sin).to(q.dtype)
        k = (kf * cos + _rotate_half(kf) * sin).to(k.dtype)
        k, v = _repeat_kv(k, n_heads // n_kv), _repeat_kv(v, n_heads // n_kv)  # (B, H, L, D)
        att = _merge_heads(_attention(q, k, v, bias))  # (B, L, d)
        x = x + F.linear(att, state_dict[b + "attn_out.weight"])

        h = _rms_norm(x, state_dict[b + "ff_norm.weight"], eps)
        gate = F.silu(F.linear(h, state_dict[b + "ff_proj.weight"]))  # (B, L, mlp): ff_proj is the gate
        up = F.linear(h, state_dict[b + "up_proj.weight"])  # (B, L, mlp)
        x = x + F.linear(gate * up, state_dict[b + "ff_out.weight"])  # block ff_out = down

    x = _rms_norm(x, state_dict[p + "ln_f.weight"], eps)
    head = state_dict[p + "wte.weight"] if config["weight_tying"] else state_dict[p + "ff_out.weight"]
    return F.linear(x, head)  # (B, L, V)


# ---------------------------------------------------------------------------------------------
# Dream
# ---------------------------------------------------------------------------------------------


def dream_forward_ref(
    state_dict: Mapping[str, Tensor],
    config: Mapping,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Dream forward (mask convention: see the module docstring): ``input_ids`` (B, L) -> RAW logits (B, L, V).

    Row i of the result predicts token i + 1 (Qwen2 next-token alignment); apply
    :func:`dream_shift` to align. ``attention_mask`` (B, L), 1 = real token: when it has a zero,
    position ids are cumsum(mask) - 1 (pads set to 1) and attention is restricted to
    query_valid AND key_valid (pad query rows: see the module docstring); otherwise positions are
    0..L-1 and attention is unmasked. Runs in the dtype of the weights.
    """
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"dream_forward_ref models hidden_act 'silu', got {config['hidden_act']!r}")
    if config.get("rope_scaling") is not None:
        raise ValueError("dream_forward_ref models rope_scaling null only")
    d, n_heads, n_kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = d // n_heads
    eps = config["rms_norm_eps"]
    B, L = input_ids.shape
    device = input_ids.device

    x = F.embedding(input_ids, state_dict["model.embed_tokens.weight"])  # (B, L, d)

    if attention_mask is not None and bool((attention_mask == 0).any()):
        m = attention_mask.to(device).long().view(B, L)
        positions = m.cumsum(-1) - 1  # (B, L): first real token at 0
        positions = positions.masked_fill(m == 0, 1)
        valid = m.bool()
        allowed = valid[:, None, :, None] & valid[:, None, None, :]  # (B, 1, L, L): query AND key
        bias = torch.zeros(B, 1, L, L, dtype=torch.float32, device=device)
        bias = bias.masked_fill(~allowed, torch.finfo(torch.float32).min)
    else:
        positions = torch.arange(L, device=device)[None]  # (1, L)
        bias = None

    angles = _rope_angles(positions, head_dim, config["rope_theta"])  # (B|1, 1, L, D) fp32
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # rotation runs in activation dtype

    for i in range(config["num_hidden_layers"]):
        b = f"model.layers.{i}."
        a = b + "self_attn."
        h = _rms_norm(x, state_dict[b + "input_layernorm.weight"], eps)
        q = _split_heads(F.linear(h, state_dict[a + "q_proj.weight"], state_dict[a + "q_proj.bias"]), n_heads)
        k = _split_heads(F.linear(h, state_dict[a + "k_proj.weight"], state_dict[a + "k_proj.bias"]), n_kv)
        v = _split_heads(F.linear(h, state_dict[a + "v_proj.weight"], state_dict[a + "v_proj.bias"]), n_kv)
        q = q * cos + _rotate_half(q) * sin  # (B, H, L, D)
        k = k * cos + _rotate_half(k) * sin  # (B, H_kv, L, D)
        k, v = _repeat_kv(k, n_heads // n_kv), _repeat_kv(v, n_heads // n_kv)  # (B, H, L, D)
        att = _merge_heads(_attention(q, k, v, bias))  # (B, L, d)
        x = x + F.linear(att, state_dict[a + "o_proj.weight"])  # no o_proj bias

        h = _rms_norm(x, state_dict[b + "post_attention_layernorm.weight"], eps)
        gate = F.silu(F.linear(h, state_dict[b + "mlp.gate_proj.weight"]))  # (B, L, mlp)
        up = F.linear(h, state_dict[b + "mlp.up_proj.weight"])  # (B, L, mlp)
        x = x + F.linear(gate * up, state_dict[b + "mlp.down_proj.weight"])

    x = _rms_norm(x, state_dict["model.norm.weight"], eps)
    head = state_dict["model.embed_tokens.weight"] if config["tie_word_embeddings"] else state_dict["lm_head.weight"]
    return F.linear(x, head)  # (B, L, V), raw (unshifted)


def dream_shift(logits: Tensor) -> Tensor:
    """Align Dream's raw logits: shifted[:, 0] = raw[:, 0], shifted[:, i] = raw[:, i - 1].

    (B, L, V) -> (B, L, V). Position 0's value is meaningless and never used (always prompt).
    """
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


# ---------------------------------------------------------------------------------------------
# LLaDA-MoE
# ---------------------------------------------------------------------------------------------


def _partial_rotation(L: int, rot: int, theta: float, dtype: torch.dtype):
    """A function rotating the first ``rot`` dims of (B, H, L, D) by positions 0..L-1, cos/sin cast
    to ``dtype`` (the activation dtype); the other dims pass unchanged."""
    angles = _rope_angles(torch.arange(L)[None], rot, theta)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(t: Tensor) -> Tensor:
        r, rest = t[..., :rot], t[..., rot:]
        return torch.cat([r * cos + _rotate_half(r) * sin, rest], dim=-1)
    return rotate


def _moe_mlp(h: Tensor, state_dict: Mapping[str, Tensor], b: str, config: Mapping) -> Tensor:
    """The routed experts of layer prefix ``b`` on h (T, d), expert by expert."""
    k, n_experts = config["num_experts_per_tok"], config["num_experts"]
    probs = F.softmax(F.linear(h, state_dict[b + "mlp.gate.weight"]), dim=-1, dtype=torch.float32)
    weights, chosen = probs.topk(k, dim=-1)
    weights = weights.to(h.dtype)
    out = torch.zeros_like(h)
    for e in range(n_experts):
        token, slot = torch.where(chosen == e)
        if token.numel() == 0:
            continue
        x = h[token]
        p = f"{b}mlp.experts.{e}."
        y = F.linear(F.silu(F.linear(x, state_dict[p + "gate_proj.weight"])) * F.linear(x, state_dict[p + "up_proj.weight"]),
                     state_dict[p + "down_proj.weight"])
        out.index_add_(0, token, y * weights[token, slot, None])
    if config.get("shared_expert_intermediate_size"):
        p = b + "shared_expert."
        out = out + F.linear(F.silu(F.linear(h, state_dict[p + "gate_proj.weight"])) * F.linear(h, state_dict[p + "up_proj.weight"]),
                             state_dict[p + "down_proj.weight"])
    return out


def lladamoe_forward_ref(
    state_dict: Mapping[str, Tensor],
    config: Mapping,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """LLaDA-MoE forward: ``input_ids`` (B, L) -> aligned logits (B, L, V) (row i predicts token i).

    Positions 0..L-1; ``attention_mask`` (B, L) with zeros becomes LLaDA's key-only additive bias.
    Runs in the dtype of the weights.
    """
    d, n_heads, n_kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = d // n_heads
    rot = int(head_dim * config.get("partial_rotary_factor", 1.0))
    eps = config["rms_norm_eps"]
    clip = config.get("clip_qkv")
    B, L = input_ids.shape
    x = F.embedding(input_ids, state_dict["model.embed_tokens.weight"])  # (B, L, d)
    bias = None
    if attention_mask is not None and bool((attention_mask == 0).any()):
        m = attention_mask.to(torch.float32).view(B, 1, 1, L)
        bias = (1.0 - m) * torch.finfo(torch.float32).min
    rotate = _partial_rotation(L, rot, config["rope_theta"], x.dtype)

    for i in range(config["num_hidden_layers"]):
        b = f"model.layers.{i}."
        a = b + "self_attn."
        h = _rms_norm(x, state_dict[b + "input_layernorm.weight"], eps)
        q = F.linear(h, state_dict[a + "q_proj.weight"]).view(B, L, n_heads, head_dim)
        k = F.linear(h, state_dict[a + "k_proj.weight"]).view(B, L, n_kv, head_dim)
        if config.get("qk_layernorm", True):
            q = _rms_norm(q, state_dict[a + "q_norm.weight"], eps)
            k = _rms_norm(k, state_dict[a + "k_norm.weight"], eps)
        v = F.linear(h, state_dict[a + "v_proj.weight"]).view(B, L, n_kv, head_dim)
        if clip is not None:
            q, k, v = q.clamp(-clip, clip), k.clamp(-clip, clip), v.clamp(-clip, clip)
        q, k, v = rotate(q.transpose(1, 2)), rotate(k.transpose(1, 2)), v.transpose(1, 2)
        k, v = _repeat_kv(k, n_heads // n_kv), _repeat_kv(v, n_heads // n_kv)
        x = x + F.linear(_merge_heads(_attention(q, k, v, bias)), state_dict[a + "o_proj.weight"])
        h = _rms_norm(x, state_dict[b + "post_attention_layernorm.weight"], eps)
        x = x + _moe_mlp(h.reshape(B * L, d), state_dict, b, config).view(B, L, d)
    x = _rms_norm(x, state_dict["model.norm.weight"], eps)
    head = state_dict["model.embed_tokens.weight"] if config["tie_word_embeddings"] else state_dict["lm_head.weight"]
    return F.linear(x, head)


# ---------------------------------------------------------------------------------------------
# LLaDA2
# ---------------------------------------------------------------------------------------------


def _swiglu(x: Tensor, state_dict: Mapping[str, Tensor], p: str) -> Tensor:
    up = F.linear(x, state_dict[p + "up_proj.weight"])
    return F.linear(F.silu(F.linear(x, state_dict[p + "gate_proj.weight"])) * up, state_dict[p + "down_proj.weight"])


def _llada2_moe(h: Tensor, state_dict: Mapping[str, Tensor], b: str, config: Mapping) -> Tensor:
    """LLaDA2's routed experts + shared expert on h (T, d)."""
    T = h.shape[0]
    E, k = config["num_experts"], config["num_experts_per_tok"]
    G, keep = config["n_group"], config["topk_group"]
    scores = torch.sigmoid(F.linear(h.float(), state_dict[b + "mlp.gate.weight"].float()))       # (T, E)
    choice = scores + state_dict[b + "mlp.gate.expert_bias"].float()
    group_scores = choice.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)                   # (T, G)
    groups = group_scores.topk(keep, dim=-1).indices
    allowed = torch.zeros(T, G, dtype=torch.bool).scatter_(1, groups, True)
    allowed = allowed[:, :, None].expand(T, G, E // G).reshape(T, E)
    chosen = choice.masked_fill(~allowed, float("-inf")).topk(k, dim=-1).indices
    weights = scores.gather(1, chosen)
    if k > 1:                                                   # one expert keeps its raw score
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * config["routed_scaling_factor"]
    out = torch.zeros(T, h.shape[1], dtype=torch.float32)
    for e in range(E):
        token, slot = torch.where(chosen == e)
        if token.numel():
            y = _swiglu(h[token], state_dict, f"{b}mlp.experts.{e}.")
            out.index_add_(0, token, y.float() * weights[token, slot, None])
    out = out.to(h.dtype)
    if config["num_shared_experts"]:
        out = out + _swiglu(h, state_dict, b + "mlp.shared_experts.")
    return out


def llada2_forward_ref(
    state_dict: Mapping[str, Tensor],
    config: Mapping,
    input_ids: Tensor,
    block_length: int = 32,
) -> Tensor:
    """LLaDA2 forward with block-causal attention (blocks of ``block_length`` from column 0):
    ``input_ids`` (B, L) -> aligned logits (B, L, V). Runs in the dtype of the weights."""
    d, H, H_kv, D = (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"],
                     config["head_dim"])
    rot, eps = int(D * config.get("partial_rotary_factor", 1.0)), config["rms_norm_eps"]
    B, L = input_ids.shape
    x = F.embedding(input_ids, state_dict["model.word_embeddings.weight"])
    blocks = -(-L // block_length)
    tril = torch.tril(torch.ones(blocks, blocks))
    bias = torch.log(tril.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)[:L, :L])
    rotate = _partial_rotation(L, rot, config["rope_theta"], x.dtype)

    for i in range(config["num_hidden_layers"]):
        b = f"model.layers.{i}."
        a = b + "attention."
        h = _rms_norm(x, state_dict[b + "input_layernorm.weight"], eps)
        qkv = F.linear(h, state_dict[a + "query_key_value.weight"]).view(B, L, H + 2 * H_kv, D)
        q, k, v = qkv.split([H, H_kv, H_kv], dim=2)
        q = _rms_norm(q, state_dict[a + "query_layernorm.weight"], eps)
        k = _rms_norm(k, state_dict[a + "key_layernorm.weight"], eps)
        q, k, v = rotate(q.transpose(1, 2)), rotate(k.transpose(1, 2)), v.transpose(1, 2)
        k, v = _repeat_kv(k, H // H_kv), _repeat_kv(v, H // H_kv)
        x = x + F.linear(_merge_heads(_attention(q, k, v, bias)), state_dict[a + "dense.weight"])
        h = _rms_norm(x, state_dict[b + "post_attention_layernorm.weight"], eps)
        if i < config["first_k_dense_replace"]:
            x = x + _swiglu(h, state_dict, b + "mlp.")
        else:
            x = x + _llada2_moe(h.reshape(B * L, d), state_dict, b, config).view(B, L, d)
    x = _rms_norm(x, state_dict["model.norm.weight"], eps)
    head = state_dict["model.word_embeddings.weight" if config["tie_word_embeddings"] else "lm_head.weight"]
    return F.linear(x, head)
