"""LLaDA-MoE: the checkpoint layout, the forward against a plain statement of the published
modelling code (tests/reference/arch_ref.py), the router and the grouped experts against
brute-force statements, LLaDA's decoding loop on it, and the errors of bad configs."""
import json
import shutil

import pytest
import torch

import dllm
from dllm.config import ModelConfig, MoEConfig
from dllm.models.moe import Experts, Router, grouped_linear, grouped_mm_runs, limit_groups
from dllm.overhead import DispatchCounter
from tests.fixtures.checkpoints import (LLADAMOE_TINY_SPECIAL_IDS, drop_weight, edit_config, lladamoe_config,
                                        load_state_dict, write_lladamoe_checkpoint)
from tests.fixtures.compiled import forget_graphs, graphs_built
from tests.reference.arch_ref import lladamoe_forward_ref
from tests.reference.samplers_ref import llada_generate_ref
from tests.test_generate import PROMPTS, PROMPTS4, _batch

VARIANT = dict(partial_rotary_factor=0.5, num_key_value_heads=2, shared_expert_intermediate_size=48, clip_qkv=0.8)


def test_config_and_special_ids_come_from_the_checkpoint(lladamoe):
    model, tok = lladamoe
    cfg = model.config
    assert cfg.family == "llada-moe" and cfg.qk_norm and cfg.rotary == cfg.head_dim and not cfg.rope_fp32
    assert cfg.moe == MoEConfig(n_experts=8, experts_per_token=2, expert_hidden=32)
    assert cfg.mask_token_id == LLADAMOE_TINY_SPECIAL_IDS["<|mask|>"]       # from the tokenizer, as published
    assert cfg.eot_token_id == LLADAMOE_TINY_SPECIAL_IDS["<|role_end|>"]
    assert cfg.n_params == sum(p.numel() for p in model.parameters())
    assert tuple(model.layers[0].mlp.experts.gate.shape) == (8, 32, 64)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"


@pytest.mark.parametrize("overrides", [{}, VARIANT], ids=["published", "partial-rotary-gqa-shared-clip"])
@pytest.mark.parametrize("sharded", [False, True])
def test_forward_equals_the_reference(tmp_path, overrides, sharded):
    folder = write_lladamoe_checkpoint(tmp_path / "m", sharded=sharded, **overrides)
    model, _ = dllm.load(folder, dtype="float32")
    state, config = load_state_dict(folder), lladamoe_config(**overrides)
    x = torch.randint(0, 300, (3, 23), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 23, dtype=torch.long)
    mask[1, :5] = 0                                      # a left-padded row
    with torch.no_grad():
        torch.testing.assert_close(model(x), lladamoe_forward_ref(state, config, x), rtol=1e-5, atol=1e-5)
        got = model(x, key_valid=mask.bool())
        want = lladamoe_forward_ref(state, config, x, mask)
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)


def test_bf16_forward_follows_the_reference_cast_order(lladamoe_dir):
    model, _ = dllm.load(lladamoe_dir, dtype="bfloat16")
    state = {k: v.to(torch.bfloat16) for k, v in load_state_dict(lladamoe_dir).items()}
    x = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = model(x).float(), lladamoe_forward_ref(state, lladamoe_config(), x).float()
    rel_rms = ((got - want).pow(2).mean() / want.pow(2).mean()).sqrt()
    assert rel_rms <= 6e-2, rel_rms            # the bound of the dense families' bf16 test (test_loading.py)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


# -- the router and the experts ---------------------------------------------------------------------
def _router(moe: MoEConfig, d=16, seed=0, bias=None):
    router = Router(d, moe)
    with torch.no_grad():
        router.weight.normal_(generator=torch.Generator().manual_seed(seed))
        if bias is not None:
            router.expert_bias.copy_(bias)
    return router


def _plain_route(x, weight, moe: MoEConfig, bias=None):
    """Brute force: per token, score, try every allowed set of groups, keep the best experts."""
    scores = (x @ weight.t()).double()
    scores = scores.softmax(-1) if moe.score == "softmax" else scores.sigmoid()
    picked, weights = [], []
    per_group = moe.n_experts // moe.n_groups
    for row in scores:
        choice = row + (0 if bias is None else bias.double())
        group_score = [sorted(choice[g * per_group:(g + 1) * per_group].tolist())[-2:] for g in range(moe.n_groups)]
        order = sorted(range(moe.n_groups), key=lambda g: (-sum(group_score[g]), g)) if moe.n_groups > 1 else [0]
        allowed = [e for g in order[:moe.topk_groups] for e in range(g * per_group, (g + 1) * per_group)]
        best = sorted(allowed, key=lambda e: (-choice[e].item(), e))[:moe.experts_per_token]
        w = row[best]
        if moe.norm_topk:
            w = w / w.sum()
        picked.append(sorted(best))
        weights.append(dict(zip(best, (w * moe.routed_scale).tolist())))
    return picked, weights


