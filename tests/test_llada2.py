"""LLaDA2: the checkpoint layout (fused q/k/v, a dense first layer, grouped sigmoid routing with an
expert bias), the forward against a plain statement of the published modelling code with its
block-causal mask (tests/reference/arch_ref.py), the block-causal K/V cache at the forward level,
and the errors of bad configs."""
import math
import re

import pytest
import torch

import dllm
from dllm.cache import KVCache, get_policy
from tests.fixtures.checkpoints import (LLADAMOE_TINY_SPECIAL_IDS, drop_weight, edit_config, llada2_config,
                                        load_state_dict, write_llada2_checkpoint)
from tests.fixtures.compiled import forget_graphs, graphs_built
from tests.reference.arch_ref import llada2_forward_ref
from tests.reference.samplers_ref import llada21_generate_ref, llada2_generate_ref


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


VARIANTS = {   # config.json changes: one expert per token (raw score, no division), a rotary_dim key the
               # published code does not read, a head tied to the embedding, a quarter of each head rotated
    "published": {},
    "one-expert": dict(num_experts_per_tok=1, n_group=1, topk_group=1),
    "stray-rotary-dim": dict(rotary_dim=4),
    "tied": dict(tie_word_embeddings=True),
    "quarter-rotary": dict(partial_rotary_factor=0.25, rotary_dim=4),
}


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("length", [75, 32, 9])
def test_forward_equals_the_reference(tmp_path, sharded, length):
    _check_forward(tmp_path, {}, length, sharded)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "published"])
def test_config_variants_forward_as_the_reference(tmp_path, variant):
    _check_forward(tmp_path, VARIANTS[variant], 40)


def _check_forward(tmp_path, changes: dict, length: int, sharded: bool = False) -> None:
    folder = write_llada2_checkpoint(tmp_path / "m", sharded=sharded, **changes)
    model, _ = dllm.load(folder, dtype="float32")
    x = torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        got = model(x)
    want = llada2_forward_ref(load_state_dict(folder), llada2_config(**changes), x)
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


# -- decoding ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eos_heavy(llada2_dir):
    """The tiny LLaDA2 with an LM head that often prefers EOS, as a model and as reference state."""
    model, _ = dllm.load(llada2_dir, dtype="float32")
    state = load_state_dict(llada2_dir)
    eos = model.config.eos_token_id
    with torch.no_grad():
        head = model.head.weight
        head[eos] += 1.5 * head.mean(0) / head.mean(0).norm() * head.norm(dim=1).mean()
    state["lm_head.weight"] = model.head.weight.detach().clone()
    return model, state


def _reference(state, model, prompt, gen_length, **options):
    def logits_fn(x):
        logits = llada2_forward_ref(state, llada2_config(), x)
        logits[..., model.config.mask_token_id] = torch.finfo(logits.dtype).min    # never a candidate
        return logits
    canvas = llada2_generate_ref(logits_fn, prompt, gen_length=gen_length, mask_id=model.config.mask_token_id,
                                 eos_id=model.config.eos_token_id, **options)
    return _until_eos(canvas[0, len(prompt):].tolist(), model.config.eos_token_id)


def _until_eos(tokens, eos):
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


PROMPTS2 = [[5, 17, 33, 2, 90], list(range(40, 72)), [7] * 45, [250, 11, 11, 19, 100, 3, 8] * 10]


@pytest.mark.parametrize("options", [dict(), dict(threshold=0.3, steps=8), dict(threshold=0.5, eos_early_stop=True)],
                         ids=["published", "threshold-0.3-steps-8", "early-stop"])
def test_llada2_loop_equals_the_reference(eos_heavy, options):
    model, state = eos_heavy
    sampler_args = {"threshold": 0.95, **options}
    hit_eos = False
    for prompt in PROMPTS2:
        want = _reference(state, model, prompt, 48, **options)
        out = dllm.generate(model, None, [prompt], gen_length=48, sampler="llada2", sampler_kwargs=sampler_args)
        got = _until_eos(out.generated[0].tolist(), model.config.eos_token_id)
        assert got == want, (prompt, got, want)
        hit_eos |= model.config.eos_token_id in want
    assert hit_eos, "the fixture must reach an EOS stop"


def test_llada2_caps_steps_at_a_generation_shorter_than_a_block(eos_heavy):
    """The reference caps the steps per block at gen_length: with 20 tokens each step commits at
    least 32 // 20 = 1, plus one in the first 12 steps."""
    model, state = eos_heavy
    for prompt in PROMPTS2[:2]:
        want = _reference(state, model, prompt, 20)
        out = dllm.generate(model, None, [prompt], gen_length=20, sampler="llada2", sampler_kwargs={"threshold": 0.95})
        assert _until_eos(out.generated[0].tolist(), model.config.eos_token_id) == want, prompt


