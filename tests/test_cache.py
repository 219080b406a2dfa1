"""Cache policies (docs/caches.md): what each step recomputes, what the K/V
buffers hold after it, exactness where exactness is owed, and Fast-dLLM's published loops."""
import warnings

import pytest
import torch

import dllm
from dllm import samplers
from dllm.cache import (CachePolicy, KVCache, available_policies, get_policy, plan_columns, policies_for,
                        same_token_columns, window_columns)
from dllm.cli import main
from dllm.config import ModelConfig
from dllm.state import Decision
from tests.reference.cache_ref import fastdllm_generate_ref, vicinity_generate_ref

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100]]   # ragged: left padding 0, 4, 2
STORING = [p for p in policies_for(ModelConfig.from_name("llada-tiny")) if p != "none"]   # `block`: test_llada2.py
# vicinity's default window (16 columns each side) spans these short canvases: every step would be full
SHORT_WINDOW = {"vicinity": {"prefix_look": 2, "after_look": 3}}


def storing_policy(name: str, **kwargs) -> CachePolicy:
    """A storing policy by name; `vicinity` with a window narrower than the test canvases."""
    return get_policy(name, **SHORT_WINDOW.get(name, {}), **kwargs)


@pytest.fixture(params=["llada", "dream"])
def family_model(request):
    return request.getfixturevalue(request.param)


# -- samplers used beside the registered ones ---------------------------------------------------
class FillAllAtStep2(dllm.samplers.Sampler):
    """Commits the most confident block position; at global step 2 row 0 fills every remaining mask
    (so it finishes early and drops out of later forwards)."""
    name = "test-fill-all"

    def score_mask(self, state, rows):
        if state.global_step == 2:
            return state.is_mask[rows] & state.in_generation()[None, :]
        return state.masked_in_block(rows)

    def step(self, state, rows, positions, valid, scores):
        in_block = (positions >= state.block_start[rows, None]) & (positions < state.block_end[rows, None])
        conf = scores.prob.double().masked_fill(~(valid & in_block), float("-inf"))
        commit = torch.zeros_like(valid)
        commit[torch.arange(len(rows)), conf.argmax(1)] = True
        fill = (rows == 0) & (state.global_step == 2)
        return Decision(commit=commit & valid & in_block, fill_all=fill)


class MovingEnd(dllm.samplers.Sampler):
    """At the first step of every block it doubles the block (a new `block_end`), then commits the
    two most confident masked positions of the (possibly wider) block."""
    name = "test-moving-end"

    def step(self, state, rows, positions, valid, scores):
        first = state.step_in_block[rows] == 0
        end = torch.where(first, state.block_start[rows] + 2 * state.block_length, state.block_end[rows])
        conf = scores.prob.double().masked_fill(~valid, float("-inf"))
        commit = samplers.top_k_mask(conf, torch.full_like(rows, 2)) & valid
        return Decision(commit=commit, block_end=end)


def _sampler_cases():
    """Every registered sampler by name that runs with stored K/V (a shadow-block sampler, WINO,
    refuses them with an error, test_samplers_leaderboard.py), plus the two above (instances are
    built per use)."""
    names = [name for name in samplers.available() if not samplers.sampler_class(name).shadow_block]
    return [(name, None) for name in names] + [("test-fill-all", FillAllAtStep2), ("test-moving-end", MovingEnd)]


# Samplers that need an argument to run on a random model: Learn2PD without a trained filter
# (its schedule plus end-of-text truncation), PC-Sampler without a frequency table.
SAMPLER_ARGS = {"learn2pd": {"filter": "none"}, "pc_sampler": {"frequencies": "none"}}


def _kwargs(name, cls, seed=3, gen=8, block=4):
    uses_blocks = cls.uses_blocks if cls is not None else samplers.sampler_class(name).uses_blocks
    return dict(gen_length=gen, block_length=block if uses_blocks else None, steps=gen, seed=seed,
                sampler=cls() if cls is not None else name, sampler_kwargs=SAMPLER_ARGS.get(name, {}))


