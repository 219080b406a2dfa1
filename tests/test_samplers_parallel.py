"""Parallel unmasking samplers (threshold, factor, adablock, localleap, prophet, eb).

1. Each rule against its plain re-statement in tests/reference/parallel_ref.py, on crafted scores
   of ragged rows (different block bounds, committed positions, ties, extremes).
2. End to end on the tiny LLaDA and Dream checkpoints: ragged batches, a row decodes the same
   tokens alone or in a batch, Prophet composed with a base that never fires equals the base.
3. The loop's invariants for EVERY registered sampler under adversarial scores from a scripted
   model (hypothesis).
"""
from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import dllm
from dllm import samplers
from dllm.cli import main, parse_kv
from dllm.kernels.scoring import TokenScores
from dllm.state import DecodeState, SpecialIds, select_positions
from tests.reference import parallel_ref as ref

NEW = ["threshold", "factor", "adablock", "localleap", "prophet", "eb"]
IDS = SpecialIds(mask=310, eos=301, pad=301)
NEWLINE = 10          # "\n" in both tiny tokenizers (byte-level ids = byte values)
PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100]]
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- crafted steps -------------------------------------------------------------------------------
def make_state(prompt_lens, gen_length, blocks, committed=None, family="llada", tokenizer=None, block_length=None):
    """A DecodeState of ragged rows. blocks[b] = (start, end) offsets into the generation region;
    committed[b] = generation offsets already holding a token."""
    B, lp = len(prompt_lens), max(prompt_lens)
    x = torch.full((B, lp + gen_length), IDS.mask, dtype=torch.long)
    for b, n in enumerate(prompt_lens):
        x[b, :lp - n] = IDS.pad
        x[b, lp - n:lp] = torch.arange(n) + 20
        for off in (committed or [()] * B)[b]:
            x[b, lp + off] = 42
    state = DecodeState(x=x, gen_start=lp, gen_length=gen_length, block_length=block_length or gen_length,
                        pad_len=torch.tensor([lp - n for n in prompt_lens]), ids=IDS, steps=gen_length,
                        family=family, tokenizer=tokenizer)
    state.block_start = torch.tensor([lp + s for s, _ in blocks])
    state.block_end = torch.tensor([lp + e for _, e in blocks])
    return state


def run_step(sampler, state, *, prob=None, entropy=None, margin=None, gap=None, token=None, setup=True):
    """One sampler step on `state` with per-column (B, L) statistics; returns (positions, valid, dec)."""
    rows = torch.arange(state.batch_size)
    if setup:
        sampler.setup(state)
        sampler.begin_block(state, rows)
    positions, valid = select_positions(sampler.score_mask(state, rows))
    B, L = state.x.shape

    def at(t, dtype=torch.float64, fill=0.0):
        t = torch.full((B, L), fill, dtype=dtype) if t is None else t
        return t.gather(1, positions)

    scores = TokenScores(token=at(token, torch.long, 7), prob=at(prob, fill=0.5), margin=at(margin),
                         entropy=at(entropy), logit_gap=at(gap))
    return positions, valid, sampler.step(state, rows, positions, valid, scores)


def row_lists(values, positions, valid, b):
    """The candidates of row b: (values at them, their columns), in scored order."""
    idx = valid[b].nonzero().flatten().tolist()
    cols = positions[b, idx].tolist()
    return [values[b, c].item() for c in cols], cols, idx


def committed_set(dec, valid, b):
    idx = valid[b].nonzero().flatten().tolist()
    return {i for i, q in enumerate(idx) if dec.commit[b, q]}


CONF_VALUES = [0.0, 1e-9, 0.1, 0.5, 0.74, 0.75, 0.76, 0.8, 0.89, 0.9, 0.91, 0.95, 0.99, 1.0]
confidence = st.one_of(st.sampled_from(CONF_VALUES), st.floats(0, 1, allow_nan=False))


@st.composite
def ragged_case(draw, values=confidence):
    """Ragged rows: prompt lengths, per-row blocks, committed positions and a per-column value."""
    B = draw(st.integers(1, 3))
    G = draw(st.integers(1, 20))
    prompt_lens = [draw(st.integers(1, 5)) for _ in range(B)]
    blocks, committed = [], []
    for _ in range(B):
        s = draw(st.integers(0, G - 1))
        e = draw(st.integers(s + 1, G))
        blocks.append((s, e))
        committed.append([o for o in range(G) if draw(st.booleans()) and draw(st.booleans())])
    state = make_state(prompt_lens, G, blocks, committed)
    vals = torch.tensor([[draw(values) for _ in range(state.length)] for _ in range(B)], dtype=torch.float64)
    return state, vals


# -- 1. rules against the references --------------------------------------------------------------
@settings(max_examples=60, **SETTINGS)
@given(case=ragged_case(), tau=st.sampled_from([0.0, 0.5, 0.75, 0.9, 1.0]))
def test_threshold_matches_reference(case, tau):
    state, prob = case
    positions, valid, dec = run_step(samplers.get("threshold", tau=tau), state, prob=prob)
    assert not (dec.commit & ~valid).any()
    for b in range(state.batch_size):
        conf, cols, _ = row_lists(prob, positions, valid, b)
        assert committed_set(dec, valid, b) == ref.threshold_ref(conf, cols, tau)


@settings(max_examples=60, **SETTINGS)
@given(case=ragged_case(), f=st.sampled_from([0.1, 0.7, 1.0, 1.5, 1.9, 5.0]), quirk=st.booleans())
def test_factor_matches_reference(case, f, quirk):
    state, prob = case
    positions, valid, dec = run_step(samplers.get("factor", f=f, last_rank_quirk=quirk), state, prob=prob)
    for b in range(state.batch_size):
        conf, cols, _ = row_lists(prob, positions, valid, b)
        assert committed_set(dec, valid, b) == ref.factor_ref(conf, cols, f, quirk)