@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
@pytest.mark.parametrize("cache", ["none", "dual", "prefix", "block"])
def test_rows_decode_alike_alone_and_in_a_ragged_batch(eos_heavy, cache, sampler):
    model, _ = eos_heavy
    request = dict(gen_length=40, sampler=sampler, sampler_kwargs={"threshold": 0.5}, cache=cache)
    together = dllm.generate(model, None, PROMPTS2, **request)
    for b, prompt in enumerate(PROMPTS2):
        alone = dllm.generate(model, None, [prompt], **request)
        assert alone.generated[0].tolist() == together.generated[b].tolist()
        assert alone.nfe[0] == together.nfe[b], (b, alone.nfe, together.nfe)   # its own tail, its own stop


def test_adablocks_default_window_is_a_quarter_of_the_answer_not_the_canvas(llada2_dir):
    model, _ = dllm.load(llada2_dir, dtype="float32")
    windows = set()
    dllm.generate(model, None, [[5, 6]], gen_length=20, sampler="adablock",
                  sampler_kwargs={"tau_d": 0.5, "delimiter_ids": [5]},
                  on_step=lambda state: windows.add(state.extra["adablock"]["window"]))
    assert windows == {5}                    # int(0.25 * 20), though the canvas runs on to 30 columns


def test_the_block_tail_is_decoded_and_left_out_of_every_output(llada2_dir):
    """gen_length 20 after a 2-token prompt: the canvas runs on to the attention block's end (32
    columns), and sequences, generated and trace hold the prompt and the 20 answer columns only."""
    model, _ = dllm.load(llada2_dir, dtype="float32")
    out = dllm.generate(model, None, [[5, 6]], gen_length=20, trace=True)
    assert out.sequences.shape == (1, 22) and out.generated.shape == (1, 20) and out.trace.shape == (1, 20)


def test_block_causal_caches_are_exact(eos_heavy):
    """Finished blocks' K/V never change, so `dual` and `prefix` give the tokens of recomputing the
    whole canvas every step (the first block's recompute starts at its attention block, prompt tail
    included)."""
    model, _ = eos_heavy
    request = dict(gen_length=64, sampler="llada2", sampler_kwargs={"threshold": 0.5})
    full = dllm.generate(model, None, PROMPTS2, cache="none", **request)
    for cache in ("dual", "prefix", "block"):
        cached = dllm.generate(model, None, PROMPTS2, cache=cache, **request)
        assert torch.equal(cached.sequences, full.sequences)
        assert cached.forwards == full.forwards


@pytest.mark.parametrize("sampler,kwargs", [("rcr", {}),
                                             ("adablock", dict(delimiter_ids=[5], tau_d=0.3))])
def test_the_block_cache_is_exact_for_rewrites_of_earlier_blocks_and_unaligned_blocks(sampler, kwargs):
    """RCR rewrites columns of earlier blocks; AdaBlock's blocks cross the attention blocks when the
    prompt does not fill whole ones. `block` recomputes every attention block a change reaches;
    `dual` and `prefix` the attention blocks of the active block, enough for AdaBlock."""
    model = dllm.build_model(dllm.ModelConfig.from_name("llada2-tiny"), seed=0, init_std=1.0)
    request = dict(gen_length=64, block_length=32, sampler=sampler, sampler_kwargs=kwargs)
    ragged = [[1, 2, 3], list(range(4, 40))] if sampler == "adablock" else [[1] * 32, list(range(4, 68))]
    caches = ["block", "dual", "prefix"] if sampler == "adablock" else ["block"]
    for prompts in ([[1] * 32], ragged):     # rcr's fixed schedule needs prompts of whole attention blocks
        full = dllm.generate(model, None, prompts, cache="none", **request)
        for cache in caches:
            cached = dllm.generate(model, None, prompts, cache=cache, **request)
            assert torch.equal(cached.sequences, full.sequences) and cached.nfe == full.nfe, (prompts, cache)


def test_the_block_cache_counts_attention_blocks_from_each_rows_first_token():
    """A row left-padded by other than a multiple of the attention block: its blocks start at its
    own first token, so `block` recomputes from there and decodes as `none` does, alone or not."""
    model = dllm.build_model(dllm.ModelConfig.from_name("llada2-tiny"), seed=0, init_std=1.0)
    request = dict(gen_length=64, sampler="llada2", sampler_kwargs={"threshold": 0.5})
    prompts = [list(range(40, 48)), list(range(50, 83))]          # row 0: 25 columns of padding
    full = dllm.generate(model, None, prompts, cache="none", **request)
    cached = dllm.generate(model, None, prompts, cache="block", **request)
    alone = dllm.generate(model, None, prompts[:1], cache="block", **request)
    assert torch.equal(cached.sequences, full.sequences) and cached.nfe == full.nfe
    assert torch.equal(alone.generated[0], cached.generated[0])


