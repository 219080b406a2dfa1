"""LLaDA2: the checkpoint layout (fused q/k/v, a dense first layer, grouped sigmoid routing with an
expert bias), the forward against a plain statement of the published modelling code with its
block-causal mask (tests/reference/arch_ref.py), the block-causal K/V cache at the forward level,
and the errors of bad configs."""
import pytest
import torch

import dllm
from dllm.cache import KVCache
from tests.fixtures.checkpoints import (LLADAMOE_TINY_SPECIAL_IDS, drop_weight, edit_config, llada2_config,
                                        load_state_dict, write_llada2_checkpoint)
from tests.reference.arch_ref import llada2_forward_ref


def test_config_comes_from_the_checkpoint(llada2_dir):
    model, tok = dllm.load(llada2_dir, dtype="float32")
    cfg = model.config
    assert cfg.family == "llada2" and cfg.attention_block == 32 and cfg.rotary == 8 and cfg.n_kv_heads == 2
    moe = cfg.moe
    assert (moe.n_experts, moe.experts_per_token, moe.n_groups, moe.topk_groups, moe.routed_scale) == (16, 4, 4, 2, 2.5)
    assert moe.score == "sigmoid" and moe.expert_bias and moe.norm_topk and moe.first_dense == 1 and moe.shared_hidden == 32
    assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1)
    assert cfg.mask_token_id == LLADAMOE_TINY_SPECIAL_IDS["<|mask|>"]
    assert cfg.eos_token_id == LLADAMOE_TINY_SPECIAL_IDS["<|endoftext|>"]
    assert cfg.n_params == sum(p.numel() for p in model.parameters()) + 16 * 2     # + the two expert_bias buffers


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("length", [75, 32, 9])
def test_forward_equals_the_reference(tmp_path, sharded, length):
    folder = write_llada2_checkpoint(tmp_path / "m", sharded=sharded)
    model, _ = dllm.load(folder, dtype="float32")
    x = torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        got = model(x)
    want = llada2_forward_ref(load_state_dict(folder), llada2_config(), x)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()          # 1e-5 of the logits' scale


def test_bf16_forward_is_as_close_to_fp32_as_the_reference(llada2_dir):
    """In bf16 a near-tie of the grouped routing can flip either way, so both bf16 forwards are
    compared with the fp32 one: dllm's error is that of the reference's cast order, or less."""
    model, _ = dllm.load(llada2_dir, dtype="bfloat16")
    state32 = load_state_dict(llada2_dir)
    state = {k: v.to(torch.bfloat16) for k, v in state32.items()}
    x = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = model(x).float()
    want, exact = llada2_forward_ref(state, llada2_config(), x).float(), llada2_forward_ref(state32, llada2_config(), x)

    def rel_rms(a, b):
        return ((a - b).pow(2).mean() / b.pow(2).mean()).sqrt()
    assert rel_rms(got, exact) <= 1.25 * rel_rms(want, exact), (rel_rms(got, exact), rel_rms(want, exact))
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_later_blocks_never_reach_earlier_ones(llada2_dir):
    model, _ = dllm.load(llada2_dir, dtype="float32")
    x = torch.randint(0, 300, (1, 80), generator=torch.Generator().manual_seed(4))
    y = x.clone()
    y[0, 64:] = LLADAMOE_TINY_SPECIAL_IDS["<|mask|>"]                # change only the third block
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :64], b[:, :64], rtol=0, atol=1e-5)   # the grouped products regroup rows
    assert (a[:, 64:] - b[:, 64:]).abs().max() > 1e-2


def test_cached_block_step_equals_the_full_forward(llada2_dir):
    """Finished blocks' K/V are final under block-causal attention: recomputing one block against
    the cache gives the full forward's logits for it."""
    model, _ = dllm.load(llada2_dir, dtype="float32")
    x = torch.randint(0, 300, (2, 96), generator=torch.Generator().manual_seed(5))
    block = torch.arange(32, 64).expand(2, 32)
    cache = KVCache.for_model(model, 2, 96)
    with torch.no_grad():
        model(x, block, cache=cache)                                    # fill every column's K/V
        x[:, 40:50] = torch.randint(0, 300, (2, 10))                    # the active block changes
        step = model(x, block, positions=block, cache=cache)
        full = model(x, block)
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


def test_generate_is_refused_with_the_reason(llada2_dir):
    model, tok = dllm.load(llada2_dir, dtype="float32")
    with pytest.raises(ValueError, match="block-causally .*blocks of 32.* not built yet"):
        dllm.generate(model, tok, "hi", gen_length=8)


def test_triton_attention_names_the_per_query_mask(llada2_dir):
    from dllm.kernels import triton_runs_on
    if not triton_runs_on("cpu"):
        pytest.skip("needs triton under TRITON_INTERPRET=1")
    model, _ = dllm.load(llada2_dir, dtype="float32", attention="triton")
    with pytest.raises(ValueError, match="a mask per query.*sdpa or eager"):
        model(torch.randint(0, 300, (1, 40)))


@pytest.mark.parametrize("overrides, message", [
    (dict(score_function="softmax"), "'score_function'"),
    (dict(use_qkv_bias=True), "'use_qkv_bias'"),
    (dict(moe_router_enable_expert_bias=False), "'moe_router_enable_expert_bias'"),
    (dict(head_dim=32), "'head_dim' = 32"),
    (dict(n_group=3), "not divisible by n_groups 3"),
    (dict(topk_group=1, num_experts_per_tok=8), "cannot hold experts_per_token 8"),
])
def test_bad_configs_name_the_key(tmp_path, overrides, message):
    folder = write_llada2_checkpoint(tmp_path / "m")
    edit_config(folder, **overrides)
    with pytest.raises(ValueError, match=message):
        dllm.load(folder)


def test_missing_expert_bias_is_named(tmp_path):
    folder = write_llada2_checkpoint(tmp_path / "m")
    drop_weight(folder, "model.layers.2.mlp.gate.expert_bias")
    with pytest.raises(ValueError, match=r"missing \['model.layers.2.mlp.gate.expert_bias'\]"):
        dllm.load(folder)