def _generate(model, tok, rows, cache="none", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dllm.generate(model, tok, rows, cache=cache, **kw)


_NONE_RUNS: dict = {}


def _each_sampler(model, tok):
    """(name, class or None, the `none` output on PROMPTS) for every registered sampler (with
    SAMPLER_ARGS); the `none` runs are shared between tests."""
    for name, cls in _sampler_cases():
        key = (id(model), name)
        if key not in _NONE_RUNS:
            _NONE_RUNS[key] = _generate(model, tok, PROMPTS, **_kwargs(name, cls))
        yield name, cls, _NONE_RUNS[key]


# -- registry and errors ------------------------------------------------------------------------
def test_registry_lists_the_policies():
    assert set(available_policies()) >= {"none", "prefix", "dual", "dkv-decode", "dkv-greedy"}
    assert not get_policy("none").needs_storage
    assert all(get_policy(p).needs_storage for p in STORING)


@pytest.mark.parametrize("call, match", [
    (lambda: get_policy("dual2"),
     r"unknown cache policy 'dual2'; valid options: block, dkv-decode, dkv-greedy, dual, none, prefix"),
    (lambda: get_policy(None), r"unknown cache policy None; valid options:"),
    (lambda: get_policy("dual", refesh=2), r"cache policy 'dual' has no argument\(s\) 'refesh'; its arguments: refresh=None"),
    (lambda: get_policy("none", refresh=1), r"cache policy 'none' has no argument\(s\) 'refresh'; its arguments: \(none\)"),
    (lambda: get_policy("dual", refresh=0), r"cache policy 'dual': refresh must be an integer >= 1 or None, got 0"),
    (lambda: get_policy("prefix", refresh=1.5), r"refresh must be an integer >= 1 or None, got 1.5"),
    (lambda: get_policy("dkv-decode", refresh=True), r"'dkv-decode': refresh must be an integer >= 1 or None, got True"),
    (lambda: get_policy("dkv-decode", warmup=-1), r"'dkv-decode': warmup must be an integer >= 0 or None, got -1"),
    (lambda: get_policy("dkv-greedy", window=-2), r"'dkv-greedy': window must be an integer >= 0, got -2"),
    (lambda: get_policy("dkv-greedy", refresh=None), r"'dkv-greedy': refresh must be an integer >= 1, got None"),
    (lambda: get_policy(get_policy("dual"), refresh=2), r"only used with a policy given by name"),
    (lambda: get_policy("dkv-greedy", twins=1), r"cache 'dkv-greedy': twins must be true or false, got 1"),
    (lambda: get_policy("dual", twins="yes"), r"cache 'dual': twins must be true or false, got 'yes'"),
    (lambda: get_policy("dkv-decode", guard=1.5), r"cache 'dkv-decode': guard must be a probability in \[0, 1\] "
                                                   r"or None, got 1.5"),
    (lambda: get_policy("dual", guard=True), r"cache 'dual': guard must be a probability .* got True"),
    (lambda: get_policy("prefix", guard="0.9"), r"cache 'prefix': guard must be a probability .* got '0.9'"),
    (lambda: get_policy("dkv-greedy", guard=-0.1), r"cache 'dkv-greedy': guard must be a probability .* got -0.1"),
])
def test_bad_names_and_arguments_are_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_generate_rejects_bad_caches_before_any_forward(llada):
    model, tok = llada
    calls = []
    hook = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"unknown cache policy 'duel'; valid options:"):
            dllm.generate(model, tok, PROMPTS, gen_length=8, cache="duel")
        with pytest.raises(ValueError, match=r"'dkv-decode' has no argument\(s\) 'every'"):
            dllm.generate(model, tok, PROMPTS, gen_length=8, cache="dkv-decode", cache_kwargs={"every": 2})
        with pytest.raises(ValueError, match=r"cfg_scale 1.5 > 0 is not supported with cache policy 'dual'.*"
                                             r"use cache='none' or cfg_scale=0"):
            dllm.generate(model, tok, PROMPTS, gen_length=8, cfg_scale=1.5, cache="dual")
    finally:
        hook.remove()
    assert not calls
    # guidance without storage still runs
    assert dllm.generate(model, tok, PROMPTS[:1], gen_length=4, steps=4, cfg_scale=1.5, cache="none").forwards == 4


def test_output_names_the_policy_with_resolved_defaults(llada, dream):
    for model, refresh, warmup in ((llada[0], 8, 2), (dream[0], 4, 1)):
        out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=4, steps=8, sampler="low_confidence",
                            cache="dkv-decode")
        assert out.cache == "dkv-decode" and out.cache_args == {"refresh": refresh, "warmup": warmup, "twins": False,
                                                                "guard": None}
    out = dllm.generate(llada[0], None, PROMPTS, gen_length=8, cache="dkv-decode", cache_kwargs={"refresh": 3})
    assert out.cache_args == {"refresh": 3, "warmup": 2, "twins": False, "guard": None}
    assert dllm.generate(llada[0], None, PROMPTS, gen_length=4).cache == "none"


# -- exactness ----------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", STORING)
def test_refresh_every_step_equals_no_cache(family_model, policy):
    """Forced to refresh every step (refresh=1), a policy recomputes and re-stores every column at
    every step: the tokens equal `none` for every sampler, on a ragged batch."""
    model, tok = family_model
    ran = 0
    for name, cls, base in _each_sampler(model, tok):
        out = _generate(model, tok, PROMPTS, cache=policy, cache_kwargs={"refresh": 1}, **_kwargs(name, cls))
        assert torch.equal(out.sequences, base.sequences), (policy, name)
        assert out.nfe == base.nfe, (policy, name)
        ran += 1
    assert ran >= 6


@pytest.fixture(scope="module")
def one_layer(llada, dream):
    """The fixture models' configurations with a single layer, random weights."""
    out = {}
    for fam, (model, tok) in (("llada", llada), ("dream", dream)):
        out[fam] = (dllm.build_model(model.config.replace(n_layers=1), seed=1, init_std=0.3), tok)
    return out


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("policy", STORING)
def test_one_layer_models_are_exact_under_every_policy(one_layer, family, policy):
    """With one layer a column's K/V depend only on its own token and position, so serving stale
    K/V is exact as long as every column whose token changed since it was stored is recomputed
    (the one-step delay included). Every policy with its default schedule must then give the
    tokens of `none`, for every sampler (fill-all, moved block ends, early-finished rows included)."""
    if (family, policy) == ("dream", "dkv-decode"):
        pytest.skip("dKV-Cache's shift_type 'un' serves a masked column from the cache once the token it predicts "
                    "is decoded, so a column written later keeps its mask's K/V: not exact even with one layer")
    model, tok = one_layer[family]
    for name, cls, base in _each_sampler(model, tok):
        out = _generate(model, tok, PROMPTS, cache=policy, **_kwargs(name, cls))
        assert torch.equal(out.sequences, base.sequences), (policy, name)


@pytest.mark.parametrize("policy", STORING)
def test_rows_decode_alike_alone_and_in_a_batch(family_model, policy):
    """Rows of one batch sit in different blocks and steps (ragged plans, some rows refreshing while
    others do not); a row's cache and tokens must not depend on its neighbours. Deterministic
    samplers only (Dream's `origin` and LLaDA's `random` share one random stream over the batch, as
    their references do)."""
    model, tok = family_model
    cases = [("low_confidence", None, {}), ("test-moving-end", MovingEnd, {})]
    if "threshold" in samplers.available():
        cases += [("threshold", None, {"tau": 0.15}), ("threshold", None, {"tau": 0.2})]
    for name, cls, args in cases:
        kw = dict(_kwargs(name, cls, gen=16, block=8), sampler_kwargs=args)
        batch = _generate(model, tok, PROMPTS, cache=policy, **kw)
        for r, p in enumerate(PROMPTS):
            kw["sampler"] = cls() if cls is not None else name
            alone = _generate(model, tok, [p], cache=policy, **kw)
            assert torch.equal(alone.generated[0], batch.generated[r]), (policy, name, r)


