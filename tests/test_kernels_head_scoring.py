"""The fused LM head + greedy scoring (`dllm.kernels.head_scoring`) against a plain statement: the
logits h @ W^T + bias written out, a float64 softmax, the first argmax. The Triton kernel runs on
CPU under TRITON_INTERPRET=1 (tests/conftest.py) or on CUDA."""
import pytest
import torch

import dllm
import dllm.decode as decode_module
from dllm.config import ModelConfig
from dllm.kernels import triton_runs_on
from dllm.kernels.head_scoring import (head_scores, head_scores_ref, head_scores_triton, head_scoring_impl,
                                       suppression_bias)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _plain(hidden, weight, bias):
    logits = (hidden.double() @ weight.double().t()) + bias.double()
    probs = torch.softmax(logits, dim=-1)
    token = logits.argmax(dim=-1)                       # first maximum on ties
    return token, probs.gather(1, token[:, None]).squeeze(1), logits.max(dim=-1).values


def _case(N, d, V, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, d, generator=g)
    weight = torch.randn(V, d, generator=g) * 0.5
    if ties:  # equal rows far apart: equal logits, the first must win
        weight[V - 3] = weight[5]
        weight[V // 2] = weight[5]
        hidden[0] = weight[5] * 4
    bias = suppression_bias(V, [7, V - 1], "cpu")
    return hidden, weight, bias


@pytest.mark.parametrize("N,d,V,chunk", [(1, 8, 50, 16), (7, 24, 301, 64), (5, 33, 1000, 1000), (3, 16, 77, 8)])
def test_reference_equals_the_written_out_softmax(N, d, V, chunk):
    hidden, weight, bias = _case(N, d, V, seed=N + V)
    token, prob, top = head_scores_ref(hidden.double(), weight.double(), bias, chunk=chunk,
                                       score_dtype=torch.float64)
    want_token, want_prob, want_top = _plain(hidden, weight, bias)
    assert torch.equal(token, want_token)
    torch.testing.assert_close(prob, want_prob, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(top, want_top)
    assert not torch.isin(token, torch.tensor([7, V - 1])).any()       # suppressed ids never win


def test_reference_breaks_ties_to_the_first_token():
    hidden, weight, bias = _case(2, 16, 200, seed=1, ties=True)
    token, _, _ = head_scores_ref(hidden.double(), weight.double(), bias, chunk=32, score_dtype=torch.float64)
    assert int(token[0]) == 5


triton_only = pytest.mark.skipif(not triton_runs_on(DEVICE), reason="needs CUDA or TRITON_INTERPRET=1 with triton")


@pytest.mark.triton
@triton_only
@pytest.mark.parametrize("N,d,V,splits", [(1, 16, 64, 1), (7, 24, 301, None), (20, 40, 515, 3), (2, 16, 200, 4)])
def test_kernel_matches_the_reference(N, d, V, splits):
    hidden, weight, bias = _case(N, d, V, seed=N * V, ties=(V == 200))
    hidden, weight, bias = hidden.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE)
    token, prob, top = head_scores_triton(hidden, weight, bias, num_splits=splits)
    want_token, want_prob, want_top = _plain(hidden.cpu(), weight.cpu(), bias.cpu())
    assert torch.equal(token.cpu(), want_token)
    torch.testing.assert_close(prob.cpu().double(), want_prob, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(top.cpu().double(), want_top, rtol=1e-4, atol=1e-4)


@pytest.mark.triton
@triton_only
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_reports_a_nan_logit_in_top_as_the_reference_does(splits):
    hidden, weight, bias = _case(3, 16, 200, seed=1)
    weight[123, 0] = float("nan")                      # one NaN logit in every row
    hidden, weight, bias = hidden.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE)
    _, _, top = head_scores_triton(hidden, weight, bias, num_splits=splits)
    assert head_scores_ref(hidden, weight, bias)[2].isnan().all()
    assert top.isnan().all()                           # what the decode's finiteness check reads


@pytest.mark.triton
@triton_only
def test_kernel_scores_no_rows():
    hidden, weight, bias = _case(1, 16, 200, seed=2)
    token, prob, top = head_scores_triton(hidden[:0].to(DEVICE), weight.to(DEVICE), bias.to(DEVICE))
    assert token.shape == prob.shape == top.shape == (0,)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tl.dot needs CUDA (the interpreter's bf16 is not faithful)")
@pytest.mark.parametrize("N,d,V", [(32, 256, 5003), (3, 128, 777)])
def test_bf16_kernel_rounds_the_logits_as_the_unfused_product(N, d, V):
    hidden, weight, bias = _case(N, d, V, seed=N + d)
    hidden, weight, bias = hidden.cuda().bfloat16(), weight.cuda().bfloat16(), bias.cuda()
    token, prob, top = head_scores_triton(hidden, weight, bias)
    logits = (hidden @ weight.t()).double() + bias.double()         # the bf16 logits the head writes
    assert torch.equal(token, logits.argmax(dim=-1))
    want_prob = torch.softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
    torch.testing.assert_close(prob.double(), want_prob, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(top.double(), logits.max(dim=-1).values)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=[pytest.mark.triton, triton_only])])