def test_block_cache_prefills_once(eos_heavy, llada_dir):
    """`block` runs one full forward per row (the prefill), `dual` one per block."""
    model, _ = eos_heavy
    request = dict(gen_length=64, sampler="llada2", sampler_kwargs={"threshold": 0.5})
    block, dual = get_policy("block"), get_policy("dual")
    a = dllm.generate(model, None, PROMPTS2, cache=block, **request)
    b = dllm.generate(model, None, PROMPTS2, cache=dual, **request)
    assert torch.equal(a.sequences, b.sequences)
    assert block.refreshes.tolist() == [1] * len(PROMPTS2)
    assert int(dual.refreshes.sum()) > len(PROMPTS2)          # rows that reach a second block refresh again
    llada, _ = dllm.load(llada_dir, dtype="float32")
    with pytest.raises(ValueError, match="cache 'block' is exact only under block-causal attention"):
        dllm.generate(llada, None, [[5, 6]], gen_length=8, cache="block")


def test_the_first_block_ends_at_the_attention_block(eos_heavy):
    model, _ = eos_heavy
    out = dllm.generate(model, None, [[5] * 45], gen_length=40, sampler="llada2", trace=True,
                        sampler_kwargs={"threshold": 1.0})       # one token per step
    steps = out.trace[0]
    assert sorted(steps[:19].tolist()) == list(range(19))          # columns 45-63 end the first attention block
    assert int(steps[19:].min()) == 19


def test_eager_attention_decodes_ragged_rows_without_nan(llada2_dir):
    """Padding queries far left of a long prompt see no key of their block; they see the row's
    valid keys instead, so the eager backend (softmax of an all -inf row: NaN) stays finite."""
    model, _ = dllm.load(llada2_dir, dtype="float32", attention="eager")
    rows = [[5, 17, 33, 2, 90], [7] * 70]
    together = dllm.generate(model, None, rows, gen_length=32, sampler="llada2", sampler_kwargs={"threshold": 0.5})
    for b, row in enumerate(rows):
        alone = dllm.generate(model, None, [row], gen_length=32, sampler="llada2", sampler_kwargs={"threshold": 0.5})
        assert alone.generated[0].tolist() == together.generated[b].tolist()


def test_fixed_schedules_need_whole_prompt_blocks(llada2_dir):
    model, _ = dllm.load(llada2_dir, dtype="float32")
    with pytest.raises(ValueError, match="prompt of 45 tokens leaves a partial first block"):
        dllm.generate(model, None, [[7] * 45], gen_length=64, steps=16, sampler="low_confidence")
    out = dllm.generate(model, None, [[7] * 64], gen_length=64, steps=16, sampler="low_confidence")
    assert out.forwards == 16


def test_block_length_and_sampler_are_checked(llada2_dir):
    model, _ = dllm.load(llada2_dir, dtype="float32")
    with pytest.raises(ValueError, match="block_length 16 differs from the 32-column attention blocks"):
        dllm.generate(model, None, [[5, 6]], gen_length=32, block_length=16)
    # The model's own block length may be given whatever gen_length, as leaving it out gives it.
    want = dllm.generate(model, None, [[5, 6]], gen_length=20)
    got = dllm.generate(model, None, [[5, 6]], gen_length=20, block_length=32)
    assert torch.equal(got.sequences, want.sequences) and got.nfe == want.nfe
    with pytest.raises(ValueError, match="block_length 20 differs from the 32-column attention blocks of llada2; "
                                         "leave it out"):
        dllm.generate(model, None, [[5, 6]], gen_length=20, block_length=20)
    with pytest.raises(ValueError, match="sampler 'entropy' decodes the whole generation region at once"):
        dllm.generate(model, None, [[5, 6]], gen_length=32, sampler="entropy")
    with pytest.raises(ValueError, match="steps 40 per block exceeds block_length 32"):
        dllm.generate(model, None, [[5, 6]], gen_length=64, sampler="llada2", sampler_kwargs={"steps": 40})


def test_an_attention_backend_without_query_masks_is_refused_when_chosen(llada2_dir, monkeypatch):
    """The triton kernel takes one key mask per row, not the per-query mask of attention blocks:
    refused at load (before any weight is read) and at set_attention, naming the backends that take it."""
    pytest.importorskip("triton")
    import dllm.models.loading as loading
    message = r"attention backend 'triton' takes no key mask per query, .* use one of eager, sdpa, auto"
    read = loading.load_weights
    with monkeypatch.context() as patch:
        patch.setattr(loading, "load_weights", lambda *a, **k: pytest.fail("weights read before the refusal"))
        with pytest.raises(ValueError, match=message):
            dllm.load(llada2_dir, dtype="float32", attention="triton")
    assert loading.load_weights is read
    model, _ = dllm.load(llada2_dir, dtype="float32")
    before = model.attention
    with pytest.raises(ValueError, match=message):
        model.set_attention("triton")
    assert model.attention == before


