"""Samplers of the methods on the ParallelBench leaderboard against independent transcriptions of
their published loops (tests/reference/leaderboard_ref.py), on the tiny LLaDA checkpoint: one
prompt and a ragged batch, token for token at temperature 0. The loop invariants of every
registered sampler are checked in test_samplers_parallel.py."""
from __future__ import annotations

import pytest
import torch

import dllm
from dllm import samplers
from dllm.samplers.dus import dilated_groups
from tests.reference.leaderboard_ref import (dus_levels_ref, dus_ref, klass_ref, parallelbench_topk_ref, rcr_ref, remdm_ref,
                                            slowfast_ref,
                                            wino_ref)
from tests.test_generate import PROMPTS, PROMPTS4, _batch, llada_logits_fn

TOPK = {"low_confidence": "confidence", "margin_topk": "margin", "entropy_topk": "entropy",
        "left_to_right": "left_to_right"}
TOPK_CASES = [(16, 16, 16), (16, 16, 4), (20, 10, 6), (15, 5, 3)]   # (gen_length, block_length, steps)


def _raw_logits_fn(model):
    """The model's logits as they are: ParallelBench's loop sets the mask column to -inf itself."""
    def fn(x, attention_mask):
        return model(x, key_valid=None if attention_mask is None else attention_mask.bool())
    return fn


@pytest.mark.parametrize("name", sorted(TOPK))
@pytest.mark.parametrize("gen,block,steps", TOPK_CASES, ids=str)
def test_parallelbench_topk_equal_reference(llada, name, gen, block, steps):
    model, _ = llada
    for rows in ([PROMPTS[0]], PROMPTS4):
        ids, mask = _batch(rows, model.config.pad_token_id)
        want = parallelbench_topk_ref(_raw_logits_fn(model), ids, mask, steps=steps, gen_length=gen,
                                      block_length=block, score=TOPK[name], mask_id=model.config.mask_token_id)
        out = dllm.generate(model, None, rows, gen_length=gen, block_length=block, steps=steps, sampler=name)
        assert torch.equal(out.sequences, want), (name, out.sequences, want)
        assert out.nfe == [steps] * len(rows)


def test_left_to_right_one_token_per_step_writes_in_order(llada):
    model, _ = llada
    seen = []
    out = dllm.generate(model, None, PROMPTS, gen_length=12, block_length=12, steps=12, sampler="left_to_right", trace=True,
                        on_step=lambda s: seen.append(s.is_mask[:, s.gen_start:s.gen_end].clone()))
    for t, masked in enumerate(seen):
        assert masked[:, :t + 1].logical_not().all() and masked[:, t + 1:].all()
    assert out.trace[0].tolist() == list(range(12))


@pytest.mark.parametrize("K", [1, 2, 3, 5, 7, 8, 12, 16, 24, 27, 31, 32, 33, 64, 65, 81])
@pytest.mark.parametrize("base,skip", [(1, 1), (2, 1), (2, 2), (3, 1), (4, 1), (2, 3)])
def test_dilated_groups_partition_and_equal_reference(K, base, skip):
    groups = dilated_groups(K, base, skip)
    assert sorted(o for g in groups for o in g) == list(range(K))
    assert groups == [[p - 100 for p in level] for level in dus_levels_ref(100, 100 + K - 1, base, skip)]


def test_dilated_groups_published_examples():
    assert dilated_groups(8) == [[0, 4], [2, 6], [1, 3, 5, 7]]
    assert [len(g) for g in dilated_groups(32)] == [2, 2, 4, 8, 16]
    assert [len(g) for g in dilated_groups(24)] == [2, 2, 4, 16]
    assert [len(g) for g in dilated_groups(32, 4)] == [4, 12, 16]


@pytest.mark.parametrize("gen,block,base,skip", [(16, 16, 2, 1), (16, 8, 2, 1), (24, 8, 2, 1), (18, 6, 3, 1),
                                                  (16, 16, 2, 2), (12, 12, 1, 1), (20, 5, 2, 1)])
