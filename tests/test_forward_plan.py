"""The forward contract (docs/architecture.md §7): logits only where asked, a recompute plan over cached
K/V at absolute positions, Dream's shift inside the model."""
import pytest
import torch

import dllm
from dllm.cache import KVCache, get_policy


def _model(name, attention="eager"):
    return dllm.build_model(dllm.ModelConfig.from_name(name), attention=attention, seed=0, init_std=0.3)


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_logits_at_equal_full_logits(name):
    model = _model(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 300, (3, 19), generator=g)
    full = model(x)                                                     # (B, L, V) aligned
    at = torch.tensor([[0, 5, 18], [3, 3, 7], [17, 1, 2]])
    part = model(x, at)
    torch.testing.assert_close(part, full.gather(1, at[..., None].expand(-1, -1, full.shape[-1])),
                               atol=1e-5, rtol=1e-5)


def test_dream_logits_are_shifted_inside_the_model():
    model = _model("dream-tiny")
    x = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    full = model(x)
    # Recompute the unshifted logits with the head applied to every hidden state directly.
    cols = torch.arange(11).expand(2, 11)
    hidden = model._run(x, cols, cols, None, None, None)
    raw = model.head_logits(model.norm(hidden))
    torch.testing.assert_close(full[:, 1:], raw[:, :-1])
    torch.testing.assert_close(full[:, 0], raw[:, 0])


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_partial_recompute_of_an_unchanged_canvas_equals_full_forward(name):
    """After a full forward filled the cache, recomputing any subset of columns of the same canvas
    reads exact K/V for every other column, so the logits equal a full forward."""
    model = _model(name)
    g = torch.Generator().manual_seed(2)
    B, L = 2, 23
    x = torch.randint(0, 300, (B, L), generator=g)
    cache = KVCache.for_model(model, B, L)
    model(x, torch.arange(L).expand(B, L), cache=cache)
    plan = torch.tensor([[3, 4, 20], [0, 11, 22]])
    at = torch.tensor([[4, 9, 12, 5], [1, 16, 22, 22]])
    torch.testing.assert_close(model(x, at, positions=plan, cache=cache), model(x, at), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_one_layer_partial_recompute_after_edits_is_exact(name):
    """With one layer a column's K/V depend only on its own token, so after editing some tokens,
    recomputing the edited columns (plus the asked-for ones) over the cache is exact, and the
    buffers hold the new canvas's K/V at the recomputed absolute columns."""
    cfg = dllm.ModelConfig.from_name(name).replace(n_layers=1)
    model = dllm.build_model(cfg, attention="eager", seed=0, init_std=0.3)
    g = torch.Generator().manual_seed(3)
    B, L = 2, 23
    x = torch.randint(0, 300, (B, L), generator=g)
    pad = torch.tensor([0, 5])
    key_valid = torch.arange(L)[None] >= pad[:, None]
    pos_ids = (torch.arange(L)[None] - pad[:, None]).clamp(min=0)
    cache = KVCache.for_model(model, B, L)
    model(x, torch.arange(L).expand(B, L), position_ids=pos_ids, key_valid=key_valid, cache=cache)
    x2 = x.clone()
    changed = torch.tensor([[4, 9, 10], [6, 15, 22]])
    x2.scatter_(1, changed, torch.randint(0, 300, (B, 3), generator=g))
    at = torch.tensor([[5, 9, 12], [7, 16, 22]])
    got = model(x2, at, positions=torch.cat([changed, at], 1), position_ids=pos_ids, key_valid=key_valid,
                cache=cache)
    want = model(x2, at, position_ids=pos_ids, key_valid=key_valid)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    fresh = KVCache.for_model(model, B, L)
    model(x2, None, position_ids=pos_ids, key_valid=key_valid, cache=fresh)
    torch.testing.assert_close(cache.k[0], fresh.k[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cache.v[0], fresh.v[0], atol=1e-6, rtol=1e-5)


def test_cache_update_scatters_at_absolute_columns():
    cache = KVCache(1, 2, 1, 6, 2, torch.float32)
    k = torch.arange(2 * 1 * 2 * 2, dtype=torch.float32).view(2, 1, 2, 2) + 1
    kb, vb = cache.update(0, torch.tensor([1]), torch.tensor([[4, 0]]), k[:1], -k[:1])
    assert kb.shape == (1, 1, 6, 2)
    assert torch.equal(cache.k[0][1, 0, 4], k[0, 0, 0]) and torch.equal(cache.k[0][1, 0, 0], k[0, 0, 1])
    assert torch.equal(cache.v[0][1, 0, 4], -k[0, 0, 0])
    assert cache.k[0][0].abs().sum() == 0          # the other row is untouched


def test_cache_layout_is_what_update_tests():
    """`layout` says whether a forward refreshes every column and covers every buffer row in order
    (rows are distinct and increasing: all of them exactly when there are as many as the buffers
    hold); `update` given that answer stores exactly what it stores when it works it out itself."""
    cache = KVCache(1, 3, 1, 5, 2, torch.float32)
    every = torch.arange(5).expand(2, 5)
    assert cache.layout(torch.tensor([0, 1, 2]), torch.arange(5).expand(3, 5)) == (True, True)
    assert cache.layout(torch.tensor([0, 2]), every) == (True, False)
    assert cache.layout(torch.tensor([1, 2]), torch.tensor([[0, 1, 2, 3, 4]] * 2)) == (True, False)
    assert cache.layout(torch.tensor([0, 1, 2]), torch.tensor([[0, 1, 2, 4, 3]] * 3)) == (False, True)
    assert cache.layout(torch.tensor([0, 1, 2]), torch.tensor([[1, 3]] * 3)) == (False, True)
    assert cache.layout(torch.tensor([0, 1]), every, every_column=False, every_row=True) == (False, True)
    g = torch.Generator().manual_seed(0)
    for rows, pos in ((torch.tensor([0, 2]), every), (torch.tensor([0, 1, 2]), torch.tensor([[4, 0, 2]] * 3)),
                      (torch.tensor([0, 1, 2]), torch.arange(5).expand(3, 5))):
        k, v = (torch.randn(len(rows), 1, pos.shape[1], 2, generator=g) for _ in range(2))
        told, alone = KVCache(1, 3, 1, 5, 2, torch.float32), KVCache(1, 3, 1, 5, 2, torch.float32)
        got = told.update(0, rows, pos, k, v, told.layout(rows, pos))
        want = alone.update(0, rows, pos, k, v)
        assert all(torch.equal(a, b) for a, b in zip(got + (told.k[0], told.v[0]), want + (alone.k[0], alone.v[0])))


def test_unknown_cache_policy():
    with pytest.raises(ValueError, match=r"unknown cache policy 'dual2'.*none"):
        get_policy("dual2")


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
def test_a_plan_covering_the_logit_sources_gives_the_united_plans_logits(name):
    """A caller that builds the plan with the logit sources in it (`cover_columns`) and passes
    their index (`logits_from`) gets the logits the forward computes when it unites the plan and
    the sources itself, and the same K/V in the cache; ragged rows, repeated padding."""
    from dllm.models.transformer import hidden_source
    from dllm.state import cover_columns
    model = _model(name)
    g = torch.Generator().manual_seed(5)
    B, L = 3, 17
    x = torch.randint(0, 300, (B, L), generator=g)
    at = torch.tensor([[4, 9, 9], [5, 6, 11], [0, 2, 16]])
    plan = torch.tensor([[3, 4, 5, 12, 12], [6, 7, 8, 9, 10], [1, 1, 1, 1, 1]])
    caches = []
    for _ in range(2):
        cache = KVCache.for_model(model, B, L)
        model(x, at, cache=cache)
        caches.append(cache)
    with torch.no_grad():
        united = model(x, at, positions=plan, cache=caches[0])
        need = torch.zeros(B, L, dtype=torch.bool).scatter_(1, plan, True)
        src = hidden_source(at, model.config.logit_shift)
        need.scatter_(1, src, True)
        columns, index = cover_columns(need, src, int(need.sum(1).max()))
        covered = model(x, at, positions=columns, cache=caches[1], logits_from=index)
    torch.testing.assert_close(covered, united)
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        torch.testing.assert_close(a, b)


def test_logits_from_needs_a_plan_and_logit_columns_of_its_shape():
    model = _model("llada-tiny")
    x = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(6))
    cache = KVCache.for_model(model, 1, 9)
    with pytest.raises(ValueError, match="logits_from"):
        model(x, torch.tensor([[3]]), cache=cache, logits_from=torch.tensor([[0]]))
    with pytest.raises(ValueError, match="logits_from"):
        model(x, torch.tensor([[3, 4]]), positions=torch.tensor([[3, 4]]), cache=cache,
              logits_from=torch.tensor([[0]]))