@pytest.mark.parametrize("overrides, message", [
    (dict(score_function="softmax"), "'score_function'"),
    (dict(use_qkv_bias=True), "'use_qkv_bias'"),
    (dict(moe_router_enable_expert_bias=False), "'moe_router_enable_expert_bias'"),
    (dict(head_dim=32), "'head_dim' = 32"),
    (dict(n_group=3), r"not divisible by n_groups 3 \(n_experts is config.json's 'num_experts'; n_groups is "
                      r"config.json's 'n_group'\)"),
    (dict(topk_group=1, num_experts_per_tok=8), r"cannot hold experts_per_token 8.*experts_per_token is "
                                                r"config.json's 'num_experts_per_tok'"),
    (dict(first_k_dense_replace=9), r"first_dense 9 exceeds n_layers 3 \(n_layers is config.json's "
                                    r"'num_hidden_layers'; first_dense is config.json's 'first_k_dense_replace'\)"),
    (dict(partial_rotary_factor=0.3125), r"rotary_dim must be .*got 5 \(rotary_dim is config.json's "
                                         r"'partial_rotary_factor'\)"),
    (dict(partial_rotary_factor=0), "'partial_rotary_factor' = 0 must lie in"),
    (dict(num_attention_heads=0), "'num_attention_heads' = 0 must be a positive integer"),
    (dict(hidden_size="64"), "'hidden_size' = '64' must be a positive integer"),
])
def test_bad_configs_name_the_key(tmp_path, overrides, message):
    folder = write_llada2_checkpoint(tmp_path / "m")
    edit_config(folder, **overrides)
    with pytest.raises(ValueError, match=message):
        dllm.load(folder)


def test_a_config_without_dense_layers_needs_no_dense_width(tmp_path):
    folder = write_llada2_checkpoint(tmp_path / "m", first_k_dense_replace=0)
    edit_config(folder, intermediate_size=None)
    model, _ = dllm.load(folder, dtype="float32")
    assert model.config.moe.first_dense == 0
    edit_config(folder, first_k_dense_replace=1)
    with pytest.raises(ValueError, match="LLaDA2 config.json lacks required keys: intermediate_size"):
        dllm.load(folder)


def test_missing_expert_bias_is_named(tmp_path):
    folder = write_llada2_checkpoint(tmp_path / "m")
    drop_weight(folder, "model.layers.2.mlp.gate.expert_bias")
    with pytest.raises(ValueError, match=r"missing \['model.layers.2.mlp.gate.expert_bias'\]"):
        dllm.load(folder)


# -- LLaDA2.1's editing ---------------------------------------------------------------------------
def _reference21(state, model, prompt, gen_length, **options):
    def logits_fn(x):
        logits = llada2_forward_ref(state, llada2_config(), x)
        logits[..., model.config.mask_token_id] = torch.finfo(logits.dtype).min
        return logits
    canvas, forwards = llada21_generate_ref(logits_fn, prompt, gen_length=gen_length,
                                            mask_id=model.config.mask_token_id, eos_id=model.config.eos_token_id,
                                            **options)
    return canvas[0, len(prompt):].tolist(), forwards


@pytest.mark.parametrize("options", [
    dict(threshold=0.7, editing_threshold=0.5),                       # the model card's quality mode
    dict(threshold=0.5, editing_threshold=0.0, max_post_steps=3),     # its speed mode, a short post phase
    dict(threshold=0.95, editing_threshold=0.3, eos_early_stop=True),
], ids=["quality", "speed", "early-stop"])
def test_llada21_loop_equals_the_reference(eos_heavy, options):
    model, state = eos_heavy
    eos = model.config.eos_token_id
    edited = 0
    for prompt in PROMPTS2:
        want, forwards = _reference21(state, model, prompt, 40, **options)
        out = dllm.generate(model, None, [prompt], gen_length=40, sampler="llada21", sampler_kwargs=options)
        got = out.generated[0].tolist()
        if options.get("eos_early_stop"):
            got, want = _until_eos(got, eos), _until_eos(want, eos)
        else:
            assert out.forwards == forwards
        assert got == want, (prompt, got, want)
        edited += out.edits[0]
    assert edited > 0, "the fixture must edit"


def test_edits_stay_in_the_active_block_and_the_decode_ends(eos_heavy):
    model, _ = eos_heavy
    prompt = PROMPTS2[3]
    out = dllm.generate(model, None, [prompt], gen_length=64, sampler="llada21", trace=True,
                        sampler_kwargs=dict(threshold=0.5, editing_threshold=0.0, max_post_steps=4))
    assert out.sequences[0, :len(prompt)].tolist() == prompt
    assert model.config.mask_token_id not in out.generated[0].tolist()
    blocks = (torch.arange(64) + len(prompt)) // 32                          # attention block of each position
    steps = out.trace[0]
    for b in blocks.unique()[:-1]:       # a position's last write comes before the next block's first
        assert int(steps[blocks == b].max()) < int(steps[blocks == b + 1].min())
    tail = -(len(prompt) + 64) % 32                                          # the last block's columns past G
    assert out.forwards <= 64 + tail + 3 * (4 + 1)                           # masks, plus bounded post steps


