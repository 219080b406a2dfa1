"""Learn2PD (docs/samplers.md §10): the learned filter, End-of-Text Prediction, the loop's canvas
truncation, label collection (EGP) and filter training.

1. The rule against its plain re-statement (tests/reference/learn2pd_ref.py) on crafted scores of
   ragged rows; EoTP cases (a) and (b) spelled out.
2. The loop's truncation: EOS fill, shorter forwards, trace; end to end against the batch-1
   reference loop that physically cuts the canvas; a pass-through filter equals LLaDA's schedule.
3. Every cache policy on a ragged batch; the loop's invariants under adversarial scores.
4. Label collection, training, `dllm train-filter`, errors.
"""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from hypothesis import given, settings, strategies as st

import dllm
from dllm import filter_train, samplers
from dllm.cache import policies_for
from dllm.config import ModelConfig
from dllm.cli import main
from dllm.kernels.scoring import TokenScores
from dllm.samplers.learn2pd import FILTER_FILE, Learn2PD, Learn2PDFilter, load_filter, save_filter
from dllm.state import DecodeState, select_positions
from tests.reference.learn2pd_ref import learn2pd_generate_ref, learn2pd_rule_ref
from tests.test_samplers_parallel import IDS, PATTERNS, SETTINGS, ScriptedModel, adversarial_logits

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100]]
LOGIT_96 = math.log(0.96 / 0.04)


def threshold_filter(K: int, t: float, scale: float = 1000.0) -> Learn2PDFilter:
    """A filter that accepts a position when its own confidence exceeds t + 1/scale (at 0.96)."""
    f = Learn2PDFilter(K)
    with torch.no_grad():
        f.linear1.weight.copy_(torch.eye(K) * scale)
        f.linear1.bias.fill_(-scale * t)
        f.linear2.weight.copy_(torch.eye(K))
        f.linear2.bias.fill_(LOGIT_96 - 1.0)
    return f


def constant_filter(K: int, logit: float) -> Learn2PDFilter:
    f = Learn2PDFilter(K)
    with torch.no_grad():
        for p in f.parameters():
            p.zero_()
        f.linear2.bias.fill_(logit)
    return f


def random_filter(K: int, seed: int, std: float = 3.0) -> Learn2PDFilter:
    f = Learn2PDFilter(K)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in f.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return f


def filter_fn(f):
    def fn(feats):
        with torch.no_grad():
            return f(torch.tensor([feats], dtype=torch.float32))[0].tolist()
    return None if f is None else fn


