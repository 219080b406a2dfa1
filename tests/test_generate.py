"""Generation against independent transcriptions of the published loops, batching, seeding."""
import pytest
import torch

import dllm
from tests.reference.samplers_ref import (block_entropy_ref, block_threshold_ref, dream_klass_ref, budget_threshold_ref, dream_generate_ref,
                                          llada_generate_ref)


def _never_mask(logits, model):
    """A trained model gives the mask token no mass; these random ones can, so the oracle's model
    gets the same guarantee dllm enforces (the mask id is never a candidate)."""
    # The lowest finite value rather than -inf, so the CFG combination u + s (c - u) stays finite.
    logits[..., model.config.mask_token_id] = torch.finfo(logits.dtype).min
    return logits


def llada_logits_fn(model):
    """What LLaDA's reference model computes: absolute positions 0..L-1, padding keys masked."""
    def fn(x, attention_mask):
        key_valid = None if attention_mask is None else attention_mask.bool()
        return _never_mask(model(x, key_valid=key_valid), model)
    return fn


def dream_raw_logits_fn(model):
    """Dream's reference model output before the caller's shift (positions recounted from the
    first real token, as diffusion_generate does). dllm returns shifted logits; unshift them
    (the last raw column is never read by the shift)."""
    def fn(x, attention_mask):
        key_valid = position_ids = None
        if attention_mask is not None:
            key_valid = attention_mask.bool()
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        shifted = _never_mask(model(x, key_valid=key_valid, position_ids=position_ids), model)
        return torch.cat([shifted[:, 1:], shifted[:, -1:]], dim=1)
    return fn


def _batch(rows, pad):
    """Left-padded input_ids and attention mask of ragged token lists."""
    lp = max(len(r) for r in rows)
    ids = torch.full((len(rows), lp), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), lp), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, lp - len(r):] = torch.tensor(r)
        mask[b, lp - len(r):] = 1
    return ids, (mask if (mask == 0).any() else None)


PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100]]
PROMPTS4 = PROMPTS + [[7, 7, 120, 45, 9, 200, 31, 2, 18]]


def equal_alone_and_batched(model, sampler, args, ref, gen, block, **generate_kw):
    """dllm on PROMPTS4 in one ragged batch equals `ref(logits_fn, prompt, gen_length=, block_length=,
    mask_id=) -> (canvas, forwards)` run on each prompt alone; returns the refs' forwards."""
    batch = dllm.generate(model, None, PROMPTS4, gen_length=gen, block_length=block, sampler=sampler,
                          sampler_kwargs=args, **generate_kw)
    lp = max(map(len, PROMPTS4))
    forwards = []
    for b, row in enumerate(PROMPTS4):
        want, n = ref(llada_logits_fn(model), torch.tensor([row]), gen_length=gen, block_length=block,
                      mask_id=model.config.mask_token_id)
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), (sampler, args, b)
        assert batch.nfe[b] == n, (sampler, args, b)
        forwards.append(n)
    return forwards

LLADA_CASES = [  # (gen_length, block_length, steps)
    (16, 16, 16), (16, 8, 8), (20, 10, 6), (12, 4, 12), (24, 8, 9), (15, 5, 3),
]


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize("gen,block,steps", LLADA_CASES, ids=lambda v: str(v))
def test_llada_samplers_equal_reference(llada, remasking, gen, block, steps):
    model, _ = llada
    for rows in ([PROMPTS[0]], PROMPTS4):
        ids, mask = _batch(rows, model.config.pad_token_id)
        want = llada_generate_ref(llada_logits_fn(model), ids, mask, steps=steps, gen_length=gen, block_length=block,
                                  remasking=remasking, mask_id=model.config.mask_token_id,
                                  generator=torch.Generator().manual_seed(11))
        out = dllm.generate(model, None, rows, gen_length=gen, block_length=block, steps=steps, sampler=remasking,
                            seed=11)
        assert torch.equal(out.sequences, want), (out.sequences, want)
        assert out.forwards == steps and out.nfe == [steps] * len(rows)