# -- Fast-dLLM's published loops ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["prefix", "dual"])
@pytest.mark.parametrize("rule", ["threshold-0.15", "threshold-0.2", "threshold-0.9", "counts-16", "counts-4"])
def test_prefix_and_dual_equal_the_fastdllm_loops(family_model, mode, rule):
    """`prefix`/`dual` + `threshold` (or LLaDA's fixed counts) on a ragged batch equal, row by row,
    the batch-1 transcription of Fast-dLLM's generate_with_prefix_cache / generate_with_dual_cache."""
    model, tok = family_model
    kind, value = rule.split("-")
    if kind == "threshold":
        if "threshold" not in samplers.available():
            pytest.skip("the threshold sampler is not registered")
        kw = dict(sampler="threshold", sampler_kwargs={"tau": float(value)})
        ref_kw = dict(threshold=float(value))
    else:
        kw = dict(sampler="low_confidence", steps=int(value))
        ref_kw = dict(threshold=None, steps=int(value))
    gen, block = 16, 8
    out = dllm.generate(model, None, PROMPTS, gen_length=gen, block_length=block, cache=mode, score_dtype="float64",
                        **kw)
    free = dllm.generate(model, None, PROMPTS, gen_length=gen, block_length=block, score_dtype="float64", **kw)
    differs = 0
    for r, p in enumerate(PROMPTS):
        want, nfe = fastdllm_generate_ref(model, p, gen_length=gen, block_length=block, mode=mode, **ref_kw)
        assert torch.equal(out.generated[r], want[0, len(p):]), (r, out.generated[r].tolist(),
                                                                  want[0, len(p):].tolist())
        assert out.nfe[r] == nfe
        differs += int((free.generated[r] != want[0, len(p):]).sum())
    if rule in ("threshold-0.2", "counts-16"):
        assert differs > 0  # the cache is approximate here: the check is not vacuous


@pytest.mark.parametrize("looks", [(16, 16, 4), (2, 3, 0), (0, 5, 1), (4, 0, 9), (0, 0, 0)], ids=str)
@pytest.mark.parametrize("tau", [0.2, 0.9])
def test_vicinity_equals_dinfers_loop(llada, looks, tau):
    """`vicinity` + `threshold` on a ragged batch equals, row by row, dInfer's vicinity-cache loop
    re-stated (warmup forwards over the whole canvas, then a window around the block)."""
    model, _ = llada
    before, after, warmup = looks
    args = dict(prefix_look=before, after_look=after, warmup_steps=warmup)
    kw = dict(gen_length=24, block_length=8, sampler="threshold", sampler_kwargs={"tau": tau}, score_dtype="float64")
    out = dllm.generate(model, None, PROMPTS, cache="vicinity", cache_kwargs=args, **kw)
    dual = dllm.generate(model, None, PROMPTS, cache="dual", **kw)
    for r, p in enumerate(PROMPTS):
        want, nfe = vicinity_generate_ref(model, p, gen_length=24, block_length=8, threshold=tau, **args)
        assert out.generated[r].tolist() == want[0, len(p):].tolist(), (r, looks)
        assert out.nfe[r] == nfe, (r, looks)
    if looks == (0, 0, 0):
        assert out.generated.tolist() == dual.generated.tolist() and out.nfe == dual.nfe


# -- plans --------------------------------------------------------------------------------------
def on_plans(policy: CachePolicy, check) -> None:
    """Call `check(state, rows, scored, plan)` at every step the loop takes, before the policy's
    own bookkeeping, with the plan the step follows: None for a full refresh of every row, else the
    (B', P) columns the policy names (`plan_columns` of its `Needs`)."""
    inner_needs, inner_advance = policy.needs, policy.advance
    asked = {}

    def needs(state, rows, scored=None, key_end=None):
        asked["scored"] = scored
        return inner_needs(state, rows, scored, key_end)

    def advance(state, rows, n):
        check(state, rows, asked["scored"], None if bool(n.full.all()) else plan_columns(n.columns))
        inner_advance(state, rows, n)

    policy.needs, policy.advance = needs, advance


def recording(policy: CachePolicy) -> list[dict]:
    """Log, per step, what the policy saw and the plan the step followed."""
    log = []

    def record(state, rows, scored, out):
        log.append(dict(step=state.global_step, rows=rows.clone(), x=state.x.clone(), scored=scored.clone(),
                        step_in_block=state.step_in_block[rows].clone(), block_start=state.block_start[rows].clone(),
                        block_end=state.block_end[rows].clone(), position_ids=state.position_ids.clone(),
                        key_valid=state.key_valid.clone(), gen_start=state.gen_start,
                        plan=out if out is None else out.clone()))

    on_plans(policy, record)
    return log


def plan_sets(entry) -> list[set[int]]:
    L = entry["x"].shape[1]
    if entry["plan"] is None:
        return [set(range(L)) for _ in entry["rows"]]
    return [set(row.tolist()) for row in entry["plan"]]


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
def test_dkv_decode_recomputes_masks_and_the_last_commits(family_model, sampler):
    """The one-step delay rule, step by step: a partial step recomputes exactly the still-masked
    columns of the generation region and the columns committed at the previous step (on Dream the
    columns left of those: dKV-Cache's shift_type "un", a column follows the token it predicts);
    full refreshes at steps i < warmup and i % refresh == 0 of each row's block."""
    if sampler not in samplers.available():
        pytest.skip(f"sampler {sampler!r} is not registered")
    model, _ = family_model
    shift = model.config.logit_shift
    policy = get_policy("dkv-decode", refresh=5)
    log = recording(policy)
    kw = dict(steps=16) if sampler == "low_confidence" else dict(sampler_kwargs={"tau": 0.3})
    out = dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, sampler=sampler, cache=policy,
                        trace=True, **kw)
    warmup = policy.warmup
    assert (policy.refresh, warmup) == (5, 2 if not shift else 1)
    partial = 0
    for e in log:
        t, g0 = e["step"], e["gen_start"]
        got = plan_sets(e)
        for k, r in enumerate(e["rows"].tolist()):
            i = int(e["step_in_block"][k])
            if i < warmup or i % 5 == 0:
                assert got[k] == set(range(e["x"].shape[1])), (t, r)
                continue
            partial += 1
            trace = out.trace[r]
            # still masked at step t (committed at t or later) or committed at t - 1
            want = {g0 + j - shift for j in range(16) if trace[j] >= t - 1}
            assert got[k] == want, (t, r, sorted(got[k]), sorted(want))
    assert partial >= 10
    assert int(policy.partial_steps.sum()) == partial


