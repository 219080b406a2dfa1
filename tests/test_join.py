"""Rows joining and leaving a running batch between steps (`Decoder.join`, `Decoder.drop_finished`),
as a serving scheduler does: each row decodes exactly as it does alone, whatever joins or leaves
around it, with its own forward cap."""
import pytest
import torch

import dllm
from dllm.decode import Decoder, build_state, resolve_request
from dllm.overhead import DispatchCounter

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100], [9, 8], [77, 1, 2, 3, 4, 5, 6, 7, 8]]
# (forwards the running batch has made, prompts that join then)
JOINS = [(0, [0]), (1, [1]), (3, [2, 3]), (6, [4])]


@pytest.fixture(scope="module")
def model():
    return dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)


def fresh(model, prompts, cfg):
    request = resolve_request(model, cfg)
    return Decoder(model, build_state(model, prompts, request.config, request.block_length), request)


def step_in_turn(decoders) -> None:
    """Step each unfinished decoder once per round until all are finished."""
    while not all(bool(d.state.finished.all()) for d in decoders):
        for d in decoders:
            if not d.state.finished.all():
                d.step()


def run_with_joins(model, cfg, joins=JOINS):
    """Decode PROMPTS through one decoder that rows join at the given forward counts and leave when
    finished; returns {prompt index: (generated ids, forwards the row took part in, hit the cap)}."""
    pending, decoder, owner, out = list(joins), None, [], {}
    while True:
        while pending and (decoder is None or pending[0][0] <= decoder.forwards):
            _, idx = pending.pop(0)
            new = fresh(model, [PROMPTS[i] for i in idx], cfg)
            if decoder is None:
                decoder = new
            else:
                decoder.join(new)
            owner += idx
        progressed = decoder.step()
        state = decoder.state
        done = state.finished.tolist()
        if any(done):
            hit = state.extra.get("hit_cap", torch.zeros_like(state.finished)).tolist()
            for r, finished in enumerate(done):
                if finished:
                    out[owner[r]] = (state.generated()[r].tolist(), int(state.nfe[r]), hit[r])
            owner = [owner[k] for k in decoder.drop_finished()]
        if not progressed and not owner:
            if not pending:
                return out
            pending[0] = (decoder.forwards, pending[0][1])


@pytest.mark.parametrize("sampler,kwargs,lengths", [
    ("low_confidence", {}, dict(gen_length=16, block_length=8, steps=8)),
    ("low_confidence", {}, dict(gen_length=12, block_length=4, steps=12)),
    ("threshold", {"tau": 0.5}, dict(gen_length=16, block_length=8)),
    ("factor", {}, dict(gen_length=12, block_length=12)),
    ("eb", {}, dict(gen_length=16, block_length=4)),
    ("threshold", {"tau": 0.9}, dict(gen_length=16, block_length=8, max_forwards=5)),   # every row hits its cap
    ("threshold", {"tau": 0.7}, dict(gen_length=16, block_length=8, cache="dual")),
    ("low_confidence", {}, dict(gen_length=16, block_length=8, steps=16, cache="prefix", cache_kwargs={"refresh": 3})),
    ("low_confidence", {}, dict(gen_length=16, block_length=8, steps=16, cache="dkv-decode",
                                cache_kwargs={"refresh": 3, "guard": 0.5, "twins": True})),
    ("threshold", {"tau": 0.7}, dict(gen_length=16, block_length=8, cache="dkv-greedy")),
    ("block_entropy", {}, dict(gen_length=16, block_length=8, steps=8, cache="prefix")),
    ("hierarchy", {"low_tau": 0.0}, dict(gen_length=16, block_length=8, cache="dual")),
    ("credit", {"tau": 0.5}, dict(gen_length=16, block_length=8)),
    ("credit", {}, dict(gen_length=12, block_length=4, cache="prefix")),
    ("dparallel", {"threshold": 1.0}, dict(gen_length=16, block_length=8, cache="dual")),
    ("dream_dparallel", {"threshold": 2.0}, dict(gen_length=12, block_length=4)),
    ("freedave", {"drafts": 3}, dict(gen_length=16, block_length=8)),
    ("freedave", {"drafts": 8, "commit_block_start": True}, dict(gen_length=12, block_length=4, cache="prefix")),
    ("threshold", {"tau": 0.5}, dict(gen_length=16, block_length=4, suffix_dropout={"window": 6, "seed": 2})),
    ("low_confidence", {}, dict(gen_length=16, block_length=4, steps=16, cache="dkv-greedy",
                                suffix_dropout={"window": 8, "distribution": "uniform", "keep": 3})),
    ("threshold", {"tau": 0.5}, dict(gen_length=16, block_length=4, cache="prefix", eos_early_stop=True)),
    ("certainty_prior", {"sigma": 3.0}, dict(gen_length=16, block_length=8, steps=16, cache="dual")),
    ("certainty_prior", {"threshold": 0.2}, dict(gen_length=16, block_length=16, steps=16)),
])
def test_rows_that_join_and_leave_decode_as_alone(model, sampler, kwargs, lengths):
    cfg = dllm.GenerationConfig(sampler=sampler, sampler_kwargs=kwargs, **lengths)
    joined = run_with_joins(model, cfg)
    assert sorted(joined) == list(range(len(PROMPTS)))
    for i, prompt in enumerate(PROMPTS):
        alone = dllm.generate(model, None, [prompt], cfg)
        assert joined[i] == (alone.generated[0].tolist(), alone.nfe[0], alone.hit_cap[0]), i
    if "max_forwards" in lengths:
        assert all(hit for _, _, hit in joined.values())