DREAM_CASES = [(16, 16), (16, 5), (12, 7), (8, 20), (10, 1)]  # (gen_length, steps)


@pytest.mark.parametrize("alg", ["origin", "maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("gen,steps", DREAM_CASES, ids=lambda v: str(v))
def test_dream_samplers_equal_reference(dream, alg, gen, steps):
    model, _ = dream
    for rows in ([PROMPTS[0]], PROMPTS4):
        ids, mask = _batch(rows, model.config.pad_token_id)
        want = dream_generate_ref(dream_raw_logits_fn(model), ids, mask, max_new_tokens=gen, steps=steps, alg=alg,
                                  mask_id=model.config.mask_token_id, generator=torch.Generator().manual_seed(5))
        out = dllm.generate(model, None, rows, gen_length=gen, steps=steps, sampler=alg, seed=5)
        assert torch.equal(out.sequences, want), (alg, out.sequences, want)
        assert max(out.nfe) <= steps


def test_dream_first_step_commits_nothing_with_steps_equal_gen_length(dream):
    """The reference's schedule spends its first forward committing 0 tokens and commits 2 at the
    end; a fixed schedule is kept exactly (its step count bounds it)."""
    model, _ = dream
    out = dllm.generate(model, None, [PROMPTS[0]], gen_length=16, steps=16, sampler="entropy", trace=True)
    per_step = torch.bincount(out.trace[0], minlength=16).tolist()
    assert per_step[0] == 0 and per_step[-1] == 2 and sum(per_step) == 16
    assert out.forwards == 16


def test_llada_per_step_counts_spread_as_reference(llada):
    model, _ = llada
    out = dllm.generate(model, None, [PROMPTS[1]], gen_length=20, block_length=10, steps=6, trace=True)
    per_step = torch.bincount(out.trace[0], minlength=6).tolist()
    assert per_step == [4, 3, 3, 4, 3, 3]
    # Block order: every position of block 0 is committed before any of block 1.
    assert out.trace[0, :10].max() < out.trace[0, 10:].min()


@pytest.mark.parametrize("family,sampler", [("llada", "low_confidence"), ("llada", "entropy"),
                                            ("dream", "maskgit_plus"), ("dream", "topk_margin"),
                                            ("dream", "entropy"), ("dream", "low_confidence")])
def test_batched_equals_unbatched(request, family, sampler):
    """A row decodes the same tokens alone or in a ragged batch (at temperature 0)."""
    model, _ = request.getfixturevalue(family)
    kw = dict(gen_length=12, block_length=6 if sampler == "low_confidence" else None, steps=12, sampler=sampler)
    batched = dllm.generate(model, None, PROMPTS, **kw)
    for b, row in enumerate(PROMPTS):
        alone = dllm.generate(model, None, [row], **kw)
        assert torch.equal(alone.generated[0], batched.generated[b]), (b, alone.generated, batched.generated)


@pytest.mark.parametrize("sampler", ["maskgit_plus", "entropy"])
def test_dream_samplers_run_on_llada_and_llada_sampler_on_dream(llada, dream, sampler):
    for model, name, block in ((llada[0], sampler, None), (dream[0], "low_confidence", 4)):
        out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=block, steps=8, sampler=name)
        assert not (out.generated == model.config.mask_token_id).any()
    with pytest.warns(UserWarning, match=rf"sampler '{sampler}' decodes the whole generation region at once; "
                                         r"block_length 4 is ignored"):
        dllm.generate(llada[0], None, PROMPTS, gen_length=8, block_length=4, steps=8, sampler=sampler)
    # ... a block length past the generation too (a grid's fixed block length on a short task)
    want = dllm.generate(llada[0], None, PROMPTS, gen_length=8, steps=8, sampler=sampler)
    with pytest.warns(UserWarning, match=r"block_length 32 is ignored"):
        got = dllm.generate(llada[0], None, PROMPTS, gen_length=8, block_length=32, steps=8, sampler=sampler)
    assert torch.equal(got.sequences, want.sequences)
    assert dllm.GenerationConfig(block_length=32, sampler=sampler).for_length(8).block_length == 32



def test_a_block_length_past_the_generation_is_checked_once_the_model_chose_its_sampler(dream_dir, capsys):
    """Without a sampler the model chooses one: Dream's ignores the block length, so the command
    line's check before loading leaves it to the decode, which warns."""
    from dllm.cli import main
    argv = ["generate", "--model", str(dream_dir), "--dtype", "float32", "--gen-length", "8", "--block-length", "32",
            "hello"]
    with pytest.warns(UserWarning, match="block_length 32 is ignored"):
        assert main(argv) == 0
    assert dllm.GenerationConfig(block_length=32).for_length(8).block_length == 32
    with pytest.raises(ValueError, match="block_length 32 exceeds gen_length 8"):
        dllm.GenerationConfig(block_length=32, sampler="low_confidence").for_length(8)


def test_a_schedule_the_sampler_does_not_use_is_warned_about(llada):
    import warnings

    model = llada[0]
    for name, value in (("steps", 4), ("tokens_per_step", 2)):
        with pytest.warns(UserWarning, match=rf"sampler 'threshold' decides its own number of steps; {name} {value} "
                                             r"is ignored") as caught:
            dllm.generate(model, None, PROMPTS, gen_length=8, sampler="threshold", **{name: value})
        assert caught[0].filename == __file__                       # shown at the caller's line
    block_causal = dllm.build_model(dllm.ModelConfig.from_name("llada2-tiny"), seed=0)
    with pytest.warns(UserWarning, match="decides its own number of steps") as caught:
        dllm.generate(block_causal, None, [[1] * 32], gen_length=32, sampler="llada2", steps=4)
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dllm.generate(model, None, PROMPTS, gen_length=8, sampler="low_confidence", steps=4)
        dllm.generate(model, None, PROMPTS, gen_length=8, sampler="klass", steps=4)


@pytest.mark.parametrize("family,sampler", [("llada", "low_confidence"), ("llada", "random"),
                                            ("dream", "origin"), ("dream", "entropy")])
def test_seeded_sampling_is_reproducible(request, family, sampler):
    model, _ = request.getfixturevalue(family)
    kw = dict(gen_length=12, block_length=12, steps=6, temperature=0.8, sampler=sampler)
    a = dllm.generate(model, None, PROMPTS, seed=3, **kw)
    b = dllm.generate(model, None, PROMPTS, seed=3, **kw)
    c = dllm.generate(model, None, PROMPTS, seed=4, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, c.sequences)


@pytest.mark.parametrize("alg", ["origin", "entropy"])
@pytest.mark.parametrize("options", [dict(top_p=0.9), dict(top_k=5), dict(alg_temp=0.3, top_p=0.9, top_k=20)],
                         ids=lambda o: str(o))
def test_dream_sampling_with_top_p_top_k_equals_reference(dream, alg, options):
    """At temperature 0.5 the seeded token draws after the top-p / top-k filters are the
    reference's, and the filters change them."""
    model, _ = dream
    if alg == "origin" and "alg_temp" in options:
        options = {k: v for k, v in options.items() if k != "alg_temp"}
    ids, mask = _batch(PROMPTS4, model.config.pad_token_id)
    want = dream_generate_ref(dream_raw_logits_fn(model), ids, mask, max_new_tokens=10, steps=5, alg=alg,
                              temperature=0.5, mask_id=model.config.mask_token_id,
                              generator=torch.Generator().manual_seed(1), **options)
    kw = dict(gen_length=10, steps=5, temperature=0.5, sampler=alg, seed=1)
    out = dllm.generate(model, None, PROMPTS4, sampler_kwargs=options, **kw)
    assert torch.equal(out.sequences, want)
    assert not torch.equal(out.sequences, dllm.generate(model, None, PROMPTS4, **kw).sequences)


def test_prompt_is_never_changed_and_padding_kept(llada):
    model, _ = llada
    out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=8, steps=4)
    lp = max(len(r) for r in PROMPTS)
    for b, r in enumerate(PROMPTS):
        assert out.sequences[b, lp - len(r):lp].tolist() == r
        assert (out.sequences[b, :lp - len(r)] == model.config.pad_token_id).all()