TWIN_PROMPTS = [[5, 17, 33, 2, 90, 41, 7, 5, 17], [64, 3, 12, 3], [250, 11, 11, 19, 100, 250]]


def test_twins_add_the_columns_holding_a_changed_token(family_model):
    """With twins=True a partial step recomputes what the policy's own rule names on that canvas
    plus every column whose token equals the token of a column changed since the row's last
    forward (found here by brute force over pairs of columns); every storing policy."""
    model, _ = family_model
    checked = {"partial": 0, "extra": 0}
    for name in STORING:
        _check_twins(model, get_policy(name, twins=True, refresh=4), checked)
    assert checked["partial"] >= 40 and checked["extra"] > 0


def _check_twins(model, policy, checked):
    def check(state, rows, scored, out):
        if out is None:
            return
        x = state.x[rows]
        changed = x != policy.seen[rows]
        rule = policy._columns(state, rows, changed, scored) | policy._full(state, rows)[:, None]
        for k in range(len(rows)):
            row = x[k].tolist()
            moved = [c for c in range(len(row)) if changed[k, c]]
            twins = {c for c in range(len(row)) for d in moved if row[c] == row[d]}
            want = set(rule[k].nonzero().flatten().tolist()) | twins
            assert set(out[k].tolist()) == want, (state.global_step, int(rows[k]))
            checked["partial"] += 1
            checked["extra"] += len(twins - set(rule[k].nonzero().flatten().tolist()))

    on_plans(policy, check)
    # prompts that repeat tokens, so a commit's twins include prompt columns
    dllm.generate(model, None, TWIN_PROMPTS, cache=policy, gen_length=12, block_length=6, steps=12,
                  sampler="low_confidence")


def test_same_token_columns_brute_force():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 6, (5, 13), generator=g)
    marked = torch.rand(5, 13, generator=g) < 0.2
    marked[2] = False                                       # a row with nothing marked
    got = same_token_columns(x, marked)
    for b in range(5):
        ids = {int(x[b, c]) for c in range(13) if marked[b, c]}
        assert got[b].tolist() == [int(t) in ids for t in x[b]]
    assert not got[2].any() and got.any()


