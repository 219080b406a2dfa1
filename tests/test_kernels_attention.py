"""The Triton attention kernel against its fp32 reference (CPU under TRITON_INTERPRET=1, or CUDA).

Error rule: |kernel - ref32| <= 2 |torch same dtype - ref32| + 1e-5 (max abs), where ref32 is
`bidir_attn_ref(upcast=True)` and the torch computation is the same reference in the kernel's
dtype. Outputs are written into NaN-filled buffers, so an element the kernel forgets stays NaN.
"""
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'dllm[triton]')")

import dllm  # noqa: E402
from dllm.attention import auto_attention, default_backend, get_backend, sdpa_attention  # noqa: E402
from dllm.kernels.attention import (CONFIGS, AttnConfig, bidir_attn, bidir_attn_fwd, bidir_attn_ref,  # noqa: E402
                                    clear_tuned_launches, launch_candidates, launch_choice, shape_key,
                                    tuned_launch, tuned_launches)
from tests.fixtures.triton_marks import DEVICE, TRITON_MARKS  # noqa: E402

pytestmark = TRITON_MARKS
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _inputs(B, H, H_kv, P, L, D, dtype, seed=0, pad=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, P, D, generator=g)
    k = torch.randn(B, H_kv, L, D, generator=g)
    v = torch.randn(B, H_kv, L, D, generator=g)
    key_valid = None
    if pad:  # left padding, row 0 unpadded
        n_pad = torch.randint(1, max(2, L // 2), (B,), generator=g)
        n_pad[0] = 0
        key_valid = torch.arange(L)[None, :] >= n_pad[:, None]
        key_valid = key_valid.to(DEVICE)
    return (*(t.to(DEVICE, dtype) for t in (q, k, v)), key_valid)


def _check(out, q, k, v, key_valid, scale=None):
    ref = bidir_attn_ref(q, k, v, key_valid, scale)                                  # fp32
    pt = bidir_attn_ref(q, k, v, key_valid, scale, upcast=False, reorder_ops=True)  # kernel dtype
    err = (out.float() - ref).abs().max().item()
    err_pt = (pt.float() - ref).abs().max().item()
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements were never written"
    assert err <= 2 * err_pt + 1e-5, f"kernel error {err:.3g} > 2 x torch {q.dtype} error {err_pt:.3g} + 1e-5"


SHAPES = [  # (B, H, H_kv, P, L, D): P not a tile multiple, L not a power of two, GQA ratios 1, 4, 7
    (2, 4, 4, 17, 45, 64),
    (3, 4, 1, 5, 100, 16),
    (1, 7, 1, 9, 63, 128),
    (2, 8, 2, 33, 77, 32),
]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-H{}-Hkv{}-P{}-L{}-D{}".format(*s))
def test_matches_fp32_reference(shape, dtype):
    q, k, v, key_valid = _inputs(*shape, dtype)
    out = torch.full_like(q, float("nan"))
    assert bidir_attn(q, k, v, key_valid, out=out) is out
    _check(out, q, k, v, key_valid)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_split_keys_and_merge(dtype):
    """Key ranges in separate programs, merged by the second kernel (the GPU path for small batches)."""
    q, k, v, key_valid = _inputs(2, 6, 3, 11, 150, 64, dtype, seed=1)
    key_valid[1, :90] = False                           # row 1: the first ranges hold no valid key
    out = torch.full_like(q, float("nan"))
    bidir_attn_fwd(q, k, v, key_valid, 0.125, out=out, config=AttnConfig(32, 32, 4, 2), num_splits=4)
    _check(out, q, k, v, key_valid, 0.125)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's rounding; a GPU runs bf16 dots natively")
@pytest.mark.parametrize("num_splits", [1, 3])
def test_bf16_under_the_interpreter_is_the_fp32_result_rounded_to_nearest(num_splits):
    """The interpreter truncates float32 to bf16; the kernel's bf16 output is rounded as a GPU's is."""
    q, k, v, key_valid = _inputs(2, 4, 2, 17, 45, 64, torch.bfloat16, seed=3)
    wide = bidir_attn_fwd(q.float(), k.float(), v.float(), key_valid, 0.125, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))
    assert bidir_attn_fwd(q, k, v, key_valid, 0.125, out=out, num_splits=num_splits) is out
    assert torch.equal(out, wide.to(torch.bfloat16))
    assert torch.equal(bidir_attn(q, k, v, key_valid, 0.125), bidir_attn(q.float(), k.float(), v.float(), key_valid,
                                                                         0.125).to(torch.bfloat16))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_rows_without_valid_keys_are_zero(num_splits):
    q, k, v, key_valid = _inputs(3, 4, 2, 6, 70, 32, torch.float32, seed=2)
    key_valid[1] = False
    out = torch.full_like(q, float("nan"))
    bidir_attn_fwd(q, k, v, key_valid, 32 ** -0.5, out=out, config=AttnConfig(32, 16, 4, 2), num_splits=num_splits)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    _check(out, q, k, v, key_valid)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_nan_scores_give_nan_as_sdpa_does(num_splits):
    """A NaN query or a NaN in a valid key makes NaN outputs (which the decode's finiteness check
    catches), not the zeros of a row without keys."""
    q, k, v, key_valid = _inputs(2, 4, 2, 5, 70, 16, torch.float32, seed=4)
    key_valid[1, :20] = False
    q[0, 0, 1, 0] = float("nan")                        # row 0: one NaN query
    k[1, 1, 40, 3] = float("nan")                       # row 1: a NaN in a valid key of kv head 1
    out = torch.full_like(q, 7.0)
    bidir_attn_fwd(q, k, v, key_valid, 16 ** -0.5, out=out, config=AttnConfig(32, 16, 4, 2), num_splits=num_splits)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=key_valid[:, None, None, :])
    assert torch.equal(out.isnan(), want.isnan()) and out.isnan().any()
    torch.testing.assert_close(out.nan_to_num(0.0), want.nan_to_num(0.0), rtol=1e-4, atol=1e-5)
    ref = bidir_attn_ref(q, k, v, key_valid, 16 ** -0.5)         # the reference keeps the same semantics
    assert torch.equal(ref.isnan(), want.isnan())
    key_valid[1] = False                                         # ... and zeros a row without keys
    assert torch.equal(bidir_attn_ref(q, k, v, key_valid)[1], torch.zeros_like(q[1]))