def test_forward_cap_flushes_the_remaining_masks(llada):
    model, _ = llada
    out = dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, steps=16, max_forwards=5)
    assert out.forwards == 5 and all(out.hit_cap)
    assert not (out.generated == model.config.mask_token_id).any()
    full = dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, steps=16)
    assert not any(full.hit_cap) and full.forwards == 16


def test_outputs_and_stats(llada):
    model, tok = llada
    out = dllm.generate(model, tok, ["hello there", "a"], gen_length=8, block_length=4, steps=4, chat=False)
    assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
    assert out.tokens_per_forward == [2.0, 2.0]
    eos = model.config.eos_token_id
    for b in range(2):
        row = out.generated[b].tolist()
        assert out.answer_lengths[b] == next((i for i, t in enumerate(row) if t in (eos, model.config.eot_token_id)),
                                             len(row))


def test_texts_are_cut_at_the_first_eos_or_eot(llada):
    """The decoded answer stops at the first EOS or EOT; everything after it is padding."""
    model, tok = llada
    from dllm.decode import _output, build_state, resolve_request
    eos, eot = model.config.eos_token_id, model.config.eot_token_id
    assert eot is not None and eot != eos
    words = tok("hi there", add_special_tokens=False)["input_ids"]
    other = tok(" more", add_special_tokens=False)["input_ids"]
    for stop in (eos, eot):
        gen = words + [stop] + other + [eos]
        request = resolve_request(model, dllm.GenerationConfig(gen_length=len(gen), sampler="low_confidence"))
        state = build_state(model, [[1, 2]], request.config, len(gen))
        state.x[0, state.gen_start:] = torch.tensor(gen)
        out = _output(state, tok, request, 1, 1.0)
        assert out.texts == ["hi there"] and out.answer_lengths == [len(words)]


