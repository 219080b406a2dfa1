"""`dllm.overhead`: what the counter calls a host-device synchronisation, and the counts of a
decode per step type (deterministic, so asserted here; `benchmarks/bench_overhead.py` prints them)."""
import pytest
import torch

import dllm
from dllm.config import GenerationConfig, ModelConfig
from dllm.overhead import DispatchCounter, count_decode

PROMPTS = [[5, 6, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def tiny():
    return dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)


def _syncs(fn) -> int:
    counter = DispatchCounter()
    with counter:
        fn()
    return counter.counts["loop"].syncs


def test_the_counter_knows_what_makes_the_host_wait():
    x = torch.arange(6.0)
    mask, idx = x > 2, torch.tensor([0, 2])
    assert _syncs(lambda: x.sum().item()) == 1
    assert _syncs(lambda: bool((x > 1).any())) == 1
    assert _syncs(lambda: x.nonzero()) == 1
    assert _syncs(lambda: x[mask]) == 1                                 # boolean-mask indexing
    assert _syncs(lambda: x.clone().__setitem__(mask, 0.0)) == 1
    assert _syncs(lambda: torch.repeat_interleave(idx, idx)) == 1
    assert _syncs(lambda: torch.repeat_interleave(idx, idx, output_size=2)) == 0
    assert _syncs(lambda: (x[idx], torch.where(mask, x, 0.0), x.argmax(), x.cumsum(0))) == 0


def test_counts_are_deterministic_and_cover_every_forward(tiny):
    cfg = GenerationConfig(gen_length=16, block_length=8, sampler="threshold", cache="dual")
    a, b = count_decode(tiny, PROMPTS, cfg), count_decode(tiny, PROMPTS, cfg)
    assert {k: vars(c) for k, c in a.counts.items()} == {k: vars(c) for k, c in b.counts.items()}
    assert a.counts["full"].calls + a.counts["cached"].calls == a.forwards == a.steps
    assert a.counts["full"].calls == 2                 # dual refreshes everything once per block
    assert a.forwards == dllm.generate(tiny, None, PROMPTS, cfg).forwards


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "dkv-decode", "dkv-greedy"])
def test_a_full_forward_makes_no_host_sync(tiny, cache):
    """Refreshing every column, with or without a cache, reads nothing back to the host; a
    cached forward reads one number (the width of its recomputed columns)."""
    counts = count_decode(tiny, PROMPTS, GenerationConfig(gen_length=16, block_length=8, sampler="threshold",
                                                          cache=cache))
    assert counts.counts["full"].calls > 0 and counts.counts["full"].syncs == 0
    assert counts.per_call("cached")[1] <= 1


@pytest.mark.parametrize("sampler,cache,most", [("low_confidence", "none", 4.3), ("threshold", "none", 4.3),
                                                ("threshold", "dual", 6.25)])
def test_loop_syncs_per_step_at_batch_1(tiny, sampler, cache, most):
    """The bookkeeping of a step (scoring, decision, commit, block moves) at batch 1 stays within
    the synchronisations it makes today."""
    counts = count_decode(tiny, PROMPTS, GenerationConfig(gen_length=32, block_length=16, sampler=sampler,
                                                          cache=cache))
    assert counts.per_call("loop")[1] <= most
