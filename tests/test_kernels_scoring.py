"""The fused token-scoring kernel against the torch reference (CPU under TRITON_INTERPRET=1, or CUDA).

Tokens are compared exactly (the kernel and the fp32 reference take the argmax of the same values,
ties to the first maximum). Statistics follow the 2x rule against a float64 reference:
|kernel - ref64| <= 2 |torch fp32 - ref64| + floor. Outputs go into NaN-filled buffers.
"""
import math

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'dllm[triton]')")

from dllm import kernels  # noqa: E402
from dllm.kernels import token_scores, token_scores_ref, token_scores_triton  # noqa: E402
from dllm.kernels.scoring import token_scores_fwd  # noqa: E402
from tests.fixtures.triton_marks import DEVICE, TRITON_MARKS  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
if DEVICE == "cuda":  # the interpreter computes bf16 wrongly; a GPU checks it
    DTYPES["bf16"] = torch.bfloat16
pytestmark = TRITON_MARKS
STATS = ("prob", "margin", "entropy", "logit_gap")


def _poisoned(B, Q):
    return (torch.full((B, Q), -1, dtype=torch.long, device=DEVICE),
            *(torch.full((B, Q), float("nan"), device=DEVICE) for _ in range(5)))


def _logits(shape, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(DEVICE, dtype)


CASES = [  # (B, Q, V, num_splits, block_v): V not a power of two, several lanes, tiles and ranges
    (1, 1, 5, None, None),
    (2, 3, 1000, None, None),
    (2, 5, 517, 3, 32),
    (3, 2, 2000, 4, 128),
]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Q{}-V{}-S{}-BV{}".format(*c))
def test_matches_reference(case, dtype):
    B, Q, V, splits, block_v = case
    logits = _logits((B, Q, V), dtype)
    logits[0, 0, V // 2:] = float("-inf")                     # a suppressed tail
    out = token_scores_fwd(logits, out=_poisoned(B, Q), num_splits=splits, block_v=block_v)
    token, stats, top = out[0], dict(zip(STATS, out[1:5])), out[5]
    ref32 = token_scores_ref(logits, score_dtype=torch.float32)
    ref64 = token_scores_ref(logits, score_dtype=torch.float64)
    assert torch.equal(token, ref32.token)
    assert torch.equal(top, logits.float().amax(-1))
    for name in STATS:
        got, want, pt = stats[name].double(), getattr(ref64, name), getattr(ref32, name).double()
        assert not got.isnan().any(), f"{name}: {int(got.isnan().sum())} positions never written"
        err, err_pt = (got - want).abs().max().item(), (pt - want).abs().max().item()
        assert err <= 2 * err_pt + 1e-6, f"{name}: kernel error {err:.3g} > 2 x torch fp32 error {err_pt:.3g} + 1e-6"
    # Entropy sums V terms: also its relative RMS error.
    rel = (stats["entropy"].double() - ref64.entropy).square().mean().sqrt() / ref64.entropy.square().mean().sqrt()
    assert rel.item() < 1e-5


def test_ties_pick_the_first_maximum_across_lanes_tiles_and_ranges():
    V = 300
    logits = torch.zeros(1, 4, V)
    logits[0, 0, [7, 70, 250]] = 5.0                          # different ranges (4 x 80) and lanes
    logits[0, 1, [201, 202]] = 5.0                            # neighbours in one tile
    logits[0, 2] = 1.0                                        # every logit equal
    logits[0, 3, [290, 11]] = torch.tensor([4.0, 4.0])
    logits = logits.to(DEVICE)
    for splits, block_v in ((1, None), (4, 16)):
        token, prob, margin, entropy, gap, _ = token_scores_fwd(logits, num_splits=splits, block_v=block_v)
        assert token.tolist() == [[7, 201, 0, 11]]
        assert margin.tolist() == [[0.0] * 4] and gap.tolist() == [[0.0] * 4]
        assert entropy[0, 2].item() == pytest.approx(math.log(V), rel=1e-6)
        assert prob[0, 2].item() == pytest.approx(1 / V, rel=1e-6)


def test_single_token_vocabulary_and_strided_logits():
    one = token_scores_triton(torch.tensor([[[2.5], [-1.0]]], device=DEVICE))
    assert one.token.tolist() == [[0, 0]] and one.prob.tolist() == [[1.0, 1.0]]
    assert one.margin.tolist() == [[1.0, 1.0]] and one.logit_gap.tolist() == [[0.0, 0.0]]
    base = _logits((4, 3, 211), torch.float32, seed=1)
    view = base.transpose(0, 1)[:, ::2]                       # (3, 2, 211), neither dim contiguous
    got, want = token_scores_triton(view), token_scores_ref(view)
    assert torch.equal(got.token, want.token)
    for name in STATS:
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6)


# +inf logits make inf - inf inside the kernel before the error is raised; numpy (the interpreter) warns.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_minus_inf_is_allowed_and_nan_inf_or_all_minus_inf_raise():
    logits = torch.tensor([[[float("-inf"), 1.0, 0.0, float("-inf")]]], device=DEVICE)
    s = token_scores_triton(logits)
    assert s.token.item() == 1 and math.isfinite(s.entropy.item()) and s.logit_gap.item() == 1.0
    for bad in (float("nan"), float("inf")):
        with pytest.raises(FloatingPointError, match="NaN/inf logits"):
            token_scores_triton(torch.tensor([[[0.0, 1.0], [2.0, bad]]], device=DEVICE))
    with pytest.raises(FloatingPointError, match=r"first bad position \[0, 1\]"):
        token_scores_triton(torch.tensor([[[0.0, 1.0], [float("-inf")] * 2]], device=DEVICE))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bad", [float("-inf"), float("nan")])
def test_a_position_without_a_finite_logit_gets_token_zero_unchecked(temperature, bad):
    """Unchecked (the decode checks finiteness at its next read), a position with no usable logit
    still gets a token inside the vocabulary: 0, as torch's argmax gives; the next check raises."""
    logits = torch.tensor([[[0.0, 3.0, 1.0], [bad] * 3]], device=DEVICE)
    got = token_scores_triton(logits, temperature=temperature, seed=5, check_finite=False)
    assert got.token[0, 1].item() == 0
    assert 0 <= got.token[0, 0].item() < 3 and (temperature > 0 or got.token[0, 0].item() == 1)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("sampler", ["low_confidence", "klass"])
def test_a_decode_of_nan_logits_raises_under_the_kernel(monkeypatch, sampler):
    """Every logit NaN (a head weight column of NaN): the decode's deferred finiteness check names it,
    with the kernel's scoring as with torch's (no out-of-vocabulary token reaches the next forward)."""
    import dllm
    monkeypatch.setenv("DLLM_SCORING", "triton")
    model = dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0).to(DEVICE)
    with torch.no_grad():
        model.head.weight[:, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN/inf logits"):
        dllm.generate(model, None, [[1, 2]], gen_length=8, sampler=sampler, steps=4)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # numpy, in the interpreter
@pytest.mark.parametrize("splits", [1, 3])
def test_logits_near_the_float32_limits(splits):
    # x - max overflows to -inf (and max - x to +inf within a lane): the entropy stays finite.
    logits = torch.full((1, 3, 100), -3e38)
    logits[0, 0, 7] = 3e38                                   # one huge logit: entropy 0, prob 1
    logits[0, 1, [5, 90]] = 3e38                              # two: entropy log 2
    logits[0, 2] = torch.linspace(-3e38, 3e38, 100, dtype=torch.float64).float()   # rising in every lane
    got = token_scores_fwd(logits.to(DEVICE), num_splits=splits, block_v=16)
    want = token_scores_ref(logits.double(), score_dtype=torch.float64)
    assert got[0].tolist() == [[7, 5, 99]]
    torch.testing.assert_close(got[3].double(), want.entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1].double(), want.prob, rtol=0, atol=1e-6)


