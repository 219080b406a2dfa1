"""The fused rotary + K/V write kernel (`dllm.kernels.rope_write`) against the layer's torch
operations it replaces (`apply_rope` and `KVCache.update`'s indexed write): bit for bit on odd
shapes, grouped-query heads, a subset of query columns, a subset of cache rows, repeated plan
columns and strided inputs; forwards and decodes through it equal the torch path's, and a cached
forward through it dispatches fewer operations than a full forward (CPU under TRITON_INTERPRET=1,
or CUDA)."""
import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install 'dllm[triton]')")

import dllm  # noqa: E402
from dllm import overhead  # noqa: E402
from dllm.cache import KVCache  # noqa: E402
from dllm.config import GenerationConfig, ModelConfig  # noqa: E402
from dllm.kernels import add_launch_listener, remove_launch_listener  # noqa: E402
from dllm.kernels.rope_write import rope_write_impl, rope_write_triton  # noqa: E402
from dllm.models.transformer import apply_rope, rope_cos_sin  # noqa: E402
from tests.fixtures.triton_marks import DEVICE, TRITON_MARKS  # noqa: E402

pytestmark = TRITON_MARKS
CASES = {"fp32": (torch.float32, True), "fp16-rotate-fp32": (torch.float16, True),
         "fp16-rotate-fp16": (torch.float16, False)}
if DEVICE == "cuda":  # the interpreter computes bf16 wrongly; a GPU checks it
    CASES["bf16-rotate-fp32"] = (torch.bfloat16, True)
    CASES["bf16-rotate-bf16"] = (torch.bfloat16, False)


def _columns(B, n, L, g, repeat_first=False):
    cols = torch.stack([torch.randperm(L, generator=g)[:n].sort().values for _ in range(B)])
    if repeat_first:   # a plan padded by repeating a row's first column (dllm.cache.plan_columns)
        cols[0, -2:] = cols[0, 0]
    return cols


class _Launches:
    def __init__(self):
        self.names = []

    def enter_launch(self, name):
        self.names.append(name)

    def exit_launch(self, name):
        pass


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("B, Q, P, H, H_kv, D, L", [
    (3, 5, 7, 4, 2, 16, 20),      # grouped-query heads, fewer query columns than written ones
    (1, 9, 9, 7, 1, 6, 13),       # head dim not a power of two, one key head
    (2, 1, 4, 2, 2, 128, 33),
])
def test_kernel_equals_the_torch_operations(case, B, Q, P, H, H_kv, D, L):
    dtype, fp32 = case
    g = torch.Generator().manual_seed(B * 100 + D)
    # q, k, v as views of one fused projection, as strided as a model's may be
    qkv = torch.randn(B, P, (H + 2 * H_kv) * D, generator=g).to(DEVICE, dtype)
    q = qkv[:, :Q, :H * D].view(B, Q, H, D)
    k = qkv[..., H * D:(H + H_kv) * D].view(B, P, H_kv, D)
    v = qkv[..., (H + H_kv) * D:].view(B, P, H_kv, D)
    positions = _columns(B, P, L, g, repeat_first=P > 2).to(DEVICE)
    cos, sin = rope_cos_sin(positions + 3, D, 10000.0)
    keep = _columns(B, Q, P, g).to(DEVICE)
    index = keep[:, None, :, None].expand(-1, 1, -1, D)
    cos_q, sin_q = cos.gather(2, index), sin.gather(2, index)
    rows = torch.tensor([0, 9, 2, 9, 3, 9], device=DEVICE)[::2][:B]     # rows 0, 2, 3 as a strided view
    kb = torch.full((4, H_kv, L, D), float("nan"), dtype=dtype, device=DEVICE)
    vb = kb.clone()
    want_k, want_v = kb.clone(), vb.clone()

    q_out = rope_write_triton(q, k, v, cos_q, sin_q, cos, sin, kb, vb, rows, positions, fp32)

    want_q = apply_rope(q.transpose(1, 2), cos_q, sin_q, fp32)
    entries = (rows.view(-1, 1, 1), torch.arange(H_kv, device=DEVICE).view(1, -1, 1), positions.unsqueeze(1))
    want_k.index_put_(entries, apply_rope(k.transpose(1, 2), cos, sin, fp32))
    want_v.index_put_(entries, v.transpose(1, 2))
    assert q_out.shape == (B, H, Q, D) and torch.equal(q_out, want_q)
    assert torch.equal(kb.nan_to_num(7.0), want_k.nan_to_num(7.0))   # untouched entries stay NaN on both
    assert torch.equal(vb.nan_to_num(7.0), want_v.nan_to_num(7.0))