def test_width_groups_split_wide_from_narrow_rows():
    """Brute force over random plans: the rows whose plan needs at most half the padded width run
    in their own forward, at the width they need; a plan of one kind of row stays one forward."""
    from dllm.cache import plan_columns
    from dllm.decode import _width_groups
    g = torch.Generator().manual_seed(0)
    L = 23
    for trial in range(200):
        B = int(torch.randint(1, 7, (1,), generator=g))
        share = torch.rand(B, 1, generator=g) * torch.rand(1, generator=g)
        need = torch.rand(B, L, generator=g) < share
        need[torch.rand(B, generator=g) < 0.3] = True                    # some rows refresh everything
        plan = plan_columns(need)
        P = plan.shape[1]
        counts = [max(int(r.sum()), 1) for r in need]
        narrow = [c <= P // 2 for c in counts]
        groups = _width_groups(plan)
        if B < 2 or all(narrow) or not any(narrow):
            assert groups is None, (trial, counts)
            continue
        (wide_rows, wide_w), (narrow_rows, narrow_w) = groups
        assert wide_rows.tolist() == [b for b in range(B) if not narrow[b]] and wide_w == P
        assert narrow_rows.tolist() == [b for b in range(B) if narrow[b]]
        assert narrow_w == max(c for c, n in zip(counts, narrow) if n)
        for b in narrow_rows.tolist():                                    # the trimmed plan keeps every column
            assert set(plan[b, :narrow_w].tolist()) == set(need[b].nonzero().flatten().tolist() or [0])


def test_twins_forced_to_refresh_every_step_equal_no_cache(family_model):
    model, tok = family_model
    for name in ("low_confidence", "threshold"):
        base = _generate(model, tok, TWIN_PROMPTS, **_kwargs(name, None))
        for policy in STORING:
            out = _generate(model, tok, TWIN_PROMPTS, cache=policy, cache_kwargs={"refresh": 1, "twins": True},
                            **_kwargs(name, None))
            assert torch.equal(out.sequences, base.sequences), (policy, name)


def _guard_run(model, policy_name, guard, sampler):
    """Decode PROMPTS with `policy_name` (refresh 4) and `guard`; returns (output, policy, checked),
    checking at every step that the plan is a full refresh exactly for the rows the policy's own
    schedule refreshes or whose best candidate was unsure. The confidences are recorded here,
    column by column, from what the loop passes to `observe`; a column never scored counts as 0."""
    policy = storing_policy(policy_name, refresh=4, guard=guard)
    seen: dict[tuple[int, int], float] = {}
    inner_observe = policy.observe
    checked = {"guarded": 0, "partial": 0, "best": []}

    def observe(state, rows, positions, valid, prob):
        for k, r in enumerate(rows.tolist()):
            for q in range(positions.shape[1]):
                if valid[k, q]:
                    seen[(r, int(positions[k, q]))] = float(prob[k, q])
        inner_observe(state, rows, positions, valid, prob)

    def check(state, rows, scored, out):
        periodic = policy._full(state, rows)
        L = state.length
        for k, r in enumerate(rows.tolist()):
            cand = [c for c in range(L) if scored[k, c] and state.x[r, c] == state.ids.mask]
            best = max((seen.get((r, c), 0.0) for c in cand), default=None)
            unsure = best is not None and best < guard
            if best is not None and not bool(periodic[k]):
                checked["best"].append(best)
            full = out is None or set(out[k].tolist()) == set(range(L))
            if bool(periodic[k]) or unsure:
                assert full, (state.global_step, r)
                checked["guarded"] += int(unsure and not bool(periodic[k]))
            else:
                assert out is not None and len(set(out[k].tolist())) < L, (state.global_step, r)
                checked["partial"] += 1

    policy.observe = observe
    on_plans(policy, check)
    out = dllm.generate(model, None, PROMPTS, cache=policy, gen_length=16, block_length=8, steps=16,
                        sampler=sampler, sampler_kwargs={"tau": 0.3} if sampler == "threshold" else {})
    return out, policy, checked


@pytest.mark.parametrize("sampler", ["low_confidence", "threshold"])
def test_guard_refreshes_the_rows_whose_best_candidate_was_unsure(family_model, sampler):
    """With a guard, a row's step is a full refresh when its own schedule says so or when none of
    the masked columns scored now was `guard` confident at its last scoring; every storing policy,
    ragged batch. The guard sits at the median of the best confidences a run without it sees at
    its partial steps, so both branches are taken."""
    model, _ = family_model
    for name in STORING:
        _, probe, seen = _guard_run(model, name, 0.0, sampler)
        guard = float(torch.tensor(seen["best"]).median())
        _, policy, checked = _guard_run(model, name, guard, sampler)
        assert checked["guarded"] > 0 and checked["partial"] > 0, (name, checked)
        assert int(policy.guarded.sum()) == checked["guarded"], name
        assert int(probe.guarded.sum()) == 0, name


def test_guard_zero_changes_nothing_and_guard_one_equals_no_cache(family_model):
    """guard=0 never refreshes (same tokens and refresh counts as no guard); on a random model no
    candidate is certain, so guard=1 refreshes every step and the tokens equal `none`."""
    model, tok = family_model
    for name in ("low_confidence", "threshold"):
        base = _generate(model, tok, PROMPTS, **_kwargs(name, None))
        for policy in STORING:
            plain, zero, one = (get_policy(policy) if g == "plain" else get_policy(policy, guard=g)
                                for g in ("plain", 0.0, 1.0))
            outs = [_generate(model, tok, PROMPTS, cache=p, **_kwargs(name, None)) for p in (plain, zero, one)]
            assert torch.equal(outs[0].sequences, outs[1].sequences), (policy, name)
            assert torch.equal(plain.refreshes, zero.refreshes) and int(zero.guarded.sum()) == 0
            assert int(one.partial_steps.sum()) == 0 and int(one.guarded.sum()) > 0, (policy, name)
            assert torch.equal(outs[2].sequences, base.sequences), (policy, name)
    for name, cls, base in _each_sampler(model, tok):  # every sampler feeds the guard its confidences
        policy = get_policy("dkv-decode", guard=1.0)
        out = _generate(model, tok, PROMPTS, cache=policy, **_kwargs(name, cls))
        assert torch.equal(out.sequences, base.sequences), name
        if name != "llada21":   # an editing sampler's post steps score no mask: the guard doubts nothing there
            assert int(policy.partial_steps.sum()) == 0, name


def test_prefix_and_dual_recompute_the_block_and_follow_moved_ends(family_model):
    """Full refresh at each row's block start, then `dual` recomputes [start, end) (read at each
    step, so a moved end is followed) and `prefix` [start, L) (the loop adds the scored columns'
    sources: on Dream the column left of a scored block start, which the Fast-dLLM loop tests
    check). Rows sit in different blocks; finished rows drop out."""
    model, _ = family_model
    for name in ("dual", "prefix"):
        for sampler in (MovingEnd(), FillAllAtStep2()):
            policy = get_policy(name)
            log = recording(policy)
            out = dllm.generate(model, None, PROMPTS, gen_length=16, block_length=4, sampler=sampler, cache=policy)
            L = out.sequences.shape[1]
            seen_rows = set()
            for e in log:
                for k, r in enumerate(e["rows"].tolist()):
                    seen_rows.add(r)
                    got = plan_sets(e)[k]
                    s, end = int(e["block_start"][k]), int(e["block_end"][k])
                    if int(e["step_in_block"][k]) == 0:
                        assert got == set(range(L))
                    elif name == "dual":
                        assert got == set(range(s, end)), (e["step"], r)
                    else:
                        assert got == set(range(s, L)), (e["step"], r)
            if isinstance(sampler, MovingEnd):
                assert any(int(e["block_end"][k] - e["block_start"][k]) == 8 and int(e["step_in_block"][k]) > 0
                           for e in log for k in range(len(e["rows"])))
            else:
                assert out.nfe[0] == 3 and out.nfe[1] > 3 and len(log[-1]["rows"]) < 3


def test_window_columns_nearest_masks_left_first():
    L = 12
    masked = torch.zeros(1, L, dtype=torch.bool)
    masked[0, [2, 3, 4, 6, 7, 8, 9, 10, 11]] = True
    due = torch.zeros(1, L, dtype=torch.bool)
    due[0, [4, 9]] = True
    chosen = due.clone()
    chosen[0, 5] = True                                     # committed at the last step
    got = window_columns(chosen, due, masked, 3)
    # around 4: 3 (left, 1), then 2 (left, 2) before 6 (right, 2); around 9: 8, 10, then 7.
    assert got[0].nonzero().flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert torch.equal(window_columns(chosen, due, masked, 0), chosen)
    # fewer free masks than the window: all of them
    assert window_columns(chosen, due, masked, 50)[0].nonzero().flatten().tolist() == list(range(2, 12))


def _window_columns_plain(chosen, due, masked, window):
    """dKV-Cache-Greedy's window search as stated: each due column in turn takes the `window`
    free masked columns nearest to it, the left one first on equal distance."""
    chosen = chosen.clone()
    B, L = chosen.shape
    for r in range(B):
        for p in range(L):
            if due[r, p]:
                free = [c for c in range(L) if masked[r, c] and not chosen[r, c]]
                for c in sorted(free, key=lambda c: (abs(c - p), c > p))[:window]:
                    chosen[r, c] = True
    return chosen


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_window_columns_equal_the_plain_search(window, seed):
    g = torch.Generator().manual_seed(seed)
    B, L = 4, 37
    masked = torch.rand(B, L, generator=g) < 0.6
    due = masked & (torch.rand(B, L, generator=g) < 0.3)
    chosen = due | (torch.rand(B, L, generator=g) < 0.1)
    due[1] = False                                          # a row with nothing due
    got = window_columns(chosen, due, masked, window)
    assert torch.equal(got, _window_columns_plain(chosen, due, masked, window))


def test_dkv_greedy_recomputes_scored_last_commits_and_a_window(family_model):
    model, _ = family_model
    policy = get_policy("dkv-greedy", refresh=3, window=2)
    log = recording(policy)
    dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, steps=16, sampler="low_confidence",
                  cache=policy)
    prev = {}
    partial = windowed = 0
    for e in log:
        got = plan_sets(e)
        for k, r in enumerate(e["rows"].tolist()):
            x = e["x"][r]
            if int(e["step_in_block"][k]) % 3 == 0:
                assert got[k] == set(range(x.shape[0]))
            else:
                partial += 1
                changed = (x != prev[r]).unsqueeze(0)
                masked = (x == model.config.mask_token_id).unsqueeze(0)
                masked[:, :e["gen_start"]] = False
                scored = e["scored"][k:k + 1]
                want = window_columns(scored | changed, scored, masked, 2)[0].nonzero().flatten().tolist()
                assert got[k] == set(want)
                assert changed.sum() == 1
                windowed += len(want) > int((scored | changed).sum())
            prev[r] = x
    assert partial >= 10 and windowed >= 5


