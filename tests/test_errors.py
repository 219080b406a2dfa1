"""Every bad input the core runtime meets gets a clear error naming the value (docs/contributing.md §2 Errors)."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import dllm
from dllm import samplers
from dllm.config import GenerationConfig, ModelConfig
from dllm.decode import check_request
from dllm.models.loading import detect_family, load, resolve_dtype

_LLADA_STATED = {"rope": True, "block_type": "llama", "layer_norm_type": "rms", "activation_type": "silu"}


@pytest.fixture(scope="module")
def tiny():
    return dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)


@pytest.fixture(scope="module")
def tiny_dream():
    return dllm.build_model(ModelConfig.from_name("dream-tiny"), seed=0, init_std=0.3)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=0), r"gen_length must be a positive integer \(at most 2147483647\), got 0"),
    (dict(steps=2 ** 40), r"steps must be a positive integer \(at most 2147483647\), got 1099511627776"),
    (dict(steps=-2), r"steps must be a positive integer \(at most 2147483647\), got -2"),
    (dict(temperature=-0.5), r"temperature must be a finite number >= 0 \(.*\), got -0.5"),
    (dict(temperature=float("nan")), r"temperature must be a finite number"),
    (dict(temperature=True), r"temperature must be a finite number >= 0 \(at most 10000\), got True"),
    (dict(temperature=1e39), r"temperature must be a finite number >= 0 \(at most 10000\), got 1e\+39"),
    (dict(cfg_scale=1e38), r"cfg_scale must be a finite number >= 0 \(at most 10000\), got 1e\+38"),
    (dict(chat="no"), r"chat must be True, False or None \(the model's default\), got 'no'"),
    (dict(trace="no"), r"trace must be True or False, got 'no'"),
    (dict(score_dtype="float16"), r"score_dtype must be 'logits', 'float32' or 'float64', got 'float16'"),
    (dict(seed="7"), r"seed must be an integer in \[-2\*\*63, 2\*\*64\) \(what torch.Generator takes\) or None, "
                     r"got '7'"),
    (dict(seed=2 ** 64), r"seed must be an integer in .* got 18446744073709551616"),
    (dict(max_forwards=0), r"max_forwards must be a positive integer \(at most 2147483647\), got 0"),
    (dict(sampler="low_conf"), r"unknown sampler 'low_conf'; valid options: .*low_confidence"),
    (dict(sampler=5), r"sampler must be a registered name or a Sampler instance, got 5 \(int\)"),
    (dict(cache="nope"), r"unknown cache policy 'nope'"),
])
def test_generation_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationConfig(**kwargs)


def test_lengths_are_checked_when_the_request_is_fixed(tiny):
    cfg = GenerationConfig(gen_length=8, block_length=16)        # a grid may hold such a combination
    with pytest.raises(ValueError, match=r"block_length 16 exceeds gen_length 8"):
        cfg.replace(sampler="low_confidence").for_length()
    with pytest.raises(ValueError, match=r"block_length 16 exceeds gen_length 8"):
        dllm.generate(tiny, None, [[1, 2]], cfg)                 # once the model chose its sampler


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompts=5), r"prompts must be a string, a list of strings or of token ids, or an input_ids tensor, got 5 "
                      r"\(int\)"),
    (dict(prompts=torch.tensor([[5, 6]]), attention_mask=[[1, 1]]), r"attention_mask must be a tensor of input_ids' "
                                                                     r"shape, got \[\[1, 1\]\] \(list\)"),
    (dict(prompts=[[5, 6]], config={"gen_length": 4}), r"config must be a dllm.GenerationConfig, got "
                                                       r"\{'gen_length': 4\} \(dict;"),
    (dict(prompts="hi", attention_mask=torch.ones(1, 3)), r"string prompts are tokenized here"),
    (dict(prompts=[[5, 6]], on_step="x"), r"on_step must be a function called with the state after every step, or "
                                          r"None, got 'x' \(str\)"),
])
def test_bad_prompt_and_config_arguments(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dllm.generate(tiny, None, gen_length=8, **kwargs)


def test_unknown_generation_option(tiny):
    with pytest.raises(ValueError, match=r"unknown generation option\(s\) gen_len; valid: .*gen_length"):
        dllm.generate(tiny, None, [[1, 2]], gen_len=8)


def test_unknown_sampler_lists_valid_ones(tiny):
    with pytest.raises(ValueError, match=r"unknown sampler 'low_conf'; valid options: .*low_confidence.*random"):
        dllm.generate(tiny, None, [[1, 2]], gen_length=8, sampler="low_conf")


def test_unknown_sampler_argument():
    with pytest.raises(ValueError, match=r"sampler 'entropy' has no argument\(s\) 'tau'; its arguments: eps, top_p"):
        samplers.get("entropy", tau=0.9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(eps=0.0), r"sampler 'maskgit_plus': eps must be > 0, got 0.0"),
    (dict(eps=1.5), r"eps must be <= 1, got 1.5"),
    (dict(top_p=0.0), r"top_p must be > 0, got 0.0"),
    (dict(top_k=0), r"top_k must be >= 1, got 0"),
    (dict(top_k=2.5), r"top_k must be an integer, got 2.5"),
    (dict(alg_temp=-1.0), r"alg_temp must be >= 0, got -1.0"),
    (dict(alg_temp=1e-300), r"alg_temp must be 0 \(no draw\) or >= 0.0001 \(smaller ones overflow"),
    (dict(alg_temp=5e38), r"alg_temp must be <= 10000.0, got 5e\+38"),
])
def test_sampler_argument_ranges(kwargs, match):
    with pytest.raises(ValueError, match=match):
        samplers.get("maskgit_plus", **kwargs)


def test_a_temperature_too_small_for_dreams_division_is_refused(tiny_dream):
    with pytest.raises(ValueError, match=r"sampler 'entropy': temperature 1e-300 overflows its logits / "
                                         r"temperature; give 0 \(greedy\) or at least 0.01"):
        dllm.generate(tiny_dream, None, [[5, 6]], gen_length=8, sampler="entropy", temperature=1e-300, seed=0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=12, block_length=8, steps=12), r"gen_length 12 must be a multiple of block_length 8"),
    (dict(gen_length=16, block_length=8, steps=5), r"steps 5 must be a multiple of the number of blocks 2"),
    (dict(gen_length=8, block_length=8, steps=16), r"steps 16 must be <= gen_length 8"),
])
def test_llada_schedule_errors(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dllm.generate(tiny, None, [[1, 2]], **kwargs)
    with pytest.raises(ValueError, match=match):          # the same refusal without a decode
        check_request(tiny, GenerationConfig(**kwargs))
    check_request(tiny, GenerationConfig(gen_length=16, block_length=8, steps=16, cache="dual"))


@pytest.mark.parametrize("ids", [torch.tensor([[1.7, 2.9]]), torch.tensor([[True, False]])])
def test_input_ids_of_another_dtype_than_integers(tiny, ids):
    with pytest.raises(ValueError, match=rf"input_ids must hold integer token ids, got dtype {ids.dtype}"):
        dllm.generate(tiny, None, ids, gen_length=4)


def test_a_block_length_other_than_the_attention_blocks_says_how_to_leave_it_out():
    model = dllm.build_model(dllm.ModelConfig.from_name("llada2-tiny"), seed=0)
    with pytest.raises(ValueError, match=r"block_length 5 differs .*; leave it out \(it is then 32, whatever gen_length\)"):
        dllm.generate(model, None, [[1, 2, 3]], gen_length=5, block_length=5)
    assert dllm.generate(model, None, [[1, 2, 3]], gen_length=5).generated.shape == (1, 5)


def test_mask_token_inside_prompt(tiny):
    mask = tiny.config.mask_token_id
    with pytest.raises(ValueError, match=rf"prompt 1 contains the mask token id {mask} at position 2"):
        dllm.generate(tiny, None, [[1, 2], [3, 4, mask]], gen_length=8)


def test_prompt_too_long(tiny):
    limit = tiny.config.max_seq_len
    with pytest.raises(ValueError, match=rf"prompt length {limit - 4} \+ gen_length 8 = {limit + 4} exceeds the "
                                         rf"model's maximum sequence length {limit}"):
        dllm.generate(tiny, None, [[1] * (limit - 4)], gen_length=8)


def test_token_out_of_vocabulary(tiny):
    with pytest.raises(ValueError, match=r"prompt 0 holds token id 999 outside the vocabulary \[0, 320\)"):
        dllm.generate(tiny, None, [[1, 999]], gen_length=8)


def test_dream_needs_a_prompt_token(tiny_dream):
    with pytest.raises(ValueError, match=r"prompt 0 is empty; dream predicts token i from position i-1"):
        dllm.generate(tiny_dream, None, [[]], gen_length=8)


def test_string_prompt_needs_tokenizer(tiny):
    with pytest.raises(ValueError, match="string prompts need a tokenizer"):
        dllm.generate(tiny, None, "hello", gen_length=8)


def test_nan_logits_stop_the_run():
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)
    with torch.no_grad():
        model.head.weight[3, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN/inf logits"):
        dllm.generate(model, None, [[1, 2]], gen_length=8)


def test_unknown_backend_on_model(tiny):
    with pytest.raises(ValueError, match=r"unknown attention backend 'triton2'; valid options: eager, sdpa"):
        tiny.set_attention("triton2")


def test_model_config_errors():
    with pytest.raises(ValueError, match=r"unknown model preset 'llada-tiniest'; available: .*llada-tiny"):
        ModelConfig.from_name("llada-tiniest")
    with pytest.raises(ValueError, match=r"d_model 60 is not divisible by n_heads 8"):
        ModelConfig.from_name("llada-tiny").replace(d_model=60, n_heads=8)
    with pytest.raises(ValueError, match=r"mask_token_id = 400 lies outside the vocabulary \[0, 320\)"):
        ModelConfig.from_name("llada-tiny").replace(mask_token_id=400)


@pytest.mark.parametrize("cfg,match", [
    ({"model_type": "llada", "hidden_size": 64, "num_experts": 8}, r"mixture-of-experts .* not one dllm reads; "
                                                                  r"supported families: 'llada'.*'llada-moe'.*'dream'"),
    ({"model_type": "gpt2", "n_embd": 64}, r"cannot tell the model family .*'gpt2'.*supported families"),
    ({"model_type": "qwen2", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1},
     r"autoregressive .* not a masked-diffusion model"),
])
def test_unknown_family(cfg, match):
    with pytest.raises(ValueError, match=match):
        detect_family(cfg)


def test_unsupported_llada_key(tmp_path):
    from dllm.models.llada import config_from_hf
    with pytest.raises(ValueError, match=r"LLaDA config key 'alibi' = True is not supported \(supported: False\)"):
        config_from_hf({"d_model": 64, "n_layers": 1, "n_heads": 4, "alibi": True, **_LLADA_STATED})


def test_bad_dtype():
    with pytest.raises(ValueError, match=r"unsupported dtype 'int8'; choose one of 'auto', 'float32'"):
        resolve_dtype("int8")


def test_missing_folder_and_offline_hub_id(tmp_path, monkeypatch):
    import huggingface_hub.constants

    with pytest.raises(FileNotFoundError, match=r"no checkpoint folder at '.*nowhere'"):
        load(str(tmp_path / "deep" / "nowhere"))
    # Offline mode (read by huggingface_hub at import, so patched on its constants module).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    with pytest.raises(FileNotFoundError, match=r"could not fetch 'no-such-org/no-such-model' from the Hugging Face "
                                                r"hub \(.*\)\. If this machine is offline, download the checkpoint "
                                                r"elsewhere .*hf download no-such-org/no-such-model.*"
                                                r"dllm.load\('./no-such-model'\)"):
        load("no-such-org/no-such-model")


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing config.json in checkpoint folder"):
        load(tmp_path)


def test_corrupt_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"corrupt config.json"):
        load(tmp_path)


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_llada_cfg()))
    with pytest.raises(FileNotFoundError, match=r"no weights in .*expected model.safetensors"):
        load(tmp_path)


def _llada_cfg(**extra):
    cfg = {"d_model": 64, "n_layers": 1, "n_heads": 4, "vocab_size": 320, "mask_token_id": 310,
           "eos_token_id": 301, "weight_tying": False, **_LLADA_STATED}
    cfg.update(extra)
    return cfg


def test_corrupt_shard_index(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_llada_cfg()))
    (tmp_path / "model.safetensors.index.json").write_text("{\"weight_map\": 3")
    with pytest.raises(ValueError, match=r"corrupt shard index .*model.safetensors.index.json"):
        load(tmp_path)


def test_pickle_weights_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_llada_cfg()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(ValueError, match=r"holds PyTorch pickle weights only; dllm reads safetensors"):
        load(tmp_path)


def test_integer_weight_is_named(tmp_path):
    from safetensors.torch import save_file
    (tmp_path / "config.json").write_text(json.dumps(_llada_cfg()))
    save_file({"model.transformer.wte.weight": torch.zeros(320, 64, dtype=torch.int32)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"weight 'model.transformer.wte.weight' in .*model.safetensors is "
                                         r"torch.int32; weights must be floating point"):
        load(tmp_path)


def test_weight_in_two_shards(tmp_path):
    from safetensors.torch import save_file
    (tmp_path / "config.json").write_text(json.dumps(_llada_cfg()))
    t = {"model.transformer.wte.weight": torch.zeros(320, 64)}
    save_file(t, str(tmp_path / "a.safetensors"))
    save_file(t, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.transformer.wte.weight": "a.safetensors", "x": "b.safetensors"}}))
    with pytest.raises(ValueError, match=r"weight 'model.transformer.wte.weight' appears in more than one shard "
                                         r"\(again in b.safetensors\)"):
        load(tmp_path)


@pytest.mark.parametrize("key,value,match", [
    ("rope_scaling", {"type": "linear", "factor": 2.0}, r"Dream config key 'rope_scaling' = .* not supported"),
    ("use_sliding_window", True, r"'use_sliding_window' = True is not supported \(supported: false\)"),
    ("use_sliding_window", "false", r"'use_sliding_window' = 'false' is not supported \(supported: false\)"),
    ("partial_rotary_factor", 0.5, r"'partial_rotary_factor' = 0.5 is not supported \(supported: 1: Dream rotates"),
    ("head_dim", 32, r"'head_dim' = 32 with 4 heads is not supported \(supported: hidden_size 64 / num_attention"),
    ("num_key_value_heads", 0, r"Dream config key 'num_key_value_heads' = 0 must be an integer >= 1"),
    ("hidden_size", "64", r"Dream config key 'hidden_size' = '64' must be a positive integer"),
    ("hidden_act", "gelu", r"'hidden_act' = 'gelu' is not supported \(supported: 'silu'\)"),
    ("mask_token_id", None, r"Dream config.json lacks required keys: mask_token_id"),
])
def test_unsupported_dream_config(key, value, match):
    from dllm.models.dream import config_from_hf
    cfg = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 96,
           "vocab_size": 320, "mask_token_id": 304, "eos_token_id": 300, key: value}
    with pytest.raises(ValueError, match=match):
        config_from_hf(cfg)


_LLADA_SMALL = {"d_model": 64, "n_layers": 1, "n_heads": 4, "mask_token_id": 310, "eos_token_id": 301,
                "vocab_size": 320, "weight_tying": False, **_LLADA_STATED}


def test_llada_config_lacking_keys():
    from dllm.models.llada import config_from_hf
    cfg = {k: v for k, v in _LLADA_SMALL.items() if k not in ("vocab_size", "weight_tying")}
    with pytest.raises(ValueError, match=r"LLaDA config.json lacks required keys: vocab_size, weight_tying"):
        config_from_hf(cfg)


@pytest.mark.parametrize("change,match", [
    ({"layer_norm_with_affine": False}, r"'layer_norm_with_affine' = False is not supported \(supported: True\)"),
    ({"bias_for_layer_norm": True}, r"'bias_for_layer_norm' = True is not supported \(supported: False\)"),
    ({"d_model": None}, r"LLaDA config.json lacks required keys: d_model"),
    ({"d_model": "64"}, r"LLaDA config key 'd_model' = '64' must be a positive integer"),
    ({"n_heads": 0}, r"LLaDA config key 'n_heads' = 0 must be a positive integer"),
    ({"embedding_size": 300}, r"'embedding_size' = 300 is smaller than vocab_size 320"),
    ({"embedding_size": 319}, r"'embedding_size' = 319 is smaller than vocab_size 320"),
])
def test_llada_config_values_llada_does_not_run_are_named(change, match):
    from dllm.models.llada import config_from_hf
    with pytest.raises(ValueError, match=match):
        config_from_hf({**_LLADA_SMALL, **change})
    # null is the class default where it is the supported value
    assert config_from_hf({**_LLADA_SMALL, "bias_for_layer_norm": None, "alibi": None}).d_model == 64


def test_built_config_errors_name_their_keys_and_key_errors_stay_as_they_are(llada_dir, tmp_path):
    import shutil

    from dllm.models.config_json import naming_keys
    from tests.fixtures.checkpoints import edit_config
    keys = {"vocab_size": "embedding_size", "n_heads": "n_heads"}
    assert naming_keys("ModelConfig.vocab_size must be a positive integer, got 0", keys) == \
        "ModelConfig.vocab_size must be a positive integer, got 0 (vocab_size is config.json's 'embedding_size')"
    assert naming_keys("n_heads 4 is not a multiple of n_kv_heads 3", keys) == "n_heads 4 is not a multiple of n_kv_heads 3"
    folder = shutil.copytree(llada_dir, tmp_path / "m")
    edit_config(folder, embedding_size=300)
    with pytest.raises(ValueError) as err:
        dllm.load(folder)
    assert str(err.value).endswith("is smaller than vocab_size 320 (it must be at least as large: the embedding "
                                   "holds every token)")


@pytest.mark.parametrize("absent", [("rope",), ("layer_norm_type",), ("block_type", "activation_type")])
def test_llada_config_must_state_keys_defaulting_elsewhere(absent):
    # LLaDA's config class defaults these to no RoPE, LayerNorm, the sequential block and SwiGLU.
    from dllm.models.llada import config_from_hf
    cfg = {k: v for k, v in _LLADA_SMALL.items() if k not in absent}
    with pytest.raises(ValueError, match=rf"LLaDA config.json lacks {', '.join(absent)}: .* supported: {absent[0]}="):
        config_from_hf(cfg)


@pytest.mark.parametrize("mqa,n_kv,want", [(None, None, 4), (True, None, 1), (False, None, 4), (True, 1, 1),
                                           (False, 4, 4), (None, 2, 2), (True, 4, None), (False, 2, None)])
def test_llada_multi_query_attention(mqa, n_kv, want):
    from dllm.models.llada import config_from_hf
    cfg = {**_LLADA_SMALL, "multi_query_attention": mqa, "n_kv_heads": n_kv}
    if want is None:
        with pytest.raises(ValueError, match=rf"multi_query_attention = {mqa} means .* n_kv_heads = {n_kv}"):
            config_from_hf(cfg)
    else:
        assert config_from_hf(cfg).n_kv_heads == want


def test_tokenizer_errors(llada_dir, dream_dir, tmp_path):
    import shutil
    d = shutil.copytree(dream_dir, tmp_path / "dream")
    (d / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing merges.txt beside vocab.json"):
        load(d)
    l = shutil.copytree(llada_dir, tmp_path / "llada")
    (l / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match=r"cannot load the tokenizer in .*llada"):
        load(l)


def test_chat_without_template(llada):
    model, tok = llada
    import copy
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(ValueError, match=r"chat=True but the tokenizer has no chat template"):
        dllm.generate(model, bare, "hi", gen_length=4, chat=True)


def test_bad_input_ids_and_mask(tiny):
    with pytest.raises(ValueError, match=r"input_ids must be 1-D or 2-D, got shape \(1, 2, 3\)"):
        dllm.generate(tiny, None, torch.ones(1, 2, 3, dtype=torch.long), gen_length=4)
    with pytest.raises(ValueError, match=r"attention_mask shape \(2, 3\) != input_ids shape \(2, 4\)"):
        dllm.generate(tiny, None, torch.ones(2, 4, dtype=torch.long), attention_mask=torch.ones(2, 3), gen_length=4)
    with pytest.raises(ValueError, match=r"prompt 0: token 1 is 2.5 \(float\); token ids must be integers"):
        dllm.generate(tiny, None, [[1, 2.5]], gen_length=4)
    with pytest.raises(ValueError, match=r"prompt 1: token 0 is True \(bool\)"):
        dllm.generate(tiny, None, [[1, 2], [True]], gen_length=4)
    with pytest.raises(ValueError, match=r"prompt 0: token 1 is 2.5 \(float\)"):
        dllm.generate(tiny, None, [1, 2.5], gen_length=4)              # one prompt as a flat list
    with pytest.raises(ValueError, match=r"prompt 0 must be a list of token ids \(ints\) or a 1-D integer tensor, got "
                                         r"a tensor of shape \(2, 2\)"):
        dllm.generate(tiny, None, [torch.ones(2, 2, dtype=torch.long)], gen_length=4)
    with pytest.raises(ValueError, match=r"prompt 0 must hold integer token ids, got a tensor of dtype torch.float32"):
        dllm.generate(tiny, None, [torch.tensor([1.0, 2.0])], gen_length=4)
    # numpy and 0-dim torch integers are token ids, and a row may be a 1-D tensor
    import numpy as np
    want = dllm.generate(tiny, None, [[1, 2], [3]], gen_length=4).sequences
    for rows in ([[1, np.int64(2)], [torch.tensor(3)]], [torch.tensor([1, 2]), torch.tensor([3])]):
        assert torch.equal(dllm.generate(tiny, None, rows, gen_length=4).sequences, want)
    with pytest.raises(ValueError, match=r"attention_mask marks the padding of input_ids given as a tensor"):
        dllm.generate(tiny, None, [[1, 2, 3]], attention_mask=torch.ones(2, 2), gen_length=4)
    # a 1-D mask goes with 1-D input_ids: the padding it marks is left out
    ids = torch.tensor([5, 6, 7, 8])
    masked = dllm.generate(tiny, None, ids, attention_mask=torch.tensor([0, 1, 1, 1]), gen_length=4)
    assert masked.sequences.tolist() == dllm.generate(tiny, None, [[6, 7, 8]], gen_length=4).sequences.tolist()


def test_sampler_kwargs_with_an_instance(tiny):
    with pytest.raises(ValueError, match=r"sampler_kwargs are only used with a sampler given by name"):
        dllm.generate(tiny, None, [[1, 2]], gen_length=4, sampler=samplers.get("random"), sampler_kwargs={"x": 1})


def test_eot_option_without_eot_id():
    model = dllm.build_model(ModelConfig.from_name("llada-tiny").replace(eot_token_id=None), seed=0)
    with pytest.raises(ValueError, match=r"confidence_eos_eot_inf needs an end-of-turn token id"):
        dllm.generate(model, None, [[1, 2]], gen_length=4, sampler_kwargs={"confidence_eos_eot_inf": True})


def test_device_and_backend_are_checked_before_loading(tmp_path):
    # tmp_path holds no checkpoint: these errors must come first.
    with pytest.raises(ValueError, match=r"unknown device 'gpu'"):
        load(tmp_path, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device 'cuda' asked for, but CUDA is not available"):
            load(tmp_path, device="cuda")
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'"):
        load(tmp_path, attention="flash")


def test_the_triton_backend_on_a_cpu_without_the_interpreter_is_refused_at_load(tmp_path, monkeypatch):
    from dllm import kernels
    monkeypatch.setattr(kernels, "INTERPRET", False)
    with pytest.raises(ValueError, match=r"the triton attention backend runs on CUDA tensors, or on CPU tensors under "
                                         r"TRITON_INTERPRET=1"):
        load(tmp_path, attention="triton", device="cpu")


@pytest.mark.parametrize("value, interpreted", [(" 1", False), ("y", True)])
def test_the_interpreter_gate_reads_triton_interpret_as_triton_does(value, interpreted):
    pytest.importorskip("triton")
    code = "import triton, dllm.kernels as k; print(k.INTERPRET, bool(triton.knobs.runtime.interpret))"
    env = {**os.environ, "TRITON_INTERPRET": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(interpreted)] * 2


def test_the_interpreter_gate_with_a_triton_without_knobs(monkeypatch):
    triton = pytest.importorskip("triton")
    from dllm import kernels

    monkeypatch.delattr(triton, "knobs")
    for value, interpreted in (("1", True), ("true", False), ("0", False)):   # as Triton before 3.4 reads it
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert kernels._interpreted() is interpreted


def test_float8_checkpoint_asks_for_a_dtype(tmp_path):
    from safetensors.torch import save_file
    from tests.fixtures.checkpoints import load_state_dict, write_llada_checkpoint
    path = write_llada_checkpoint(tmp_path / "f8")
    state = load_state_dict(path)
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in state.items()}, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"weights are torch.float8_e4m3fn, which dllm does not compute in; pass "
                                         r"dtype \(--dtype\) float32, bfloat16 or float16"):
        load(path)
    model, _ = load(path, dtype="float32")
    assert next(model.parameters()).dtype == torch.float32


def test_numpy_numbers_are_taken_as_python_numbers(tiny):
    import numpy as np
    cfg = GenerationConfig(gen_length=np.int64(8), block_length=np.int32(8), temperature=np.float32(0.5),
                           cfg_scale=np.float64(0.0), seed=np.uint64(3))
    assert (cfg.gen_length, cfg.block_length, cfg.seed) == (8, 8, 3) and cfg.temperature == 0.5
    assert {type(v) for v in (cfg.gen_length, cfg.block_length, cfg.seed)} == {int}
    assert type(cfg.temperature) is float and type(cfg.cfg_scale) is float
    with pytest.raises(ValueError, match="GenerationConfig.gen_length must be a positive integer"):
        GenerationConfig(gen_length=np.bool_(True))
    out = dllm.generate(tiny, None, [[1, 2]], config=cfg)
    assert out.generated.shape[1] == 8


def test_check_request_reads_token_ids_from_the_tokenizer_as_generate_does():
    """AdaBlock's default delimiter is text: without the tokenizer `generate` gets, the pre-check
    would refuse what the decode accepts."""
    model, tok = dllm.load()
    cfg = GenerationConfig(gen_length=32, sampler="adablock")
    check_request(model, cfg, tok)
    dllm.generate(model, tok, "Hi", config=cfg)
    with pytest.raises(ValueError, match="need the tokenizer"):
        check_request(model, cfg)


def test_a_tokens_per_step_the_sampler_ignores_is_warned_not_refused(tiny):
    """threshold decides its own steps: tokens_per_step 3 on gen_length 8 is ignored with a
    warning (as tokens_per_step 2 is), not refused for not dividing a length it never splits."""
    with pytest.warns(UserWarning, match="tokens_per_step 3 is ignored"):
        out = dllm.generate(tiny, None, [[1, 2]], gen_length=8, sampler="threshold", tokens_per_step=3)
    assert out.generated.shape[1] == 8
    with pytest.raises(ValueError, match="tokens_per_step 3 does not divide gen_length 8"):
        dllm.generate(tiny, None, [[1, 2]], gen_length=8, sampler="low_confidence", tokens_per_step=3)


def test_numpy_numbers_in_sampler_and_cache_arguments_are_python_numbers(tiny):
    import numpy as np
    import samplers
    from dllm.cache import get_policy

    out = dllm.generate(tiny, None, [[1, 2]], gen_length=8, block_length=4, sampler="threshold",
                        sampler_kwargs={"tau": np.float32(0.5)}, cache="dual", cache_kwargs={"refresh": np.int64(2)})
    assert type(out.sampler_args["tau"]) is float and out.cache_args["refresh"] == 2
    assert type(out.cache_args["refresh"]) is int
    assert samplers.get("prophet", thresholds=[np.float32(7.5), 5.0, 2.5]).arguments()["thresholds"] == [7.5, 5.0, 2.5]
    assert type(samplers.get("dus", base=np.int64(3)).arguments()["base"]) is int
    assert get_policy("dkv-greedy", window=np.int32(2)).arguments()["window"] == 2
    with pytest.raises(ValueError, match=r"sampler_kwargs keys must be argument names \(strings\), got 1 \(int\)"):
        GenerationConfig(sampler="threshold", sampler_kwargs={1: 2})
    cfg = GenerationConfig(sampler="threshold", sampler_kwargs={"tau": np.float32(0.5)}, cache="dual",
                           cache_kwargs={"refresh": np.int64(2)})
    assert type(cfg.sampler_kwargs["tau"]) is float and type(cfg.cache_kwargs["refresh"]) is int
    from dllm.cache import policy_class
    assert type(policy_class("dual")(refresh=np.int64(2)).arguments()["refresh"]) is int


@pytest.mark.parametrize("change,match", [
    (dict(n_layers=True), r"ModelConfig.n_layers must be a positive integer, got True"),
    (dict(norm_eps=float("inf")), r"ModelConfig.norm_eps must be a finite positive number, got inf"),
    (dict(rope_theta=float("nan")), r"ModelConfig.rope_theta must be a finite positive number, got nan"),
    (dict(eot_token_id=10 ** 6), r"ModelConfig.eot_token_id = 1000000 lies outside the vocabulary \[0, 320\)"),
    (dict(eot_token_id=310), r"eot_token_id must differ from mask_token_id \(both 310\)"),
    (dict(eos_token_id=310), r"eos_token_id must differ from mask_token_id \(both 310\)"),
    (dict(clip_qkv="x"), r"ModelConfig.clip_qkv must be None or a finite number > 0, got 'x'"),
    (dict(clip_qkv=True), r"ModelConfig.clip_qkv must be None or a finite number > 0, got True"),
    (dict(clip_qkv=float("inf")), r"ModelConfig.clip_qkv must be None or a finite number > 0, got inf"),
])
def test_model_config_values_are_checked(change, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_name("llada-tiny").replace(**change)


def test_build_model_and_load_name_bad_arguments():
    cfg = ModelConfig.from_name("llada-tiny")
    with pytest.raises(ValueError, match=r"seed must be an integer in \[-2\*\*63, 2\*\*64\) .* or None, got 'x'"):
        dllm.build_model(cfg, seed="x")
    with pytest.raises(ValueError, match=r"seed must be an integer .* got 1180591620717411303424"):
        dllm.build_model(cfg, seed=2 ** 70)
    for bad in (float("nan"), float("inf"), 0, "x", True):
        with pytest.raises(ValueError, match=rf"init_std must be a finite number > 0, got {re.escape(repr(bad))}"):
            dllm.build_model(cfg, init_std=bad)
    for bad, shown in (("", "''"), (" ", "' '"), (123, "123 \\(int\\)")):
        with pytest.raises(ValueError, match=rf"the model must be a checkpoint folder, .* got {shown}"):
            dllm.load(bad)


def test_generate_names_a_model_that_is_not_one_and_mask_values_other_than_0_and_1(tiny):
    _, tok = dllm.load()
    for model, kind in ((tok, type(tok).__name__), (None, "NoneType")):
        with pytest.raises(ValueError, match=rf"model must be a dllm model .*got {kind}; the call is generate\(model, "):
            dllm.generate(model, tok, "hi", gen_length=8)
    ids = torch.tensor([[5, 6, 7], [0, 8, 9]])
    for mask, shown in ((torch.tensor([[1, 1, 1], [-1, 1, 1]]), "-1 at row 1, column 0"),
                        (torch.tensor([[1.0, 1, 1], [0, 0.5, 1]]), "0.5 at row 1, column 1")):
        with pytest.raises(ValueError, match=rf"attention_mask must hold only 1 \(a token\) and 0 \(padding\), "
                                             rf"got {shown}"):
            dllm.generate(tiny, None, ids, attention_mask=mask, gen_length=4)
    floats = dllm.generate(tiny, None, ids, attention_mask=torch.tensor([[1.0, 1, 1], [0, 1, 1]]), gen_length=4)
    assert floats.generated[1].tolist() == dllm.generate(tiny, None, [[8, 9]], gen_length=4).generated[0].tolist()
    with pytest.warns(UserWarning, match="prompts given as token ids are decoded as given"):
        dllm.generate(tiny, None, [[1, 2]], gen_length=4, chat=True)