@settings(max_examples=60, **SETTINGS)
@given(case=ragged_case(), kappa=st.sampled_from([0.5, 0.9, 1.0]), tau=st.sampled_from([None, 0.0, 0.5, 0.75]),
       radius=st.integers(0, 6))
def test_localleap_matches_reference(case, kappa, tau, radius):
    state, prob = case
    positions, valid, dec = run_step(samplers.get("localleap", kappa=kappa, tau=tau, radius=radius), state, prob=prob)
    for b in range(state.batch_size):
        conf, cols, _ = row_lists(prob, positions, valid, b)
        assert committed_set(dec, valid, b) == ref.localleap_ref(conf, cols, kappa, tau, radius)


def test_localleap_with_tau_above_kappa_tightens_near_anchors():
    """dlmserve's (kappa 0.5, tau 0.75): an anchor lies within its own radius, so near anchors the
    bar is tau; 0.6 does not commit although it is an anchor."""
    state = make_state([2], 3, [(0, 3)])
    prob = torch.zeros(state.x.shape, dtype=torch.float64)
    prob[0, 2:5] = torch.tensor([0.9, 0.6, 0.3], dtype=torch.float64)
    positions, valid, dec = run_step(samplers.get("localleap", kappa=0.5, tau=0.75, radius=4), state, prob=prob)
    assert committed_set(dec, valid, 0) == ref.localleap_ref([0.9, 0.6, 0.3], [2, 3, 4], 0.5, 0.75, 4) == {0}


BITS = st.one_of(st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 2.0]), st.floats(0, 6, allow_nan=False))


@settings(max_examples=60, **SETTINGS)
@given(case=ragged_case(values=BITS), gamma=st.sampled_from([0.0, 0.01, 0.5, 1.0, 4.0]),
       order=st.sampled_from(["entropy", "confidence", "margin"]), seed=st.integers(0, 2**16))
def test_eb_matches_reference(case, gamma, order, seed):
    state, bits = case
    nats = bits * math.log(2)
    other = torch.rand(bits.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).round(decimals=1)
    kw = {"prob" if order == "confidence" else "margin": other}
    positions, valid, dec = run_step(samplers.get("eb", gamma=gamma, order=order), state, entropy=nats, **kw)
    for b in range(state.batch_size):
        h_nats, cols, _ = row_lists(nats, positions, valid, b)
        h = [v / math.log(2) for v in h_nats]
        keys = [-v for v in h] if order == "entropy" else row_lists(other, positions, valid, b)[0]
        assert committed_set(dec, valid, b) == ref.eb_ref(h, keys, cols, gamma)


# -- threshold / factor / localleap / eb: explicit cases -----------------------------------------------
def test_threshold_nothing_above_tau_commits_exactly_the_first_of_tied_best():
    state = make_state([3, 1], 8, [(0, 4), (2, 8)])
    prob = torch.full(state.x.shape, 0.3, dtype=torch.float64)
    positions, valid, dec = run_step(samplers.get("threshold"), state, prob=prob)
    assert dec.commit.sum(1).tolist() == [1, 1]
    # All tied: the lowest column of each row's block.
    assert positions[dec.commit].tolist() == [state.gen_start + 0, state.gen_start + 2]


@pytest.mark.parametrize("dtype, commits", [(torch.bfloat16, [True, True, False]),
                                           (torch.float32, [True, False, False]),
                                           (torch.float64, [True, False, False])])
def test_threshold_compares_tau_in_the_confidences_dtype(dtype, commits):
    """As `conf >= 0.9` on a tensor compares (Fast-dLLM's Dream loops, SlowFast's reference, bf16):
    0.9 is 0.8984375 in bfloat16, so a bf16 confidence of 0.8984375 commits; in float32 and float64
    it stays below."""
    state = make_state([1], 3, [(0, 3)])
    g = state.gen_start
    prob = torch.zeros(state.x.shape, dtype=dtype)
    prob[0, g:g + 3] = torch.tensor([0.99, 0.8984375, 0.5], dtype=dtype)
    for sampler in (samplers.get("threshold", tau=0.9), samplers.get("adablock", tau=0.9, delimiter_ids=[299]),
                    samplers.get("slowfast", high_threshold=0.9), samplers.get("localleap", kappa=0.9, tau=None)):
        _, _, dec = run_step(sampler, state, prob=prob)
        assert dec.commit[0].tolist() == commits, sampler.name