def test_the_mask_token_is_never_committed(llada_dir):
    """Even a model whose LM head prefers the mask token never writes it: it is not a candidate."""
    model, _ = dllm.load(llada_dir, dtype="float32")
    with torch.no_grad():
        model.head.weight[model.config.mask_token_id] = model.head.weight.sum(0)  # large mask logits
    out = dllm.generate(model, None, PROMPTS, gen_length=12, block_length=6, steps=6)
    assert not (out.generated == model.config.mask_token_id).any()
    assert out.forwards == 6 and not any(out.hit_cap)


@pytest.fixture(scope="module")
def llada_eos_heavy(llada_dir):
    """A copy of the tiny LLaDA whose LM head often prefers EOS or EOT, so the options matter."""
    model, _ = dllm.load(llada_dir, dtype="float32")
    with torch.no_grad():
        for tid in (model.config.eos_token_id, model.config.eot_token_id):
            model.head.weight[tid] = model.head.weight[tid] + 0.6 * model.head.weight.mean(0) / \
                model.head.weight.mean(0).norm() * model.head.weight.norm(dim=1).mean()
    return model


@pytest.mark.parametrize("options", [dict(logits_eos_inf=True), dict(confidence_eos_eot_inf=True),
                                     dict(logits_eos_inf=True, confidence_eos_eot_inf=True)],
                         ids=lambda o: "+".join(o))