def test_fields_and_score_dtype_follow_the_reference():
    logits = _logits((2, 3, 50), torch.float16, seed=2)
    s = token_scores_triton(logits, fields={"margin"}, score_dtype=torch.float64, keep_logits=True)
    assert s.prob is None and s.entropy is None and s.logit_gap is None and s.logits is logits
    assert s.margin.dtype == torch.float64 and s.token.dtype == torch.long


# ------------------------------------------------------------------------------ Gumbel-max
def test_tiny_temperature_is_the_argmax():
    logits = _logits((2, 8, 300), torch.float32, seed=3)
    top2 = logits.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-3          # no near ties in this draw
    s = token_scores_triton(logits, temperature=1e-6, seed=11)
    assert torch.equal(s.token, logits.argmax(-1))


def test_same_seed_same_tokens_whatever_the_launch():
    logits = _logits((2, 6, 300), torch.float32, seed=4, scale=0.5)
    seed = torch.tensor([123], device=DEVICE)
    a = token_scores_fwd(logits, temperature=1.0, seed=seed)[0]
    b = token_scores_fwd(logits, temperature=1.0, seed=seed, num_splits=3, block_v=32)[0]
    c = token_scores_fwd(logits, temperature=1.0, seed=torch.tensor([124], device=DEVICE))[0]
    assert torch.equal(a, b)
    assert (a != c).any() and (a != logits.argmax(-1)).any()
    g1, g2 = torch.Generator(DEVICE).manual_seed(5), torch.Generator(DEVICE).manual_seed(5)
    x = token_scores_triton(logits, temperature=1.0, generator=g1)
    y = token_scores_triton(logits, temperature=1.0, generator=g2)
    assert torch.equal(x.token, y.token)
    assert not torch.equal(token_scores_triton(logits, temperature=1.0, generator=g1).token, x.token)