class Spy(Learn2PD):
    """Learn2PD that records which EoTP case fired at each step."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.cases = []

    def step(self, state, rows, positions, valid, scores):
        dec = super().step(state, rows, positions, valid, scores)
        if dec.truncate_at is not None:
            masked = valid & (state.x[rows].gather(1, positions) == state.ids.mask)
            eos = scores.token == state.ids.eos
            accepted = self.filter_accepts(state, rows, positions, valid, scores.prob) & masked
            for r in range(len(rows)):
                if dec.truncate_at[r] >= 0:
                    self.cases.append("a" if bool((accepted[r] & eos[r]).any()) else "b")
        return dec


class WidthLog:
    """Wraps a model and logs the canvas width of every forward."""

    def __init__(self, model):
        self.model, self.widths = model, []
        self.config, self.device, self.dtype = model.config, model.device, model.dtype
        self.generation_defaults = getattr(model, "generation_defaults", {})

    def __call__(self, x, *args, **kw):
        self.widths.append(x.shape[1])
        return self.model(x, *args, **kw)


class EosBias(WidthLog):
    """Adds `bias` to the EOS logit, so the random tiny models predict EOS here and there."""

    def __init__(self, model, bias):
        super().__init__(model)
        self.bias = bias

    def __call__(self, x, *args, **kw):
        out = super().__call__(x, *args, **kw)
        out[..., self.config.eos_token_id] += self.bias
        return out


EOS_BIAS = {"llada": 1.0, "dream": 4.0}


# -- 1. the rule -----------------------------------------------------------------------------------
@st.composite
def crafted(draw):
    """Ragged rows with blocks of K columns (some cut short), committed positions, confidences and
    candidates with EOS among them."""
    K = draw(st.sampled_from([2, 4, 8]))
    n_blocks = draw(st.integers(1, 3))
    G = K * n_blocks
    B = draw(st.integers(1, 3))
    lens = [draw(st.integers(1, 4)) for _ in range(B)]
    lp = max(lens)
    x = torch.full((B, lp + G), IDS.mask, dtype=torch.long)
    state = DecodeState(x=x, gen_start=lp, gen_length=G, block_length=K, pad_len=torch.tensor([lp - n for n in lens]),
                        ids=IDS, steps=G)
    for b, n in enumerate(lens):
        x[b, :lp - n] = IDS.pad
        x[b, lp - n:lp] = torch.arange(n) + 20
        blk = draw(st.integers(0, n_blocks - 1))
        s = lp + blk * K
        x[b, lp:s] = 42                                               # earlier blocks decoded
        for c in range(s, s + K):
            if draw(st.booleans()) and draw(st.booleans()):
                x[b, c] = 42
        end = s + K
        if draw(st.booleans()):                                       # a row cut at some point of its block
            end = draw(st.integers(s + 1, s + K))
            if end < lp + G:
                state.truncate(torch.tensor([b]), torch.tensor([end - 1]))
        state.block_start[b], state.block_end[b] = s, min(end, s + K)
    L = lp + G
    conf = torch.tensor([[draw(st.sampled_from([0.0, 0.05, 0.3, 0.5, 0.5, 0.9, 0.97, 1.0])) for _ in range(L)]
                         for _ in range(B)], dtype=torch.float64)
    token = torch.tensor([[draw(st.sampled_from([IDS.eos, IDS.eos, 7, 8])) for _ in range(L)] for _ in range(B)])
    return state, conf, token


@settings(max_examples=80, **SETTINGS)
@given(case=crafted(), kind=st.sampled_from(["none", "random", "threshold", "all"]), seed=st.integers(0, 99),
       thres=st.sampled_from([0.0, 0.5, 0.96, 1.0]), eotp=st.booleans(), step=st.integers(0, 9))
def test_rule_matches_reference(case, kind, seed, thres, eotp, step):
    state, conf, token = case
    K = state.block_length
    filt = {"none": None, "random": random_filter(K, seed), "threshold": threshold_filter(K, 0.4),
            "all": constant_filter(K, 20.0)}[kind]
    sampler = samplers.get("learn2pd", filter="none" if filt is None else filt, accept_thres=thres, eotp=eotp)
    rows = torch.arange(state.batch_size)
    sampler.setup(state)
    sampler.begin_block(state, rows)
    per_block = state.extra["steps_per_block"]
    state.step_in_block[:] = step % per_block
    positions, valid = select_positions(sampler.score_mask(state, rows))
    scores = TokenScores(token=token.gather(1, positions), prob=conf.gather(1, positions))
    dec = sampler.step(state, rows, positions, valid, scores)
    assert not (dec.commit & ~valid).any()
    for b in range(state.batch_size):
        s, e = int(state.block_start[b]), int(state.block_end[b])
        masked = (state.x[b] == IDS.mask).tolist()
        k = int(state.extra["counts"][b, step % per_block])
        want, cut = learn2pd_rule_ref(conf[b].tolist(), token[b].tolist(), masked, (s, e),
                                      (state.gen_start, int(state.row_end[b])), K, filter_fn(filt), thres, k,
                                      IDS.eos, eotp)
        got = set(positions[b][dec.commit[b]].tolist())
        assert got == want, b
        if eotp:
            assert int(dec.truncate_at[b]) == (-1 if cut is None else cut), b
        else:
            assert dec.truncate_at is None


def _one_row(G=16, K=8, committed=(), conf=None, token=None):
    state = DecodeState(x=torch.full((1, 2 + G), IDS.mask, dtype=torch.long), gen_start=2, gen_length=G,
                        block_length=K, pad_len=torch.tensor([0]), ids=IDS, steps=G)
    state.x[0, :2] = torch.tensor([20, 21])
    for off in committed:
        state.x[0, 2 + off] = 42
    c = torch.full((1, 2 + G), 0.3, dtype=torch.float64)
    t = torch.full((1, 2 + G), 7, dtype=torch.long)
    for off, (p, tok) in (conf or {}).items():
        c[0, 2 + off], t[0, 2 + off] = p, tok
    return state, c, t


def _decide(sampler, state, conf, token):
    rows = torch.arange(state.batch_size)
    sampler.setup(state)
    sampler.begin_block(state, rows)
    positions, valid = select_positions(sampler.score_mask(state, rows))
    dec = sampler.step(state, rows, positions, valid,
                       TokenScores(token=token.gather(1, positions), prob=conf.gather(1, positions)))
    return positions, valid, dec


def test_eotp_case_a_cuts_after_the_first_accepted_eos():
    # Accepted (confidence > 0.5): offsets 3 (EOS), 5 (EOS), 1 (not EOS); a more confident masked EOS
    # beyond the block (offset 12) and a committed EOS candidate (offset 0) do not matter.
    state, conf, token = _one_row(committed=[0], conf={0: (0.99, IDS.eos), 1: (0.8, 7), 3: (0.7, IDS.eos),
                                                       5: (0.9, IDS.eos), 12: (1.0, IDS.eos)})
    positions, valid, dec = _decide(samplers.get("learn2pd", filter=threshold_filter(8, 0.5)), state, conf, token)
    assert (positions[0][dec.commit[0]] - 2).tolist() == [1, 3, 5]
    assert int(dec.truncate_at[0]) == 2 + 3
    # Scored: all 8 block columns (committed offset 0 included) and every masked column after the block.
    assert (positions[0][valid[0]] - 2).tolist() == list(range(16))


def test_eotp_case_b_cuts_after_the_most_confident_masked_eos():
    # Nothing accepted: the baseline commits offset 2 (k = 1, most confident); masked EOS candidates at
    # 4 (0.6), 9 (0.7) and 13 (0.7): the tie goes to the lower column, 9, beyond the block.
    state, conf, token = _one_row(committed=[0], conf={0: (0.99, IDS.eos), 2: (0.95, 7), 4: (0.6, IDS.eos),
                                                       9: (0.7, IDS.eos), 13: (0.7, IDS.eos)})
    sampler = samplers.get("learn2pd", filter=constant_filter(8, -20.0))
    positions, valid, dec = _decide(sampler, state, conf, token)
    assert (positions[0][dec.commit[0]] - 2).tolist() == [2]
    assert int(dec.truncate_at[0]) == 2 + 9
    # Without EOS candidates: no cut; with eotp off, neither a cut nor out-of-block scoring.
    token[token == IDS.eos] = 7
    _, _, dec = _decide(samplers.get("learn2pd", filter=constant_filter(8, -20.0)), state, conf, token)
    assert int(dec.truncate_at[0]) == -1
    positions, valid, dec = _decide(samplers.get("learn2pd", filter=constant_filter(8, -20.0), eotp=False),
                                    state, conf, token)
    assert dec.truncate_at is None and int(positions[0][valid[0]].max()) == 2 + 7


def test_baseline_count_and_acceptance_threshold():
    state, conf, token = _one_row(G=16, K=8, conf={1: (0.9, 7), 4: (0.97, 7), 6: (0.96, 7)})
    # steps = 8 over 2 blocks: 4 per block, 8 masks -> k = 2.
    state.steps = 8
    f = threshold_filter(8, 0.0, scale=1.0)            # logit = c + LOGIT_96 - 1: sigmoid > thres iff c > ...
    for thres, want in [(1.0, [4, 6]), (0.0, list(range(8)))]:
        positions, _, dec = _decide(samplers.get("learn2pd", filter=f, accept_thres=thres, eotp=False), state, conf,
                                    token)
        assert (positions[0][dec.commit[0]] - 2).tolist() == want


# -- 2. the loop's truncation ------------------------------------------------------------------------
def test_truncation_fills_eos_and_shortens_later_forwards():
    """A near-certain EOS at generation offset 5, moderate candidates elsewhere: step 0 commits it
    (the baseline's top-1) and cuts after it (case b); offsets 6..15 become EOS at step 0, block 0
    ends at offset 6, block 1 vanishes, and the five later forwards see 3 + 6 columns."""
    gen_start, G = 3, 16

    def logits_fn(x, cols, V):
        out = torch.zeros(*cols.shape, V)
        out[..., 7] = 5.0
        out[..., IDS.eos] = torch.where(cols == gen_start + 5, 30.0, 0.0)
        return out

    model = WidthLog(ScriptedModel(logits_fn=logits_fn))
    eos = model.config.eos_token_id
    assert eos == IDS.eos
    ends = []
    out = dllm.generate(model, None, [[1, 2, 3]], gen_length=G, block_length=8, sampler="learn2pd",
                        sampler_kwargs=dict(filter="none"), trace=True,
                        on_step=lambda s: ends.append(int(s.row_end[0]) - s.gen_start))
    assert out.generated[0].tolist() == [7] * 5 + [eos] * 11
    assert out.trace[0].tolist() == [1, 2, 3, 4, 5, 0] + [0] * 10
    assert out.nfe == [6] and ends == [6] * 6
    assert model.widths == [gen_start + G] + [gen_start + 6] * 5
    assert out.tokens_per_forward == [16 / 6]
    assert not (out.generated == model.config.mask_token_id).any()


@pytest.fixture(scope="module", params=["llada", "dream"])
def family(request):
    model, tok = request.getfixturevalue(request.param)
    return model, tok


def _never_mask_fn(model):
    def fn(x):
        with torch.no_grad():
            logits = model(x).clone()                 # the whole canvas: (1, L, V), aligned
        logits[..., model.config.mask_token_id] = float("-inf")
        return logits
    return fn


@pytest.mark.parametrize("kind,eotp", [("threshold", True), ("threshold", False), ("all", True), ("none", True)])
def test_equals_the_reference_loop_row_by_row(family, kind, eotp):
    """A ragged batch against the batch-1 reference that physically cuts its canvas: the kept tokens
    and the forwards of each row agree; the cut-off columns are EOS."""
    model, tok = family
    model = EosBias(model, EOS_BIAS[model.config.family])
    G, K = 32, 8
    filt = {"threshold": threshold_filter(K, 0.2), "all": constant_filter(K, 20.0), "none": None}[kind]
    spy = Spy(filter="none" if filt is None else filt, eotp=eotp)
    out = dllm.generate(model, None, PROMPTS, gen_length=G, block_length=K, sampler=spy)
    eos, mask = model.config.eos_token_id, model.config.mask_token_id
    lp = max(map(len, PROMPTS))
    cut_rows = 0
    for b, p in enumerate(PROMPTS):
        want, nfe = learn2pd_generate_ref(_never_mask_fn(model), p, gen_length=G, block_length=K, steps=G,
                                          filter_module=filt, accept_thres=0.96, eotp=eotp, eos_id=eos, mask_id=mask)
        kept = len(want) - len(p)
        got = out.generated[b].tolist()
        assert got[:kept] == want[len(p):], b
        assert got[kept:] == [eos] * (G - kept), b
        assert out.nfe[b] == nfe, b
        assert out.sequences[b, lp - len(p):lp].tolist() == p
        cut_rows += kept < G
    assert not (out.generated == mask).any()
    if eotp:
        assert cut_rows >= 1 and spy.cases
        if kind == "all":
            assert "a" in spy.cases


def test_pass_through_filter_equals_llada_up_to_the_cut(llada):
    """filter='none': without EoTP the sampler is LLaDA's low_confidence (steps = gen_length); with
    it, every token committed up to the step of a row's cut is the same, at the same step."""
    model, _ = llada
    kw = dict(gen_length=32, block_length=8, trace=True)
    base = dllm.generate(model, None, PROMPTS, sampler="low_confidence", **kw)
    plain = dllm.generate(model, None, PROMPTS, sampler="learn2pd", sampler_kwargs=dict(filter="none", eotp=False),
                          **kw)
    assert torch.equal(plain.sequences, base.sequences) and plain.nfe == base.nfe
    cut = [None] * len(PROMPTS)                         # (step, kept generation length) of each row's cut

    def on_step(state):
        for b in range(state.batch_size):
            if cut[b] is None and int(state.row_end[b]) < state.gen_end:
                cut[b] = (state.global_step - 1, int(state.row_end[b]) - state.gen_start)

    eot = dllm.generate(model, None, PROMPTS, sampler="learn2pd", sampler_kwargs=dict(filter="none"),
                        on_step=on_step, **kw)
    assert any(c is not None for c in cut)
    eos = model.config.eos_token_id
    for b in range(len(PROMPTS)):
        if cut[b] is None:
            assert torch.equal(eot.generated[b], base.generated[b]) and eot.nfe[b] == base.nfe[b]
            continue
        t, kept = cut[b]
        same = (base.trace[b] <= t) & (torch.arange(32) < kept)
        assert torch.equal(eot.generated[b][same], base.generated[b][same]), b
        assert torch.equal(eot.trace[b][same], base.trace[b][same]), b
        assert (eot.generated[b][kept:] == eos).all()
        assert eot.nfe[b] < base.nfe[b]


# -- 3. caches and invariants -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_layer_llada(llada):
    model, tok = llada
    return dllm.build_model(model.config.replace(n_layers=1), seed=3, init_std=0.3), tok


@pytest.mark.parametrize("policy", policies_for(ModelConfig.from_name("llada-tiny")))
def test_every_cache_policy_with_truncation(llada, one_layer_llada, policy):
    """Truncating rows under every cache policy, on a ragged batch: a one-layer model is exact (a
    column's K/V depend only on its own token), refresh=1 equals `none`, rows decode alike alone and
    in a batch, and the forwards get shorter."""
    K, G = 8, 32
    kw = dict(gen_length=G, block_length=K, sampler="learn2pd", sampler_kwargs=dict(filter=threshold_filter(K, 0.2)))
    storing = policy != "none"
    model = EosBias(one_layer_llada[0], 2.0)
    base = dllm.generate(model, None, PROMPTS, **kw)
    model.widths.clear()
    out = dllm.generate(model, None, PROMPTS, cache=policy, **kw)
    assert torch.equal(out.sequences, base.sequences) and out.nfe == base.nfe
    assert min(model.widths) < max(model.widths)
    model = EosBias(llada[0], EOS_BIAS["llada"])
    base = dllm.generate(model, None, PROMPTS, **kw)
    if storing:
        out = dllm.generate(model, None, PROMPTS, cache=policy, cache_kwargs={"refresh": 1}, **kw)
        assert torch.equal(out.sequences, base.sequences) and out.nfe == base.nfe
    model.widths.clear()
    batch = dllm.generate(model, None, PROMPTS, cache=policy, **kw)
    assert min(model.widths) < max(map(len, PROMPTS)) + G
    assert not (batch.generated == model.config.mask_token_id).any()
    for b, p in enumerate(PROMPTS):
        alone = dllm.generate(model, None, [p], cache=policy, **kw)
        assert torch.equal(alone.generated[0], batch.generated[b]) and alone.nfe[0] == batch.nfe[b], (policy, b)


@settings(max_examples=40, **SETTINGS)
@given(family=st.sampled_from(["llada", "dream"]), pattern=st.sampled_from(PATTERNS), seed=st.integers(0, 10**6),
       G=st.sampled_from([1, 4, 8, 12]), blocks=st.sampled_from([1, 2, 4]), few_steps=st.booleans(),
       kind=st.sampled_from(["none", "random", "all"]), eotp=st.booleans(),
       prompt_lens=st.lists(st.integers(1, 6), min_size=1, max_size=3))
def test_loop_invariants_under_adversarial_scores(family, pattern, seed, G, blocks, few_steps, kind, eotp,
                                                  prompt_lens):
    """The invariants of tests/test_samplers_parallel.py for learn2pd with a filter of the request's
    block size: prompts intact, no mask left, no cap hit, a mask fewer per step for every live row."""
    model = ScriptedModel(family, adversarial_logits(pattern, seed))
    blocks = blocks if G % blocks == 0 else 1
    K = G // blocks
    filt = {"none": "none", "random": random_filter(K, seed), "all": constant_filter(K, 20.0)}[kind]
    prompts = [[(seed + 31 * b + i) % 300 for i in range(n)] for b, n in enumerate(prompt_lens)]
    masks, alive = [[G] * len(prompts)], [[True] * len(prompts)]

    def on_step(state):
        masks.append(state.is_mask[:, state.gen_start:state.gen_end].sum(1).tolist())
        alive.append((~state.finished).tolist())

    out = dllm.generate(model, None, prompts, sampler="learn2pd", sampler_kwargs=dict(filter=filt, eotp=eotp),
                        gen_length=G, block_length=K, steps=blocks if few_steps else G, seed=seed, on_step=on_step)
    assert out.forwards <= G and not any(out.hit_cap)
    assert not (out.generated == model.config.mask_token_id).any()
    lp = max(prompt_lens)
    for b, row in enumerate(prompts):
        assert out.sequences[b, lp - len(row):lp].tolist() == row
    for t in range(1, len(masks)):
        for b in range(len(prompts)):
            if alive[t - 1][b]:
                assert masks[t][b] < masks[t - 1][b], (t, b)


# -- 4. labels, training, CLI, errors ----------------------------------------------------------------------
class OracleLog(filter_train.EGPOracle):
    def step(self, state, rows, positions, valid, scores):
        dec = super().step(state, rows, positions, valid, scores)
        self.log = getattr(self, "log", [])
        self.log.append(dict(rows=rows.clone(), positions=positions.clone(), token=scores.token.clone(),
                             x=state.x[rows].gather(1, positions), commit=dec.commit.clone()))
        return dec


def test_egp_oracle_commits_exactly_the_correct_positions(llada):
    """Each oracle step commits exactly the masked block positions whose candidate equals the
    reference, or, when the block's candidates repeat the previous step's, copies the reference into
    the block; either way it ends on the reference. A reference the model never predicts (its own
    decode, shifted by one id) makes every block stuck after one step."""
    model, _ = llada
    G, K = 16, 8
    own = dllm.generate(model, None, PROMPTS, gen_length=G, block_length=K, steps=G, sampler="low_confidence")
    shifted = (own.generated + 1) % 300
    stuck_seen = 0
    for ref in (own.generated, shifted):
        oracle = OracleLog(ref.clone())
        out = dllm.generate(model, None, PROMPTS, gen_length=G, block_length=K, steps=G, sampler=oracle,
                            max_forwards=G + G // K + 1)
        assert torch.equal(out.generated, ref) and not any(out.hit_cap)
        assert len(oracle.confidence) == len(oracle.log) == out.forwards
        prev = {}
        for e, conf, correct in zip(oracle.log, oracle.confidence, oracle.is_correct):
            assert conf.shape == correct.shape == (len(e["rows"]), K) and conf.dtype == torch.float32
            for i, r in enumerate(e["rows"].tolist()):
                want_ref = ref[r].gather(0, e["positions"][i] - out.sequences.shape[1] + G)
                assert torch.equal(correct[i], e["token"][i] == want_ref)
                masked = e["x"][i] == model.config.mask_token_id
                block = int(e["positions"][i, 0])
                stuck = prev.get(r, (None, None))[0] == block and torch.equal(prev[r][1], e["token"][i])
                stuck_seen += stuck
                assert torch.equal(e["commit"][i], masked if stuck else masked & correct[i])
                prev[r] = (block, e["token"][i])
    assert stuck_seen >= 1


def test_collect_labels_and_train(llada):
    model, _ = llada
    records = filter_train.collect_labels(model, None, PROMPTS, [16, 16, 32], block_length=8, batch_size=2,
                                          progress=False)
    assert records.confidence.shape == records.is_correct.shape and records.confidence.shape[1] == 8
    assert records.confidence.dtype == torch.float32 and records.is_correct.dtype == torch.bool
    assert records.prompts == 3 and records.blocks == 2 + 2 + 4 and len(records) >= records.blocks
    assert ((records.confidence >= 0) & (records.confidence <= 1)).all()
    f1, rep = filter_train.train_filter(records, epochs=30, seed=3, progress=False)
    f2, _ = filter_train.train_filter(records, epochs=30, seed=3, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(f1.state_dict().values(), f2.state_dict().values()))
    # it learns: the train loss falls from the one of its first epoch (its initial weights)
    _, first = filter_train.train_filter(records, epochs=1, seed=3, progress=False)
    assert rep["train_loss"] < first["train_loss"] - 1e-3
    assert sum(rep["split"].values()) == len(records) and rep["split"]["train"] == int(len(records) * 0.8)
    assert sum(p.numel() for p in Learn2PDFilter(32).parameters()) == 2112
    with pytest.raises(ValueError, match="gen_length 12 must be a positive multiple of block_length 8"):
        filter_train.collect_labels(model, None, PROMPTS, 12, block_length=8, progress=False)
    with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
        filter_train.train_filter(records, epochs=0)


def test_train_filter_command_end_to_end(tmp_path, capsys):
    from tests.fixtures.checkpoints import write_llada_checkpoint

    ckpt = write_llada_checkpoint(tmp_path / "model", seed=0, max_sequence_length=320)   # room for the prompts
    out = tmp_path / "f.safetensors"
    rc = main(["train-filter", "--model", str(ckpt), "--out", str(out), "--tasks", "puzzle/latin_square_n4",
               "--samples-per-task", "2", "--epochs", "20", "--seed", "1", "--dtype", "float32", "--no-progress"])
    assert rc == 0 and "validation accuracy" in capsys.readouterr().out
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["block_length"] == 32 and meta["accept_thres"] == 0.96 and meta["model"] == str(ckpt)
    assert meta["prompts"]["tasks"] == ["puzzle/latin_square_n4"] and meta["counts"]["prompts"] == 2
    assert meta["training"]["epochs"] == 20 and 0 <= meta["validation"]["accuracy"] <= 1
    filt = load_filter(out)
    assert filt.block_length == 32 and filt.metadata == meta
    model, tok = dllm.load(ckpt, dtype="float32")
    res = dllm.generate(model, tok, "hi", gen_length=64, block_length=32, sampler="learn2pd",
                        sampler_kwargs=dict(filter=str(out)))
    assert not (res.generated == model.config.mask_token_id).any() and res.sampler_args["filter"] == str(out)
    # Shipped in the checkpoint folder, the filter is found without an argument.
    shutil.copy(out, ckpt / FILTER_FILE)
    model, tok = dllm.load(ckpt, dtype="float32")
    res2 = dllm.generate(model, tok, "hi", gen_length=64, block_length=32, sampler="learn2pd")
    assert torch.equal(res2.sequences, res.sequences) and res2.sampler_args["filter"] == str(ckpt / FILTER_FILE)


def test_errors(llada, tmp_path):
    model, _ = llada
    with pytest.raises(FileNotFoundError, match="no Learn2PD filter file at .*missing.safetensors.*dllm train-filter"):
        samplers.get("learn2pd", filter=str(tmp_path / "missing.safetensors"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt Learn2PD filter file .*bad.safetensors"):
        samplers.get("learn2pd", filter=str(bad))
    path = save_filter(threshold_filter(8, 0.2), tmp_path / "f8.safetensors", {"model": "tiny"})
    with pytest.raises(ValueError, match="trained for block_length 8, and this request has block_length 16"):
        dllm.generate(model, None, PROMPTS, gen_length=16, block_length=16, sampler="learn2pd",
                      sampler_kwargs=dict(filter=str(path)))
    with pytest.raises(ValueError, match="needs a trained filter and model .* ships none .*dllm train-filter"):
        dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, sampler="learn2pd")
    for kw, msg in [(dict(accept_thres=1.5), "sampler 'learn2pd': accept_thres must be <= 1, got 1.5"),
                    (dict(accept_thres=-0.1), "accept_thres must be >= 0"),
                    (dict(accept_thres="high"), "accept_thres must be a number"),
                    (dict(eotp="yes"), "eotp must be True or False"),
                    (dict(filter=3), "filter must be a file path, 'none' or a Learn2PDFilter")]:
        with pytest.raises(ValueError, match=msg):
            samplers.get("learn2pd", **({"filter": "none"} | kw))
    with pytest.raises(ValueError, match="gen_length 20 must be a multiple of block_length 8"):
        dllm.generate(model, None, PROMPTS, gen_length=20, block_length=8, sampler="learn2pd",
                      sampler_kwargs=dict(filter=str(path)))
    # The file's recorded threshold is the default; an explicit one wins.
    meta_path = save_filter(threshold_filter(8, 0.2), tmp_path / "f9.safetensors", {"accept_thres": 0.8})
    assert samplers.get("learn2pd", filter=str(meta_path)).accept_thres == 0.8
    assert samplers.get("learn2pd", filter=str(meta_path), accept_thres=0.9).accept_thres == 0.9
    assert samplers.get("learn2pd", filter="none").arguments() == {"filter": "none", "accept_thres": 0.96,
                                                                   "eotp": True}


def test_filter_prompts_take_their_people_and_the_checkpoints_length():
    from transformers import PreTrainedTokenizerFast

    from dllm.eval import generators
    from dllm.models.loading import default_model_path

    tok = PreTrainedTokenizerFast.from_pretrained(str(default_model_path()))
    lists, lists_lengths = filter_train.task_prompts(tok, ["waiting_line/copy"], 3, names="lists")
    held, held_lengths = filter_train.task_prompts(tok, ["waiting_line/copy"], 3, gen_length=64)   # open, shard 3
    assert lists_lengths == [32] * 3 and held_lengths == [64] * 3
    record = generators.make_records("waiting_line/copy", split="train", num_samples=3, shard=3, names="open")[0]
    assert json.loads(record["answer"])[0] in tok.decode(held[0]) and held[0] != lists[0]


def test_fit_settings_are_checked_before_the_labels(llada, tmp_path, monkeypatch):
    model, tok = llada
    monkeypatch.setattr(filter_train, "collect_labels", lambda *a, **k: pytest.fail("labels were collected"))
    seed_range = "seed must be an integer in [-2**63, 2**64) (what torch.Generator takes)"
    for kw, msg in [(dict(lr=2.0), "lr must be a number in (0, 1), got 2.0"),
                    (dict(epochs=0), "epochs must be an integer >= 1, got 0"),
                    (dict(seed=1.5), f"{seed_range}, got 1.5"), (dict(seed=10 ** 20), f"{seed_range}, got {10 ** 20}")]:
        with pytest.raises(ValueError) as err:
            filter_train.train_filter_for_model(model, tok, tmp_path / "f.safetensors", samples_per_task=1,
                                                progress=False, **kw)
        assert msg in str(err.value)


def _write_filter(path, meta, tensors=None):
    from safetensors.torch import save_file
    state = tensors if tensors is not None else threshold_filter(8, 0.2).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(path),
              metadata={"dllm_learn2pd": json.dumps(meta)})
    return path


def test_filter_files_that_do_not_fit_are_refused_by_name(tmp_path):
    """A folder, metadata that is not an object, a recorded threshold outside [0, 1] and
    non-finite weights are each refused naming the file, before any decode."""
    ok = {"format": "dllm-learn2pd-filter", "block_length": 8}
    with pytest.raises(ValueError, match=f"Learn2PD filter '{tmp_path}' is a folder; give the .safetensors file"):
        samplers.get("learn2pd", filter=str(tmp_path))
    with pytest.raises(ValueError, match="is not a Learn2PD filter file .*metadata object"):
        samplers.get("learn2pd", filter=str(_write_filter(tmp_path / "list.safetensors", [1, 2])))
    with pytest.raises(ValueError, match=r"records accept_thres 5; it must lie in \[0, 1\]"):
        samplers.get("learn2pd", filter=str(_write_filter(tmp_path / "t.safetensors", ok | {"accept_thres": 5})))
    broken = {k: v.clone() for k, v in threshold_filter(8, 0.2).state_dict().items()}
    name = sorted(broken)[0]
    broken[name].view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=f"holds NaN or infinite weights in {name}"):
        samplers.get("learn2pd", filter=str(_write_filter(tmp_path / "nan.safetensors", ok, broken)))
    assert samplers.get("learn2pd", filter=str(_write_filter(tmp_path / "f.safetensors", ok))).accept_thres == 0.96


def test_train_filter_refuses_an_empty_task_list_and_an_unwritable_out_before_the_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dllm, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["train-filter", "--out", str(tmp_path / "f.safetensors"), "--tasks", ""]) == 2
    assert "empty task selection" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["train-filter", "--out", str(blocker / "f.safetensors"), "--tasks", "waiting_line/copy"]) == 2
    assert f"cannot write out '{blocker / 'f.safetensors'}'" in capsys.readouterr().err
    monkeypatch.setattr(filter_train.tempfile, "TemporaryFile", lambda **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))      # a folder that exists but takes no files
    assert main(["train-filter", "--out", str(tmp_path / "ok" / "f.safetensors"), "--tasks", "waiting_line/copy"]) == 2
    assert "cannot write out" in capsys.readouterr().err
    taken = tmp_path / "taken.safetensors"
    taken.mkdir()                          # safetensors' own error type becomes an OSError naming the file
    with pytest.raises(OSError, match=f"cannot write the Learn2PD filter '{taken}'"):
        save_filter(threshold_filter(8, 0.2), taken)