def test_entropies_count_a_zero_probability_as_zero_in_float16():
    """Dream's `entropy` (and `block_entropy`), ParallelBench's `entropy_topk` and dParallel's rules score
    sum p log(p + floor) in a float16 request's dtype, where the floor rounds to 0: the suppressed mask
    token (p = 0) must add 0, not 0 log 0 = NaN."""
    from dllm.samplers.dparallel import entropy_with_floor
    logits = torch.tensor([[[5.0, 1.0, 0.0, float("-inf")], [0.5, 0.0, -30.0, float("-inf")]]], dtype=torch.float16)
    probs = torch.softmax(logits, dim=-1)
    want = [sum(p * math.log(p + 1e-10) for p in row if p > 0) for row in probs[0].double().tolist()]
    scores = {
        "entropy": samplers.get("entropy").confidence(probs, None),
        "block_entropy": samplers.get("block_entropy").confidence(probs, None),
        "entropy_topk": samplers.get("entropy_topk").scores_for(SimpleNamespace(score_dtype=torch.float16), None,
                                                                None, None, SimpleNamespace(logits=logits)),
        "dparallel": -entropy_with_floor(logits, 1e-12),
    }
    for name, got in scores.items():
        assert got.dtype == torch.float16 and torch.allclose(got.double().flatten(), torch.tensor(want, dtype=torch.float64),
                                                             atol=2e-3), (name, got)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_thresholds_round_as_a_tensor_of_the_dtype_holds_them(dtype):
    """`rounded_to`, worked out on the host, against torch's own conversion: random values, ties of
    bfloat16 and float16, values beyond each dtype's range."""
    from dllm.samplers.threshold import rounded_to
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(3000, generator=gen, dtype=torch.float64).tolist() + [0.0, 1.0, 0.9, 65504.0, 65520.0, 1e39]
    values += (torch.randint(0x3800, 0x3F80, (500,), generator=gen, dtype=torch.int32) << 16 | 0x8000
               ).view(torch.float32).tolist()                                       # bfloat16 ties
    values += (torch.randint(0x3000, 0x3C00, (500,), generator=gen, dtype=torch.int16) << 0
               ).view(torch.float16).float().add(2 ** -25).tolist()                # float16 near-ties
    values += [-v for v in values]
    for value in values:
        assert rounded_to(value, dtype) == float(torch.tensor(value, dtype=dtype)), value


def test_threshold_commits_only_inside_each_rows_block():
    state = make_state([2, 4, 1], 12, [(0, 4), (4, 8), (8, 12)])
    prob = torch.full(state.x.shape, 0.95, dtype=torch.float64)
    positions, valid, dec = run_step(samplers.get("threshold"), state, prob=prob)
    for b, (s, e) in enumerate([(0, 4), (4, 8), (8, 12)]):
        cols = positions[b][dec.commit[b]] - state.gen_start
        assert cols.tolist() == list(range(s, e))


def test_factor_quirk_commits_all_when_only_the_last_rank_fails():
    state = make_state([2], 3, [(0, 3)])
    g = state.gen_start
    prob = torch.zeros(state.x.shape, dtype=torch.float64)
    prob[0, g:g + 3] = torch.tensor([0.99, 0.99, 0.1])   # rank 3 needs 1 - 1/4 = 0.75
    _, _, dec = run_step(samplers.get("factor"), state, prob=prob)
    assert dec.commit.sum() == 3
    _, _, dec = run_step(samplers.get("factor", last_rank_quirk=False), state, prob=prob)
    assert dec.commit.sum() == 2
    prob[0, g:g + 3] = torch.tensor([0.99, 0.5, 0.99])    # sorted 0.99, 0.99 (>= 2/3), 0.5 (< 3/4): last fails
    _, _, dec = run_step(samplers.get("factor", last_rank_quirk=False), state, prob=prob)
    assert dec.commit[0].tolist() == [True, False, True]


def test_factor_boundary_is_inclusive():
    state = make_state([1], 4, [(0, 4)])
    g = state.gen_start
    prob = torch.zeros(state.x.shape, dtype=torch.float64)
    prob[0, g:g + 4] = torch.tensor([0.5, 0.5, 0.5, 0.1])  # f = 1.5: rank 2 needs 0.5 (equal: passes), rank 3 0.625
    _, _, dec = run_step(samplers.get("factor", f=1.5), state, prob=prob)
    assert dec.commit[0].tolist() == [True, True, False, False]


def test_localleap_anchor_radius():
    state = make_state([1], 16, [(0, 16)])
    g = state.gen_start
    prob = torch.full(state.x.shape, 0.8, dtype=torch.float64)   # between tau 0.75 and kappa 0.9
    prob[0, g + 6] = 0.95                                      # the only anchor
    positions, valid, dec = run_step(samplers.get("localleap"), state, prob=prob)
    cols = (positions[0][dec.commit[0]] - g).tolist()
    assert cols == list(range(2, 11))                          # 6 +- 4
    # Without an anchor: plain threshold with kappa, i.e. only the top-1 (lowest of the tied 0.8s).
    prob[0, g + 6] = 0.85
    positions, valid, dec = run_step(samplers.get("localleap"), state, prob=prob)
    assert (positions[0][dec.commit[0]] - g).tolist() == [6]
    # tau=None: plain threshold with kappa even with an anchor.
    prob[0, g + 6] = 0.95
    positions, valid, dec = run_step(samplers.get("localleap", tau=None), state, prob=prob)
    assert (positions[0][dec.commit[0]] - g).tolist() == [6]


def test_localleap_radius_reaches_across_committed_columns_but_not_outside_the_block():
    state = make_state([2, 2], 12, [(0, 6), (6, 12)], committed=[[1, 2], []])
    g = state.gen_start
    prob = torch.full(state.x.shape, 0.8, dtype=torch.float64)
    prob[:, g + 5] = 0.99
    prob[1, g + 9] = 0.99
    positions, valid, dec = run_step(samplers.get("localleap", radius=3), state, prob=prob)
    assert (positions[0][dec.commit[0]] - g).tolist() == [3, 4, 5]          # 0 is 5 away; 1, 2 committed
    assert (positions[1][dec.commit[1]] - g).tolist() == [6, 7, 8, 9, 10, 11]