def test_sampled_frequencies_follow_the_tempered_softmax():
    """Chi-square of 1000 draws (one per row) over a 5-token vocabulary at T = 0.7, fixed seed
    (every expected count >= 30). The same draws must reject the un-tempered softmax (expected
    statistic about 54), so the check has the power to fail."""
    N, T = 1000, 0.7
    l = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    logits = l[None, None].expand(1, N, 5).contiguous().to(DEVICE)
    s = token_scores_triton(logits, temperature=T, seed=2024)
    counts = torch.bincount(s.token.reshape(-1).cpu(), minlength=5).double()
    critical = 18.47                                            # chi-square, 4 dof, p = 0.001

    def chi2(p):
        return (((counts - N * p) ** 2) / (N * p)).sum().item()

    assert chi2(torch.softmax(l.double() / T, 0)) < critical
    assert chi2(torch.softmax(l.double(), 0)) > critical
    # The confidence is the un-tempered probability of the sampled token.
    torch.testing.assert_close(s.prob.cpu(), torch.softmax(l, 0)[s.token.cpu()], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------ dispatch, errors
def test_dispatcher_picks_the_kernel_on_cuda_and_honours_the_override(monkeypatch):
    logits = _logits((1, 6, 40), torch.float32, seed=6, scale=0.3)
    kw = dict(temperature=1.0, fields={"prob"})
    monkeypatch.delenv("DLLM_SCORING", raising=False)
    auto = token_scores(logits, generator=torch.Generator(DEVICE).manual_seed(1), **kw)
    ref = token_scores_ref(logits, generator=torch.Generator(DEVICE).manual_seed(1), **kw)
    kern = token_scores_triton(logits, generator=torch.Generator(DEVICE).manual_seed(1), **kw)
    assert not torch.equal(ref.token, kern.token)               # the two samplers draw differently
    assert torch.equal(auto.token, kern.token if DEVICE == "cuda" else ref.token)
    monkeypatch.setenv("DLLM_SCORING", "triton")
    forced = token_scores(logits, generator=torch.Generator(DEVICE).manual_seed(1), **kw)
    assert torch.equal(forced.token, kern.token)
    forced_torch = token_scores(logits, impl="Torch", generator=torch.Generator(DEVICE).manual_seed(1), **kw)
    assert torch.equal(forced_torch.token, ref.token)
    monkeypatch.setenv("DLLM_SCORING", "fused")
    with pytest.raises(ValueError, match=r"DLLM_SCORING='fused'; valid: auto, torch, triton"):
        token_scores(logits)


def test_an_unrunnable_device_names_the_variable_as_read_at_import(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "set later")
    with pytest.raises(RuntimeError, match=rf"got tensors on meta \(TRITON_INTERPRET={kernels.INTERPRET_VARIABLE!r} "
                                           rf"at import\)"):
        kernels.require_triton("meta", "the kernel")


@pytest.mark.parametrize("call, match", [
    (lambda x: token_scores_triton(x.double()), r"logits dtype torch.float64 .*allowed: float16, bfloat16, float32"),
    (lambda x: token_scores_triton(x[0]), r"logits must be a 3-D tensor \(B, Q, V\), got \(3, 20\)"),
    (lambda x: token_scores_triton(x[..., :0]), r"empty vocabulary"),
    (lambda x: token_scores_triton(x, temperature=-0.5), r"temperature must be a finite number >= 0, got -0.5"),
    (lambda x: token_scores(x, temperature=float("nan")), r"temperature must be a finite number >= 0, got nan"),
    (lambda x: token_scores_triton(x, fields={"probs"}), r"unknown score field\(s\) \['probs'\]"),
    (lambda x: token_scores_triton(x, temperature=1.0, seed=-1), r"seed must be an int in \[0, 2\*\*63\), got -1"),
    (lambda x: token_scores_triton(x, score_dtype=torch.int32), r"score_dtype must be a floating torch.dtype"),
    (lambda x: token_scores(x, impl="cuda"), r"unknown scoring implementation impl='cuda'"),
], ids=["float64", "2d", "empty-vocab", "negative-temperature", "nan-temperature", "unknown-field", "bad-seed",
        "int-score-dtype", "unknown-impl"])
def test_bad_inputs_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(_logits((1, 3, 20), torch.float32))