def test_dus_equals_reference_alone_and_in_a_ragged_batch(llada, gen, block, base, skip):
    model, _ = llada
    kw = dict(gen_length=gen, block_length=block, sampler="dus", sampler_kwargs=dict(base=base, base_skip=skip))
    batch = dllm.generate(model, None, PROMPTS4, **kw)
    lp = max(map(len, PROMPTS4))
    for b, row in enumerate(PROMPTS4):
        want, forwards = dus_ref(llada_logits_fn(model), torch.tensor([row]), gen_length=gen, block_length=block,
                                 mask_id=model.config.mask_token_id, base=base, skip=skip)
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), b
        assert batch.nfe[b] == forwards == gen // block * len(dilated_groups(block, base, skip))


@pytest.mark.parametrize("name,kwargs,message", [
    ("dus", dict(base=0), "sampler 'dus': base must be >= 1, got 0"),
    ("dus", dict(base=2.0), "sampler 'dus': base must be an integer, got 2.0"),
    ("dus", dict(base_skip=0), "sampler 'dus': base_skip must be >= 1, got 0"),
    ("left_to_right", dict(k=2), "sampler 'left_to_right' has no argument"),
    ("klass", dict(conf_threshold=1.5), "sampler 'klass': conf_threshold must be <= 1, got 1.5"),
    ("klass", dict(kl_threshold=-0.1), "sampler 'klass': kl_threshold must be >= 0, got -0.1"),
    ("klass", dict(kl_history_length=0), "sampler 'klass': kl_history_length must be >= 1, got 0"),
])
def test_bad_arguments_are_clear_errors(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        samplers.get(name, **kwargs)


def test_dus_refuses_a_partial_last_block(llada):
    model, _ = llada
    with pytest.raises(ValueError, match="sampler 'dus': gen_length 12 must be a multiple of block_length 8"):
        dllm.generate(model, None, PROMPTS, gen_length=12, block_length=8, sampler="dus")


KLASS_CASES = [  # (model, gen_length, block_length, conf_threshold, kl_threshold, history)
    ("llada", 16, 16, 0.9, 0.01, 2), ("llada", 12, 4, 0.0, 1.0, 3), ("peaked", 16, 16, 0.9, 0.01, 2),
    ("peaked", 16, 8, 0.5, 0.05, 2), ("peaked", 20, 10, 0.3, 0.5, 1),
]


@pytest.mark.parametrize("which,gen,block,conf,kl,history", KLASS_CASES, ids=str)
def test_klass_equals_reference_alone_and_in_a_ragged_batch(request, which, gen, block, conf, kl, history):
    model = request.getfixturevalue("llada")[0] if which == "llada" else request.getfixturevalue("peaked_llada")
    args = dict(conf_threshold=conf, kl_threshold=kl, kl_history_length=history)
    batch = dllm.generate(model, None, PROMPTS4, gen_length=gen, block_length=block, steps=gen, sampler="klass",
                          sampler_kwargs=args)
    lp = max(map(len, PROMPTS4))
    for b, row in enumerate(PROMPTS4):
        want, forwards = klass_ref(llada_logits_fn(model), torch.tensor([row]), steps=gen, gen_length=gen,
                                   block_length=block, mask_id=model.config.mask_token_id, conf_threshold=conf,
                                   kl_threshold=kl, history=history)
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), b
        assert batch.nfe[b] == forwards, b