def test_eb_gamma_boundary():
    state = make_state([1], 4, [(0, 4)])
    g = state.gen_start
    h = torch.zeros(state.x.shape, dtype=torch.float64)
    h[0, g:g + 4] = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64) * math.log(2)    # bits 0.5 each
    _, _, dec = run_step(samplers.get("eb", gamma=1.0), state, entropy=h)
    assert dec.commit.sum() == 3                                       # 1.5 - 0.5 = 1.0 <= 1; 2.0 - 0.5 > 1
    _, _, dec = run_step(samplers.get("eb", gamma=0.999), state, entropy=h)
    assert dec.commit.sum() == 2
    _, _, dec = run_step(samplers.get("eb", gamma=0.0), state, entropy=h)
    assert dec.commit.sum() == 1                                       # at least one
    # The largest entropy of a set is free: 0, 0, 1 commit (excess 0), adding 3 gives excess 1.
    h[0, g:g + 4] = torch.tensor([3.0, 0.0, 0.0, 1.0], dtype=torch.float64) * math.log(2)
    _, _, dec = run_step(samplers.get("eb", gamma=0.0), state, entropy=h)
    assert dec.commit[0].tolist() == [False, True, True, True]


# -- AdaBlock ------------------------------------------------------------------------------------------
def _adablock_case(prompt_lens, G, starts, delim_at, committed=None, family="llada"):
    """Rows whose blocks open at `starts`; delim_at[b] = {offset: confidence} of newline candidates,
    every other candidate token 7 at confidence 0.2."""
    state = make_state(prompt_lens, G, [(s, G) for s in starts], committed, family=family)
    prob = torch.full(state.x.shape, 0.2, dtype=torch.float64)
    token = torch.full(state.x.shape, 7, dtype=torch.long)
    for b, d in enumerate(delim_at):
        for off, c in d.items():
            prob[b, state.gen_start + off] = c
            token[b, state.gen_start + off] = NEWLINE
    return state, prob, token


def test_adablock_block_end_from_delimiter_confidence():
    G = 32
    # row 0: confident delimiter at 5; row 1: delimiter below tau_d (0.3); row 2: none;
    # row 3: two equally confident delimiters (the lower wins); row 4: confident one beyond the window (8).
    state, prob, token = _adablock_case([3, 1, 2, 4, 1], G, [0] * 5,
                                        [{5: 0.8}, {3: 0.25}, {}, {6: 0.6, 4: 0.6}, {8: 0.99}])
    sampler = samplers.get("adablock", base_block=6, delimiter_ids=[NEWLINE])
    positions, valid, dec = run_step(sampler, state, prob=prob, token=token)
    g = state.gen_start
    assert (dec.block_end - g).tolist() == [6, 6, 6, 5, 6]
    # Commits: top-1 inside the chosen block only (nothing reaches tau 0.9 but row 4's delimiter, outside it).
    got = [(positions[b][dec.commit[b]] - g).tolist() for b in range(5)]
    assert got == [[5], [3], [0], [4], [0]]
    # The window scanned past the fixed block: a confident delimiter at 7 of an 8-wide window.
    state, prob, token = _adablock_case([1], G, [0], [{7: 0.95}])
    sampler = samplers.get("adablock", base_block=4, delimiter_ids=[NEWLINE])
    _, _, dec = run_step(sampler, state, prob=prob, token=token)
    assert (dec.block_end - state.gen_start).tolist() == [8]


def test_adablock_ragged_rows_and_remaining():
    G = 20
    state, prob, token = _adablock_case([1, 2, 3], G, [0, 12, 17], [{}, {14: 0.9}, {19: 0.9}],
                                        committed=[[], list(range(12)), list(range(17))])
    sampler = samplers.get("adablock", base_block=8, delimiter_ids=[NEWLINE])
    positions, valid, dec = run_step(sampler, state, prob=prob, token=token)
    # window = int(0.25 * 20) = 5 columns from each start; fallback min(8, remaining).
    assert (dec.block_end - state.gen_start).tolist() == [8, 15, 20]


def test_adablock_decides_once_per_block():
    state, prob, token = _adablock_case([2], 32, [0], [{3: 0.9}])
    sampler = samplers.get("adablock", delimiter_ids=[NEWLINE])
    _, _, dec = run_step(sampler, state, prob=prob, token=token)
    assert (dec.block_end - state.gen_start).tolist() == [4]
    state.block_end = dec.block_end.clone()
    token[0, state.gen_start + 1] = NEWLINE                   # a new confident delimiter: ignored now
    prob[0, state.gen_start + 1] = 0.99
    positions, valid, dec = run_step(sampler, state, prob=prob, token=token, setup=False)
    assert (dec.block_end - state.gen_start).tolist() == [4]
    assert positions[valid].max() < state.gen_start + 4        # only the block is scored after the opening


@pytest.mark.parametrize("family,expected", [("llada", 3), ("dream", 16)])
def test_adablock_tau_d_default_by_family(family, expected):
    state, prob, token = _adablock_case([2], 64, [0], [{2: 0.4}], family=family)
    _, _, dec = run_step(samplers.get("adablock", base_block=16, delimiter_ids=[NEWLINE]), state, prob=prob,
                         token=token)
    assert (dec.block_end - state.gen_start).tolist() == [expected]


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_adablock_matches_reference(data):
    B = data.draw(st.integers(1, 3))
    G = data.draw(st.integers(1, 40))
    window = data.draw(st.one_of(st.none(), st.integers(0, 12)))
    base_block = data.draw(st.integers(1, 12))
    tau_d = data.draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))
    starts = [data.draw(st.integers(0, G - 1)) for _ in range(B)]
    state = make_state([data.draw(st.integers(1, 4)) for _ in range(B)], G, [(s, G) for s in starts],
                       [list(range(s)) for s in starts])
    L = state.length
    prob = torch.tensor([[data.draw(confidence) for _ in range(L)] for _ in range(B)], dtype=torch.float64)
    token = torch.tensor([[data.draw(st.sampled_from([NEWLINE, 46, 7, 7])) for _ in range(L)] for _ in range(B)])
    sampler = samplers.get("adablock", tau_d=tau_d, base_block=base_block, window=window,
                           delimiter_ids=[NEWLINE, 46])
    positions, valid, dec = run_step(sampler, state, prob=prob, token=token)
    win = int(0.25 * G) if window is None else window
    for b in range(B):
        conf, cols, _ = row_lists(prob, positions, valid, b)
        toks = [token[b, c].item() for c in cols]
        start = state.gen_start + starts[b]
        want = ref.adablock_block_length_ref(toks, conf, cols, start, G - starts[b], win, {NEWLINE, 46}, tau_d,
                                             base_block)
        assert dec.block_end[b].item() - start == want
        inside = [i for i, c in enumerate(cols) if c < start + want]
        want_commit = {inside[i] for i in ref.threshold_ref([conf[i] for i in inside], [cols[i] for i in inside], 0.9)}
        assert committed_set(dec, valid, b) == want_commit


