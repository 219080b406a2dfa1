"""The test fixtures and reference oracles are what they claim to be (no `dllm` import)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from tests.fixtures.checkpoints import (
    DREAM_REAL_SPECIAL_IDS,
    DREAM_TINY_SPECIAL_IDS,
    LLADA_REAL_SPECIAL_IDS,
    LLADA_TINY_SPECIAL_IDS,
    load_state_dict,
    write_dream_checkpoint,
    write_dream_tokenizer,
    write_llada_checkpoint,
    write_llada_tokenizer,
)
from tests.reference.arch_ref import dream_forward_ref, dream_shift, llada_forward_ref
from tests.reference.samplers_ref import dream_generate_ref, llada_generate_ref

TEXT = "The robot walked to the river, saw 12345 ducks!\n  Then it went home.\tOK?"

# Every key of LLaDA-8B-Instruct's config.json.
LLADA_KEYS = {
    "activation_type", "alibi", "alibi_bias_max", "architectures", "attention_dropout",
    "attention_layer_norm", "attention_layer_norm_with_affine", "auto_map", "bias_for_layer_norm",
    "block_group_size", "block_type", "d_model", "embedding_dropout", "embedding_size", "eos_token_id",
    "flash_attention", "include_bias", "include_qkv_bias", "init_cutoff_factor", "init_device", "init_fn",
    "init_std", "input_emb_norm", "layer_norm_type", "layer_norm_with_affine", "mask_token_id",
    "max_sequence_length", "mlp_hidden_size", "mlp_ratio", "model_type", "multi_query_attention", "n_heads",
    "n_kv_heads", "n_layers", "pad_token_id", "precision", "residual_dropout", "rms_norm_eps", "rope",
    "rope_full_precision", "rope_theta", "scale_logits", "transformers_version", "use_cache", "vocab_size",
    "weight_tying",
}
DREAM_KEYS = {
    "architectures", "attention_dropout", "auto_map", "bos_token_id", "eos_token_id", "hidden_act",
    "hidden_size", "initializer_range", "intermediate_size", "mask_token_id", "max_position_embeddings",
    "max_window_layers", "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
    "pad_token_id", "rms_norm_eps", "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings",
    "torch_dtype", "transformers_version", "use_cache", "use_sliding_window", "vocab_size",
}


# Own fixtures (not conftest's llada_dir / dream_dir): these checks pin the default tiny sizes.
@pytest.fixture(scope="module")
def tiny_llada_dir(tmp_path_factory):
    return write_llada_checkpoint(tmp_path_factory.mktemp("selfcheck_llada"))


@pytest.fixture(scope="module")
def tiny_dream_dir(tmp_path_factory):
    return write_dream_checkpoint(tmp_path_factory.mktemp("selfcheck_dream"))


def _read(path, name):
    return json.loads((path / name).read_text())


# ---------------------------------------------------------------------------------------------
# Configs and weights
# ---------------------------------------------------------------------------------------------


def test_llada_config_and_weights(tiny_llada_dir):
    cfg = _read(tiny_llada_dir, "config.json")
    assert set(cfg) == LLADA_KEYS
    assert cfg["model_type"] == "llada" and cfg["architectures"] == ["LLaDAModelLM"]
    assert cfg["auto_map"]["AutoModel"] == "modeling_llada.LLaDAModelLM"
    tiny = dict(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=96, vocab_size=320,
                embedding_size=320, max_sequence_length=128, mask_token_id=310, eos_token_id=301,
                pad_token_id=301, rope=True, alibi=False, weight_tying=False, rope_theta=500000.0)
    assert {k: cfg[k] for k in tiny} == tiny
    assert _read(tiny_llada_dir, "generation_config.json")["bos_token_id"] == 300

    sd = load_state_dict(tiny_llada_dir)
    p = "model.transformer."
    expected = {p + "wte.weight": (320, 64), p + "ln_f.weight": (64,), p + "ff_out.weight": (320, 64)}
    for i in range(2):
        b = f"{p}blocks.{i}."
        expected |= {
            b + "attn_norm.weight": (64,), b + "ff_norm.weight": (64,),
            b + "q_proj.weight": (64, 64), b + "k_proj.weight": (64, 64), b + "v_proj.weight": (64, 64),
            b + "attn_out.weight": (64, 64), b + "ff_proj.weight": (96, 64), b + "up_proj.weight": (96, 64),
            b + "ff_out.weight": (64, 96),
        }
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected
    assert all(v.dtype == torch.float32 for v in sd.values())
    assert sum(v.numel() for v in sd.values()) == 110_912  # 102,720 at vocab 256; these fixtures have vocab 320
    norm = sd[p + "blocks.0.attn_norm.weight"]
    assert abs(norm.mean().item() - 1) < 0.1 and 0.2 < sd[p + "wte.weight"].std().item() < 0.4


def test_llada_gqa_override_and_bf16(tmp_path):
    path = write_llada_checkpoint(tmp_path, n_kv_heads=2, dtype=torch.bfloat16)
    assert _read(path, "config.json")["n_kv_heads"] == 2
    sd = load_state_dict(path)
    assert sd["model.transformer.blocks.1.k_proj.weight"].shape == (32, 64)
    assert all(v.dtype == torch.bfloat16 for v in sd.values())
    with pytest.raises(KeyError):
        write_llada_checkpoint(tmp_path / "bad", n_kv_head=2)  # typo is rejected


def test_dream_config_and_weights(tiny_dream_dir):
    cfg = _read(tiny_dream_dir, "config.json")
    assert set(cfg) == DREAM_KEYS
    assert cfg["model_type"] == "Dream" and cfg["architectures"] == ["DreamModel"]
    tiny = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=320, max_position_embeddings=128, rope_theta=1000000.0,
                rms_norm_eps=1e-6, rope_scaling=None, tie_word_embeddings=False, mask_token_id=304,
                pad_token_id=300, bos_token_id=300, eos_token_id=300, torch_dtype="float32")
    assert {k: cfg[k] for k in tiny} == tiny
    gen = _read(tiny_dream_dir, "generation_config.json")
    assert (gen["alg"], gen["alg_temp"], gen["eps"], gen["steps"], gen["temperature"]) == ("origin", None, 0.001, 512, 0.0)
    assert gen["eos_token_id"] == gen["pad_token_id"] == gen["bos_token_id"] == 300

    sd = load_state_dict(tiny_dream_dir)
    expected = {"model.embed_tokens.weight": (320, 64), "model.norm.weight": (64,), "lm_head.weight": (320, 64)}
    for i in range(2):
        b = f"model.layers.{i}."
        a = b + "self_attn."
        expected |= {
            b + "input_layernorm.weight": (64,), b + "post_attention_layernorm.weight": (64,),
            a + "q_proj.weight": (64, 64), a + "q_proj.bias": (64,),
            a + "k_proj.weight": (32, 64), a + "k_proj.bias": (32,),
            a + "v_proj.weight": (32, 64), a + "v_proj.bias": (32,),
            a + "o_proj.weight": (64, 64),
            b + "mlp.gate_proj.weight": (96, 64), b + "mlp.up_proj.weight": (96, 64),
            b + "mlp.down_proj.weight": (64, 96),
        }
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected
    assert sum(v.numel() for v in sd.values()) == 102_976  # 94,784 at vocab 256; these fixtures have vocab 320


@pytest.mark.parametrize("writer", [write_llada_checkpoint, write_dream_checkpoint], ids=["llada", "dream"])
def test_sharded_equals_single(tmp_path, writer):
    single = writer(tmp_path / "single", seed=3)
    sharded = writer(tmp_path / "sharded", seed=3, sharded=True)
    assert not (sharded / "model.safetensors").exists()
    index = _read(sharded, "model.safetensors.index.json")
    assert set(index) == {"metadata", "weight_map"} and set(index["metadata"]) == {"total_size"}
    files = sorted(set(index["weight_map"].values()))
    assert 2 <= len(files) <= 3
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    a, b = load_state_dict(single), load_state_dict(sharded)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in b.values())
    other = load_state_dict(writer(tmp_path / "other", seed=4))
    assert not torch.equal(a[next(iter(a))], other[next(iter(a))])


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------


def _check_roundtrip(tok, special_ids):
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == TEXT
    assert len(ids) < len(TEXT.encode())  # merges apply
    assert max(ids) < 300
    for token, idx in special_ids.items():
        assert tok.convert_tokens_to_ids(token) == idx
        assert tok(f"a{token}b", add_special_tokens=False)["input_ids"] == [ord("a"), idx, ord("b")]
        assert tok.decode([idx]) == token


def test_llada_tokenizer(tiny_llada_dir):
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tiny_llada_dir / "tokenizer.json"))
    _check_roundtrip(tok, LLADA_TINY_SPECIAL_IDS)
    assert tok("hi")["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]  # no implicit BOS

    tok = transformers.PreTrainedTokenizerFast.from_pretrained(tiny_llada_dir)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (300, 301, 301)
    chat = tok.apply_chat_template([{"role": "user", "content": " Hi there \n"}], add_generation_prompt=True, tokenize=False)
    assert chat == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok(chat, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [300, 311] and ids.count(300) == 1 and ids[-3:] == [312, 10, 10]


def test_dream_tokenizer(tiny_dream_dir):
    assert not (tiny_dream_dir / "tokenizer.json").exists()
    tok = transformers.Qwen2Tokenizer.from_pretrained(tiny_dream_dir)
    _check_roundtrip(tok, DREAM_TINY_SPECIAL_IDS)
    assert len(tok) == 305
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (300, 300, None)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_real_id_tokenizers(tmp_path):
    llada = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(write_llada_tokenizer(tmp_path / "llada", LLADA_REAL_SPECIAL_IDS) / "tokenizer.json")
    )
    _check_roundtrip(llada, LLADA_REAL_SPECIAL_IDS)
    dream = transformers.Qwen2Tokenizer.from_pretrained(write_dream_tokenizer(tmp_path / "dream", "real"))
    _check_roundtrip(dream, DREAM_REAL_SPECIAL_IDS)
    assert len(dream) == 151_667  # as the real Dream tokenizer
    assert dream.eos_token_id == dream.pad_token_id == 151643


# ---------------------------------------------------------------------------------------------
# Reference forwards
# ---------------------------------------------------------------------------------------------


def _padding_invariance(forward, sd, cfg, pad_id, shift):
    gen = torch.Generator().manual_seed(0)
    long = torch.randint(0, 300, (1, 12), generator=gen)
    short = torch.randint(0, 300, (1, 7), generator=gen)
    n_pad = long.shape[1] - short.shape[1]
    batch = torch.cat([torch.cat([torch.full((1, n_pad), pad_id), short], dim=1), long])  # (2, 12), row 0 left-padded
    mask = torch.ones_like(batch)
    mask[0, :n_pad] = 0

    out = forward(sd, cfg, batch, mask)  # (2, 12, V)
    assert out.shape == (2, 12, 320) and torch.isfinite(out).all()
    ref_short = forward(sd, cfg, short)
    ref_long = forward(sd, cfg, long, torch.ones_like(long))  # all-ones mask == no mask
    # 1e-5 relative to the logit scale (|logits| reach ~9): LLaDA rotates at absolute positions, so
    # left padding moves every angle and changes fp32 rounding by up to ~2e-5, the same size as the
    # forward's own fp32-vs-fp64 error. Dream recounts positions and meets 1e-5 absolute.
    atol = 1e-5 * max(1.0, ref_short.abs().max().item())
    torch.testing.assert_close(out[0, n_pad:], ref_short[0], rtol=0, atol=atol)
    torch.testing.assert_close(out[1], ref_long[0], rtol=0, atol=atol)
    unmasked = forward(sd, cfg, batch)  # the mask matters: without it pads leak into real rows
    assert (unmasked[0, n_pad:] - ref_short[0]).abs().max() > 1e-2
    if shift:
        torch.testing.assert_close(dream_shift(out)[:, 1:], out[:, :-1], rtol=0, atol=0)
        torch.testing.assert_close(dream_shift(out)[:, 0], out[:, 0], rtol=0, atol=0)
    return ref_short


def test_llada_forward_ref(tiny_llada_dir):
    sd, cfg = load_state_dict(tiny_llada_dir), _read(tiny_llada_dir, "config.json")
    logits = _padding_invariance(llada_forward_ref, sd, cfg, pad_id=301, shift=False)
    # Peaky and well separated: argmax stable under rounding, confidences distinct across positions.
    top2 = logits.softmax(-1).topk(2, dim=-1).values[0]  # (L, 2)
    assert top2[:, 0].mean() > 30 / 320 and (top2[:, 0] - top2[:, 1]).min() > 1e-3
    assert top2[:, 0].sort().values.diff().min() > 1e-4


def test_dream_forward_ref(tiny_dream_dir):
    sd, cfg = load_state_dict(tiny_dream_dir), _read(tiny_dream_dir, "config.json")
    _padding_invariance(dream_forward_ref, sd, cfg, pad_id=300, shift=True)


# ---------------------------------------------------------------------------------------------
# Reference loops
# ---------------------------------------------------------------------------------------------


def test_llada_loop_one_token_per_step(tiny_llada_dir):
    sd, cfg = load_state_dict(tiny_llada_dir), _read(tiny_llada_dir, "config.json")
    mask_id, gen_length = 310, 8
    prompt = torch.tensor([[301, 301, 5, 6, 7], [8, 9, 10, 11, 12]])  # row 0 left-padded with EOS
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    seen = []

    def logits_fn(x, mask):
        assert mask.shape == x.shape and mask[:, 5:].eq(1).all()
        seen.append((x == mask_id).sum(dim=1).tolist())
        return llada_forward_ref(sd, cfg, x, mask)

    out = llada_generate_ref(logits_fn, prompt, attention_mask, steps=gen_length, gen_length=gen_length,
                             block_length=4, mask_id=mask_id)
    assert seen == [[n, n] for n in range(gen_length, 0, -1)]
    assert out.shape == (2, 13) and torch.equal(out[:, :5], prompt) and not (out == mask_id).any()

    # Seeded sampling is reproducible; the global RNG is not touched.
    kwargs = dict(steps=4, gen_length=8, block_length=4, temperature=0.7, remasking="random", mask_id=mask_id)
    fn = lambda x, m: llada_forward_ref(sd, cfg, x, m)  # noqa: E731
    state = torch.get_rng_state()
    a = llada_generate_ref(fn, prompt, attention_mask, generator=torch.Generator().manual_seed(1), **kwargs)
    b = llada_generate_ref(fn, prompt, attention_mask, generator=torch.Generator().manual_seed(1), **kwargs)
    assert torch.equal(a, b) and torch.equal(state, torch.get_rng_state())


def test_dream_loop_schedule(tiny_dream_dir):
    sd, cfg = load_state_dict(tiny_dream_dir), _read(tiny_dream_dir, "config.json")
    mask_id, n = 304, 8
    prompt = torch.tensor([[300, 5, 6, 7], [8, 9, 10, 11]])
    attention_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    seen = []

    def logits_fn(x, mask):
        assert mask.shape == x.shape and mask[:, 4:].eq(1).all()
        seen.append((x == mask_id).sum(dim=1).tolist())
        return dream_forward_ref(sd, cfg, x, mask)

    out = dream_generate_ref(logits_fn, prompt, attention_mask, max_new_tokens=n, steps=n,
                             alg="maskgit_plus", mask_id=mask_id)
    commits = [a[0] - b[0] for a, b in zip(seen, seen[1:] + [[0, 0]])]
    assert commits == [0, 1, 1, 1, 1, 1, 1, 2]  # float32 schedule with steps == max_new_tokens (docs/samplers.md §3)
    assert not (out == mask_id).any() and torch.equal(out[:, :4], prompt)

    # Without padding the callee gets None; origin at T > 0 is reproducible under a seed.
    def unpadded(x, mask):
        assert mask is None
        return dream_forward_ref(sd, cfg, x)

    kwargs = dict(max_new_tokens=n, steps=4, temperature=0.5, top_p=0.9, mask_id=mask_id)
    a = dream_generate_ref(unpadded, prompt[1:], generator=torch.Generator().manual_seed(2), **kwargs)
    b = dream_generate_ref(unpadded, prompt[1:], generator=torch.Generator().manual_seed(2), **kwargs)
    assert torch.equal(a, b) and not (a == mask_id).any()