def test_klass_fallback_commits_no_more_than_the_masks_left():
    """steps < gen_length: ready commits (3) beyond the schedule's count leave one mask where the
    next fallback counts 2. The published top-k would also write a column holding no mask (a later
    block's, here 10, whose prediction flips); KLASS commits the mask alone, as klass_ref now does."""
    from tests.test_samplers_parallel import ScriptedModel

    V, mask = 320, 310

    def full_logits(x):
        B, L = x.shape
        out = torch.zeros(B, L, V)
        rows = torch.arange(B)
        out[:, 0, 20] = 12.0
        out[:, 3:5, 10] = 12.0                                    # confidence ~0.99
        out[:, 5:8, 11] = 8.8                                     # ~0.95
        out[:, 8, 12] = 5.77                                      # ~0.5
        for c in range(9, 15):
            out[rows, c, torch.where(x[:, 0] == 1, 30, 31)] = 12.0
        out[:, 10, :] = 0.0
        out[rows, 10, torch.where(x[:, 8] == mask, 40, 30)] = 12.0
        return out

    model = ScriptedModel(logits_fn=lambda x, cols, V_: full_logits(x).gather(1, cols[..., None].expand(-1, -1, V_)))
    kw = dict(conf_threshold=0.9, kl_threshold=0.01, kl_history_length=1)
    out = dllm.generate(model, None, [[1, 2, 3]], gen_length=12, block_length=6, steps=6, sampler="klass",
                        sampler_kwargs=kw, score_dtype="float64")
    want, forwards = klass_ref(lambda x, at: full_logits(x), torch.tensor([[1, 2, 3]]), steps=6, gen_length=12,
                               block_length=6, mask_id=mask, conf_threshold=0.9, kl_threshold=0.01, history=1)
    assert out.sequences[0].tolist() == want[0].tolist() == [1, 2, 3, 10, 10, 11, 11, 11, 12] + [30] * 6
    assert out.nfe[0] == forwards


def test_klass_commits_early_when_the_distributions_settle(peaked_llada):
    out = dllm.generate(peaked_llada, None, PROMPTS, gen_length=16, block_length=16, steps=16, sampler="klass",
                        sampler_kwargs=dict(conf_threshold=0.5, kl_threshold=0.05))
    never = dllm.generate(peaked_llada, None, PROMPTS, gen_length=16, block_length=16, steps=16, sampler="klass",
                          sampler_kwargs=dict(kl_threshold=0.0))
    assert min(out.nfe) < 16 and never.nfe == [16] * len(PROMPTS)
    assert torch.equal(never.sequences, dllm.generate(peaked_llada, None, PROMPTS, gen_length=16, block_length=16,
                                                      steps=16, sampler="low_confidence").sequences)


SLOWFAST_CASES = [  # (model, gen_length, block_length, sampler arguments)
    ("peaked", 16, 16, {}), ("peaked", 24, 8, dict(explore_steps=2, span_threshold=0.1, high_threshold=0.5)),
    ("llada", 16, 16, {}), ("llada", 20, 10, dict(explore_steps=3, window=3, std_threshold=2.0, high_threshold=0.3)),
    ("llada", 24, 8, dict(explore_steps=2, span_threshold=0.0)),    # spans to the block end: later blocks hidden
]


@pytest.mark.parametrize("which,gen,block,args", SLOWFAST_CASES, ids=str)
def test_slowfast_equals_reference_alone_and_in_a_ragged_batch(request, monkeypatch, which, gen, block, args):
    model = request.getfixturevalue("llada")[0] if which == "llada" else request.getfixturevalue("peaked_llada")
    cut = []
    real = samplers.sampler_class("slowfast").key_end
    monkeypatch.setattr(samplers.sampler_class("slowfast"), "key_end",
                        lambda self, state, rows: (cut.append(out := real(self, state, rows)) and False) or
                        (cut.__setitem__(-1, bool((out < state.length).any())) or out))
    batch = dllm.generate(model, None, PROMPTS4, gen_length=gen, block_length=block, sampler="slowfast",
                          sampler_kwargs=args)
    names = dict(explore_steps="explore", span_threshold="tau_min", high_threshold="tau_high", window="window",
                 std_threshold="std_max")
    lp = max(map(len, PROMPTS4))
    for b, row in enumerate(PROMPTS4):
        want, forwards, idle = slowfast_ref(llada_logits_fn(model), torch.tensor([row]), gen_length=gen,
                                            block_length=block, mask_id=model.config.mask_token_id,
                                            **{names[k]: v for k, v in args.items()})
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), b
        assert batch.nfe[b] == forwards - idle, b
    if args.get("span_threshold") == 0.0:
        assert any(cut)     # fast phases ran forwards with the keys after their span hidden