def test_padding_entries_are_never_read():
    """A cache's padding slots may hold garbage (NaN, inf): the output must not depend on them."""
    q, k, v, key_valid = _inputs(2, 4, 2, 7, 40, 16, torch.float32, seed=3)
    key_valid[1, :13] = False
    clean = bidir_attn(q, k, v, key_valid)
    k, v = k.clone(), v.clone()
    k[1, :, :13] = float("nan")
    v[1, :, :13] = float("inf")
    assert torch.equal(bidir_attn(q, k, v, key_valid), clean)


def test_strided_views_and_cache_slices():
    """q as the model makes it (a transposed view), K/V as a slice of a larger cache with a storage
    offset, the output written into a transposed view."""
    B, H, H_kv, P, L, D = 2, 4, 2, 9, 37, 32
    g = torch.Generator().manual_seed(4)
    q = torch.randn(B, P, H, D, generator=g).to(DEVICE).transpose(1, 2)          # (B, H, P, D), strided
    cache_k = torch.randn(B + 1, H_kv, L + 11, D, generator=g).to(DEVICE)
    cache_v = torch.randn(B + 1, H_kv, L + 11, D, generator=g).to(DEVICE)
    k, v = cache_k[1:, :, 5:5 + L], cache_v[1:, :, 5:5 + L]                       # (B, H_kv, L, D), offset
    key_valid = torch.ones(B + 1, L + 11, dtype=torch.bool, device=DEVICE)[1:, 5:5 + L]
    key_valid[0, :4] = False
    out = torch.full((B, P, H, D), float("nan"), device=DEVICE).transpose(1, 2)
    bidir_attn(q, k, v, key_valid, out=out)
    _check(out, q, k, v, key_valid)
    default = bidir_attn(q, k, v, key_valid)            # allocated (B, P, H, D) storage, seen as (B, H, P, D)
    assert default.transpose(1, 2).is_contiguous() and torch.equal(default, out)


def test_registered_backend_and_auto_selection():
    q, k, v, key_valid = _inputs(2, 4, 2, 5, 20, 16, torch.float32, seed=5)
    assert get_backend("triton") is bidir_attn
    out = get_backend("triton")(q, k, v, key_valid, 0.3)
    _check(out, q, k, v, key_valid, 0.3)
    assert default_backend("cpu") == "sdpa" and default_backend("cuda") == "sdpa"   # measured faster on a GPU
    assert torch.equal(auto_attention(q, k, v, key_valid, 0.3), sdpa_attention(q, k, v, key_valid, 0.3))