def test_bad_inputs_are_named():
    q, k = torch.zeros(1, 2, 2, 8, device=DEVICE), torch.zeros(1, 3, 1, 8, device=DEVICE)
    cos = torch.zeros(1, 1, 3, 8, device=DEVICE)
    kb = torch.zeros(1, 1, 5, 8, device=DEVICE)
    rows, positions = torch.zeros(1, dtype=torch.long, device=DEVICE), torch.zeros(1, 3, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match=r"cos_q must be float32 \(B, 1, 2, 8\)"):
        rope_write_triton(q, k, k, cos, cos, cos, cos, kb, kb, rows, positions, True)
    with pytest.raises(ValueError, match=r"k and v must be \(B, P, H_kv, D\)"):
        rope_write_triton(q, k, k[:, :2], cos[:, :, :2], cos[:, :, :2], cos, cos, kb, kb, rows, positions, True)
    with pytest.raises(ValueError, match=r"H a multiple of H_kv, got D 8, H 2, H_kv 0"):
        rope_write_triton(q, k[:, :2, :0], k[:, :2, :0], cos[:, :, :2], cos[:, :, :2], cos[:, :, :2], cos[:, :, :2],
                          kb, kb, rows, positions, True)
    with pytest.raises(ValueError, match=r"kb and vb must be alike"):
        rope_write_triton(q, k, k, cos[:, :, :2], cos[:, :, :2], cos, cos, kb, kb.half(), rows, positions, True)
    with pytest.raises(ValueError, match=r"rows and positions must be int32 or int64, got torch.float32"):
        rope_write_triton(q, k, k, cos[:, :, :2], cos[:, :, :2], cos, cos, kb, kb, rows.float(), positions, True)


def test_columns_and_rows_outside_the_buffers_are_not_written():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 1, 8, generator=g).to(DEVICE) for _ in range(3))
    cos, sin = rope_cos_sin(torch.tensor([[0, 1, 2], [0, 1, 2]], device=DEVICE), 8, 10000.0)
    kb = torch.zeros(2, 1, 4, 8, device=DEVICE)
    vb = kb.clone()
    rows = torch.tensor([0, 2], device=DEVICE)                       # row 2 lies past the 2 buffer rows
    positions = torch.tensor([[1, 4, -1], [0, 1, 2]], device=DEVICE)  # columns 4 and -1 outside L = 4
    rope_write_triton(q, k, v, cos, sin, cos, sin, kb, vb, rows, positions, True)
    written = (vb != 0).any(-1)[:, 0]
    assert written.tolist() == [[False, True, False, False], [False, False, False, False]]
    assert torch.equal(vb[0, 0, 1], v[0, 0, 0])


def test_impl_choice(monkeypatch):
    monkeypatch.delenv("DLLM_ROPE_WRITE", raising=False)
    assert rope_write_impl() == "torch" and rope_write_impl(device=DEVICE, dtype=torch.float32) == "torch"
    monkeypatch.setenv("DLLM_ROPE_WRITE", "triton")
    assert rope_write_impl(None, DEVICE, torch.float32) == "triton"
    assert rope_write_impl(None, DEVICE, torch.float64) == "torch"      # not a dtype the kernel takes
    # the interpreter truncates to bf16 where a GPU rounds: bf16 stays on the torch path there
    assert rope_write_impl(None, DEVICE, torch.bfloat16) == ("torch" if DEVICE == "cpu" else "triton")
    monkeypatch.setenv("DLLM_ROPE_WRITE", "fast")
    with pytest.raises(ValueError, match=r"DLLM_ROPE_WRITE='fast'; valid: auto, torch, triton"):
        rope_write_impl()


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's bf16")
def test_bf16_under_the_interpreter_is_refused_by_the_kernel_and_decodes_on_the_torch_path(monkeypatch):
    z = torch.zeros(1, 1, 2, 4, dtype=torch.bfloat16)
    cs = torch.zeros(1, 1, 1, 4)
    with pytest.raises(ValueError, match=r"cannot write bf16 under TRITON_INTERPRET=1"):
        rope_write_triton(z, z[:, :, :1], z[:, :, :1], cs, cs, cs, cs, torch.zeros(1, 1, 3, 4, dtype=torch.bfloat16),
                          torch.zeros(1, 1, 3, 4, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.long),
                          torch.zeros(1, 1, dtype=torch.long), fp32=True)
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=1, dtype=torch.bfloat16)
    runs = {}
    for impl in ("torch", "triton"):
        monkeypatch.setenv("DLLM_ROPE_WRITE", impl)
        runs[impl] = dllm.generate(model, None, [[5, 6, 7], [9]], gen_length=16, block_length=8, cache="dual",
                                   sampler="threshold").sequences
    assert torch.equal(runs["torch"], runs["triton"])


