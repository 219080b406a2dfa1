"""dParallel's entropy-threshold rules against its loops re-stated (tests/reference/dparallel_ref.py), on
the tiny LLaDA checkpoint (near-uniform), peaked random weights, the tiny Dream checkpoint and the
shipped model: one prompt at a time and a ragged batch, token for token and forward for forward."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dllm
from dllm import samplers
from dllm.samplers.dparallel import lowest_entropy_commit
from tests.reference.dparallel_ref import dparallel_ref, dream_dparallel_ref, entropy_pick
from tests.test_generate import PROMPTS4, _never_mask, equal_alone_and_batched, llada_logits_fn


DPARALLEL_CASES = [  # (model, gen_length, block_length, threshold, score_dtype)
    ("llada", 16, 8, 0.5, "float64"), ("llada", 12, 12, 6.0, "float64"), ("peaked", 16, 16, 0.5, "float64"),
    ("peaked", 24, 8, 1.2, "float64"), ("peaked", 20, 6, 1.0, "float32"), ("peaked", 16, 8, 0.0, "float64"),
    ("peaked", 16, 16, 2.0, "float64"), ("bf16", 16, 8, 1.2, "logits"), ("bf16", 24, 8, 1.0, "float64"),
]


@pytest.mark.parametrize("which,gen,block,threshold,score_dtype", DPARALLEL_CASES, ids=str)
def test_dparallel_equals_reference_alone_and_in_a_ragged_batch(model_named, which, gen, block, threshold, score_dtype):
    model = model_named(which)
    dtype = {"float64": torch.float64, "float32": torch.float32, "logits": model.dtype}[score_dtype]

    def ref(fn, prompt, **kw):
        return dparallel_ref(fn, prompt, threshold=threshold, dtype=dtype, **kw)

    forwards = equal_alone_and_batched(model, "dparallel", dict(threshold=threshold), ref, gen, block,
                                        score_dtype=score_dtype)
    if threshold == 0.0:
        assert forwards == [gen] * len(PROMPTS4)        # one token per step: no entropy is 0
    if threshold == 2.0:
        assert max(forwards) == 1                       # every mask of the one block below 2 nats


DREAM_CASES = [  # (model, gen_length, block_length, threshold)
    ("dream", 16, 8, 0.5), ("dream", 24, 8, 1.5), ("dream", 20, 6, 2.0), ("peaked", 16, 16, 1.2),
    ("shipped", 16, 8, 0.5), ("shipped", 24, 8, 3.0), ("bf16", 16, 8, 1.2),
]


@pytest.mark.parametrize("which,gen,block,threshold", DREAM_CASES, ids=str)
def test_dream_dparallel_equals_reference_alone_and_in_a_ragged_batch(model_named, which, gen, block, threshold):
    model = model_named(which)

    def ref(fn, prompt, **kw):
        return dream_dparallel_ref(fn, prompt, threshold=threshold, **kw)

    equal_alone_and_batched(model, "dream_dparallel", dict(threshold=threshold), ref, gen, block)


def test_dparallel_takes_the_loops_gumbel_candidates(peaked_llada):
    model, row = peaked_llada, PROMPTS4[0]
    kw = dict(gen_length=16, block_length=8, sampler="dparallel", sampler_kwargs=dict(threshold=1.0),
              score_dtype="float64")
    out = dllm.generate(model, None, [row], temperature=1.0, seed=3, **kw)
    want, forwards = dparallel_ref(llada_logits_fn(model), torch.tensor([row]), gen_length=16, block_length=8,
                                   mask_id=model.config.mask_token_id, threshold=1.0, temperature=1.0,
                                   generator=torch.Generator().manual_seed(3))
    assert out.sequences[0].tolist() == want[0].tolist() and out.nfe == [forwards]
    assert not torch.equal(out.sequences, dllm.generate(model, None, [row], **kw).sequences)


@pytest.mark.parametrize("name", ["dparallel", "dream_dparallel"])
def test_float16_entropies_stay_finite(name):
    """In float16 the floors 1e-12 and 1e-8 round to 0; the mask token's suppressed logit (and any
    probability that underflows) must add 0, not NaN, so a high threshold still commits every mask."""
    logits = torch.tensor([[[5.0, 1.0, 0.0, float("-inf")], [0.5, 0.0, -30.0, float("-inf")]]], dtype=torch.float16)
    assert _one_step(name, 100.0, logits, score_dtype=torch.float16)[0] == [True, True]
    model = dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=1.0, dtype=torch.float16)
    out = dllm.generate(model, None, PROMPTS4, gen_length=16, block_length=8, sampler=name,
                        sampler_kwargs=dict(threshold=100.0))
    assert out.nfe == [2] * len(PROMPTS4)


def test_dream_dparallel_samples_from_the_tempered_softmax(dream):
    model, row = dream[0], PROMPTS4[1]
    kw = dict(gen_length=16, block_length=8, sampler="dream_dparallel", sampler_kwargs=dict(threshold=1.5))
    out = dllm.generate(model, None, [row], temperature=0.8, seed=7, **kw)
    logits_fn = lambda x, _: _never_mask(model(x), model)                      # noqa: E731
    want, forwards = dream_dparallel_ref(logits_fn, torch.tensor([row]), gen_length=16, block_length=8,
                                         mask_id=model.config.mask_token_id, threshold=1.5, temperature=0.8,
                                         generator=torch.Generator().manual_seed(7))
    assert out.sequences[0].tolist() == want[0].tolist() and out.nfe == [forwards]
    assert not torch.equal(out.sequences, dllm.generate(model, None, [row], **kw).sequences)


def test_dream_dparallel_decodes_blocks_of_32_by_default(dream):
    model = dream[0]
    kw = dict(sampler="dream_dparallel", sampler_kwargs=dict(threshold=1.0))
    default = dllm.generate(model, None, PROMPTS4, gen_length=64, trace=True, **kw)
    assert (default.trace[:, 32:].amin(1) > default.trace[:, :32].amax(1)).all()     # two blocks, in turn
    assert default.generated.tolist() == dllm.generate(model, None, PROMPTS4, gen_length=64, block_length=32,
                                                       **kw).generated.tolist()


def test_the_rules_commit_by_brute_force():
    """`lowest_entropy_commit` against the reference's sort-and-scan on random entropies with ties and
    values equal to the threshold: LLaDA's rule takes H <= threshold, Dream's H < threshold."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        Q = int(torch.randint(1, 9, (1,), generator=gen))
        entropy = (torch.rand(Q, generator=gen, dtype=torch.float64) * 2).round(decimals=1)
        valid = torch.rand(Q, generator=gen) < 0.8
        if not valid.any():
            continue
        threshold = float(torch.randint(0, 21, (1,), generator=gen)) / 10
        for strict in (False, True):
            got = lowest_entropy_commit(entropy[None], valid[None], threshold, strict=strict)[0]
            assert got.tolist() == (entropy_pick(entropy, valid, threshold, strict) & valid).tolist()