# -- cache contents -------------------------------------------------------------------------------
def _fresh_kv(model, x, position_ids, key_valid):
    kv = KVCache.for_model(model, x.shape[0], x.shape[1])
    model(x, None, position_ids=position_ids, key_valid=key_valid, cache=kv)
    return kv


@pytest.mark.parametrize("sampler", ["test-fill-all", "threshold"])
@pytest.mark.parametrize("policy_name", STORING)
def test_cache_contents_after_every_step(family_model, policy_name, sampler):
    """After each step: a full refresh leaves every layer equal to a fresh full forward of the canvas
    that step saw; a partial step rewrites exactly the recomputed columns (plan, scored columns and,
    on Dream, their left neighbours) and leaves every other column, and every finished row, as it
    was; layer 0 of a rewritten column holds the K/V of its token at that step (layer 0 depends on
    nothing else)."""
    model, _ = family_model
    shift = model.config.logit_shift
    policy = storing_policy(policy_name)
    log = recording(policy)
    snaps = []
    if sampler == "threshold" and sampler not in samplers.available():
        pytest.skip("the threshold sampler is not registered")
    kw = dict(sampler="threshold", sampler_kwargs={"tau": 0.2}) if sampler == "threshold" else \
        dict(sampler=FillAllAtStep2())
    def on_step(state):
        snaps.append(([k.clone() for k in policy.kv.k], [v.clone() for v in policy.kv.v]))

    dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, cache=policy, on_step=on_step, **kw)
    assert len(snaps) == len(log) >= 6
    full_steps = partial_steps = 0
    for t, e in enumerate(log):
        fresh = _fresh_kv(model, e["x"], e["position_ids"], e["key_valid"])
        k_now, v_now = snaps[t]
        rows = e["rows"].tolist()
        for k_idx, r in enumerate(rows):
            cols = sorted(plan_sets(e)[k_idx] | set(e["scored"][k_idx].nonzero().flatten().tolist()))
            if shift:
                cols = sorted(set(cols) | {c - 1 for c in e["scored"][k_idx].nonzero().flatten().tolist() if c > 0})
            if len(cols) == e["x"].shape[1]:
                full_steps += 1
                for layer in range(len(k_now)):
                    torch.testing.assert_close(k_now[layer][r], fresh.k[layer][r], atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(v_now[layer][r], fresh.v[layer][r], atol=1e-5, rtol=1e-5)
                continue
            partial_steps += 1
            other = sorted(set(range(e["x"].shape[1])) - set(cols))
            k_before, v_before = snaps[t - 1]
            for layer in range(len(k_now)):
                assert torch.equal(k_now[layer][r][:, other], k_before[layer][r][:, other]), (t, r, layer)
                assert torch.equal(v_now[layer][r][:, other], v_before[layer][r][:, other]), (t, r, layer)
            torch.testing.assert_close(k_now[0][r][:, cols], fresh.k[0][r][:, cols], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v_now[0][r][:, cols], fresh.v[0][r][:, cols], atol=1e-5, rtol=1e-5)
        for r in set(range(len(PROMPTS))) - set(rows):          # finished rows are frozen
            for layer in range(len(k_now)):
                assert torch.equal(k_now[layer][r], snaps[t - 1][0][layer][r])
    assert full_steps >= 3 and partial_steps >= 3


@pytest.mark.parametrize("policy_name, kwargs, span", [("dkv-greedy", {}, 0.1), ("dkv-decode", {}, 0.2),
                                                        ("dual", {"refresh": 3}, 0.2), ("prefix", {"refresh": 3}, 0.2)])
def test_no_forward_that_hides_nothing_reads_kv_of_a_cut_canvas(policy_name, kwargs, span):
    """SlowFast's fast-phase forwards hide the keys after the span (`Sampler.key_end`): the K/V they
    store are of a cut canvas. Every forward that hides nothing first rewrites each column such a
    forward wrote (found by comparing the stored K/V of every layer before and after each step)."""
    if "slowfast" not in samplers.available():
        pytest.skip("the slowfast sampler is not registered")
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), "sdpa", seed=1, init_std=0.3)
    assert model.config.n_layers >= 2          # layer 0's K/V depend on the token alone
    policy = get_policy(policy_name, **kwargs)
    sampler = samplers.get("slowfast", span_threshold=span, high_threshold=0.5, explore_steps=2, window=2,
                           std_threshold=100.0)
    asked = {}
    inner = sampler.key_end

    def key_end(state, rows):
        asked["rows"], asked["end"] = rows.clone(), inner(state, rows)
        return asked["end"]
    sampler.key_end = key_end
    last, cut_steps, clean_reads = {}, 0, 0

    def on_step(state):
        nonlocal cut_steps, clean_reads
        now = torch.stack([torch.stack(policy.kv.k), torch.stack(policy.kv.v)])      # (2, layers, B, H, L, D)
        before = last.get("kv", torch.full_like(now, float("nan")))
        written = (now != before).any(-1).any(-2).any(1).any(0)                          # (B, L)
        tainted = last.setdefault("tainted", torch.zeros_like(written))                 # written by a cut forward
        refreshes = last.get("refreshes", torch.zeros_like(policy.refreshes))
        for r, end in zip(asked["rows"].tolist(), asked["end"].tolist()):
            if end < state.length:
                cut_steps += 1
                assert not written[r, end:].any(), (state.global_step, r)       # nothing past the cut is stored
                assert policy.refreshes[r] == refreshes[r]                      # and it is not a full refresh
                tainted[r] |= written[r]
            else:
                clean_reads += bool(tainted[r].any())
                assert not (tainted[r] & ~written[r]).any(), (state.global_step, r)
                tainted[r] = False
        last["kv"], last["refreshes"] = now.clone(), policy.refreshes.clone()
    dllm.generate(model, None, [[5, 17, 33, 2, 90, 41, 7], [64, 3]], gen_length=32, block_length=16,
                  sampler=sampler, cache=policy, on_step=on_step)
    assert cut_steps >= 2 and clean_reads >= 1


