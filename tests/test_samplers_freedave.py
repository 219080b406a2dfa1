"""FreeDave's draft-and-verify decoding against its loop re-stated (tests/reference/freedave_ref.py) and
against `low_confidence` with one token per step, whose tokens it must give: on the tiny LLaDA
checkpoint (near-uniform), peaked random weights (float32 and bfloat16), the tiny Dream checkpoint
and the shipped model, one prompt at a time and in a ragged batch, token for token and forward for
forward."""
from __future__ import annotations

import pytest
import torch

import dllm
from tests.reference.freedave_ref import freedave_ref
from tests.test_generate import PROMPTS4, equal_alone_and_batched


CASES = [  # (model, gen_length, block_length, drafts, score_dtype)
    ("llada", 16, 8, 4, "float64"), ("peaked", 16, 16, 4, "float64"), ("peaked", 24, 8, 3, "float32"),
    ("peaked", 20, 6, 8, "float64"), ("peaked", 12, 12, 1, "float64"), ("peaked", 10, 1, 4, "float64"),
    ("bf16", 16, 8, 4, "float64"), ("dream", 16, 8, 4, "float64"), ("shipped", 24, 8, 4, "float64"),
    ("shipped", 20, 7, 16, "float32"),
]


@pytest.mark.parametrize("which,gen,block,drafts,score_dtype", CASES, ids=str)
def test_freedave_equals_reference_alone_and_in_a_ragged_batch(model_named, which, gen, block, drafts, score_dtype):
    model = model_named(which)
    dtype = {"float64": torch.float64, "float32": torch.float32}[score_dtype]

    def ref(fn, prompt, **kw):
        return freedave_ref(fn, prompt, drafts=drafts, dtype=dtype, **kw)

    forwards = equal_alone_and_batched(model, "freedave", dict(drafts=drafts), ref, gen, block,
                                        score_dtype=score_dtype)
    if drafts == 1:
        assert forwards == [gen] * len(PROMPTS4)


BLOCK_START_CASES = [  # (model, gen_length, block_length, drafts)
    ("dream", 16, 8, 4), ("dream", 20, 6, 8), ("peaked", 24, 8, 4), ("peaked", 12, 3, 2), ("shipped", 24, 8, 8),
    ("dream", 12, 12, 1),
]


@pytest.mark.parametrize("which,gen,block,drafts", BLOCK_START_CASES, ids=str)
def test_freedave_committing_block_starts_equals_its_dream_loop(model_named, which, gen, block, drafts):
    """FreeDave's loop for AR-adapted models: each block's first forward commits its first column."""
    model = model_named(which)

    def ref(fn, prompt, **kw):
        return freedave_ref(fn, prompt, drafts=drafts, dtype=model.dtype, commit_block_start=True, **kw)

    equal_alone_and_batched(model, "freedave", dict(drafts=drafts, commit_block_start=True), ref, gen, block,
                            score_dtype="logits")


def test_freedave_gives_low_confidence_tokens_in_fewer_forwards(shipped_float32):
    """On the shipped model's own prompts the drafts verify: the same texts in fewer forwards, and with
    one draft exactly the forwards of one token per step."""
    model, tok = shipped_float32
    prompts = ["Copy the list: red, blue, green, black, white, pink, gold",
               "Reverse the list: one, two, three, four, five, six"]
    kw = dict(gen_length=48, block_length=16, score_dtype="float64")
    base = dllm.generate(model, tok, prompts, sampler="low_confidence", steps=48, **kw)
    one = dllm.generate(model, tok, prompts, sampler="freedave", sampler_kwargs=dict(drafts=1), **kw)
    four = dllm.generate(model, tok, prompts, sampler="freedave", sampler_kwargs=dict(drafts=4), **kw)
    assert torch.equal(one.sequences, base.sequences) and torch.equal(four.sequences, base.sequences)
    assert one.nfe == base.nfe == [48, 48]
    assert all(n < 48 for n in four.nfe), four.nfe


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("which,gen,block", [("peaked", 24, 8), ("shipped", 24, 8), ("dream", 20, 10),
                                             ("bf16", 16, 8)], ids=str)