@pytest.mark.parametrize("gen,block,steps", [(16, 8, 8), (12, 12, 12)], ids=lambda v: str(v))
def test_llada_eos_options_equal_reference(llada_eos_heavy, options, gen, block, steps):
    model = llada_eos_heavy
    eos, eot = model.config.eos_token_id, model.config.eot_token_id
    plain = dllm.generate(model, None, PROMPTS4, gen_length=gen, block_length=block, steps=steps)
    assert ((plain.generated == eos) | (plain.generated == eot)).any(), "the fixture must predict EOS/EOT"
    ids, mask = _batch(PROMPTS4, model.config.pad_token_id)
    want = llada_generate_ref(llada_logits_fn(model), ids, mask, steps=steps, gen_length=gen, block_length=block,
                              mask_id=model.config.mask_token_id, eos_id=eos, eot_id=eot, **options)
    out = dllm.generate(model, None, PROMPTS4, gen_length=gen, block_length=block, steps=steps,
                        sampler_kwargs=options)
    assert torch.equal(out.sequences, want)
    if options.get("logits_eos_inf"):
        assert not (out.generated == eos).any()
    assert not torch.equal(out.sequences, plain.sequences)


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize("cfg_scale", [0.5, 2.0])
def test_llada_cfg_equals_reference(llada, remasking, cfg_scale):
    model, _ = llada
    ids, mask = _batch(PROMPTS4, model.config.pad_token_id)
    want = llada_generate_ref(llada_logits_fn(model), ids, mask, steps=8, gen_length=16, block_length=8,
                              remasking=remasking, mask_id=model.config.mask_token_id, cfg_scale=cfg_scale,
                              generator=torch.Generator().manual_seed(2))
    out = dllm.generate(model, None, PROMPTS4, gen_length=16, block_length=8, steps=8, sampler=remasking,
                        cfg_scale=cfg_scale, seed=2)
    assert torch.equal(out.sequences, want)
    assert out.forwards == 8


def test_eos_eot_options_are_validated(llada):
    from dllm import samplers
    with pytest.raises(ValueError, match=r"sampler 'low_confidence': logits_eos_inf must be True or False, got 1"):
        samplers.get("low_confidence", logits_eos_inf=1)
    with pytest.raises(ValueError, match=r"cfg_scale must be a finite number >= 0 \(.*\), got -1"):
        dllm.GenerationConfig(cfg_scale=-1)


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_llada_bf16_equals_reference(llada_dir, remasking):
    """bf16 checkpoints: LLaDA scores confidences in the logits dtype, where confident positions
    tie often (1.0, 0.996, ...); the default score dtype does the same and breaks ties the same way.
    Rows of equal length: with left padding the reference rotates absolute columns while dllm
    recounts positions per row (equal up to rounding, which bf16 makes visible)."""
    model, _ = dllm.load(llada_dir, dtype="bfloat16")
    with torch.no_grad():
        model.head.weight.mul_(3.0)     # sharper distributions: many confidences round to 1.0 in bf16
    for rows in ([PROMPTS[0]], [p[:3] for p in PROMPTS4]):
        ids, mask = _batch(rows, model.config.pad_token_id)
        assert mask is None
        want = llada_generate_ref(llada_logits_fn(model), ids, mask, steps=8, gen_length=16, block_length=8,
                                  remasking=remasking, mask_id=model.config.mask_token_id,
                                  generator=torch.Generator().manual_seed(0))
        out = dllm.generate(model, None, rows, gen_length=16, block_length=8, steps=8, sampler=remasking, seed=0)
        assert torch.equal(out.sequences, want)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("options", [dict(top_p=0.9), dict(top_k=5), dict(top_p=0.8, top_k=3, eps=0.01),
                                     dict(alg_temp=0.5), dict(alg_temp=0.2, top_k=7)], ids=lambda o: str(o))
def test_dream_options_equal_reference(dream, alg, options):
    """top_p / top_k / eps at temperature 0, and alg_temp's seeded position draw, as the reference."""
    model, _ = dream
    kw = {k: v for k, v in options.items()}
    for rows in ([PROMPTS[0]], PROMPTS4):
        ids, mask = _batch(rows, model.config.pad_token_id)
        want = dream_generate_ref(dream_raw_logits_fn(model), ids, mask, max_new_tokens=12, steps=6, alg=alg,
                                  mask_id=model.config.mask_token_id, generator=torch.Generator().manual_seed(9), **kw)
        out = dllm.generate(model, None, rows, gen_length=12, steps=6, sampler=alg, seed=9, sampler_kwargs=kw)
        assert torch.equal(out.sequences, want), (options, out.sequences, want)
    assert all(out.sampler_args[k] == v for k, v in options.items())
    if "alg_temp" in options:  # a random choice of positions: it must change the greedy result
        plain = dllm.generate(model, None, PROMPTS4, gen_length=12, steps=6, sampler=alg, seed=9)
        assert not torch.equal(plain.sequences, out.sequences)