@pytest.mark.parametrize("moe", [
    MoEConfig(n_experts=8, experts_per_token=2, expert_hidden=4),
    MoEConfig(n_experts=8, experts_per_token=3, expert_hidden=4, norm_topk=True, routed_scale=2.5),
    MoEConfig(n_experts=16, experts_per_token=4, expert_hidden=4, score="sigmoid", norm_topk=True, n_groups=4,
              topk_groups=2, routed_scale=2.5, expert_bias=True),
], ids=["softmax", "softmax-norm-scaled", "sigmoid-groups-bias"])
def test_router_equals_a_brute_force_choice(moe):
    bias = torch.linspace(-0.2, 0.3, moe.n_experts) if moe.expert_bias else None
    router = _router(moe, bias=bias)
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(3))
    weights, experts = router(x)
    want_experts, want_weights = _plain_route(x, router.weight.detach(), moe, bias)
    for t in range(40):
        assert sorted(experts[t].tolist()) == want_experts[t]
        for e, w in zip(experts[t].tolist(), weights[t].tolist()):
            assert w == pytest.approx(want_weights[t][e], rel=1e-5)


def test_group_limit_keeps_the_groups_of_the_best_pairs():
    # Group 0 holds the single best expert but a weak second; group 2 has the best pair.
    choice = torch.tensor([[0.9, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]])
    kept = limit_groups(choice, n_groups=4, topk_groups=1)
    assert torch.equal(torch.isfinite(kept[0]), torch.tensor([False, False, False, False, True, True, False, False]))
    assert torch.equal(kept[0, 4:6], choice[0, 4:6])
    tie = limit_groups(torch.tensor([[0.3, 0.3, 0.3, 0.3]]), n_groups=2, topk_groups=1)
    assert torch.isfinite(tie).sum() == 2                  # ties between groups keep exactly topk_groups


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("d_in,d_out", [(16, 8), (6, 5)], ids=["grouped-gemm", "loop"])
def test_grouped_linear_runs_each_expert_on_its_own_rows(dtype, d_in, d_out):
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(11, d_in, generator=g).to(dtype), torch.randn(4, d_out, d_in, generator=g).to(dtype)
    assert grouped_mm_runs(x, w) == (d_in == 16 and dtype != torch.float64)    # torch's grouped GEMM has no float64
    ends = torch.tensor([3, 3, 9, 11], dtype=torch.int32)         # expert 1 gets no rows
    want = torch.cat([x[0:3] @ w[0].t(), x[3:9] @ w[2].t(), x[9:11] @ w[3].t()])
    torch.testing.assert_close(grouped_linear(x, w, ends), want)


def test_experts_equal_a_per_token_sum():
    g = torch.Generator().manual_seed(5)
    experts = Experts(6, 8, 5)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(generator=g)
    x = torch.randn(9, 8, generator=g)
    chosen = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(9)])
    weights = torch.rand(9, 3, generator=g)
    got = experts(x, weights, chosen, sum_fp32=False)
    want = torch.zeros_like(x)
    for t in range(9):
        for e, w in zip(chosen[t].tolist(), weights[t].tolist()):
            h = torch.nn.functional.silu(experts.gate[e] @ x[t]) * (experts.up[e] @ x[t])
            want[t] += w * (experts.down[e] @ h)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(experts(x, weights, chosen, sum_fp32=True), want, rtol=1e-5, atol=1e-5)


# -- decoding --------------------------------------------------------------------------------------
def _reference_logits(folder):
    state, config = load_state_dict(folder), lladamoe_config()
    mask_id = LLADAMOE_TINY_SPECIAL_IDS["<|mask|>"]

    def fn(x, attention_mask):
        logits = lladamoe_forward_ref(state, config, x, attention_mask)
        logits[..., mask_id] = torch.finfo(logits.dtype).min
        return logits
    return fn


@pytest.mark.parametrize("sampler", ["low_confidence", "random"])
def test_llada_loop_on_lladamoe_equals_the_reference(lladamoe, lladamoe_dir, sampler):
    model, _ = lladamoe
    for rows in ([PROMPTS[0]], PROMPTS4):
        ids, mask = _batch(rows, model.config.pad_token_id)
        want = llada_generate_ref(_reference_logits(lladamoe_dir), ids, mask, steps=8, gen_length=16, block_length=8,
                                  remasking=sampler, mask_id=model.config.mask_token_id,
                                  generator=torch.Generator().manual_seed(7))
        out = dllm.generate(model, None, rows, gen_length=16, block_length=8, steps=8, sampler=sampler, seed=7)
        assert torch.equal(out.sequences, want)


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_a_row_decodes_the_same_alone_and_in_a_batch(lladamoe, cache):
    model, _ = lladamoe
    together = dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, sampler="threshold", cache=cache)
    for b, row in enumerate(PROMPTS):
        alone = dllm.generate(model, None, [row], gen_length=16, block_length=8, sampler="threshold", cache=cache)
        assert alone.generated[0].tolist() == together.generated[b].tolist()


def test_moe_forward_reads_nothing_back(lladamoe):
    model, _ = lladamoe
    x = torch.randint(0, 300, (2, 19))
    with torch.no_grad(), DispatchCounter() as counter:
        model(x, torch.arange(4, 12).expand(2, 8))
    assert counter.counts[counter.kind].syncs == 0