@pytest.mark.parametrize("sampler,cache", [("threshold", "dual"), ("low_confidence", "none")])
def test_decoding_with_the_fused_head_gives_the_unfused_tokens(monkeypatch, impl, sampler, cache):
    """Weights at std 0.3, so predictions are peaked as a trained model's are (fused and unfused
    sum the head's products in different orders)."""
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3, device=DEVICE)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    kw = dict(gen_length=16, block_length=8, sampler=sampler, cache=cache)
    monkeypatch.setenv("DLLM_HEAD_SCORING", "unfused")
    want = dllm.generate(model, None, prompts, **kw)
    monkeypatch.setenv("DLLM_HEAD_SCORING", impl)
    calls = []
    real = decode_module.head_scores
    monkeypatch.setattr(decode_module, "head_scores", lambda *a, **k: calls.append(1) or real(*a, **k))
    got = dllm.generate(model, None, prompts, **kw)
    assert len(calls) == got.forwards                  # every step scored through the fused head
    assert torch.equal(got.sequences, want.sequences) and got.forwards == want.forwards


def test_samplers_that_edit_logits_keep_the_unfused_path(monkeypatch):
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)
    monkeypatch.setenv("DLLM_HEAD_SCORING", "torch")
    calls = []
    monkeypatch.setattr(decode_module, "head_scores", lambda *a, **k: calls.append(1))
    dllm.generate(model, None, [[5, 6, 7]], gen_length=8, block_length=8, sampler="low_confidence",
                  sampler_kwargs={"logits_eos_inf": True})
    dllm.generate(model, None, [[5, 6, 7]], gen_length=8, block_length=8, sampler="threshold", temperature=0.5)
    assert calls == []


def test_auto_fuses_on_cuda_only(monkeypatch):
    monkeypatch.delenv("DLLM_HEAD_SCORING", raising=False)
    assert head_scoring_impl(None, "cpu", torch.float32) == "unfused"
    assert head_scoring_impl("auto", "cpu", torch.bfloat16) == "unfused"
    assert head_scoring_impl("auto", None) == "unfused"
    assert head_scoring_impl("torch", "cpu") == "torch"
    if torch.cuda.is_available() and triton_runs_on("cuda"):
        assert head_scoring_impl(None, "cuda", torch.bfloat16) == "triton"
        assert head_scoring_impl(None, "cuda", torch.float64) == "unfused"


@pytest.mark.triton
@triton_only
def test_triton_falls_back_where_the_kernel_cannot_compute_the_dtype(monkeypatch):
    """A forced kernel scores unfused where it cannot run the dtype: float64 anywhere, bf16 under the
    interpreter (which truncates to bf16 where a GPU rounds); called directly it says why."""
    monkeypatch.setenv("DLLM_HEAD_SCORING", "triton")
    assert head_scoring_impl(None, DEVICE, torch.float64) == "unfused"
    assert head_scoring_impl(None, DEVICE, torch.float32) == "triton"
    interpreted = DEVICE == "cpu"
    assert head_scoring_impl(None, DEVICE, torch.bfloat16) == ("unfused" if interpreted else "triton")
    with pytest.raises(ValueError, match=r"one dtype among float16, bfloat16, float32; got torch.float64"):
        head_scores_triton(torch.zeros(2, 4, dtype=torch.float64, device=DEVICE),
                           torch.zeros(3, 4, dtype=torch.float64, device=DEVICE))
    if interpreted:
        with pytest.raises(ValueError, match=r"cannot round bf16 logits under TRITON_INTERPRET=1"):
            head_scores_triton(torch.zeros(2, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16))
        model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3, dtype=torch.bfloat16)
        monkeypatch.setenv("DLLM_HEAD_SCORING", "unfused")
        want = dllm.generate(model, None, [[5, 6, 7]], gen_length=8, block_length=8, sampler="threshold")
        monkeypatch.setenv("DLLM_HEAD_SCORING", "triton")
        got = dllm.generate(model, None, [[5, 6, 7]], gen_length=8, block_length=8, sampler="threshold")
        assert torch.equal(got.sequences, want.sequences)


def test_unknown_implementations_are_refused(monkeypatch):
    monkeypatch.setenv("DLLM_HEAD_SCORING", "fast")
    with pytest.raises(ValueError, match="DLLM_HEAD_SCORING='fast'.*auto, unfused, torch, triton"):
        head_scoring_impl()
    with pytest.raises(ValueError, match="fused implementation"):
        head_scores(torch.zeros(1, 4), torch.zeros(3, 4), impl="unfused")
    with pytest.raises(ValueError, match="share d"):
        head_scores(torch.zeros(1, 4), torch.zeros(3, 5), impl="torch")