def test_one_settings_object_carries_the_cache(llada):
    """GenerationConfig.cache/cache_kwargs give the tokens of the cache keyword arguments."""
    model, tok = llada
    by_keyword = dllm.generate(model, tok, ["hello", "a longer prompt"], gen_length=8, block_length=4,
                               sampler="threshold", cache="dkv-decode", cache_kwargs={"refresh": 2})
    cfg = dllm.GenerationConfig(gen_length=8, block_length=4, sampler="threshold", cache="dkv-decode",
                                cache_kwargs={"refresh": 2})
    by_config = dllm.generate(model, tok, ["hello", "a longer prompt"], cfg)
    assert torch.equal(by_keyword.sequences, by_config.sequences)
    assert by_config.cache == "dkv-decode" and by_config.cache_args["refresh"] == 2


def test_tokens_per_step_is_steps_by_another_name(llada):
    model, tok = llada
    a = dllm.generate(model, tok, "hello", gen_length=12, block_length=6, tokens_per_step=3)
    b = dllm.generate(model, tok, "hello", gen_length=12, block_length=6, steps=4)
    assert torch.equal(a.sequences, b.sequences) and a.forwards == b.forwards == 4


def test_gen_length_none_is_the_default_length(llada):
    model, tok = llada
    from dllm.decode import resolve_request
    assert dllm.GenerationConfig().gen_length is None
    request = resolve_request(model, dllm.GenerationConfig(block_length=32))
    assert request.config.gen_length == dllm.config.DEFAULT_GEN_LENGTH == 128
    assert (request.block_length, request.config.resolved_steps) == (32, 128)


def test_sampler_and_policy_are_resolved_once_per_request(llada, monkeypatch):
    """A request builds its named sampler and cache policy exactly once."""
    import dllm.decode as decode
    model, tok = llada
    built = []
    real_sampler, real_policy = decode.samplers.get, decode.get_policy
    monkeypatch.setattr(decode.samplers, "get", lambda *a, **k: built.append("sampler") or real_sampler(*a, **k))
    monkeypatch.setattr(decode, "get_policy", lambda *a, **k: built.append("policy") or real_policy(*a, **k))
    dllm.generate(model, tok, ["hello", "hi"], gen_length=8, block_length=4, sampler="threshold", cache="dual")
    assert sorted(built) == ["policy", "sampler"]


def test_request_errors_name_the_value():
    with pytest.raises(ValueError, match=r"give steps \(4\) or tokens_per_step \(2\), not both"):
        dllm.GenerationConfig(steps=4, tokens_per_step=2)
    with pytest.raises(ValueError, match="tokens_per_step 5 does not divide gen_length 32"):
        dllm.GenerationConfig(gen_length=32, tokens_per_step=5, sampler="low_confidence").for_length()
    with pytest.raises(ValueError, match="tokens_per_step 5 does not divide gen_length 32"):
        dllm.GenerationConfig(tokens_per_step=5, sampler="low_confidence").for_length(32)
    # The model's sampler may decide its own steps (LLaDA2's): checked once it is chosen.
    assert dllm.GenerationConfig(tokens_per_step=5).for_length(32).tokens_per_step == 5
    with pytest.raises(ValueError, match="block_length 64 exceeds gen_length 32"):
        dllm.GenerationConfig(block_length=64, sampler="threshold").for_length(32)
    with pytest.raises(ValueError, match="cache must be a registered policy name or a CachePolicy instance"):
        dllm.GenerationConfig(cache=3)
    with pytest.raises(ValueError, match="unknown cache policy 'dual2'"):
        dllm.GenerationConfig(cache="dual2")
    with pytest.raises(ValueError, match="unknown generation option"):
        dllm.GenerationConfig().replace(temprature=1.0)