def test_adablock_delimiters_resolve_through_the_tokenizer(llada):
    model, tok = llada
    s = samplers.get("adablock", delimiters="\\n,.")                  # as a shell passes it
    assert s.delimiters == ["\n", ",", "."]
    assert s.resolve_delimiter_ids(tok) == sorted({tok.encode(c, add_special_tokens=False)[0] for c in "\n,."})
    assert samplers.get("adablock").resolve_delimiter_ids(tok) == [NEWLINE]
    assert samplers.get("adablock", delimiters=["\n", "."], delimiter_ids=99).resolve_delimiter_ids(tok) == [10, 46, 99]
    assert samplers.get("adablock", delimiter_ids=[5]).resolve_delimiter_ids(None) == [5]
    with pytest.raises(ValueError, match="single token"):
        samplers.get("adablock", delimiters=["\n\n"]).resolve_delimiter_ids(tok)
    with pytest.raises(ValueError, match="need the tokenizer"):
        dllm.generate(model, None, PROMPTS, gen_length=8, sampler="adablock")
    # With a tokenizer, token-id prompts work too.
    out = dllm.generate(model, tok, PROMPTS, gen_length=8, sampler="adablock")
    assert not (out.generated == model.config.mask_token_id).any()
    V = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"delimiter_ids \[{V}\] are outside the model's vocabulary \[0, {V}\)"):
        dllm.generate(model, tok, PROMPTS, gen_length=8, sampler="adablock", sampler_kwargs={"delimiter_ids": [5, V]})
    mask = model.config.mask_token_id
    with pytest.raises(ValueError, match=rf"delimiter_ids hold the mask token id {mask}, which is never decoded"):
        dllm.generate(model, tok, PROMPTS, gen_length=8, sampler="adablock", sampler_kwargs={"delimiter_ids": [mask]})


class ScriptedModel:
    """Stands in for a model: logits from a function of the scored canvas columns."""

    def __init__(self, family="llada", logits_fn=None):
        self.config = dllm.ModelConfig.from_name(f"{family}-tiny")
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.generation_defaults = {}
        self.logits_fn = logits_fn

    def __call__(self, x, logits_at=None, **kw):
        return self.logits_fn(x, logits_at, self.config.vocab_size)


def test_adablock_moves_the_loops_block_end():
    """Uniform logits except a near-certain newline at generation column 5: the first block ends
    right after it (committed first, then 0..4 left to right); later blocks fall back to base_block."""
    gen_start = 3

    def logits_fn(x, cols, V):
        out = torch.zeros(*cols.shape, V)
        out[..., NEWLINE] = torch.where(cols == gen_start + 5, 30.0, 0.0)
        return out

    out = dllm.generate(ScriptedModel(logits_fn=logits_fn), None, [[1, 2, 3]], gen_length=14, sampler="adablock",
                        sampler_kwargs=dict(base_block=4, window=8, delimiter_ids=[NEWLINE]), trace=True)
    assert out.trace[0].tolist() == [1, 2, 3, 4, 5, 0, 6, 7, 8, 9, 10, 11, 12, 13]
    assert out.generated[0, 5] == NEWLINE


# -- Prophet -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage,step", [("early", 0), ("early", 31), ("mid", 32), ("mid", 40), ("late", 66),
                                        ("late", 80)])     # the published loop counts its steps from 1
@pytest.mark.parametrize("above", [True, False])
def test_prophet_fill_all_at_each_stage(stage, step, above):
    G = 100
    tau = {"early": 7.5, "mid": 5.0, "late": 2.5}[stage]
    state = make_state([2, 3], G, [(0, 10), (10, 20)], committed=[[], list(range(10))])
    state.global_step = step
    gap = torch.full(state.x.shape, tau + (0.25 if above else -0.25), dtype=torch.float64)
    gap[1] = tau - 1                                               # row 1 never fires
    prob = torch.full(state.x.shape, 0.95, dtype=torch.float64)
    sampler = samplers.get("prophet", base="threshold")
    positions, valid, dec = run_step(sampler, state, prob=prob, gap=gap)
    g = state.gen_start
    assert dec.fill_all.tolist() == [above, False]
    assert ref.prophet_fill_ref(gap[0, g:g + G].tolist(), step + 1, G) == above
    # Every masked generation column was scored, and a firing row commits all of them.
    assert valid.sum(1).tolist() == [G, G]                    # row 1: its committed answer columns too
    if above:
        assert dec.commit[0][valid[0]].all()
    else:
        assert (positions[0][dec.commit[0]] - g).tolist() == list(range(10))   # the base's block commits
    assert (positions[1][dec.commit[1]] - g).tolist() == list(range(10, 20))