@pytest.mark.parametrize("cache", ["dual", "prefix", "block"])
def test_llada21_caches_are_exact(eos_heavy, cache):
    model, _ = eos_heavy
    request = dict(gen_length=40, sampler="llada21", sampler_kwargs=dict(threshold=0.7, editing_threshold=0.5))
    full = dllm.generate(model, None, PROMPTS2, cache="none", **request)
    cached = dllm.generate(model, None, PROMPTS2, cache=cache, **request)
    assert torch.equal(cached.sequences, full.sequences) and cached.edits == full.edits


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
def test_compiled_equals_eager(llada2_dir, sampler):
    model, _ = dllm.load(llada2_dir, dtype="float32")
    request = dict(gen_length=40, sampler=sampler, cache="dual", sampler_kwargs={"threshold": 0.6})
    eager = dllm.generate(model, None, PROMPTS2[:2], **request)
    model.set_compile(True)
    forget_graphs()
    before = graphs_built()
    compiled = dllm.generate(model, None, PROMPTS2[:2], **request)
    assert torch.equal(compiled.sequences, eager.sequences) and compiled.forwards == eager.forwards
    assert graphs_built() > before                     # the compiled forwards ran


def test_config_keys_read_as_the_published_model_reads_them():
    """The rotary width is head_dim x partial_rotary_factor (rotary_dim is not read), and absent
    keys take LLaDA2MoeConfig's defaults."""
    from dllm.models.llada2 import config_from_hf
    from tests.fixtures.checkpoints import llada2_config

    tokens = {"<|mask|>": 304, "<|endoftext|>": 301}
    assert config_from_hf(llada2_config(rotary_dim=4), tokens).rotary_dim == 8         # head_dim 16 x 0.5
    d = llada2_config(num_experts=16)
    for key in ("routed_scaling_factor", "n_group", "topk_group", "rms_norm_eps", "rope_theta"):
        d.pop(key, None)
    cfg = config_from_hf(d, tokens)
    assert (cfg.moe.routed_scale, cfg.moe.n_groups, cfg.moe.topk_groups) == (2.5, 8, 4)
    assert (cfg.norm_eps, cfg.rope_theta) == (1e-5, 10000.0)


def test_use_bias_must_be_stated():
    # LLaDA2MoeConfig defaults use_bias to true (a bias on the attention output).
    from dllm.models.llada2 import config_from_hf
    from tests.fixtures.checkpoints import llada2_config

    d = llada2_config()
    d.pop("use_bias")
    with pytest.raises(ValueError, match=r"LLaDA2 config.json lacks use_bias: .* supported: use_bias=False"):
        config_from_hf(d, {"<|mask|>": 304, "<|endoftext|>": 301})


def test_served_rows_join_a_batch_of_their_own_canvas(llada2_dir):
    """A block-causal decode runs on to each row's last attention block, so the canvas depends on the
    prompt's length: a request joins a running batch only when its canvas is the batch's."""
    from dllm.serve.engine import Engine, Job

    model, tok = dllm.load(llada2_dir, dtype="float32")
    config = dllm.GenerationConfig(gen_length=40, sampler="threshold", sampler_kwargs={"tau": 0.5})
    prompts = [[5, 17, 33, 2, 90], list(range(40, 72)), [9, 8, 7, 6, 5]]   # tails 19, 24, 19
    answers = {}
    engine = Engine(model, tok)
    jobs = [Job(p, config, lambda kind, payload, i=i: answers.update({i: payload}) if kind == "done" else None)
            for i, p in enumerate(prompts)]
    for job in jobs:
        engine._start_group("llada2", [job])
    assert [len(g.jobs) for g in engine.groups] == [2, 1]               # the third joined the first
    engine.run(keep_running=lambda: len(answers) < len(prompts))
    for i, prompt in enumerate(prompts):
        alone = dllm.generate(model, tok, [prompt], config=config)
        assert answers[i]["text"] == alone.texts[0] and answers[i]["completion_tokens"] == alone.answer_lengths[0]


