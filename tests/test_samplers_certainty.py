"""d2Cache's certainty-prior decoding against its loop re-stated (tests/reference/certainty_prior_ref.py)
on the tiny LLaDA checkpoint, peaked random weights (float32 and bfloat16), the tiny Dream checkpoint
and the shipped model, alone and in a ragged batch; its density against d2Cache's FFT formula and
plain sums."""
from __future__ import annotations

import pytest
import torch

import dllm
from dllm import samplers
from dllm.samplers.certainty_prior import certainty_density, density_kernel
from tests.reference.certainty_prior_ref import certainty_prior_ref, density_fft_ref, density_sum_ref
from tests.test_generate import PROMPTS4, equal_alone_and_batched


def test_the_density_is_d2caches_convolution_and_the_plain_sums():
    gen = torch.Generator().manual_seed(0)
    for G, sigma in [(1, 1.0), (7, 0.5), (16, 10.0), (33, 3.0), (64, 10.0), (300, 0.6), (400, 2.0)]:
        decoded = torch.rand(5, G, generator=gen) < torch.rand(5, 1, generator=gen)
        decoded[0], decoded[1, -1] = False, True                 # nothing decoded; the last column decoded
        ours = certainty_density(decoded, *density_kernel(G, sigma, "cpu"))
        assert torch.allclose(ours, density_fft_ref(decoded, sigma), rtol=0, atol=1e-12)
        for row in range(5):
            assert ours[row].tolist() == pytest.approx(density_sum_ref(decoded[row].tolist(), sigma), abs=1e-12)
    all_decoded = certainty_density(torch.ones(1, 8, dtype=torch.bool), *density_kernel(8, 2.0, "cpu"))
    assert torch.all(all_decoded < 1) and torch.all(all_decoded > 0.49)   # the kernel's mass beyond 3G is cut
    kernel, _ = density_kernel(8192, 10.0, "cpu")          # a long generation: the kernel spans 39 sigmas
    assert kernel.shape == (2 * 390 + 1,) and kernel[0] == kernel[-1] == 0 and kernel[390] == 1   # nothing cut is > 0


CASES = [  # (model, gen_length, block_length, steps, sigma, threshold, score_dtype)
    ("llada", 16, 16, 16, 10.0, None, "float32"), ("llada", 16, 8, 8, 2.0, None, "float32"),
    ("peaked", 16, 16, 16, 10.0, None, "float32"), ("peaked", 24, 8, 12, 3.0, None, "float64"),
    ("peaked", 32, 32, 32, 10.0, 0.3, "float32"), ("peaked", 16, 8, 16, 1.0, 0.4, "float32"),
    ("bf16", 16, 16, 16, 10.0, None, "logits"), ("dream", 16, 8, 16, 4.0, 0.3, "float32"),
    ("shipped", 32, 16, 32, 10.0, None, "float32"), ("shipped", 32, 32, 32, 10.0, 0.45, "float32"),
    ("peaked", 32, 8, 16, 3.0, 0.05, "float32"), ("peaked", 24, 12, 6, 10.0, 0.2, "float64"),   # k > 1 per step
]


@pytest.mark.parametrize("which,gen,block,steps,sigma,threshold,score_dtype", CASES, ids=str)
def test_certainty_prior_equals_reference_alone_and_in_a_ragged_batch(model_named, which, gen, block, steps, sigma,
                                                                      threshold, score_dtype):
    model = model_named(which)
    dtype = {"float64": torch.float64, "float32": torch.float32, "logits": model.dtype}[score_dtype]

    def ref(fn, prompt, **kw):
        return certainty_prior_ref(fn, prompt, steps=steps, sigma=sigma, threshold=threshold, dtype=dtype, **kw)

    forwards = equal_alone_and_batched(model, "certainty_prior", dict(sigma=sigma, threshold=threshold), ref, gen,
                                       block, steps=steps, score_dtype=score_dtype)
    if threshold is None:
        assert forwards == [steps] * len(PROMPTS4)


def test_a_threshold_commits_more_per_step(peaked_llada):
    kw = dict(gen_length=32, block_length=32, steps=32, sampler="certainty_prior")
    plain = dllm.generate(peaked_llada, None, PROMPTS4, **kw)
    fast = dllm.generate(peaked_llada, None, PROMPTS4, sampler_kwargs=dict(threshold=0.3), **kw)
    assert plain.nfe == [32] * 4 and max(fast.nfe) < 32


def test_the_order_runs_from_the_prompt(shipped_float32):
    """On the shipped model `low_confidence` fills the answer's end first; the prior starts at the prompt."""
    model, tok = shipped_float32
    prompt = tok.apply_chat_template([{"role": "user", "content": "Copy the list: [\"Ann Lee\", \"Bob Stone\"]"}],
                                     add_generation_prompt=True, tokenize=False)
    kw = dict(gen_length=32, block_length=32, steps=32, trace=True)
    plain = dllm.generate(model, tok, [prompt], sampler="low_confidence", **kw).trace[0]
    prior = dllm.generate(model, tok, [prompt], sampler="certainty_prior", **kw).trace[0]
    assert plain[-1] < plain[0] and prior[0] == 0 and (prior[:16].float().mean() < prior[16:].float().mean())


def test_arguments_are_checked():
    for sigma, bound in ((0, ">= 1e-06"), (1e-200, ">= 1e-06"), (1e200, "<= 1000000.0")):
        with pytest.raises(ValueError, match=f"sigma must be {bound}"):
            samplers.get("certainty_prior", sigma=sigma)
    with pytest.raises(ValueError, match="threshold must be <= 1"):
        samplers.get("certainty_prior", threshold=1.5)
    assert samplers.get("certainty_prior").arguments() == {"sigma": 10.0, "threshold": None}


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_it_reads_the_device_as_low_confidence_or_once_per_step(peaked_llada, threshold):
    """Without a threshold the widths are planned as `low_confidence`'s (one read in all); with one,
    one read per step plus the last (one row: rows finishing apart cost a read each)."""
    from dllm.overhead import count_decode

    cfg = dllm.GenerationConfig(sampler="certainty_prior", sampler_kwargs=dict(threshold=threshold), gen_length=16,
                                block_length=8, steps=16)
    prompts = PROMPTS4[:3] if threshold is None else PROMPTS4[:1]
    counts = count_decode(peaked_llada, prompts, cfg)
    loop = counts.counts["loop"]
    if threshold is None:
        plain = count_decode(peaked_llada, prompts, cfg.replace(sampler="low_confidence", sampler_kwargs={}))
        assert loop.sync_sites == plain.counts["loop"].sync_sites and loop.syncs == 1
    else:
        assert counts.forwards < 16 and loop.syncs == counts.forwards + 1, loop.sync_sites