def test_prophet_answer_region():
    G = 16
    state = make_state([2], G, [(0, 8)], committed=[[12]])
    g = state.gen_start
    gap = torch.zeros(state.x.shape, dtype=torch.float64)
    gap[0, g + 12:g + 14] = 10.0                               # committed 12 counts too
    for kw, fires in [({}, False), (dict(answer_start=12, answer_length=2), True),
                      (dict(answer_start=-4, answer_length=2), True), (dict(answer_start=-4), False),
                      (dict(answer_start=11, answer_length=3), False), (dict(answer_start=13), False)]:
        sampler = samplers.get("prophet", base="threshold", thresholds=[7.5, 5, 2.5], **kw)
        _, _, dec = run_step(sampler, state, gap=gap)
        assert dec.fill_all.tolist() == [fires], kw
    with pytest.raises(ValueError, match="answer_start 16 lies outside"):
        run_step(samplers.get("prophet", answer_start=16), state, gap=gap)


def test_prophet_answer_region_counts_from_the_answers_end_not_the_block_tails():
    """On a canvas that runs past the answer (LLaDA2's block tail), a negative answer_start counts
    back from the answer's end."""
    x = torch.full((1, 4 + 27), IDS.mask, dtype=torch.long)
    state = DecodeState(x=x, gen_start=4, gen_length=27, block_length=27, pad_len=torch.tensor([0]), ids=IDS,
                        answer_length=20)
    assert samplers.get("prophet", answer_start=-4).answer_columns(state) == (4 + 16, 4 + 20)


@pytest.mark.parametrize("base,family", [("low_confidence", "llada"), ("threshold", "llada"), ("eb", "dream"),
                                         ("entropy", "dream"), ("adablock", "llada"), ("llada21", "llada"),
                                         ("remdm", "llada"), ("rcr", "llada"), ("slowfast", "llada"),
                                         ("klass", "llada"), ("dus", "llada")])
def test_prophet_that_never_fires_equals_its_base(request, base, family):
    model, tok = request.getfixturevalue(family)
    kw = dict(gen_length=16, block_length=8, steps=16)
    if base == "entropy":
        kw.pop("block_length")
    want = dllm.generate(model, tok, PROMPTS, sampler=base, **kw)
    got = dllm.generate(model, tok, PROMPTS, sampler="prophet",
                        sampler_kwargs=dict(base=base, thresholds=[1e9, 1e9, 1e9]), **kw)
    assert torch.equal(got.sequences, want.sequences) and got.nfe == want.nfe
    assert got.sampler_args["base"] == base


def test_prophet_fires_and_stops(llada):
    model, tok = llada
    out = dllm.generate(model, tok, PROMPTS, gen_length=16, block_length=4, sampler="prophet",
                        sampler_kwargs=dict(thresholds=[0, 0, 0]), trace=True)
    assert out.forwards == 1 and (out.trace == 0).all()
    # The fill writes this step's candidates: the argmax of the first forward over the whole region.
    first = dllm.generate(model, tok, PROMPTS, gen_length=16, block_length=16, sampler="threshold",
                          sampler_kwargs=dict(tau=0.0))
    assert torch.equal(out.generated, first.generated)