def test_a_served_row_is_answered_once_its_answer_is_written_while_its_tail_decodes(llada2_dir):
    """gen_length 20 after 2 prompt tokens: the canvas runs on for 10 tail columns; the answer's
    columns are all written two forwards before the tail's, and the row is answered then."""
    from dllm.serve.engine import Engine, Job

    model, tok = dllm.load(llada2_dir, dtype="float32")
    config = dllm.GenerationConfig(gen_length=20, sampler="threshold", sampler_kwargs={"tau": 0.5})
    mask, written = model.config.mask_token_id, []
    alone = dllm.generate(model, tok, [[5, 6]], config=config, on_step=lambda state: written.append(
        not (state.generated()[0] == mask).any()))
    first = written.index(True) + 1
    assert first < alone.nfe[0]                             # the fixture has the case
    answers = []
    engine = Engine(model, tok)
    engine._start_group("llada2", [Job([5, 6], config, lambda kind, payload: answers.append(payload)
                                        if kind == "done" else None)])
    engine.run(keep_running=lambda: not answers)
    assert answers[0]["text"] == alone.texts[0] and answers[0]["forwards"] == first


# -- sampling at temperature > 0 (the reference's _sample_with_temperature_topk_topp) -------------
def _top_k_then_top_p_ref(logits, top_k, top_p):
    """LLaDA2's filters restated: keep the k largest logits, then the nucleus of what is left."""
    if top_k:
        kth = torch.topk(logits, top_k).values[..., -1:]
        logits = torch.where(logits < kth, float("-inf"), logits)
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.cumsum(torch.softmax(sorted_logits, -1), -1)
        drop = cum > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits


@pytest.mark.parametrize("top_k,top_p", [(2, 0.6), (3, 0.9), (None, 0.55), (1, None), (5, 0.3)])
def test_llada2_filters_top_k_before_top_p(top_k, top_p):
    from dllm.samplers.sampling import filter_logits
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-3, 2e-3], [0.1, 0.15, 0.25, 0.2, 0.3]]))
    want = torch.softmax(_top_k_then_top_p_ref(logits / 0.7, top_k, top_p), -1)
    got = torch.softmax(filter_logits(logits, 0.7, top_p, top_k, top_k_first=True), -1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    if (top_k, top_p) == (2, 0.6):   # the order matters here: Dream's (nucleus first) keeps two tokens
        dream = torch.softmax(filter_logits(logits, 0.7, top_p, top_k), -1)
        assert (dream[0] > 0).sum() == 2 and (got[0] > 0).sum() == 1


def _one_token_model(logit):
    """Every column's logits: `logit` for token 7, 0 for the others."""
    from tests.test_samplers_parallel import ScriptedModel

    def logits_fn(x, cols, V):
        out = torch.zeros(*cols.shape, V)
        out[..., 7] = logit
        return out
    return ScriptedModel(logits_fn=logits_fn)


@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
def test_confidence_at_temperature_is_the_tempered_probability(sampler):
    """Token 7's probability is e^2 / (e^2 + V - 1) (under 0.03) raw, above 1 - 1e-5 at
    temperature 0.1: the tempered one passes the 0.95 threshold, so every block fills in one step."""
    model = _one_token_model(2.0)
    V = model.config.vocab_size
    assert math.exp(2) / (math.exp(2) + V - 1) < 0.03
    kwargs = dict(gen_length=16, block_length=8, sampler=sampler, sampler_kwargs={"max_post_steps": 0}
                  if sampler == "llada21" else {})
    hot = dllm.generate(model, None, [[1, 2, 3]], temperature=0.1, seed=3, **kwargs)
    assert hot.generated[0].tolist() == [7] * 16 and hot.forwards == 2
    greedy = dllm.generate(model, None, [[1, 2, 3]], temperature=0.0, **kwargs)
    assert greedy.generated[0].tolist() == [7] * 16 and greedy.forwards == 16


@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
def test_top_k_one_draws_the_argmax_with_confidence_one(sampler):
    """With top_k 1 the filtered distribution holds the argmax alone (probability 1): at any
    temperature a block fills at once with the argmax tokens, as a greedy run with threshold 0 does."""
    from tests.test_samplers_parallel import ScriptedModel

    def logits_fn(x, cols, V):
        g = torch.Generator().manual_seed(int(cols.sum()))
        return torch.randn(*cols.shape, V, generator=g)
    model = ScriptedModel(logits_fn=logits_fn)
    base = dict(gen_length=12, block_length=4, sampler=sampler)
    hot = dllm.generate(model, None, [[1, 2, 3]], temperature=1.5, seed=0, sampler_kwargs={"top_k": 1}, **base)
    want = dllm.generate(model, None, [[1, 2, 3]], temperature=0.0, sampler_kwargs={"threshold": 0.0}, **base)
    assert hot.generated.tolist() == want.generated.tolist()
    assert hot.forwards == want.forwards


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_k=0), r"sampler 'llada2': top_k must be"),
    (dict(top_p=0.0), r"sampler 'llada2': top_p must be"),
    (dict(top_p=1.5), r"sampler 'llada2': top_p must be"),
])
def test_llada2_filters_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dllm.samplers.get("llada2", **kwargs)