def test_slowfast_arguments_are_checked():
    with pytest.raises(ValueError, match="sampler 'slowfast': window 4 must be <= explore_steps 3"):
        samplers.get("slowfast", explore_steps=3, window=4)
    with pytest.raises(ValueError, match="sampler 'slowfast': high_threshold must be <= 1, got 2"):
        samplers.get("slowfast", high_threshold=2)


def test_slowfast_takes_a_std_threshold_given_as_a_huge_integer(llada):
    model, _ = llada
    kw = dict(gen_length=8, block_length=8, sampler="slowfast")
    huge = dllm.generate(model, None, [[1, 2]], sampler_kwargs={"std_threshold": 10 ** 30}, **kw)
    assert torch.equal(huge.sequences, dllm.generate(model, None, [[1, 2]], sampler_kwargs={"std_threshold": 1e30},
                                                     **kw).sequences)


def test_slowfast_hidden_keys_change_the_answer(llada, monkeypatch):
    """Without hiding the keys after the span, the fast phases' logits and tokens differ from the reference's."""
    model = llada[0]
    kw = dict(gen_length=24, block_length=8, sampler="slowfast", sampler_kwargs=dict(explore_steps=2, span_threshold=0.0))
    hidden = dllm.generate(model, None, PROMPTS4, **kw)
    monkeypatch.setattr(samplers.sampler_class("slowfast"), "key_end", lambda self, state, rows: None)
    shown = dllm.generate(model, None, PROMPTS4, **kw)
    assert not torch.equal(hidden.sequences, shown.sequences)


def test_per_query_key_mask_forward_equals_reference(llada_dir, llada):
    """A forward with one key mask per query and chosen positions (WINO's shadow block) equals the
    plain re-statement of LLaDA's forward given the same 4-D mask and position ids."""
    from tests.fixtures.checkpoints import load_state_dict
    from tests.reference.arch_ref import llada_forward_ref
    import json

    model = llada[0]
    sd, cfg = load_state_dict(llada_dir), json.loads((llada_dir / "config.json").read_text())
    g = torch.Generator().manual_seed(3)
    L = 13
    x = torch.randint(0, 250, (1, L), generator=g)
    mask = torch.rand(1, 1, L, L, generator=g) < 0.6
    mask |= torch.eye(L, dtype=torch.bool)                      # every query sees at least itself
    pos = torch.randint(0, 20, (L,), generator=g)
    want = llada_forward_ref(sd, cfg, x, mask, pos)
    got = model(x, position_ids=pos[None], key_valid=mask[:, 0])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    part = model(x, torch.tensor([[2, 7, 12]]), position_ids=pos[None], key_valid=mask[:, 0])
    torch.testing.assert_close(part, got[:, [2, 7, 12]], rtol=0, atol=1e-6 * want.abs().max().item())


def _shadow_logits_fn(model):
    """WINO's patched LLaDA: a 4-D attention mask and position ids, through dllm's per-query mask."""
    return lambda x, mask, position_ids: model(x, position_ids=position_ids[None], key_valid=mask[:, 0])


WINO_CASES = [  # (model, gen_length, block_length, threshold, threshold_back)
    ("llada", 16, 16, 0.6, 0.9), ("llada", 16, 8, 0.1, 0.3), ("llada", 24, 8, 0.05, 0.5), ("llada", 20, 10, 0.12, 0.2),
    ("peaked", 16, 16, 0.6, 0.9), ("peaked", 24, 8, 0.3, 0.95), ("peaked", 16, 4, 0.5, 0.99),
]