def test_dkv_decode_stores_a_commit_one_step_late(llada):
    """A token committed at step t is stored with the mask's K/V until step t+1 recomputes it with its
    real id; from then on its K/V stay as step t+1 wrote them (until a refresh)."""
    model, _ = llada
    policy = get_policy("dkv-decode", refresh=100, warmup=1)    # one full forward, then partial steps only
    log = recording(policy)
    snaps = []
    out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=8, steps=8, sampler="low_confidence",
                        cache=policy, trace=True, on_step=lambda s: snaps.append([k.clone() for k in policy.kv.k]))
    assert out.forwards == 8
    g0 = log[0]["gen_start"]
    checked = 0
    for t in range(1, 7):
        fresh_t = _fresh_kv(model, log[t]["x"], log[t]["position_ids"], log[t]["key_valid"])
        fresh_prev = _fresh_kv(model, log[t - 1]["x"], log[t]["position_ids"], log[t]["key_valid"])
        for r in range(len(PROMPTS)):
            for j in (out.trace[r] == t - 1).nonzero().flatten().tolist():
                c = g0 + j
                # after step t-1 (its commit step): still the mask's K/V
                torch.testing.assert_close(snaps[t - 1][0][r][:, c], fresh_prev.k[0][r][:, c], atol=1e-5, rtol=1e-5)
                assert not torch.allclose(snaps[t - 1][0][r][:, c], fresh_t.k[0][r][:, c], atol=1e-3)
                # after step t: the token's own K/V, kept unchanged afterwards
                torch.testing.assert_close(snaps[t][0][r][:, c], fresh_t.k[0][r][:, c], atol=1e-5, rtol=1e-5)
                for later in range(t + 1, 8):
                    for layer in range(len(snaps[t])):
                        assert torch.equal(snaps[later][layer][r][:, c], snaps[t][layer][r][:, c])
                checked += 1
    assert checked >= 12


def test_a_policy_instance_serves_many_requests(llada):
    """setup() is idempotent: one instance, reused across batch sizes and lengths, decodes as fresh
    instances do, and its buffers follow the request's shape."""
    model, _ = llada
    shared = get_policy("dkv-decode", refresh=3)
    for rows, gen in ((PROMPTS, 8), (PROMPTS[:1], 12), (PROMPTS, 8)):
        kw = dict(gen_length=gen, block_length=4, steps=gen, sampler="low_confidence")
        a = dllm.generate(model, None, rows, cache=shared, **kw)
        b = dllm.generate(model, None, rows, cache=get_policy("dkv-decode", refresh=3), **kw)
        assert torch.equal(a.sequences, b.sequences)
        assert shared.kv.shape[0] == len(rows) and shared.kv.shape[2] == a.sequences.shape[1]