def test_train_filter_says_when_no_record_was_held_out_for_validation(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dllm, "load", lambda *a, **k: (None, None))
    out = tmp_path / "f.safetensors"
    meta = {"validation": None, "counts": {"records": 3, "prompts": 1}}
    monkeypatch.setattr(filter_train, "train_filter_for_model", lambda *a, **k: (out, meta))
    assert main(["train-filter", "--out", str(out), "--tasks", "waiting_line/copy"]) == 0
    printed = capsys.readouterr().out
    assert "no validation records" in printed and "nan" not in printed


def test_a_request_without_block_length_decodes_in_the_filters_blocks(tmp_path):
    """The shipped model's filter is for blocks of 32: `generate` without block_length decodes in
    them (and records them), as with block_length=32 given; a filter given by path does the same,
    and a length its blocks do not divide keeps the whole-region default (refused by setup)."""
    model, tok = dllm.load()
    plain = dllm.generate(model, tok, "Copy: a b", gen_length=64, sampler="learn2pd")
    given = dllm.generate(model, tok, "Copy: a b", gen_length=64, block_length=32, sampler="learn2pd")
    assert plain.block_length == given.block_length == 32 and torch.equal(plain.sequences, given.sequences)
    path = save_filter(threshold_filter(8, 0.2), tmp_path / "f8.safetensors")
    out = dllm.generate(model, tok, "Copy: a b", gen_length=16, sampler="learn2pd", sampler_kwargs={"filter": str(path)})
    assert out.block_length == 8
    with pytest.raises(ValueError, match="trained for block_length 8, and this request has block_length 12"):
        dllm.generate(model, tok, "Copy: a b", gen_length=12, sampler="learn2pd", sampler_kwargs={"filter": str(path)})
    assert dllm.generate(model, tok, "Copy: a b", gen_length=16, sampler="learn2pd",
                         sampler_kwargs={"filter": "none"}).block_length == 16
    wrapped = dllm.generate(model, tok, "Copy: a b", gen_length=64, sampler="prophet",
                            sampler_kwargs={"base": "learn2pd"})
    assert wrapped.block_length == 32
    assert samplers.get("prophet", base="learn2pd", base_kwargs={"filter": str(path)}).block_length_for(None) == 8