@pytest.mark.parametrize("which,gen,block,tau,tau_back", WINO_CASES, ids=str)
def test_wino_equals_reference_alone_and_in_a_ragged_batch(request, which, gen, block, tau, tau_back):
    model = request.getfixturevalue("llada")[0] if which == "llada" else request.getfixturevalue("peaked_llada")
    kw = dict(gen_length=gen, block_length=block, sampler="wino", score_dtype="float64",
              sampler_kwargs=dict(threshold=tau, threshold_back=tau_back))
    batch = dllm.generate(model, None, PROMPTS4, **kw)
    lp = max(map(len, PROMPTS4))
    remasked = 0
    for b, row in enumerate(PROMPTS4):
        want, forwards, again = wino_ref(_shadow_logits_fn(model), torch.tensor([row]), gen_length=gen,
                                         block_length=block, mask_id=model.config.mask_token_id, threshold=tau,
                                         threshold_back=tau_back)
        alone = dllm.generate(model, None, [row], **kw)
        assert alone.sequences[0, len(row):].tolist() == want[0, len(row):].tolist(), b
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), b
        assert alone.nfe[0] == batch.nfe[b] == forwards, b
        assert alone.remasks[0] == batch.remasks[b] == again, b
        remasked += again
    if (which, tau_back) in (("llada", 0.3), ("llada", 0.5), ("peaked", 0.99)):
        assert remasked > 0         # the narrow-out path ran


def test_wino_masks_written_tokens_again(llada):
    """Narrow out: a token written at one step is a mask at a later one, the output counts the
    re-masks, the trace holds each position's last commit, and the canvas ends full."""
    model = llada[0]
    seen, uncommitted = [], []

    def look(s):
        seen.append(s.is_mask[:, s.gen_start:s.gen_end].clone())
        uncommitted.append(s.commit_step < 0)
    out = dllm.generate(model, None, PROMPTS, gen_length=16, block_length=8, sampler="wino",
                        sampler_kwargs=dict(threshold=0.1, threshold_back=0.3), trace=True, on_step=look)
    assert all(torch.equal(m, u) for m, u in zip(seen, uncommitted))   # a re-masked position has no commit step
    again = sum(int((~a & b).sum()) for a, b in zip([torch.ones_like(seen[0])] + seen, seen))
    assert again == sum(out.remasks) > 0 and not seen[-1].any()
    assert not (out.sequences == model.config.mask_token_id).any()
    last = [max(t for t, m in enumerate(seen) if not bool(m[b, c]) and (t == 0 or bool(seen[t - 1][b, c])))
            for b in range(len(PROMPTS)) for c in range(16)]
    assert out.trace.flatten().tolist() == last


@pytest.mark.parametrize("kwargs,message", [
    (dict(cache="dual"), "sampler 'wino' runs shadow copies of its block .* a cache policy that stores K/V"),
    (dict(cfg_scale=1.0), "sampler 'wino' runs shadow copies .* classifier-free guidance"),
])
def test_wino_refuses_what_its_shadow_block_cannot_run_with(llada, kwargs, message):
    with pytest.raises(ValueError, match=message):
        dllm.generate(llada[0], None, PROMPTS, gen_length=16, block_length=8, sampler="wino", **kwargs)


def test_wino_refuses_a_model_with_shifted_logits(dream):
    with pytest.raises(ValueError, match="sampler 'wino' runs shadow copies .* shifted logits"):
        dllm.generate(dream[0], None, PROMPTS, gen_length=16, block_length=8, sampler="wino")


REMDM_CASES = [  # (model, gen_length, block_length, steps, remdm_steps, remdm_number)
    ("llada", 16, 16, 16, 1, 1), ("llada", 16, 8, 8, 2, 1), ("llada", 24, 8, 12, 3, 2), ("llada", 16, 16, 8, 1, 3),
    ("peaked", 16, 8, 16, 1, 1), ("peaked", 20, 10, 10, 2, 2), ("llada", 12, 4, 12, 0, 1),
    ("llada", 16, 16, 16, 1, 2),   # a regular step after the revision commits another count than remdm_number
]