def test_prophet_progress_counts_the_requested_steps_whatever_its_base(llada):
    """The stage is the step over the requested steps, also over a base that sets its own
    schedule: `steps` is used, not warned about as ignored."""
    model, tok = llada
    kw = dict(gen_length=16, block_length=8, sampler="prophet",
              sampler_kwargs=dict(base="threshold", base_kwargs={"tau": 1.0}, thresholds=[1e9, 1e9, -1e9],
                                  switches=[0.5, 0.5]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for steps in (4, 8):
            # fills everything at the step that reaches half the requested steps (counted from 1)
            assert dllm.generate(model, tok, PROMPTS, steps=steps, **kw).forwards == steps // 2


def test_prophet_base_instance_and_kwargs():
    inner = samplers.get("threshold", tau=0.8)
    p = samplers.get("prophet", base=inner)
    assert p.base is inner and p.uses_blocks and not p.fixed_schedule and "logit_gap" in p.score_fields
    assert p.arguments()["base_kwargs"] == {"tau": 0.8, "commit_block_start": False}
    p = samplers.get("prophet", base="entropy", base_kwargs={"eps": 0.01})
    assert not p.uses_blocks and p.fixed_schedule and p.needs_logits and not p.gumbel_candidates
    with pytest.raises(ValueError, match="base_kwargs are only used"):
        samplers.get("prophet", base=inner, base_kwargs={"tau": 0.5})
    with pytest.raises(ValueError, match="unknown sampler 'nope'"):
        samplers.get("prophet", base="nope")
    with pytest.raises(ValueError, match="sampler 'threshold': tau must be <= 1"):
        samplers.get("prophet", base="threshold", base_kwargs={"tau": 2})


# -- argument validation --------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kwargs,message", [
    ("threshold", dict(tau=1.5), "sampler 'threshold': tau must be <= 1, got 1.5"),
    ("threshold", dict(tau="high"), "sampler 'threshold': tau must be a number"),
    ("factor", dict(f=0), "sampler 'factor': f must be > 0, got 0"),
    ("factor", dict(last_rank_quirk="yes"), "last_rank_quirk must be True or False"),
    ("localleap", dict(kappa=-0.1), "sampler 'localleap': kappa must be >= 0"),
    ("localleap", dict(radius=1.5), "radius must be an integer"),
    ("eb", dict(gamma=-1), "sampler 'eb': gamma must be >= 0, got -1"),
    ("eb", dict(order="random"), "order must be one of entropy, confidence, margin"),
    ("adablock", dict(tau_d=2), "sampler 'adablock': tau_d must be <= 1"),
    ("adablock", dict(base_block=0), "base_block must be >= 1"),
    ("adablock", dict(window=-1), "window must be >= 0"),
    ("adablock", dict(delimiters=5), "delimiters must be a string"),
    ("adablock", dict(delimiters=[""]), "non-empty strings"),
    ("adablock", dict(delimiter_ids=[-3]), "delimiter_ids must be a non-negative token id"),
    ("prophet", dict(thresholds=[1, 2]), "thresholds must be a list of 3 numbers"),
    ("prophet", dict(switches=[0.7, 0.3]), "switches must satisfy"),
    ("prophet", dict(answer_length=0), "answer_length must be >= 1"),
    ("prophet", dict(base="prophet"), "cannot be prophet itself"),
    ("prophet", dict(base="wino"), "base 'wino' runs shadow copies of its block"),
    ("prophet", dict(base="freedave"), "base 'freedave' runs drafts beside the canvas"),
    ("prophet", dict(base=3), "base must be a registered sampler name"),
    ("prophet", dict(base_kwargs="tau=1"), "base_kwargs must be a dict"),
])
def test_bad_arguments_are_clear_errors(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        samplers.get(name, **kwargs)


def test_arguments_round_trip():
    for name in NEW:
        s = samplers.get(name)
        assert set(s.arguments()) == set(samplers.signature(name)), name
        assert s.describe() and samplers.sampler_class(name).__module__ == f"dllm.samplers.{name}"
        assert "Published defaults" in __import__(f"dllm.samplers.{name}", fromlist=["x"]).__doc__


def test_cli_arguments(llada_dir, capsys):
    kv = parse_kv(["delimiters=\\n,.", "base_kwargs={'tau': 0.8}", "thresholds=[8,5,3.5]"], "--sampler-arg")
    assert samplers.get("adablock", delimiters=kv["delimiters"]).delimiters == ["\n", ",", "."]
    assert samplers.get("prophet", base="threshold", base_kwargs=kv["base_kwargs"],
                        thresholds=kv["thresholds"]).thresholds == [8.0, 5.0, 3.5]
    rc = main(["generate", "--model", str(llada_dir), "hi", "--gen-length", "8", "--dtype", "float32",
               "--sampler", "adablock", "--sampler-arg", "delimiters=\\n,.", "--sampler-arg", "base_block=4"])
    assert rc == 0
    rc = main(["generate", "--model", str(llada_dir), "hi", "--gen-length", "8", "--dtype", "float32",
               "--sampler", "prophet", "--sampler-arg", "base=threshold", "--sampler-arg", "base_kwargs={'tau': 0.8}"])
    assert rc == 0
    rc = main(["samplers"])
    out = capsys.readouterr().out
    assert all(name in out for name in NEW)


# -- 2. end to end on the tiny checkpoints --------------------------------------------------------------
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("name", NEW)
def test_generates_ragged_batch_and_rows_alone(request, family, name):
    model, tok = request.getfixturevalue(family)
    kw = dict(gen_length=16, block_length=8, sampler=name)
    out = dllm.generate(model, tok, PROMPTS, **kw)
    assert not (out.generated == model.config.mask_token_id).any() and not any(out.hit_cap)
    lp = max(map(len, PROMPTS))
    for b, row in enumerate(PROMPTS):
        assert out.sequences[b, lp - len(row):lp].tolist() == row
    b = 1                                                        # the most padded row of the batch
    alone = dllm.generate(model, tok, [PROMPTS[b]], **kw)
    assert torch.equal(alone.generated[0], out.generated[b]) and alone.nfe[0] == out.nfe[b]


@pytest.fixture(scope="module", params=["llada", "dream"])
def peaked_model(request):
    """Random weights at init_std 1: peaked distributions, so the rules really commit in parallel."""
    return dllm.build_model(dllm.ModelConfig.from_name(f"{request.param}-tiny"), seed=0, init_std=1.0)


@pytest.mark.parametrize("name", NEW)
def test_parallel_commits_same_alone_or_batched(peaked_model, name):
    kw = dict(gen_length=32, block_length=8, sampler=name,
              sampler_kwargs=dict(delimiter_ids=[NEWLINE]) if name == "adablock" else {})
    out = dllm.generate(peaked_model, None, PROMPTS, **kw)
    assert min(out.nfe) < 32 and not (out.generated == peaked_model.config.mask_token_id).any()
    for b, row in enumerate(PROMPTS):
        alone = dllm.generate(peaked_model, None, [row], **kw)
        assert torch.equal(alone.generated[0], out.generated[b]) and alone.nfe[0] == out.nfe[b], b
    # Seeded sampling is reproducible.
    runs = [dllm.generate(peaked_model, None, PROMPTS, temperature=0.7, seed=3, **kw).generated for _ in range(2)]
    assert torch.equal(*runs)


# -- 3. loop invariants for every sampler under adversarial scores ----------------------------------------
PATTERNS = ["uniform", "tiny", "peaked", "tie2", "huge", "random", "eos", "delimiter", "mixed"]


def adversarial_logits(pattern, seed):
    def fn(x, cols, V):
        B, Q = cols.shape
        gen = torch.Generator().manual_seed(seed * 7919 + int(x.sum()) % 100003)
        top = torch.randint(0, 300, (B, Q), generator=gen)
        kinds = {
            "uniform": lambda: torch.zeros(B, Q, V),
            "tiny": lambda: torch.randn(B, Q, V, generator=gen) * 1e-6,
            "peaked": lambda: torch.zeros(B, Q, V).scatter(-1, top[..., None], 1e4),
            "tie2": lambda: torch.zeros(B, Q, V).scatter(-1, top[..., None], 30.0).scatter(
                -1, ((top + 1) % 300)[..., None], 30.0),
            "huge": lambda: torch.randn(B, Q, V, generator=gen) * 1e3,
            "random": lambda: torch.randn(B, Q, V, generator=gen) * float(seed % 13),
            "eos": lambda: torch.zeros(B, Q, V).index_fill(-1, torch.tensor([301, 300]), 50.0),
            "delimiter": lambda: torch.zeros(B, Q, V).index_fill(-1, torch.tensor([NEWLINE]), float(seed % 9)),
        }
        if pattern != "mixed":
            return kinds[pattern]()
        parts = torch.stack([kinds[k]() for k in PATTERNS[:-1]])                  # (K, B, Q, V)
        pick = torch.randint(0, len(PATTERNS) - 1, (B, Q), generator=gen)
        return parts.gather(0, pick[None, ..., None].expand(1, B, Q, V))[0]
    return fn


SAMPLER_KWARGS = {"adablock": dict(delimiter_ids=[NEWLINE], base_block=4), "learn2pd": dict(filter="none"),
                  "pc_sampler": dict(frequencies="none")}


@pytest.mark.parametrize("name", samplers.available())
@settings(max_examples=40, **SETTINGS)
@given(family=st.sampled_from(["llada", "dream"]), pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 10**6),
       G=st.sampled_from([1, 4, 8, 12]), blocks=st.sampled_from([1, 2, 4]), few_steps=st.booleans(),
       prompt_lens=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_loop_invariants_under_adversarial_scores(name, family, pattern, seed, G, blocks, few_steps, prompt_lens):
    model = ScriptedModel(family, adversarial_logits(pattern, seed))
    sampler = samplers.get(name, **SAMPLER_KWARGS.get(name, {}))
    assume(not (sampler.shadow_block and family == "dream"))      # refused with a clear error
    blocks = blocks if G % blocks == 0 else 1
    kw = dict(gen_length=G, steps=blocks if few_steps else G)
    if name == "block_entropy":                                    # at least two steps per block
        kw["steps"] = max(kw["steps"], 2 * blocks)
    if sampler.uses_blocks:
        kw["block_length"] = G // blocks
    prompts = [[(seed + 31 * b + i) % 300 for i in range(n)] for b, n in enumerate(prompt_lens)]
    masks = [[G] * len(prompts)]
    alive = [[True] * len(prompts)]

    def on_step(state):
        masks.append(state.is_mask[:, state.gen_start:state.gen_end].sum(1).tolist())
        alive.append((~state.finished).tolist())

    out = dllm.generate(model, None, prompts, sampler=sampler, seed=seed, on_step=on_step, **kw)
    # Steps that commit nothing: only an editing sampler's post steps, which its allowance bounds.
    allowance = sampler.forward_allowance(SimpleNamespace(gen_length=G, block_length=kw.get("block_length", G)))
    cap = max(kw["steps"], G) + allowance
    assert out.forwards <= cap and not any(out.hit_cap)
    assert not (out.generated == model.config.mask_token_id).any()
    lp = max(prompt_lens)
    for b, row in enumerate(prompts):
        assert out.sequences[b, lp - len(row):lp].tolist() == row
        assert (out.sequences[b, :lp - len(row)] == model.config.pad_token_id).all()
    if not sampler.fixed_schedule:
        for b in range(len(prompts)):
            stalls = 0
            for t in range(1, len(masks)):
                if alive[t - 1][b] and not sampler.remasks:
                    assert masks[t][b] <= masks[t - 1][b], (t, b)
                    stalls += masks[t][b] == masks[t - 1][b]
            assert stalls <= allowance, (b, stalls)


def test_oversized_window_and_history_arguments_decode_as_their_largest_useful_value(llada, monkeypatch):
    """A LocalLeap radius past the canvas covers what the canvas's length covers, and a KLASS history
    or SlowFast window longer than the canvas never fills, as one just past it: they decode alike,
    without the memory or time the raw values would take."""
    model, tok = llada
    import dllm.samplers.localleap as localleap
    widths, pool = [], localleap.F.max_pool1d
    monkeypatch.setattr(localleap.F, "max_pool1d", lambda x, kernel_size, **kw: widths.append(kernel_size) or
                        pool(x, kernel_size, **kw))
    kw = dict(gen_length=16, block_length=8)
    for name, big, useful in (("localleap", dict(radius=2 ** 31 - 1), dict(radius=64)),
                              ("klass", dict(kl_history_length=2 ** 31 - 1), dict(kl_history_length=17)),
                              ("slowfast", dict(window=2 ** 31 - 1, explore_steps=2 ** 31 - 1),
                               dict(window=17, explore_steps=2 ** 31 - 1))):
        want = dllm.generate(model, tok, PROMPTS, sampler=name, sampler_kwargs=useful, **kw)
        got = dllm.generate(model, tok, PROMPTS, sampler=name, sampler_kwargs=big, **kw)
        assert torch.equal(got.sequences, want.sequences) and got.nfe == want.nfe, name
    assert widths and max(widths) <= 2 * (max(map(len, PROMPTS)) + 16) + 1       # the pool spans the canvas at most
    # ReMDM's revision steps are forwards: up to a forward cap, any count past it decodes alike.
    kw = dict(gen_length=8, block_length=8, steps=8, max_forwards=10, sampler="remdm")
    want = dllm.generate(model, tok, PROMPTS, sampler_kwargs=dict(remdm_steps=3), **kw)
    got = dllm.generate(model, tok, PROMPTS, sampler_kwargs=dict(remdm_steps=2 ** 31 - 1), **kw)
    assert torch.equal(got.sequences, want.sequences) and got.nfe == want.nfe == [10] * 3