@pytest.mark.parametrize("make, match", [
    (lambda q, k, v, m: (q.double(), k.double(), v.double(), m),
     r"q dtype torch.float64 .*allowed: float16, bfloat16, float32"),
    (lambda q, k, v, m: (q, k.half(), v, m), r"share one dtype"),
    (lambda q, k, v, m: (q[..., :1].expand(*q.shape[:3], 300), k[..., :1].expand(*k.shape[:3], 300),
                         v[..., :1].expand(*v.shape[:3], 300), m), r"head dim 300 .*allowed: 1\.\.256"),
    (lambda q, k, v, m: (q[:, :3], k, v, m), r"H=3 must be a multiple of .*H_kv=2"),
    (lambda q, k, v, m: (q[0], k, v, m), r"q must be a 4-D tensor"),
    (lambda q, k, v, m: (q, k, v[:, :, :-1], m), r"k and v shapes differ"),
    (lambda q, k, v, m: (q, k, v, m[:, :-1]), r"key_valid shape \(2, 19\) != \(B, L\) = \(2, 20\)"),
    (lambda q, k, v, m: (q, k, v, m.long()), r"key_valid must be a bool tensor"),
], ids=["float64", "mixed-dtypes", "head-dim-300", "heads-not-multiple", "3d-q", "kv-shapes", "mask-shape",
        "mask-dtype"])
def test_bad_inputs_raise_value_error(make, match):
    q, k, v, key_valid = _inputs(2, 4, 2, 5, 20, 16, torch.float32, seed=6)
    with pytest.raises(ValueError, match=match):
        bidir_attn(*make(q, k, v, key_valid))


def test_inputs_that_record_gradients_are_refused(llada_dir):
    """The kernel has no backward: q/k/v that require grad are refused (not a gradient-less output);
    under no_grad they run; a model training on the backend says so at its first forward."""
    q, k, v = (torch.randn(1, 2, 5, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    with pytest.raises(RuntimeError, match=r"the triton attention backend runs forward only .* attention='sdpa'"):
        bidir_attn(q, k, v)
    with pytest.raises(RuntimeError, match="runs forward only"):            # one input recording is enough
        bidir_attn(q, k.detach(), v.detach())
    with torch.no_grad():
        assert bidir_attn(q, k, v).shape == (1, 2, 5, 16)
    model, _ = dllm.load(llada_dir, dtype="float32", device=DEVICE, attention="triton")
    model.train()
    with pytest.raises(RuntimeError, match="runs forward only"):
        model(torch.tensor([[1, 2, 3]], device=DEVICE))


def test_bad_scale_out_and_launch_overrides_raise_value_error():
    q, k, v, key_valid = _inputs(2, 4, 2, 5, 20, 16, torch.float32, seed=6)
    with pytest.raises(ValueError, match=r"scale must be a finite number, got nan"):
        bidir_attn(q, k, v, key_valid, float("nan"))
    with pytest.raises(ValueError, match=r"out must be a tensor of q's shape"):
        bidir_attn(q, k, v, key_valid, out=torch.empty(2, 4, 5, 8, device=DEVICE))
    with pytest.raises(ValueError, match=r"BLOCK_N must be a power of two >= 16 \(tl.dot tiles\), got 24"):
        bidir_attn_fwd(q, k, v, key_valid, 0.25, config=AttnConfig(32, 24, 4, 2))


def test_generation_with_triton_kernels_equals_sdpa(llada_dir, monkeypatch):
    """A whole generation with both kernels forced (CUDA, or CPU tensors under the interpreter)
    gives the tokens of sdpa + torch scoring: a ragged batch, so padding keys are masked, and the
    dual cache, so block starts recompute every position and the other steps only the block's
    queries against the cached keys."""
    model, _ = dllm.load(llada_dir, dtype="float32", device=DEVICE)   # the tiny checkpoint
    prompts = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12]]
    kw = dict(gen_length=8, block_length=4, steps=4, cache="dual")
    before = model.attention
    try:
        model.set_attention("sdpa")
        monkeypatch.setenv("DLLM_SCORING", "torch")
        want = dllm.generate(model, None, prompts, **kw)
        model.set_attention("triton")
        monkeypatch.setenv("DLLM_SCORING", "triton")
        got = dllm.generate(model, None, prompts, **kw)
    finally:
        model.set_attention(before)
    assert torch.equal(got.sequences, want.sequences)
    assert got.nfe == want.nfe


# -- launches tuned per shape (DLLM_ATTENTION_LAUNCH=tuned) ---------------------------------------
@pytest.fixture
def no_tuned_launches():
    clear_tuned_launches()
    yield
    clear_tuned_launches()