@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
def test_a_temperature_too_small_to_divide_by_is_refused(sampler):
    with pytest.raises(ValueError, match=rf"sampler '{sampler}': temperature 1e-30 overflows its logits / temperature"):
        dllm.generate(_one_token_model(2.0), None, [[1, 2]], gen_length=8, block_length=8, sampler=sampler,
                      temperature=1e-30, seed=0)


def _fixed_distribution_model(probs):
    """Every column's logits: log(probs) over the first tokens, -inf elsewhere."""
    from tests.test_samplers_parallel import ScriptedModel

    def logits_fn(x, cols, V):
        out = torch.full((*cols.shape, V), float("-inf"))
        out[..., :len(probs)] = torch.log(torch.tensor(probs))
        return out
    return ScriptedModel(logits_fn=logits_fn)


def test_the_drawn_tokens_follow_the_tempered_distribution():
    """Two tokens at 0.73 / 0.27: with threshold 0 every mask commits in one step, each with a token
    drawn at temperature 1 (not the argmax): about 27% of 64 are the second."""
    model = _fixed_distribution_model([0.73, 0.27])
    out = dllm.generate(model, None, [[1, 2, 3]], gen_length=64, block_length=64, sampler="llada2", temperature=1.0,
                        seed=0, sampler_kwargs={"threshold": 0.0})
    share = (out.generated[0] == 1).float().mean().item()
    assert out.forwards == 1 and 0.1 < share < 0.45, share


def test_an_eos_drawn_at_temperature_stops_the_row_after_its_block():
    """EOS at 0.27, token 0 at 0.73: with threshold 0 the first block fills in one step and almost
    surely holds a drawn EOS (the argmax never is), so the row stops after it."""
    from tests.test_samplers_parallel import ScriptedModel

    eos = ScriptedModel().config.eos_token_id

    def logits_fn(x, cols, V):
        out = torch.full((*cols.shape, V), float("-inf"))
        out[..., 0], out[..., eos] = math.log(0.73), math.log(0.27)
        return out
    out = dllm.generate(ScriptedModel(logits_fn=logits_fn), None, [[1, 2, 3]], gen_length=64, block_length=32,
                        sampler="llada2", temperature=1.0, seed=0, sampler_kwargs={"threshold": 0.0})
    assert out.forwards == 1 and (out.generated[0, :32] == eos).any() and (out.generated[0, 32:] == eos).all()


def test_prophet_over_llada2_passes_the_logits_its_draw_needs():
    out = dllm.generate(_fixed_distribution_model([0.73, 0.27]), None, [[1, 2, 3]], gen_length=16, block_length=8,
                        sampler="prophet", temperature=1.0, seed=0, sampler_kwargs={"base": "llada2"})
    assert out.generated.shape == (1, 16) and set(out.generated[0].tolist()) <= {0, 1}


def test_greedy_llada2_scores_with_the_lm_head_fused(monkeypatch):
    """At temperature 0 llada2 reads only the candidate and its probability: the fused head scoring
    runs (its draw needs the logits at temperature > 0 only)."""
    import dllm.decode as decode_module

    model = dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)
    monkeypatch.setenv("DLLM_HEAD_SCORING", "torch")
    calls = []
    fused = decode_module.head_scores
    monkeypatch.setattr(decode_module, "head_scores", lambda *a, **k: calls.append(1) or fused(*a, **k))
    dllm.generate(model, None, [[5, 6, 7]], gen_length=8, block_length=8, sampler="llada2")
    assert calls
    calls.clear()
    dllm.generate(model, None, [[5, 6, 7]], gen_length=8, block_length=8, sampler="llada2", temperature=1.0, seed=0)
    assert not calls


@pytest.mark.parametrize("seed", [0, 1])
def test_llada2_commits_its_own_draws_from_the_requests_generator(seed):
    """Threshold 0 commits the 8-column block in one step: its tokens are one torch.multinomial
    draw from the request's seeded generator (no other draw consumes it first)."""
    model = _fixed_distribution_model([0.55, 0.45])
    out = dllm.generate(model, None, [[1, 2, 3]], gen_length=8, block_length=8, sampler="llada2", temperature=0.8,
                        seed=seed, sampler_kwargs={"threshold": 0.0})
    logits = torch.full((8, model.config.vocab_size), float("-inf"))
    logits[:, :2] = torch.log(torch.tensor([0.55, 0.45]))
    probs = torch.softmax(logits / 0.8, -1)
    want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)).squeeze(-1)
    assert 1 in want.tolist()                                   # the draw is not the argmax everywhere
    assert out.generated[0].tolist() == want.tolist() and out.forwards == 1


