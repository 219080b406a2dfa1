"""Every bad input of DESIGN §4 that the core runtime meets gets a clear error naming the value."""
import json

import pytest
import torch

import dllm
from dllm import samplers
from dllm.config import GenerationConfig, ModelConfig
from dllm.models.loading import detect_family, load, resolve_dtype


@pytest.fixture(scope="module")
def tiny():
    return dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)


@pytest.fixture(scope="module")
def tiny_dream():
    return dllm.build_model(ModelConfig.from_name("dream-tiny"), seed=0, init_std=0.3)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=0), r"gen_length must be a positive integer, got 0"),
    (dict(gen_length=8, block_length=16), r"block_length 16 exceeds gen_length 8"),
    (dict(steps=-2), r"steps must be a positive integer, got -2"),
    (dict(temperature=-0.5), r"temperature must be a finite number >= 0, got -0.5"),
    (dict(temperature=float("nan")), r"temperature must be a finite number"),
    (dict(score_dtype="float16"), r"score_dtype must be 'logits', 'float32' or 'float64', got 'float16'"),
    (dict(seed="7"), r"seed must be an integer or None, got '7'"),
    (dict(max_forwards=0), r"max_forwards must be a positive integer, got 0"),
])
def test_generation_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationConfig(**kwargs)


def test_unknown_generation_option(tiny):
    with pytest.raises(ValueError, match=r"unknown generation option\(s\) gen_len; valid: .*gen_length"):
        dllm.generate(tiny, None, [[1, 2]], gen_len=8)


def test_unknown_sampler_lists_valid_ones(tiny):
    with pytest.raises(ValueError, match=r"unknown sampler 'low_conf'; valid options: .*low_confidence.*random"):
        dllm.generate(tiny, None, [[1, 2]], gen_length=8, sampler="low_conf")


def test_unknown_sampler_argument():
    with pytest.raises(ValueError, match=r"sampler 'entropy' has no argument\(s\) tau; its arguments: eps, top_p"):
        samplers.get("entropy", tau=0.9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(eps=0.0), r"sampler 'maskgit_plus': eps must be > 0, got 0.0"),
    (dict(eps=1.5), r"eps must be <= 1, got 1.5"),
    (dict(top_p=0.0), r"top_p must be > 0, got 0.0"),
    (dict(top_k=0), r"top_k must be >= 1, got 0"),
    (dict(top_k=2.5), r"top_k must be an integer, got 2.5"),
    (dict(alg_temp=-1.0), r"alg_temp must be >= 0, got -1.0"),
])
def test_sampler_argument_ranges(kwargs, match):
    with pytest.raises(ValueError, match=match):
        samplers.get("maskgit_plus", **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(gen_length=12, block_length=8, steps=12), r"gen_length 12 must be a multiple of block_length 8"),
    (dict(gen_length=16, block_length=8, steps=5), r"steps 5 must be a multiple of the number of blocks 2"),
    (dict(gen_length=8, block_length=8, steps=16), r"steps 16 must be <= gen_length 8"),
])
def test_llada_schedule_errors(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dllm.generate(tiny, None, [[1, 2]], **kwargs)


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
    ({"model_type": "llada", "hidden_size": 64, "num_experts": 8}, r"mixture-of-experts .* not supported; "
                                                                  r"supported families: 'llada'.*'dream'"),
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
        config_from_hf({"d_model": 64, "n_layers": 1, "n_heads": 4, "alibi": True})


def test_bad_dtype():
    with pytest.raises(ValueError, match=r"unsupported dtype 'int8'; choose one of 'auto', 'float32'"):
        resolve_dtype("int8")


def test_missing_folder_and_offline_hub_id(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"no checkpoint folder at '.*nowhere'"):
        load(str(tmp_path / "deep" / "nowhere"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"could not fetch 'no-such-org/no-such-model'.*pass its path"):
        load("no-such-org/no-such-model")


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing config.json in checkpoint folder"):
        load(tmp_path)


def test_corrupt_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"corrupt config.json"):
        load(tmp_path)


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"d_model": 64, "n_layers": 1, "n_heads": 4, "vocab_size": 320, "mask_token_id": 310, "eos_token_id": 301,
         "weight_tying": False}))
    with pytest.raises(FileNotFoundError, match=r"no weights in .*expected model.safetensors"):
        load(tmp_path)
