import math

import pytest
import torch

from dllm.kernels import token_scores_ref


def _brute(logits):
    """Statistics of each position computed one at a time in float64 from the definitions."""
    B, Q, V = logits.shape
    rows = []
    for b in range(B):
        for q in range(Q):
            l = logits[b, q].double().tolist()
            m = max(l)
            z = sum(math.exp(x - m) for x in l)
            p = [math.exp(x - m) / z for x in l]
            tok = l.index(m)                       # first maximum
            sp = sorted(p, reverse=True)
            sl = sorted(l, reverse=True)
            ent = -sum(pi * math.log(pi) for pi in p if pi > 0)
            rows.append((tok, p[tok], sp[0] - sp[1], ent, sl[0] - sl[1]))
    return rows


@pytest.mark.parametrize("shape", [(1, 1, 5), (2, 3, 17), (3, 7, 100)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_match_brute_force(shape, dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(shape, generator=g) * 3).to(dtype)
    s = token_scores_ref(logits, score_dtype=dtype)
    want = _brute(logits)
    flat = lambda t: t.reshape(-1).tolist()  # noqa: E731
    assert flat(s.token) == [w[0] for w in want]
    for got, idx in ((s.prob, 1), (s.margin, 2), (s.entropy, 3), (s.logit_gap, 4)):
        assert flat(got) == pytest.approx([w[idx] for w in want], rel=1e-5, abs=1e-6)


def test_ties_pick_the_first_maximum():
    logits = torch.tensor([[[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]]])
    s = token_scores_ref(logits)
    assert s.token.tolist() == [[1, 0]]
    assert s.margin[0, 1].item() == 0.0 and s.logit_gap[0, 1].item() == 0.0
    assert s.entropy[0, 1].item() == pytest.approx(math.log(4))


def test_minus_inf_logits_are_allowed_and_nan_is_an_error():
    logits = torch.tensor([[[float("-inf"), 1.0, 0.0]]])
    s = token_scores_ref(logits)
    assert s.token.item() == 1 and math.isfinite(s.entropy.item())
    with pytest.raises(FloatingPointError, match="NaN/inf logits"):
        token_scores_ref(torch.tensor([[[float("nan"), 1.0]]]))
    with pytest.raises(FloatingPointError):
        token_scores_ref(torch.tensor([[[float("inf"), 1.0]]]))


def test_gumbel_sampling_is_seeded_and_follows_the_tempered_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))[None, None].expand(1, 4000, 3).contiguous()
    a = token_scores_ref(logits, temperature=1.0, generator=torch.Generator().manual_seed(3))
    b = token_scores_ref(logits, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.token, b.token)
    freq = torch.bincount(a.token.reshape(-1), minlength=3).double() / 4000
    assert freq.tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.03)
    # The confidence is read from the un-tempered distribution at the sampled token.
    assert torch.allclose(a.prob, torch.tensor([0.5, 0.3, 0.2])[a.token])
    # A low temperature concentrates on the argmax.
    c = token_scores_ref(logits, temperature=0.05, generator=torch.Generator().manual_seed(3))
    assert (c.token == 0).float().mean() > 0.99


def test_empty_vocabulary_is_refused():
    from dllm.kernels.head_scoring import head_scores_ref

    with pytest.raises(ValueError, match=r"empty vocabulary dimension \(V = 0\)"):
        token_scores_ref(torch.zeros(1, 2, 0))
    with pytest.raises(ValueError, match=r"weight has no vocabulary rows \(V = 0\)"):
        head_scores_ref(torch.zeros(3, 16), torch.zeros(0, 16))
