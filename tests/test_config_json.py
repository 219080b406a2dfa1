"""Reading each family's `config.json`: values of the wrong type or range are refused with the key
named, and the null and list forms real configs use are read as the reference code reads them."""
import re

import pytest

from dllm.models import dream, llada, llada2, llada_moe
from tests.fixtures.checkpoints import (LLADAMOE_TINY_SPECIAL_IDS, dream_config, llada2_config, llada_config,
                                        lladamoe_config)

FAMILIES = {"LLaDA": (llada.config_from_hf, llada_config, {}),
            "Dream": (dream.config_from_hf, dream_config, {}),
            "LLaDA-MoE": (llada_moe.config_from_hf, lladamoe_config, {"tokens": LLADAMOE_TINY_SPECIAL_IDS}),
            "LLaDA2": (llada2.config_from_hf, llada2_config, {"tokens": LLADAMOE_TINY_SPECIAL_IDS})}
FLAGS = {"LLaDA": "weight_tying", "Dream": "tie_word_embeddings", "LLaDA-MoE": "tie_word_embeddings",
         "LLaDA2": "tie_word_embeddings"}


def parse(family: str, **changes):
    read, config, extra = FAMILIES[family]
    d = config()
    d.update(changes)
    return read(d, **extra)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key,value", [("rms_norm_eps", "x"), ("rms_norm_eps", 0), ("rope_theta", "abc"),
                                       ("rope_theta", True)])
def test_a_number_of_the_wrong_type_names_its_key(family, key, value):
    with pytest.raises(ValueError, match=rf"{family} config key '{key}' = {value!r} must be a positive number"):
        parse(family, **{key: value})


@pytest.mark.parametrize("family", FAMILIES)
def test_a_flag_must_be_a_boolean(family):
    key = FLAGS[family]
    with pytest.raises(ValueError, match=rf"{family} config key '{key}' = 'false' must be true or false"):
        parse(family, **{key: "false"})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("key,value", [("mask_token_id", "3"), ("bos_token_id", [1.5]), ("pad_token_id", "-2"),
                                       ("bos_token_id", True)])
def test_a_token_id_must_be_an_integer(family, key, value):
    with pytest.raises(ValueError, match=re.escape(f"{family} config key {key!r} = {value!r} must be an integer token id")):
        parse(family, **{key: value})


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bos_id_written_as_a_list_is_read_as_its_first_entry(family):
    assert parse(family, bos_token_id=[7, 9]).bos_token_id == 7


@pytest.mark.parametrize("family", FAMILIES)
def test_a_negative_id_means_none_as_in_hugging_face_configs(family):
    cfg = parse(family, pad_token_id=-1, bos_token_id=-1)
    assert cfg.pad_token_id == cfg.eos_token_id and cfg.bos_token_id is None


@pytest.mark.parametrize("changes, message", [
    (dict(max_sequence_length="4k"), "LLaDA config key 'max_sequence_length' = '4k' must be an integer >= 1"),
    (dict(n_kv_heads="2"), "LLaDA config key 'n_kv_heads' = '2' must be an integer >= 1"),
    (dict(n_kv_heads=0), "LLaDA config key 'n_kv_heads' = 0 must be an integer >= 1"),
])
def test_llada_sizes_name_their_key(changes, message):
    with pytest.raises(ValueError, match=message):
        parse("LLaDA", **changes)


def test_a_null_key_takes_its_default():
    assert parse("Dream", hidden_act=None).family == "dream"
    cfg = parse("LLaDA2", partial_rotary_factor=None)
    assert cfg.rotary_dim == cfg.head_dim // 2
    assert parse("LLaDA", max_sequence_length=None, max_position_embeddings=None).max_seq_len == 1024


def test_dream_reads_a_null_pad_or_eos_id_as_the_other():
    d = dream_config()
    eos, pad = d["eos_token_id"], d["pad_token_id"]
    assert parse("Dream", pad_token_id=None).pad_token_id == eos
    assert parse("Dream", eos_token_id=None).eos_token_id == pad


def test_llada_reads_a_list_of_end_ids_as_its_first():
    eos = llada_config()["eos_token_id"]
    cfg = parse("LLaDA", eos_token_id=[eos, eos - 1], pad_token_id=None)
    assert cfg.eos_token_id == eos and cfg.pad_token_id == eos


@pytest.mark.parametrize("freq", [2, True, 0, [1, 2], "1"])
def test_llada_moe_refuses_dense_layers(freq):
    with pytest.raises(ValueError, match=r"LLaDA-MoE config key 'moe_layer_freq' .* is not supported"):
        parse("LLaDA-MoE", moe_layer_freq=freq)


@pytest.mark.parametrize("family,changes,message", [
    ("LLaDA", {"mlp_hidden_size": None, "mlp_ratio": "1.5"}, r"LLaDA config key 'mlp_ratio' = '1.5' must be a "
                                                             r"positive number"),
    ("LLaDA", {"mlp_hidden_size": "48"}, r"LLaDA config key 'mlp_hidden_size' = '48' must be an integer >= 1"),
    ("LLaDA-MoE", {"shared_expert_intermediate_size": "48"}, r"'shared_expert_intermediate_size' = '48' must be an "
                                                             r"integer >= 0"),
    ("LLaDA-MoE", {"clip_qkv": "8"}, r"LLaDA-MoE config key 'clip_qkv' = '8' must be a positive number"),
    ("LLaDA2", {"num_shared_experts": "1"}, r"LLaDA2 config key 'num_shared_experts' = '1' must be an integer >= 0"),
    ("LLaDA2", {"first_k_dense_replace": -1}, r"'first_k_dense_replace' = -1 must be an integer >= 0"),
    ("Dream", {"max_position_embeddings": "4k"}, r"Dream config key 'max_position_embeddings' = '4k' must be an "
                                                 r"integer >= 1"),
    ("LLaDA2", {"n_group": 0}, r"LLaDA2 config key 'n_group' = 0 must be an integer >= 1"),
    ("LLaDA2", {"topk_group": 0}, r"LLaDA2 config key 'topk_group' = 0 must be an integer >= 1"),
    ("LLaDA2", {"num_key_value_heads": 0}, r"LLaDA2 config key 'num_key_value_heads' = 0 must be an integer >= 1"),
    ("LLaDA-MoE", {"num_key_value_heads": 0}, r"'num_key_value_heads' = 0 must be an integer >= 1"),
    ("LLaDA-MoE", {"partial_rotary_factor": None}, r"LLaDA-MoE config.json lacks partial_rotary_factor \(the config "
                                                   r"class's default -1 means no rotary embedding"),
    ("LLaDA-MoE", {"rope_theta": None, "partial_rotary_factor": None}, r"lacks partial_rotary_factor, rope_theta"),
])
def test_a_size_of_the_wrong_type_names_its_key(family, changes, message):
    with pytest.raises(ValueError, match=message):
        parse(family, **changes)


@pytest.mark.parametrize("family,default", [("Dream", 32768), ("LLaDA-MoE", 4096), ("LLaDA2", 16384)])
def test_a_null_context_length_takes_the_default(family, default):
    assert parse(family, max_position_embeddings=None).max_seq_len == default