# -- command line ---------------------------------------------------------------------------------
def test_cli_cache_flags(llada_dir, capsys):
    args = ["generate", "--model", str(llada_dir), "hello", "a longer prompt", "--gen-length", "8",
            "--block-length", "4", "--steps", "8", "--dtype", "float32"]
    assert main(args + ["--cache", "dkv-decode", "--cache-arg", "refresh=2"]) == 0
    out, err = capsys.readouterr()
    model, tok = dllm.load(llada_dir, dtype="float32")
    want = dllm.generate(model, tok, ["hello", "a longer prompt"], gen_length=8, block_length=4, steps=8,
                         cache="dkv-decode", cache_kwargs={"refresh": 2})
    assert out == "".join(t + "\n" for t in want.texts) and "cache dkv-decode" in err

    assert main(args + ["--cache", "dual", "--cache-arg", "twins=true"]) == 0
    want = dllm.generate(model, tok, ["hello", "a longer prompt"], gen_length=8, block_length=4, steps=8,
                         cache="dual", cache_kwargs={"twins": True})
    out, err = capsys.readouterr()
    assert out == "".join(t + "\n" for t in want.texts) and "cache dual" in err
    assert main(args + ["--cache", "dual", "--cache-arg", "twins=2"]) == 2
    assert "cache 'dual': twins must be true or false, got 2" in capsys.readouterr()[1]

    assert main(args + ["--cache", "dual2"]) == 2
    assert "unknown cache policy 'dual2'; valid options: block, dkv-decode, dkv-greedy, dual, none, prefix" in \
        capsys.readouterr()[1]
    assert main(args + ["--cache", "dual", "--cache-arg", "refresh=0"]) == 2
    assert "cache policy 'dual': refresh must be an integer >= 1 or None, got 0" in capsys.readouterr()[1]
    assert main(args + ["--cache", "dual", "--cfg-scale", "1"]) == 2
    assert "cfg_scale 1.0 > 0 is not supported with cache policy 'dual'" in capsys.readouterr()[1]


def _filled_kv(rows: int, length: int = 6, seed: int = 0) -> KVCache:
    kv = KVCache(n_layers=2, batch=rows, n_kv_heads=2, length=length, head_dim=3, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    for t in kv.k + kv.v:
        t.copy_(torch.randn(t.shape, generator=g))
    return kv


def _rows_of(kv: KVCache) -> list[torch.Tensor]:
    return [t.clone() for t in kv.k + kv.v]


def test_kv_keep_rows_moves_rows_in_place_when_they_fill_from_the_end():
    kv = _filled_kv(5)
    before, base = _rows_of(kv), kv.k[0].data_ptr()
    kept = kv.keep_rows([0, 4, 2])                 # row 1 and 3 leave; row 4 takes row 1's place
    assert kept.k[0].shape[0] == 3 and kept.k[0].data_ptr() == base
    for got, full in zip(kept.k + kept.v, before):
        assert torch.equal(got, full[[0, 4, 2]])
    shuffled = _filled_kv(5).keep_rows([2, 0])     # row 0 moves behind row 2: new buffers
    for got, full in zip(shuffled.k + shuffled.v, _rows_of(_filled_kv(5))):
        assert torch.equal(got, full[[2, 0]])


def test_kv_append_writes_into_spare_rows_or_new_buffers():
    kv, other = _filled_kv(5), _filled_kv(2, length=4, seed=1)
    mine, theirs = _rows_of(kv), _rows_of(other)
    kept = kv.keep_rows([0, 4, 2])
    joined = kept.append(other, 0, 2)                 # 3 + 2 rows fit in the 5 the buffers hold
    assert joined.k[0].data_ptr() == kv.k[0].data_ptr() and joined.k[0].shape[0] == 5
    for got, full, new in zip(joined.k + joined.v, mine, theirs):
        padded = torch.cat([new.new_zeros(2, 2, 2, 3), new], 2)
        assert torch.equal(got, torch.cat([full[[0, 4, 2]], padded]))
    grown = joined.append(_filled_kv(1, seed=2), 0, 0)   # no spare row left: new buffers
    assert grown.k[0].shape[0] == 6 and grown.k[0].data_ptr() != kv.k[0].data_ptr()
    assert torch.equal(grown.k[1][:5], joined.k[1]) and torch.equal(grown.v[0][5:], _filled_kv(1, seed=2).v[0])


def test_fill_from_the_end_keeps_rows_in_place_and_fills_the_gaps_in_order():
    from itertools import combinations

    from dllm.decode import fill_from_the_end

    assert fill_from_the_end([0, 2, 3, 5]) == [0, 5, 2, 3]
    assert fill_from_the_end([3, 4]) == [3, 4] and fill_from_the_end([]) == []
    for size in range(7):
        for kept in map(list, combinations(range(7), size)):
            order = fill_from_the_end(kept)
            assert sorted(order) == kept
            assert all(order[j] == j for j in range(size) if j in kept)
            assert all(r >= size for j, r in enumerate(order) if r != j)


def test_the_hidden_key_flag_follows_its_rows_when_rows_leave():
    """`hidden_kv` is per-row state: rows leaving a batch (`keep_rows`) take their flags along."""
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), "sdpa", seed=0)
    policy = get_policy("dual")
    from dllm.decode import build_state
    state = build_state(model, [[5, 6], [7, 8], [9, 10]], dllm.GenerationConfig(gen_length=8), 8)
    policy.setup(state, model)
    policy.hidden_kv = torch.tensor([False, True, False])
    policy.keep_rows(torch.tensor([1, 2]), [1, 2])
    assert policy.hidden_kv.tolist() == [True, False]


def test_observed_confidences_land_on_their_columns_and_padding_changes_nothing():
    """`observe` writes without a host read: padding entries (column 0) leave column 0 as the step
    leaves it, the new confidence where column 0 was scored, the stored one elsewhere."""
    policy = get_policy("dkv-decode", guard=0.5)
    policy.confidence = torch.full((3, 5), 7.0)
    positions = torch.tensor([[0, 3, 0], [2, 0, 0], [1, 4, 0]])
    valid = torch.tensor([[True, True, False], [True, False, False], [True, True, False]])
    prob = torch.tensor([[0.1, 0.2, 0.9], [0.3, 0.9, 0.9], [0.4, 0.5, 0.9]], dtype=torch.float64)
    policy.observe(None, torch.tensor([0, 2]), positions[:2], valid[:2], prob[:2])
    want = torch.full((3, 5), 7.0)
    want[0, 0], want[0, 3], want[2, 2] = 0.1, 0.2, 0.3
    assert torch.equal(policy.confidence, want)