@pytest.fixture(scope="module")
def shipped():
    return dllm.load(dtype="float32")


@pytest.mark.parametrize("family,gen,steps,threshold", [
    ("dream", 16, 2, 0.9), ("dream", 16, 4, 0.02), ("dream", 8, 8, 0.0), ("llada", 10, 5, 1.0),
    ("llada", 8, 1, 0.01), ("shipped", 16, 4, 0.3), ("shipped", 16, 4, 0.5), ("shipped", 16, 4, 0.9),
    ("shipped", 12, 3, 0.7)])        # the trained model's steps commit some, carry some and run past the last
def test_budget_threshold_equals_fastdllms_loop_without_blocks(request, family, gen, steps, threshold):
    """Each prompt alone against the re-stated loop (tokens and forwards), and the ragged batch row
    for row equal to the prompts alone."""
    model, _ = request.getfixturevalue(family)
    mask = model.config.mask_token_id
    logits_fn = lambda x, _: _never_mask(model(x), model)                      # noqa: E731
    kw = dict(gen_length=gen, steps=steps, sampler="budget_threshold", sampler_kwargs={"threshold": threshold})
    alone = []
    for row in PROMPTS4:
        want, forwards = budget_threshold_ref(logits_fn, torch.tensor([row]), max_new_tokens=gen, steps=steps,
                                              threshold=threshold, mask_id=mask)
        out = dllm.generate(model, None, [row], **kw)
        assert out.sequences.tolist() == want.tolist() and out.forwards == forwards >= steps
        alone.append(out.generated[0].tolist())
    assert dllm.generate(model, None, PROMPTS4, **kw).generated.tolist() == alone