@pytest.mark.parametrize("head_dim,keys", [(128, 512), (64, 4096), (256, 100), (16, 7)])
def test_launch_candidates_cover_every_config_and_split_that_fits(head_dim, keys):
    got = launch_candidates(head_dim, keys)
    configs = [c for c in CONFIGS if head_dim <= 128 or c.BLOCK_N == 32]
    assert [c for c in dict.fromkeys(g.config for g in got)] == configs
    for cfg in configs:
        tiles = -(-keys // cfg.BLOCK_N)
        want = [1] + [s for s in (2, 4, 8, 16, 32, 64, 128) if tiles >= 2 * s]
        assert [g.splits for g in got if g.config == cfg] == want


def test_the_fastest_candidate_is_kept_per_shape(no_tuned_launches):
    q, k, v, key_valid = _inputs(2, 4, 2, 5, 200, 16, torch.float32)
    candidates = launch_candidates(16, 200)
    times = {c: 10.0 - 0.5 * (i % 5) for i, c in enumerate(candidates)}      # ties: the earliest fastest wins
    timed = []

    def timer(fn):
        c = candidates[len(timed)]
        timed.append(c)
        assert not torch.isnan(fn()).any()                                   # each candidate runs
        return times[c]

    best = tuned_launch(q, k, v, key_valid, 0.25, timer=timer)
    assert timed == candidates and best == candidates[4]
    assert tuned_launch(q, k, v, key_valid, 0.25, timer=timer) is best and len(timed) == len(candidates)
    q2, k2, v2, kv2 = _inputs(2, 4, 2, 7, 250, 16, torch.float32)           # 7 queries, 250 keys: the same buckets
    assert tuned_launch(q2, k2, v2, kv2, 0.25, timer=timer) is best and len(timed) == len(candidates)
    assert list(tuned_launches()) == [shape_key(q, k, key_valid)]
    q3, k3, v3, _ = _inputs(2, 4, 2, 5, 200, 16, torch.float32)
    timed.clear()
    tuned_launch(q3, k3, v3, None, 0.25, timer=timer)                       # unmasked: another shape
    assert len(timed) == len(candidates) and len(tuned_launches()) == 2
    q4, k4, v4, kv4 = _inputs(3, 4, 2, 9, 200, 16, torch.float32)           # 3 rows, 9 queries: the next buckets
    timed.clear()
    tuned_launch(q4, k4, v4, kv4, 0.25, timer=timer)
    assert len(timed) == len(candidates) and len(tuned_launches()) == 3


@pytest.mark.parametrize("shape", [(1, 4, 4, 32, 96, 16), (2, 6, 2, 7, 130, 24), (1, 2, 1, 1, 300, 64)])
def test_tuned_launches_give_the_reference_attention(shape, monkeypatch, no_tuned_launches):
    monkeypatch.setenv("DLLM_ATTENTION_LAUNCH", "tuned")
    q, k, v, key_valid = _inputs(*shape, torch.float32)
    out = bidir_attn(q, k, v, key_valid)
    _check(out, q, k, v, key_valid)
    assert list(tuned_launches()) == [shape_key(q, k, key_valid)]
    _check(bidir_attn(q, k, v, key_valid), q, k, v, key_valid)              # the remembered launch


def test_fixed_launches_tune_nothing_and_bad_choices_are_named(monkeypatch, no_tuned_launches):
    q, k, v, key_valid = _inputs(1, 2, 2, 4, 64, 16, torch.float32)
    for value in (None, "auto", "fixed"):
        if value is None:
            monkeypatch.delenv("DLLM_ATTENTION_LAUNCH", raising=False)
        else:
            monkeypatch.setenv("DLLM_ATTENTION_LAUNCH", value)
        assert launch_choice() == "fixed"
        bidir_attn(q, k, v, key_valid)
    assert tuned_launches() == {}
    monkeypatch.setenv("DLLM_ATTENTION_LAUNCH", "fastest")
    with pytest.raises(ValueError, match="DLLM_ATTENTION_LAUNCH='fastest'; valid: auto, fixed, tuned"):
        bidir_attn(q, k, v, key_valid)


def test_a_candidate_out_of_shared_memory_is_skipped(no_tuned_launches):
    import triton
    q, k, v, key_valid = _inputs(1, 2, 2, 4, 128, 16, torch.float32)
    candidates = launch_candidates(16, 128)

    def timer(fn):
        timer.calls += 1
        if timer.calls == 1:                     # the first (and otherwise fastest) does not fit
            raise triton.runtime.errors.OutOfResources(200_000, 100_000, "shared memory")
        return float(timer.calls)

    timer.calls = 0
    assert tuned_launch(q, k, v, key_valid, 0.25, timer=timer) == candidates[1]
