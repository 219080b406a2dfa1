"""dInfer's hierarchy and credit decoders against the loop re-stated (tests/reference/dinfer_ref.py), on
the tiny LLaDA checkpoint (near-uniform) and on peaked random weights: one prompt at a time and a
ragged batch, token for token and forward for forward."""
from __future__ import annotations

import pytest
import torch

import dllm
from dllm import samplers
from dllm.samplers.dinfer import mask_runs, run_maxima
from tests.reference.dinfer_ref import credit_ref, hierarchy_ref
from tests.test_generate import PROMPTS4, equal_alone_and_batched, llada_logits_fn


def _model(request, which):
    if which == "llada":
        return request.getfixturevalue("llada")[0]
    return request.getfixturevalue({"peaked": "peaked_llada", "bf16": "peaked_llada_bf16"}[which])


HIERARCHY_CASES = [  # (model, gen_length, block_length, tau, low_tau)
    ("llada", 16, 16, 0.9, 0.3), ("llada", 16, 8, None, 0.0), ("llada", 20, 7, 0.9, None), ("llada", 12, 4, None, None),
    ("peaked", 16, 16, 0.9, 0.3), ("peaked", 24, 8, 0.7, 0.5), ("peaked", 20, 6, None, 0.2), ("peaked", 16, 16, 1.0, 0.0),
    ("bf16", 16, 16, None, 0.1), ("bf16", 32, 16, 0.9, 0.0), ("bf16", 24, 8, None, None),
]


@pytest.mark.parametrize("which,gen,block,tau,low_tau", HIERARCHY_CASES, ids=str)
def test_hierarchy_equals_reference_alone_and_in_a_ragged_batch(request, which, gen, block, tau, low_tau):
    model = _model(request, which)

    def ref(fn, prompt, **kw):
        return hierarchy_ref(fn, prompt, tau=tau, low_tau=low_tau, **kw)

    forwards = equal_alone_and_batched(model, "hierarchy", dict(tau=tau, low_tau=low_tau), ref, gen, block)
    if low_tau == 0.0:
        assert max(forwards) < gen        # the maxima of runs apart commit in one step


CREDIT_CASES = [  # (model, gen_length, block_length, tau, credit_alpha, boost_gamma, decay_beta)
    ("llada", 16, 8, 0.9, 0.7, 0.2, 0.8), ("peaked", 16, 16, 0.9, 0.7, 0.2, 0.8), ("peaked", 24, 8, 0.9, 0.7, 0.2, 0.8),
    ("peaked", 20, 6, 0.6, 2.0, 1.0, 0.5), ("peaked", 16, 8, 0.95, 0.0, 0.2, 0.8), ("peaked", 12, 12, 1.0, 5.0, 0.2, 1.0),
]


@pytest.mark.parametrize("which,gen,block,tau,alpha,gamma,beta", CREDIT_CASES, ids=str)
def test_credit_equals_reference_alone_and_in_a_ragged_batch(request, which, gen, block, tau, alpha, gamma, beta):
    model = _model(request, which)

    def ref(fn, prompt, **kw):
        return credit_ref(fn, prompt, tau=tau, alpha=alpha, gamma=gamma, beta=beta, **kw)

    args = dict(tau=tau, credit_alpha=alpha, boost_gamma=gamma, decay_beta=beta)
    equal_alone_and_batched(model, "credit", args, ref, gen, block)


def test_credit_changes_what_the_threshold_rule_commits(peaked_llada):
    """With a credit the decode differs from credit_alpha 0 (dInfer's plain threshold decoder)."""
    kw = dict(gen_length=24, block_length=8, sampler="credit")
    plain = dllm.generate(peaked_llada, None, PROMPTS4, **kw, sampler_kwargs=dict(credit_alpha=0.0))
    fused = dllm.generate(peaked_llada, None, PROMPTS4, **kw, sampler_kwargs=dict(credit_alpha=5.0, boost_gamma=0.5))
    assert plain.nfe != fused.nfe or not torch.equal(plain.sequences, fused.sequences)


def test_credit_samples_from_the_fused_logits(llada):
    model, args = llada[0], dict(tau=0.9, credit_alpha=2.0, boost_gamma=0.5, decay_beta=0.8)
    row = PROMPTS4[0]
    out = dllm.generate(model, None, [row], gen_length=16, block_length=8, sampler="credit", sampler_kwargs=args,
                        temperature=0.8, seed=7)
    want, forwards = credit_ref(llada_logits_fn(model), torch.tensor([row]), gen_length=16, block_length=8,
                                mask_id=model.config.mask_token_id, tau=0.9, alpha=2.0, gamma=0.5, beta=0.8,
                                temperature=0.8, generator=torch.Generator().manual_seed(7))
    assert out.sequences[0].tolist() == want[0].tolist() and out.nfe == [forwards]
    greedy = dllm.generate(model, None, [row], gen_length=16, block_length=8, sampler="credit", sampler_kwargs=args)
    assert not torch.equal(out.sequences, greedy.sequences)


def test_mask_runs_and_their_maxima_by_brute_force():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        Q = int(torch.randint(1, 9, (1,), generator=gen))
        cols = torch.sort(torch.randperm(12, generator=gen)[:Q]).values
        valid = torch.rand(Q, generator=gen) < 0.8
        conf = torch.rand(Q, generator=gen).round(decimals=1)
        runs, best = mask_runs(cols[None], valid[None])[0], run_maxima(conf[None], mask_runs(cols[None], valid[None]))[0]
        real = [q for q in range(Q) if valid[q]]
        groups = []
        for q in real:
            if groups and groups[-1][-1] == q - 1 and cols[q] == cols[q - 1] + 1:
                groups[-1].append(q)
            else:
                groups.append([q])
        for g, members in enumerate(groups):
            for q in members:
                assert int(runs[q]) == g and float(best[q]) == max(float(conf[m]) for m in members)
        assert all(int(runs[q]) == Q and best[q] == float("-inf") for q in range(Q) if not valid[q])


@pytest.mark.parametrize("name,args,message", [
    ("hierarchy", dict(tau=1.5), "sampler 'hierarchy': tau must be <= 1, got 1.5"),
    ("hierarchy", dict(low_tau=-0.1), "sampler 'hierarchy': low_tau must be >= 0, got -0.1"),
    ("hierarchy", dict(low_tau="high"), "sampler 'hierarchy': low_tau must be a number, got 'high'"),
    ("credit", dict(tau=None), "sampler 'credit': tau must be a number, got None"),
    ("credit", dict(credit_alpha=-1), "sampler 'credit': credit_alpha must be >= 0, got -1"),
    ("credit", dict(boost_gamma=float("nan")), "sampler 'credit': boost_gamma must be a number, got NaN"),
    ("credit", dict(decay_beta=1.2), "sampler 'credit': decay_beta must be <= 1, got 1.2"),
])
def test_bad_arguments_are_refused(name, args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        samplers.get(name, **args)