def test_freedave_with_a_cache_gives_low_confidences_tokens_with_that_cache(model_named, which, gen, block, cache):
    """Each draft reads a copy of its canvas's stored K/V: the tokens of low_confidence one token per
    step with the same cache, in fewer forwards, in a ragged batch and (float32) alone."""
    model = model_named(which)
    kw = dict(gen_length=gen, block_length=block, cache=cache, score_dtype="float64")
    want = dllm.generate(model, None, PROMPTS4, sampler="low_confidence", steps=gen, **kw)
    got = dllm.generate(model, None, PROMPTS4, sampler="freedave", sampler_kwargs={"drafts": 4}, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert all(n <= gen for n in got.nfe) and sum(got.nfe) < sum(want.nfe), got.nfe
    if model.dtype != torch.float32:
        return          # bf16 products round differently at another batch size (docs/fidelity.md §3)
    for b, prompt in enumerate(PROMPTS4):
        alone = dllm.generate(model, None, [prompt], sampler="freedave", sampler_kwargs={"drafts": 4}, **kw)
        assert alone.generated[0].tolist() == got.generated[b].tolist() and alone.nfe == [got.nfe[b]]


@pytest.mark.parametrize("seed,cache,gen,block,drafts", [(0, "dual", 12, 3, 8), (1, "prefix", 24, 6, 4),
                                                      (2, "dual", 24, 8, 4)])
def test_freedave_on_shifted_logits_with_a_cache_gives_low_confidences_tokens(seed, cache, gen, block, drafts):
    """On Dream a cached step recomputes the column left of the block while the block's first column
    is masked, so the K/V stored there depend on the canvases one token at a time passes through:
    until that column is written, a row's drafts verify nothing."""
    model = dllm.build_model(dllm.ModelConfig.from_name("dream-tiny"), seed=seed, init_std=1.0)
    kw = dict(gen_length=gen, block_length=block, cache=cache, score_dtype="float64")
    want = dllm.generate(model, None, PROMPTS4, sampler="low_confidence", steps=gen, **kw)
    got = dllm.generate(model, None, PROMPTS4, sampler="freedave", sampler_kwargs={"drafts": drafts}, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert sum(got.nfe) < sum(want.nfe)


def test_freedave_keeps_low_confidences_options(peaked_llada):
    row = [PROMPTS4[0]]
    for option in ("logits_eos_inf",):
        kw = dict(gen_length=16, block_length=8, score_dtype="float64")
        want = dllm.generate(peaked_llada, None, row, sampler="low_confidence", steps=16,
                             sampler_kwargs={option: True}, **kw)
        got = dllm.generate(peaked_llada, None, row, sampler="freedave", sampler_kwargs={"drafts": 4, option: True},
                            **kw)
        assert torch.equal(got.sequences, want.sequences)
        assert peaked_llada.config.eos_token_id not in got.sequences[0, len(row[0]):].tolist()


@pytest.mark.parametrize("drafts", [0, 17, 2.5, True, "4"])
def test_freedave_refuses_a_bad_draft_count(drafts):
    with pytest.raises(ValueError, match=r"sampler 'freedave': drafts must be"):
        dllm.samplers.get("freedave", drafts=drafts)
    with pytest.raises(ValueError, match=r"sampler 'freedave': commit_block_start must be true or false, got 1"):
        dllm.samplers.get("freedave", commit_block_start=1)


@pytest.mark.parametrize("settings,message", [
    (dict(temperature=0.7), r"decodes greedily and needs temperature 0, got 0.7"),
    (dict(cfg_scale=1.0), r"does not work with classifier-free guidance"),
])
def test_freedave_refuses_what_its_drafts_cannot_verify(peaked_llada, settings, message):
    with pytest.raises(ValueError, match=message):
        dllm.generate(peaked_llada, None, [PROMPTS4[0]], gen_length=8, block_length=8, sampler="freedave", **settings)


def test_the_server_names_temperature_when_freedave_refuses_it(peaked_llada):
    """The error a request meets at temperature > 0 is answered as a bad `temperature`."""
    from dllm.serve.schema import param_of
    with pytest.raises(ValueError) as error:
        dllm.generate(peaked_llada, None, [PROMPTS4[0]], gen_length=8, block_length=8, sampler="freedave",
                      temperature=0.5)
    assert param_of(str(error.value)) == "temperature"