def _model(preset: str):
    return dllm.build_model(ModelConfig.from_name(preset), seed=1).to(DEVICE).eval()


@pytest.mark.parametrize("preset", ["llada-tiny", "dream-tiny"])
def test_cached_forward_equals_the_torch_path(preset, monkeypatch):
    model = _model(preset)
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    B, L = 3, 40
    x = torch.randint(0, 200, (B, L), generator=g).to(DEVICE)
    key_valid = (torch.arange(L)[None, :] >= torch.tensor([0, 5, 11])[:, None]).to(DEVICE)   # left padding
    positions = _columns(2, 6, L, g, repeat_first=True).to(DEVICE)
    rows = torch.tensor([0, 2], device=DEVICE)
    logits_at = positions[:, 1:4]
    results, launches = {}, _Launches()
    add_launch_listener(launches)
    try:
        for impl in ("torch", "triton"):
            monkeypatch.setenv("DLLM_ROPE_WRITE", impl)
            cache = KVCache(cfg.n_layers, B, cfg.n_kv_heads, L, cfg.head_dim, model.dtype, DEVICE)
            with torch.no_grad():
                model(x, cache=cache, key_valid=key_valid)                      # fill every column
                out = model(x[rows], logits_at, positions=positions, cache=cache, rows=rows,
                            key_valid=key_valid[rows])
            results[impl] = (out, [t.clone() for t in cache.k + cache.v])
    finally:
        remove_launch_listener(launches)
    assert launches.names == ["rope_write"] * cfg.n_layers                     # the cached forward only
    assert torch.equal(results["torch"][0], results["triton"][0])
    assert all(torch.equal(a, b) for a, b in zip(results["torch"][1], results["triton"][1]))


def test_a_cached_forward_that_records_gradients_keeps_the_torch_path(monkeypatch):
    """The kernel has no backward: where autograd records, the rotary write stays in torch ops and
    the keys' gradient reaches the k projection."""
    model = _model("llada-tiny")
    cfg = model.config
    B, L = 2, 24
    x = torch.randint(0, 200, (B, L), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    positions = torch.tensor([[3, 4, 9], [5, 6, 7]], device=DEVICE)
    monkeypatch.setenv("DLLM_ROPE_WRITE", "triton")
    cache = KVCache(cfg.n_layers, B, cfg.n_kv_heads, L, cfg.head_dim, model.dtype, DEVICE)
    with torch.no_grad():
        model(x, cache=cache)
    launches = _Launches()
    add_launch_listener(launches)
    try:
        out = model(x, positions, positions=positions, cache=cache)
    finally:
        remove_launch_listener(launches)
    assert launches.names == []
    out.float().sum().backward()
    k_weights = [p for name, p in model.named_parameters() if name.endswith("attn.k.weight")]
    assert k_weights and all(p.grad is not None and p.grad.abs().sum() > 0 for p in k_weights)


@pytest.mark.parametrize("cache", ["dual", "prefix", "dkv-decode"])
def test_decode_gives_the_torch_paths_tokens(cache, monkeypatch):
    model = _model("llada-tiny")
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]      # ragged
    config = GenerationConfig(gen_length=16, block_length=8, sampler="threshold", cache=cache)
    monkeypatch.setenv("DLLM_ROPE_WRITE", "torch")
    want = dllm.generate(model, None, prompts, config)
    monkeypatch.setenv("DLLM_ROPE_WRITE", "triton")
    got = dllm.generate(model, None, prompts, config)
    assert torch.equal(got.generated, want.generated) and got.forwards == want.forwards


@pytest.mark.parametrize("preset", ["llada-tiny", "dream-tiny"])
def test_a_fused_cached_forward_dispatches_fewer_operations_than_a_full_forward(preset, monkeypatch):
    model = _model(preset)
    config = GenerationConfig(gen_length=16, block_length=8, sampler="threshold")
    prompt = [list(range(5, 21))]
    full_ops, _ = overhead.count_decode(model, prompt, config.replace(cache="none")).per_call("full")
    monkeypatch.setenv("DLLM_ROPE_WRITE", "triton")
    counts = overhead.count_decode(model, prompt, config.replace(cache="dual"))
    cached_ops, cached_syncs = counts.per_call("cached")
    assert cached_syncs == 0
    # the torch path's cached forward dispatches more than a full one (tests/test_overhead.py);
    # rotating and writing in one launch saves 14 operations per layer on these presets
    assert cached_ops < full_ops - model.config.n_layers * 10, (cached_ops, full_ops)
