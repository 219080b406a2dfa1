"""Loading tiny checkpoints written in the exact Hugging Face layout, against independent forwards."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import dllm
from tests.reference.arch_ref import dream_forward_ref, dream_shift, llada_forward_ref


def _state_dict(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _ragged_batch(pad):
    rows = [[5, 17, 33, 2, 90, 41, 7, 8, 9, 10, 11], [64, 3, 12, 250], [200, 11, 11, 19, 100, 1, 2]]
    L = max(len(r) for r in rows)
    ids = torch.full((3, L), pad, dtype=torch.long)
    mask = torch.zeros((3, L), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, L - len(r):] = torch.tensor(r)
        mask[b, L - len(r):] = 1
    return ids, mask


@pytest.fixture(scope="module")
def llada_fwd_dir(tmp_path_factory):
    """Moderate weights (logits of order 1), so the 1e-5 absolute bound measures the forward, not
    the rounding of large logits."""
    from tests.fixtures.checkpoints import write_llada_checkpoint
    return write_llada_checkpoint(tmp_path_factory.mktemp("llada_fwd"), seed=1, init_std=0.1)


@pytest.fixture(scope="module")
def dream_fwd_dir(tmp_path_factory):
    from tests.fixtures.checkpoints import write_dream_checkpoint
    return write_dream_checkpoint(tmp_path_factory.mktemp("dream_fwd"), seed=1, init_std=0.1)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_llada_forward_equals_reference(llada_fwd_dir, attention):
    llada_dir = llada_fwd_dir
    model, _ = dllm.load(llada_dir, dtype="float32", attention=attention)
    cfg = json.loads((llada_dir / "config.json").read_text())
    sd = _state_dict(llada_dir)
    ids, mask = _ragged_batch(cfg["pad_token_id"])
    # Unpadded: identical positions, so the forwards agree to float32 rounding.
    want = llada_forward_ref(sd, cfg, ids[:1])
    assert (model(ids[:1]) - want).abs().max() <= 1e-5
    # Left-padded batch with the reference's absolute positions: padding keys are masked.
    want = llada_forward_ref(sd, cfg, ids, mask)
    real = mask.bool()
    got = model(ids, key_valid=real)
    assert (got[real] - want[real]).abs().max() <= 1e-5
    # dllm's generation recounts positions from each row's first real token (so a row computes
    # the same alone or in a batch); RoPE depends only on offsets, so this agrees up to rounding.
    pos = (torch.arange(ids.shape[1]) - (1 - mask).sum(1, keepdim=True)).clamp(min=0)
    got = model(ids, key_valid=real, position_ids=pos)
    assert (got[real] - want[real]).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_dream_forward_equals_reference(dream_fwd_dir, attention):
    dream_dir = dream_fwd_dir
    model, _ = dllm.load(dream_dir, dtype="float32", attention=attention)
    cfg = json.loads((dream_dir / "config.json").read_text())
    sd = _state_dict(dream_dir)
    ids, mask = _ragged_batch(cfg["pad_token_id"])
    want = dream_shift(dream_forward_ref(sd, cfg, ids[:1]))
    assert (model(ids[:1]) - want).abs().max() <= 1e-5
    want = dream_shift(dream_forward_ref(sd, cfg, ids, mask))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    got = model(ids, key_valid=mask.bool(), position_ids=pos)
    real = mask.bool()
    real[:, :-1] &= mask.bool()[:, 1:]  # a shifted logit is defined where its source column is real too
    real[torch.arange(3), (1 - mask).sum(1)] = False  # first real token: its source is padding
    assert (got[real] - want[real]).abs().max() <= 1e-5


def test_eager_equals_sdpa_on_checkpoints(llada_dir, dream_dir):
    for folder in (llada_dir, dream_dir):
        a, _ = dllm.load(folder, dtype="float32", attention="eager")
        b, _ = dllm.load(folder, dtype="float32", attention="sdpa")
        x = torch.randint(0, 300, (2, 13), generator=torch.Generator().manual_seed(0))
        assert (a(x) - b(x)).abs().max() <= 1e-5


def test_sharded_equals_single(llada_dir, llada_sharded_dir, dream_dir, dream_sharded_dir):
    assert (llada_sharded_dir / "model.safetensors.index.json").is_file()
    for single, sharded in ((llada_dir, llada_sharded_dir), (dream_dir, dream_sharded_dir)):
        a, _ = dllm.load(single, dtype="float32")
        b, _ = dllm.load(sharded, dtype="float32")
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_family_and_config(llada, dream):
    lm, ltok = llada
    dm, dtok = dream
    assert lm.family == "llada" and dm.family == "dream"
    assert (lm.config.n_heads, lm.config.n_kv_heads, lm.config.qkv_bias, lm.config.logit_shift) == (4, 4, False, False)
    assert (dm.config.n_heads, dm.config.n_kv_heads, dm.config.qkv_bias, dm.config.logit_shift) == (4, 2, True, True)
    assert (lm.config.mask_token_id, lm.config.eos_token_id, lm.config.eot_token_id, lm.config.bos_token_id) == \
        (310, 301, 313, 300)
    assert (dm.config.mask_token_id, dm.config.eos_token_id, dm.config.eot_token_id) == (304, 300, 302)
    assert ltok.convert_ids_to_tokens(310) == "<|mdm_mask|>" and dtok.convert_ids_to_tokens(304) == "<|mask|>"


@pytest.mark.parametrize("dtype,torch_dtype", [("float16", torch.float16), ("bfloat16", torch.bfloat16),
                                               (torch.float32, torch.float32)])
def test_dtypes(llada_dir, dream_dir, dtype, torch_dtype):
    for folder in (llada_dir, dream_dir):
        model, _ = dllm.load(folder, dtype=dtype)
        assert all(p.dtype == torch_dtype for p in model.parameters())
        ref, _ = dllm.load(folder, dtype="float32")
        x = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0))
        got, want = model(x).float(), ref(x)
        assert torch.isfinite(got).all()
        rel_rms = ((got - want).square().mean().sqrt() / want.square().mean().sqrt()).item()
        assert rel_rms <= {torch.float32: 1e-6, torch.float16: 5e-3, torch.bfloat16: 6e-2}[torch_dtype], rel_rms


def test_chat_prompts_are_built_as_the_references_do(llada, dream):
    _, ltok = llada
    _, dtok = dream
    from dllm.decode import encode_prompts
    ids = encode_prompts(ltok, ["  What is 2+2?"], chat=True)[0]
    text = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert ids == ltok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 300 and ids.count(300) == 1          # BOS once
    ids = encode_prompts(dtok, ["Hi"], chat=True)[0]
    text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert ids == dtok(text)["input_ids"]
    assert dtok.decode(ids) == text
    # Without the template the prompt is tokenized as plain text.
    assert encode_prompts(dtok, ["Hi"], chat=False)[0] == dtok("Hi")["input_ids"]


def test_tokenizers_round_trip(llada, dream):
    for _, tok in (llada, dream):
        text = "The quick brown fox, 12 + 30 = 42!\nNew line."
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text


def test_real_special_ids_round_trip(tmp_path):
    from tests.fixtures.checkpoints import write_dream_tokenizer, write_llada_tokenizer
    from dllm.models.loading import load_tokenizer
    ltok = load_tokenizer(write_llada_tokenizer(tmp_path / "l", special_ids="real"), "llada")
    dtok = load_tokenizer(write_dream_tokenizer(tmp_path / "d", special_ids="real"), "dream")
    for tok, table in ((ltok, {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336,
                               "<|start_header_id|>": 126346, "<|end_header_id|>": 126347, "<|eot_id|>": 126348}),
                       (dtok, {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                               "<|beginoftext|>": 151665, "<|mask|>": 151666})):
        for token, tid in table.items():
            assert tok.convert_tokens_to_ids(token) == tid
            text = f"a{token}b"
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tid in ids and tok.decode(ids) == text


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_shard_is_named(llada_sharded_dir, tmp_path):
    folder = _copy(llada_sharded_dir, tmp_path / "ck")
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf"missing weight shard\(s\) {shard.name}"):
        dllm.load(folder)


def test_corrupt_shard_is_named(llada_sharded_dir, tmp_path):
    folder = _copy(llada_sharded_dir, tmp_path / "ck")
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"corrupt or unreadable weight file .*{shard.name}"):
        dllm.load(folder)


def test_missing_and_unexpected_weights(llada_dir, tmp_path):
    folder = _copy(llada_dir, tmp_path / "ck")
    sd = load_file(str(folder / "model.safetensors"))
    sd.pop("model.transformer.blocks.1.up_proj.weight")
    sd["model.transformer.blocks.1.gate_proj.weight"] = torch.zeros(1)
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['model.transformer.blocks.1.up_proj.weight'\], unexpected "
                                         r"\['model.transformer.blocks.1.gate_proj.weight'\]"):
        dllm.load(folder)


def test_tensors_the_model_does_not_use_are_skipped_as_hugging_face_skips_them(dream_dir, tmp_path):
    """A tied head's stored copy and rotary inv_freq buffers load (the head is the embedding), while
    any other extra tensor is still an error."""
    folder = _copy(dream_dir, tmp_path / "ck")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(folder / "model.safetensors"))
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    save_file(sd, str(folder / "model.safetensors"))
    model, _ = dllm.load(folder, dtype="float32")
    assert model.head is None and torch.equal(model.head_weight(), sd["model.embed_tokens.weight"])
    sd["model.layers.0.self_attn.other"] = torch.ones(4)
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected \['model.layers.0.self_attn.other'\]"):
        dllm.load(folder)


def test_shape_mismatch(dream_dir, tmp_path):
    folder = _copy(dream_dir, tmp_path / "ck")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"weight shapes .* do not match its config.json: "
                                         r"model.layers.0.mlp.down_proj.weight: checkpoint \(64, 96\) vs config "
                                         r"\(64, 128\); model.layers.0.mlp.gate_proj.weight: checkpoint \(96, 64\)"):
        dllm.load(folder)


def test_missing_tokenizer(llada_dir, tmp_path):
    folder = _copy(llada_dir, tmp_path / "ck")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no tokenizer in .*expected tokenizer.json, or vocab.json"):
        dllm.load(folder)


def test_bf16_pieces_are_bitwise_the_references():
    """bf16 numerics the fp32 tests cannot see: RMSNorm's cast order and each family's rotation
    precision, bit for bit against the independent statements."""
    from dllm.models.transformer import RMSNorm, apply_rope, rope_cos_sin
    from tests.reference import arch_ref
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 5, 64, generator=g) * 3).bfloat16()
    norm = RMSNorm(64, 1e-6).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(64, generator=g))
    assert torch.equal(norm(x), arch_ref._rms_norm(x, norm.weight, 1e-6))
    q = (torch.randn(2, 4, 7, 32, generator=g) * 2).bfloat16()
    pos = torch.arange(7)[None].expand(2, 7) + 100
    cos, sin = rope_cos_sin(pos, 32, 500000.0)
    angles = arch_ref._rope_angles(pos, 32, 500000.0)
    assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())
    rot = arch_ref._rotate_half
    c, s = angles.cos(), angles.sin()
    assert torch.equal(apply_rope(q, cos, sin, fp32=True), (q.float() * c + rot(q.float()) * s).bfloat16())
    cb, sb = c.bfloat16(), s.bfloat16()
    assert torch.equal(apply_rope(q, cos, sin, fp32=False), q * cb + rot(q) * sb)
    # The two precisions really differ in bf16, so a family using the wrong one is caught.
    assert not torch.equal(apply_rope(q, cos, sin, fp32=True), apply_rope(q, cos, sin, fp32=False))


def test_family_rotation_precision(llada, dream):
    assert llada[0].config.rope_fp32 and not dream[0].config.rope_fp32


def test_dream_default_sampler_comes_from_generation_config(dream):
    model, _ = dream
    assert model.generation_defaults["alg"] == "origin"
    out = dllm.generate(model, None, [[5, 6, 7]], gen_length=8, steps=8, seed=0)
    assert out.sampler == "origin" and out.sampler_args["eps"] == 0.001
    out = dllm.generate(model, None, [[5, 6, 7]], gen_length=8, steps=8, sampler="entropy")
    assert out.sampler == "entropy"


def test_auto_dtype_runs_a_checkpoint_that_stores_its_norms_in_float32(llada_dir, tmp_path):
    folder = _copy(llada_dir, tmp_path / "ck")
    sd = load_file(str(folder / "model.safetensors"))
    sd = {k: v.float() if "norm" in k else v.bfloat16() for k, v in sd.items()}
    save_file(sd, str(folder / "model.safetensors"))
    model, _ = dllm.load(folder)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    want, _ = dllm.load(folder, dtype="bfloat16")
    got = dllm.generate(model, None, [[1, 2, 3]], gen_length=4)
    assert torch.equal(got.sequences, dllm.generate(want, None, [[1, 2, 3]], gen_length=4).sequences)


@pytest.mark.parametrize("index,message", [({"weight_map": []}, "'weight_map' must map"),
                                           ({"weight_map": {"a": None}}, "'weight_map' must map"),
                                           ({"metadata": {}}, "KeyError")])
def test_a_bad_shard_index_is_named(llada_sharded_dir, tmp_path, index, message):
    folder = _copy(llada_sharded_dir, tmp_path / "ck")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"corrupt shard index .*{message}"):
        dllm.load(folder)


def test_a_generation_config_that_is_not_an_object_is_named(llada_dir, tmp_path):
    folder = _copy(llada_dir, tmp_path / "ck")
    (folder / "generation_config.json").write_text("[]")
    with pytest.raises(ValueError, match=r"corrupt generation_config.json .*expected a JSON object, got \[\]"):
        dllm.load(folder)


def test_auto_dtype_casts_a_float32_expert_bias_beside_bfloat16_weights(tmp_path):
    """As Hugging Face's dtype "auto": the routing's expert_bias buffer runs in the weights' dtype."""
    from tests.fixtures.checkpoints import write_llada2_checkpoint

    folder = write_llada2_checkpoint(tmp_path / "ck")
    sd = load_file(str(folder / "model.safetensors"))
    sd = {k: v.float() if "expert_bias" in k else v.bfloat16() for k, v in sd.items()}
    save_file(sd, str(folder / "model.safetensors"))
    model, _ = dllm.load(folder)
    assert {b.dtype for name, b in model.named_buffers() if "expert_bias" in name} == {torch.bfloat16}
    want, _ = dllm.load(folder, dtype="bfloat16")
    prompt = [list(range(5, 37))]
    assert torch.equal(dllm.generate(model, None, prompt, gen_length=32).sequences,
                       dllm.generate(want, None, prompt, gen_length=32).sequences)