@pytest.mark.parametrize("sampler", ["llada2", "llada21"])
def test_the_sampler_applies_top_k_before_top_p(sampler):
    """Probabilities 0.5 / 0.3 / 0.2, top_k 2, top_p 0.6: top-k first leaves (0.625, 0.375), whose
    nucleus is the first token alone (probability 1 > threshold: each block fills in one step with
    it); Dream's order would keep two tokens."""
    model = _fixed_distribution_model([0.5, 0.3, 0.2])
    out = dllm.generate(model, None, [[1, 2, 3]], gen_length=16, block_length=8, sampler=sampler, temperature=1.0,
                        seed=0, sampler_kwargs={"top_k": 2, "top_p": 0.6, **({"max_post_steps": 0}
                                                                            if sampler == "llada21" else {})})
    assert out.generated[0].tolist() == [0] * 16 and out.forwards == 2


def test_llada21_edits_with_the_drawn_tokens_probability():
    """Generated column 0 predicts 7 while column 1 is masked, then 8 (raw probability 0.6 each).
    With top_k 1 a draw has probability 1: the first step writes 7, the post step edits it to 8
    (1 > editing_threshold 0.9, where the raw 0.6 would not edit)."""
    from tests.test_samplers_parallel import ScriptedModel

    def logits_fn(x, cols, V):
        out = torch.zeros(*cols.shape, V)
        rows = torch.arange(x.shape[0])[:, None].expand_as(cols)
        first = cols == 3
        token = torch.where(first & (x[:, 4:5] == 310), 7, torch.where(first, 8, 9))
        out[rows, torch.arange(cols.shape[1])[None, :].expand_as(cols), token] = math.log(0.6 * (V - 1) / 0.4)
        return out
    model = ScriptedModel(logits_fn=logits_fn)
    assert model.config.mask_token_id == 310
    out = dllm.generate(model, None, [[1, 2, 3]], gen_length=8, block_length=8, sampler="llada21", temperature=1.0,
                        seed=0, sampler_kwargs={"top_k": 1, "editing_threshold": 0.9})
    assert out.generated[0].tolist() == [8] + [9] * 7 and out.edits[0] == 1


def _rewrite(folder, change):
    from safetensors.torch import save_file
    state = load_state_dict(folder)
    change(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_shape_errors_name_checkpoint_tensors(tmp_path):
    """An expert of another shape, all experts of another shape and a fused q/k/v of another height
    are named by their checkpoint names, not by the stacked or split internal ones."""
    one = write_llada2_checkpoint(tmp_path / "one")
    expert = "model.layers.1.mlp.experts.3.gate_proj.weight"
    _rewrite(one, lambda s: s.__setitem__(expert, s[expert][:-1]))
    with pytest.raises(ValueError, match=rf"differ in shape: model.layers.1.mlp.experts.0.gate_proj.weight "
                                         rf"\(\d+, \d+\), {re.escape(expert)} \(\d+, \d+\)"):
        dllm.load(one)
    every = write_llada2_checkpoint(tmp_path / "every")
    _rewrite(every, lambda s: s.update({k: v[:-1] for k, v in s.items()
                                        if k.startswith("model.layers.1.mlp.experts.") and "gate_proj" in k}))
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.experts.0.gate_proj.weight and the tensors stacked "
                                         r"with it: checkpoint \(\d+, \d+, \d+\) vs config"):
        dllm.load(every)
    qkv = write_llada2_checkpoint(tmp_path / "qkv")
    name = "model.layers.0.attention.query_key_value.weight"
    _rewrite(qkv, lambda s: s.__setitem__(name, s[name][:-2]))
    with pytest.raises(ValueError, match=rf"fused q/k/v weight {re.escape(name)} has \d+ rows"):
        dllm.load(qkv)


def test_samplers_on_whole_blocks_are_refused_by_their_rule_and_name_the_region(tmp_path):
    """A sampler that spreads its steps over gen_length / block_length blocks (not only the fixed
    schedules: klass, learn2pd) is refused for a prompt leaving a partial first attention block,
    by that rule; a length error names the columns the region runs on to, not a gen_length the
    request never gave."""
    model = dllm.build_model(dllm.ModelConfig.from_name("llada2-tiny"), "sdpa")
    for sampler in ("klass", "low_confidence", "margin_topk"):
        with pytest.raises(ValueError, match=rf"sampler '{sampler}' spreads its step schedule over gen_length / "
                                             r"block_length blocks, but a prompt of 2 tokens leaves a partial"):
            dllm.generate(model, None, [[1, 2]], gen_length=32, sampler=sampler)
    with pytest.raises(ValueError, match=r"steps 33 must be a multiple of the number of blocks 2 \(64 columns / "
                                         r"block_length 32; gen_length 33 runs on to the end of the model's "
                                         r"attention blocks\)"):
        dllm.generate(model, None, [list(range(1, 33))], gen_length=33, sampler="low_confidence")
    out = dllm.generate(model, None, [list(range(1, 33))], gen_length=32, sampler="klass")
    assert out.generated.shape[1] == 32