@pytest.mark.parametrize("cache,kwargs", [("dual", {}), ("prefix", {}), ("dkv-decode", {"refresh": 3})])
def test_rows_joining_after_others_left_decode_as_alone(model, cache, kwargs):
    """Rows 4, 2 and 0 leave before row 1 joins: the rows left keep their places or fill the gaps,
    and the joining row is written into the rows the K/V buffers have spare."""
    cfg = dllm.GenerationConfig(sampler="threshold", sampler_kwargs={"tau": 0.7}, gen_length=16, block_length=8,
                                cache=cache, cache_kwargs=kwargs)
    joined = run_with_joins(model, cfg, [(0, [4, 2, 0]), (5, [3]), (17, [1])])
    assert sorted(joined) == [0, 1, 2, 3, 4]
    for i, result in joined.items():
        alone = dllm.generate(model, None, [PROMPTS[i]], cfg)
        assert result == (alone.generated[0].tolist(), alone.nfe[0], alone.hit_cap[0]), i


def test_joined_rows_are_re_padded_to_the_longest_prompt(model):
    cfg = dllm.GenerationConfig(gen_length=8, block_length=8, sampler="threshold")
    running, new = fresh(model, [PROMPTS[1]], cfg), fresh(model, [PROMPTS[4], PROMPTS[3]], cfg)
    running.step()
    running.join(new)
    state = running.state
    assert state.gen_start == len(PROMPTS[4]) and state.batch_size == 3
    assert state.pad_len.tolist() == [len(PROMPTS[4]) - len(p) for p in (PROMPTS[1], PROMPTS[4], PROMPTS[3])]
    assert state.x[0, state.pad_len[0]:state.gen_start].tolist() == PROMPTS[1]
    assert (state.position_ids[2, state.pad_len[2]:state.gen_start] == torch.arange(len(PROMPTS[3]))).all()
    assert state.nfe.tolist() == [1, 0, 0] and running.starts.tolist() == [0, 1, 1]


def test_requests_that_cannot_share_a_batch_are_refused(model):
    base = dict(gen_length=8, block_length=8)
    running = fresh(model, [PROMPTS[0]], dllm.GenerationConfig(sampler="threshold", **base))
    for cfg in (dllm.GenerationConfig(sampler="random", steps=8, **base),
                dllm.GenerationConfig(sampler="threshold", cfg_scale=1.0, **base),
                dllm.GenerationConfig(sampler="threshold", temperature=0.7, **base)):
        other = fresh(model, [PROMPTS[1]], cfg)
        assert not other.joinable
        with pytest.raises(ValueError, match="joinable"):
            running.join(other)
    other = fresh(model, [PROMPTS[1]], dllm.GenerationConfig(sampler="threshold", **base))
    other.step()
    with pytest.raises(ValueError, match="fresh rows"):
        running.join(other)
    with pytest.raises(ValueError, match="gen_length 16"):
        running.join(fresh(model, [PROMPTS[1]], dllm.GenerationConfig(sampler="threshold", gen_length=16,
                                                                          block_length=8)))
    for cfg in (dllm.GenerationConfig(sampler="low_confidence", steps=2, cache="dual", **base),
                dllm.GenerationConfig(sampler="threshold", sampler_kwargs={"tau": 0.5}, **base),
                dllm.GenerationConfig(sampler="threshold", score_dtype="float64", **base)):
        with pytest.raises(ValueError, match="only a request with the same settings"):
            running.join(fresh(model, [PROMPTS[1]], cfg))
    running.join(fresh(model, [PROMPTS[1]], dllm.GenerationConfig(sampler="threshold", seed=5, **base)))


@pytest.mark.parametrize("sampler,cache", [("maskgit_plus", "none"), ("entropy", "dual"), ("topk_margin", "dkv-decode"),
                                          ("budget_threshold", "none"), ("budget_threshold", "dual")])
def test_dream_rows_that_join_decode_as_alone(sampler, cache):
    """Dream predicts each position from the column before it; joined rows keep that shift."""
    dream = dllm.build_model(dllm.ModelConfig.from_name("dream-tiny"), seed=1, init_std=0.3)
    cfg = dllm.GenerationConfig(sampler=sampler, cache=cache, gen_length=16, steps=8)
    joined = run_with_joins(dream, cfg)
    for i, prompt in enumerate(PROMPTS):
        alone = dllm.generate(dream, None, [prompt], cfg)
        assert joined[i][:2] == (alone.generated[0].tolist(), alone.nfe[0]), i


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_rows_leaving_read_the_device_once(model, cache):
    """drop_finished reads which rows finished and which are padded (one read); the kept rows'
    order goes to the state and the cache policy from the host."""
    cfg = dllm.GenerationConfig(sampler="threshold", sampler_kwargs={"tau": 0.5}, gen_length=16, block_length=8,
                                cache=cache)
    decoder = fresh(model, PROMPTS[:4], cfg)
    decoder.step()
    decoder.state.finished[1] = True                 # row 1 leaves; row 3 moves into its place
    with DispatchCounter() as counter:
        assert decoder.drop_finished() == [0, 3, 2]
    assert counter.counts["loop"].syncs == 1, counter.counts["loop"].sync_sites
    assert decoder.state.padded == bool((decoder.state.pad_len > 0).any())