def test_generate_with_a_chat_prompt(lladamoe):
    model, tok = lladamoe
    out = dllm.generate(model, tok, "hi", gen_length=8, block_length=8, chat=True)
    assert len(out.texts) == 1 and out.generated.shape == (1, 8)


# -- bad configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (dict(moe_layer_freq=[1, 0]), "'moe_layer_freq'"),
    (dict(moe_router_enable_expert_bias=True), "'moe_router_enable_expert_bias'"),
    (dict(num_experts_per_tok=9), r"experts_per_token 9 exceeds n_experts 8 \(n_experts is config.json's "
                                  r"'num_experts'; experts_per_token is config.json's 'num_experts_per_tok'\)"),
    (dict(num_key_value_heads=3), r"n_kv_heads.*\(n_heads is config.json's 'num_attention_heads'; n_kv_heads is "
                                  r"config.json's 'num_key_value_heads'\)"),
    (dict(hidden_act="gelu"), "'hidden_act'"),
    (dict(partial_rotary_factor=0.0), "'partial_rotary_factor'"),
    (dict(attention_bias=True), "'attention_bias'"),
])
def test_bad_configs_name_the_key(tmp_path, overrides, message):
    folder = write_lladamoe_checkpoint(tmp_path / "m")
    edit_config(folder, **overrides)
    with pytest.raises(ValueError, match=message):
        dllm.load(folder)


@pytest.mark.parametrize("dense", [-1, 0, True, None])
def test_an_unset_dense_width_is_the_config_class_default(tmp_path, dense):
    folder = write_lladamoe_checkpoint(tmp_path / "m")
    edit_config(folder, dense_intermediate_size=dense)
    model, _ = dllm.load(folder, dtype="float32")
    assert model.config.mlp_hidden == model.config.moe.expert_hidden


def test_qk_layernorm_must_be_stated(tmp_path):
    from dllm.models.llada_moe import config_from_hf
    config = {**json.loads((write_lladamoe_checkpoint(tmp_path / "m") / "config.json").read_text()), "mask_token_id": 5}
    assert config_from_hf(config).qk_norm is True
    assert config_from_hf({**config, "qk_layernorm": None}).qk_norm is False
    del config["qk_layernorm"]
    with pytest.raises(ValueError, match="lacks 'qk_layernorm'"):
        config_from_hf(config)


def test_missing_expert_weight_and_mask_token_are_named(tmp_path):
    folder = write_lladamoe_checkpoint(tmp_path / "m")
    drop_weight(folder, "model.layers.1.mlp.experts.5.up_proj.weight")
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.experts.5.up_proj.weight'\]"):
        dllm.load(folder)
    other = write_lladamoe_checkpoint(tmp_path / "n")
    (other / "tokenizer.json").unlink()
    shutil.copy(folder / "tokenizer_config.json", other / "tokenizer_config.json")
    with pytest.raises(ValueError, match="'mask_token_id'.*'<\\|mask\\|>'"):
        dllm.load(other)


def test_moe_config_errors_name_the_field():
    with pytest.raises(ValueError, match="router score"):
        MoEConfig(n_experts=8, experts_per_token=2, expert_hidden=4, score="relu")
    with pytest.raises(ValueError, match="not divisible by n_groups 3"):
        MoEConfig(n_experts=8, experts_per_token=2, expert_hidden=4, n_groups=3)
    with pytest.raises(ValueError, match="first_dense 5 exceeds n_layers 2"):
        ModelConfig.from_name("llada-tiny").replace(moe=MoEConfig(n_experts=4, experts_per_token=2, expert_hidden=4,
                                                                  first_dense=5))


@pytest.mark.parametrize("cache", ["dual", pytest.param("none", marks=pytest.mark.slow)])
def test_compiled_equals_eager(lladamoe_dir, cache):
    model, _ = dllm.load(lladamoe_dir, dtype="float32")
    request = dict(gen_length=16, block_length=8, sampler="threshold", cache=cache)
    eager = dllm.generate(model, None, PROMPTS, **request)
    model.set_compile(True)
    forget_graphs()
    before = graphs_built()
    assert torch.equal(dllm.generate(model, None, PROMPTS, **request).sequences, eager.sequences)
    assert graphs_built() > before                     # the compiled forwards ran


def test_cli_generates_with_a_lladamoe_folder(lladamoe, lladamoe_dir, capsys):
    from dllm.cli import main
    rc = main(["generate", "--model", str(lladamoe_dir), "hello", "--gen-length", "8", "--block-length", "4",
               "--steps", "4", "--dtype", "float32", "--cache", "dual", "--sampler", "threshold"])
    out, _ = capsys.readouterr()
    model, tok = lladamoe
    want = dllm.generate(model, tok, ["hello"], gen_length=8, block_length=4, steps=4, cache="dual",
                         sampler="threshold")
    assert rc == 0 and out == "".join(t + "\n" for t in want.texts)