@pytest.mark.parametrize("which,gen,block,steps,r_steps,r_number", REMDM_CASES, ids=str)
def test_remdm_equals_reference_alone_and_in_a_ragged_batch(request, which, gen, block, steps, r_steps, r_number):
    model = request.getfixturevalue("llada")[0] if which == "llada" else request.getfixturevalue("peaked_llada")
    kw = dict(gen_length=gen, block_length=block, steps=steps, sampler="remdm", score_dtype="float64",
              sampler_kwargs=dict(remdm_steps=r_steps, remdm_number=r_number))
    batch = dllm.generate(model, None, PROMPTS4, **kw)
    lp = max(map(len, PROMPTS4))
    for b, row in enumerate(PROMPTS4):
        want, forwards, again = remdm_ref(llada_logits_fn(model), torch.tensor([row]), steps=steps, gen_length=gen,
                                          block_length=block, mask_id=model.config.mask_token_id,
                                          remdm_steps=r_steps, remdm_number=r_number)
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), b
        assert batch.nfe[b] == forwards == steps + gen // block * r_steps, b
        assert batch.remasks[b] == again == gen // block * r_steps * r_number, b
    if r_steps == 0:
        plain = dllm.generate(model, None, PROMPTS4, **{**kw, "sampler": "low_confidence", "sampler_kwargs": {}})
        assert torch.equal(plain.sequences, batch.sequences)


def test_remdm_revision_schedule():
    from dllm.samplers.remdm import revision_schedule

    assert revision_schedule(32, 32, 2) == [False] * 28 + [True, True] + [False] * 4
    assert revision_schedule(8, 4, 1) == [False] * 4 + [True]          # fewer steps than the insertion point
    assert revision_schedule(1, 1, 1) == [False, True]
    with pytest.raises(ValueError, match="sampler 'remdm': remdm_number must be >= 1, got 0"):
        samplers.get("remdm", remdm_number=0)


RCR_CASES = [  # (model, gen_length, block_length, steps)
    ("llada", 16, 16, 8), ("llada", 16, 8, 8), ("llada", 24, 8, 6), ("llada", 20, 10, 20), ("llada", 12, 4, 3),
    ("peaked", 16, 8, 8), ("peaked", 24, 12, 6),
]


@pytest.mark.parametrize("which,gen,block,steps", RCR_CASES, ids=str)
def test_rcr_equals_reference_alone_and_in_a_ragged_batch(request, which, gen, block, steps):
    model = request.getfixturevalue("llada")[0] if which == "llada" else request.getfixturevalue("peaked_llada")
    kw = dict(gen_length=gen, block_length=block, steps=steps, sampler="rcr")
    batch = dllm.generate(model, None, PROMPTS4, **kw)
    lp = max(map(len, PROMPTS4))
    earlier = 0
    for b, row in enumerate(PROMPTS4):
        want, forwards, again = rcr_ref(llada_logits_fn(model), torch.tensor([row]), steps=steps, gen_length=gen,
                                        block_length=block, mask_id=model.config.mask_token_id)
        assert batch.sequences[b, lp:].tolist() == want[0, len(row):].tolist(), b
        assert batch.nfe[b] == forwards == max(1, steps // (gen // block)) * (gen // block), b
        assert batch.remasks[b] == again, b
    seen = []
    dllm.generate(model, None, PROMPTS4, **kw, on_step=lambda s: seen.append((s.is_mask.clone(), s.block_start.clone())))
    for (a, _), (m, start) in zip(seen, seen[1:]):
        cols = torch.arange(m.shape[1])[None, :]
        earlier += int((m & ~a & (cols < start[:, None])).sum())
    if gen // block > 1 and steps // (gen // block) > 1:
        assert earlier > 0          # tokens of earlier blocks were masked again


def test_rcr_refuses_sampling():
    with pytest.raises(ValueError, match="sampler 'rcr' decodes greedily"):
        dllm.generate(dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0), None, PROMPTS,
                      gen_length=8, sampler="rcr", temperature=0.5)