def test_train_filter_refuses_a_multi_process_launch(tmp_path, capsys, monkeypatch):
    """Every process would collect the same labels and write the same file: refused, as `dllm train`."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dllm, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["train-filter", "--out", str(tmp_path / "f.safetensors"), "--tasks", "waiting_line/copy"]) == 2
    assert "train-filter runs in one process, but this is one of 2 launched processes" in capsys.readouterr().err
    assert not (tmp_path / "f.safetensors").exists()


def test_one_instance_decodes_two_models_with_their_own_shipped_filters(tmp_path, llada_dir):
    """A sampler instance shared by decodes of two checkpoints, stepped in turn, reads each one's
    shipped filter and its recorded threshold."""
    from tests.test_generate import PROMPTS4
    from tests.test_join import fresh, step_in_turn

    models = []
    for i, (t, thres) in enumerate([(0.0, 0.5), (1.0, 0.99)]):    # one accepts every position, one none
        folder = tmp_path / f"m{i}"
        shutil.copytree(llada_dir, folder)
        save_filter(threshold_filter(8, t), folder / FILTER_FILE, {"accept_thres": thres})
        models.append(dllm.load(folder, dtype="float32")[0])
    sampler = samplers.get("learn2pd", eotp=False)
    cfg = dllm.GenerationConfig(sampler=sampler, gen_length=16, block_length=8, steps=16)
    alone = [dllm.generate(model, None, PROMPTS4[:2], cfg) for model in models]
    assert alone[0].nfe != alone[1].nfe
    decoders = [fresh(model, PROMPTS4[:2], cfg) for model in models]
    step_in_turn(decoders)
    assert [d.state.generated().tolist() for d in decoders] == [out.generated.tolist() for out in alone]
    assert [d.state.nfe.tolist() for d in decoders] == [out.nfe for out in alone]
    assert [sampler.resolved_arguments(d.state) for d in decoders] == [out.sampler_args for out in alone]
    assert [out.sampler_args["accept_thres"] for out in alone] == [0.5, 0.99]
    assert sampler.arguments()["filter"] is None