def _one_step(name, threshold, logits, score_dtype=torch.float64):
    """The commits and tokens of one step of sampler `name` over logits (1, Q, V), every column masked."""
    state = SimpleNamespace(score_dtype=score_dtype, temperature=0.0, generator=None)
    valid = torch.ones(logits.shape[:2], dtype=torch.bool)
    decision = samplers.get(name, threshold=threshold).step(state, torch.tensor([0]), torch.arange(logits.shape[1])[None],
                                                            valid, SimpleNamespace(logits=logits))
    return decision.commit[0].tolist(), None if decision.tokens is None else decision.tokens[0].tolist()


@pytest.mark.parametrize("name,dtype,floor,strict", [("dparallel", torch.float64, 1e-12, False),
                                                     ("dream_dparallel", torch.float32, 1e-8, True)])
def test_each_rule_compares_its_own_entropy_with_the_threshold(name, dtype, floor, strict):
    """Column 1 holds one likely token and 3000 of probability about 1e-9 each, whose terms
    p log(p + floor) tell the two floors apart; a threshold at its entropy exactly, and one step
    either side of it, commits it as the rule's comparison says."""
    logits = torch.full((1, 2, 3001), -20.7, dtype=dtype)
    logits[0, 0, 0], logits[0, 1, 1] = 30.0, 0.0                                  # column 0: the lowest entropy
    p = torch.softmax(logits[0, 1], dim=-1)
    exact = -(p * torch.log(p + floor)).sum()
    below, above = (torch.nextafter(exact, exact + direction) for direction in (-1, 1))
    for threshold, expected in ((exact, not strict), (below, False), (above, True)):
        assert _one_step(name, float(threshold), logits)[0] == [True, expected], (float(threshold), expected)


def test_dream_dparallel_takes_the_argmax_of_the_logits():
    """In bfloat16 the softmax of 0 and 2^-8 rounds both to 0.5; the candidate is the larger logit, as
    the reference's argmax of the logits."""
    logits = torch.full((1, 1, 4), float("-inf"), dtype=torch.bfloat16)
    logits[0, 0, :2] = torch.tensor([0.0, 2 ** -8])
    assert torch.softmax(logits, -1)[0, 0, 0] == torch.softmax(logits, -1)[0, 0, 1]
    assert _one_step("dream_dparallel", 0.5, logits) == ([True], [1])


@pytest.mark.parametrize("name,args,message", [
    ("dparallel", dict(threshold=-0.1), "sampler 'dparallel': threshold must be >= 0, got -0.1"),
    ("dparallel", dict(threshold=None), "sampler 'dparallel': threshold must be a number, got None"),
    ("dream_dparallel", dict(threshold="low"), "sampler 'dream_dparallel': threshold must be a number, got 'low'"),
    ("dream_dparallel", dict(tau=0.9), "sampler 'dream_dparallel' has no argument(s) 'tau'; its arguments: threshold"),
])
def test_bad_arguments_are_refused(name, args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        samplers.get(name, **args)


def test_dream_dparallel_refuses_a_temperature_too_small_to_divide_by(dream):
    with pytest.raises(ValueError, match=r"sampler 'dream_dparallel': temperature 0.001 overflows"):
        dllm.generate(dream[0], None, [[5, 6]], gen_length=8, sampler="dream_dparallel", temperature=1e-3)