def test_init_weights_zeroes_buffers_left_uninitialised():
    """A model built on meta and moved with `to_empty` (the accelerator path of `build_model`) holds
    uninitialised memory: LLaDA2's `expert_bias` buffer must start at zero as on the CPU path."""
    from dllm.config import ModelConfig
    from dllm.models.loading import FAMILY_CLASSES, build_model, init_weights
    cfg = ModelConfig.from_name("llada2-tiny")
    with torch.device("meta"):
        model = FAMILY_CLASSES[cfg.family](cfg, attention="sdpa")
    model = model.to_empty(device="cpu")
    buffers = dict(model.named_buffers())
    assert any(name.endswith("expert_bias") for name in buffers)
    for b in buffers.values():
        b.fill_(float("nan"))
    init_weights(model, torch.Generator().manual_seed(0), 0.02)
    want = dict(build_model(cfg, "sdpa", seed=0).named_buffers())
    for name, b in model.named_buffers():
        assert torch.equal(b, want[name]) and not b.any(), name


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float8"), "unsupported dtype 'float8'"),
    (dict(device="cuda:7" if not torch.cuda.is_available() else "cuda:99"), "device 'cuda:"),
    (dict(device="gpu0"), "unknown device 'gpu0'"),
    (dict(device="meta"), "device 'meta' holds no weights"),
    (dict(attention="flash9"), "flash9"),
])
def test_build_model_refuses_bad_arguments_by_name(kwargs, message):
    from dllm.config import ModelConfig
    with pytest.raises(ValueError, match=message):
        dllm.build_model(ModelConfig.from_name("llada-tiny"), **kwargs)


def test_build_model_takes_dtype_names_and_refuses_a_preset_name():
    from dllm.config import ModelConfig
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), dtype="bfloat16", device="auto")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"build_model takes a ModelConfig \(ModelConfig.from_name\(...\) "
                                         r"for a preset\), got 'llada-tiny'"):
        dllm.build_model("llada-tiny")


def test_build_model_takes_every_compute_dtype():
    from dllm.config import ModelConfig
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64


def test_load_refuses_the_meta_device(llada_dir):
    with pytest.raises(ValueError, match="device 'meta' holds no weights"):
        dllm.load(llada_dir, device="meta")