def _equals_block_loop(model, kw: dict, reference, **reference_kw):
    """Each prompt alone against a Fast-dLLM block-wise Dream loop re-stated with full forwards (the
    tokens; its forwards less the idle one it runs in a block of length 1), then the ragged batch
    row for row. Checks that a block's first step commits exactly its first column; returns the
    batch's result."""
    logits_fn = lambda x, _: _never_mask(model(x), model)                      # noqa: E731
    gen, block = kw["gen_length"], kw["block_length"]
    alone = []
    for row in PROMPTS4:
        want, forwards = reference(logits_fn, torch.tensor([row]), max_new_tokens=gen, block_length=block,
                                   mask_id=model.config.mask_token_id, **reference_kw)
        out = dllm.generate(model, None, [row], **kw)
        assert out.sequences.tolist() == want.tolist()
        assert out.forwards == forwards - (gen // block if block == 1 else 0)
        alone.append(out.generated[0].tolist())
    batch = dllm.generate(model, None, PROMPTS4, trace=True, **kw)
    assert batch.generated.tolist() == alone
    for steps in batch.trace.view(len(PROMPTS4), gen // block, block):       # a block's first step: its first column
        assert all(int(b[0]) == int(b.min()) and int((b == b[0]).sum()) == 1 for b in steps)
    return batch


@pytest.mark.parametrize("family,gen,block,steps", [("dream", 16, 8, 4), ("dream", 16, 4, 16), ("dream", 12, 4, 9),
                                                    ("dream", 6, 1, 12), ("shipped", 16, 8, 8)])
def test_block_entropy_equals_fastdllms_block_loop(request, family, gen, block, steps):
    """`block_entropy` against Fast-dLLM's block-wise Dream loop for algorithms other than
    confidence_threshold."""
    model, _ = request.getfixturevalue(family)
    _equals_block_loop(model, dict(gen_length=gen, block_length=block, steps=steps, sampler="block_entropy"),
                       block_entropy_ref, steps=steps)


def test_block_entropy_needs_two_steps_per_whole_block(dream):
    model, _ = dream
    with pytest.raises(ValueError, match=r"sampler 'block_entropy': steps 2 give 1 per block over the 2 blocks "
                                         r"\(gen_length 16 / block_length 8\); it needs at least 2 per block"):
        dllm.generate(model, None, [[5, 6]], gen_length=16, block_length=8, steps=2, sampler="block_entropy")
    with pytest.raises(ValueError, match="steps 5 must be a multiple of the number of blocks 2"):
        dllm.generate(model, None, [[5, 6]], gen_length=16, block_length=8, steps=5, sampler="block_entropy")


@pytest.mark.parametrize("family,gen,block,tau", [("dream", 16, 8, 0.9), ("dream", 16, 4, 0.02), ("dream", 12, 1, 0.9),
                                                  ("shipped", 16, 8, 0.5), ("shipped", 24, 8, 0.9)])
def test_threshold_committing_block_starts_equals_fastdllms_block_loop(request, family, gen, block, tau):
    """`commit_block_start` against Fast-dLLM's block-wise Dream loop for confidence_threshold."""
    model, _ = request.getfixturevalue(family)
    _equals_block_loop(model, dict(gen_length=gen, block_length=block, sampler="threshold", score_dtype="logits",
                                   sampler_kwargs={"tau": tau, "commit_block_start": True}),
                       block_threshold_ref, threshold=tau)


def test_fastdllms_block_loops_default_to_blocks_of_32(dream):
    """Without a block_length, `block_entropy` and `threshold(commit_block_start=True)` decode blocks
    of 32 as Fast-dLLM's block-wise Dream loop does (the whole region when 32 does not divide it)."""
    model, _ = dream
    for kw in (dict(sampler="block_entropy", steps=64),
               dict(sampler="threshold", sampler_kwargs={"tau": 0.5, "commit_block_start": True})):
        default = dllm.generate(model, None, PROMPTS4, gen_length=64, trace=True, **kw)
        assert (default.trace[:, 32:].amin(1) > default.trace[:, :32].amax(1)).all()     # two blocks, in turn
        assert default.generated.tolist() == dllm.generate(model, None, PROMPTS4, gen_length=64, block_length=32,
                                                           **kw).generated.tolist()
        assert dllm.generate(model, None, PROMPTS4, gen_length=48, **kw).generated.tolist() == dllm.generate(
            model, None, PROMPTS4, gen_length=48, block_length=48, **kw).generated.tolist()
    plain = dict(sampler="threshold", sampler_kwargs={"tau": 0.5})           # Fast-dLLM's LLaDA rule: no blocks
    assert dllm.generate(model, None, PROMPTS4, gen_length=64, **plain).generated.tolist() == dllm.generate(
        model, None, PROMPTS4, gen_length=64, block_length=64, **plain).generated.tolist()


@pytest.mark.parametrize("family,gen,conf,kl", [("dream", 16, 0.9, 0.01), ("dream", 12, 0.2, 0.5), ("dream", 8, 0.0, 1e9),
                                               ("shipped", 16, 0.9, 0.01), ("shipped", 16, 0.5, 0.1)])
def test_dream_klass_equals_klass_dream_loop(request, family, gen, conf, kl):
    """`dream_klass` against KLASS's Dream loop re-stated: tokens and forwards, each prompt alone, and
    the ragged batch row for row."""
    model, _ = request.getfixturevalue(family)
    logits_fn = lambda x, _: _never_mask(model(x), model)                      # noqa: E731
    kw = dict(gen_length=gen, sampler="dream_klass", sampler_kwargs={"conf_threshold": conf, "kl_threshold": kl})
    alone = []
    for row in PROMPTS4:
        want, forwards = dream_klass_ref(logits_fn, torch.tensor([row]), max_new_tokens=gen, steps=gen,
                                         conf_threshold=conf, kl_threshold=kl, kl_history_length=2,
                                         mask_id=model.config.mask_token_id)
        out = dllm.generate(model, None, [row], **kw)
        assert out.sequences.tolist() == want.tolist() and out.forwards == forwards
        alone.append(out.generated[0].tolist())
    assert dllm.generate(model, None, PROMPTS4, **kw).generated.tolist() == alone
