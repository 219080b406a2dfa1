"""The model's products (`dllm.models.transformer.linear`): on CPU float32, few rows and a large
weight take W @ x^T; everything else is F.linear itself. Either way the result is x @ W^T + b."""
import pytest
import torch
import torch.nn.functional as F

import dllm
from dllm.cache import KVCache
from dllm.models import transformer
from dllm.models.transformer import Linear, linear

LO, HI = transformer.SMALL_ROWS


def _reference(x, w, b):
    """x @ W^T + b in float64: an order-independent yardstick for both float32 paths."""
    out = x.double() @ w.double().t()
    return out if b is None else out + b.double()


@pytest.mark.parametrize("lead", [(LO,), (1, 13), (3, 5), (2, 3, 4), (HI,)])
@pytest.mark.parametrize("bias", [False, True])
def test_small_rows_take_the_transposed_product_and_agree(lead, bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1031, 1024, generator=g) * 0.05                      # >= 2**20 entries, odd width
    b = torch.randn(1031, generator=g) if bias else None
    x = torch.randn(*lead, 1024, generator=g)
    calls = []
    real_mm, real_addmm = torch.mm, torch.addmm
    torch.mm = lambda *a, **k: calls.append("mm") or real_mm(*a, **k)
    torch.addmm = lambda *a, **k: calls.append("addmm") or real_addmm(*a, **k)
    try:
        out = linear(x, w, b)
    finally:
        torch.mm, torch.addmm = real_mm, real_addmm
    assert calls == ["addmm" if bias else "mm"]
    assert out.shape == (*lead, 1031) and out.is_contiguous()
    torch.testing.assert_close(out.double(), _reference(x, w, b), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out, F.linear(x, w, b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows, width, dtype", [
    (LO - 1, 1024, torch.float32),      # too few rows
    (HI + 1, 1024, torch.float32),      # too many
    (16, 1000, torch.float32),          # weight under the size
    (16, 1024, torch.float64),          # not float32
    (16, 1024, torch.float16),
])
def test_everything_else_is_F_linear_bit_for_bit(rows, width, dtype):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1024, width, generator=g).to(dtype)
    x = torch.randn(rows, width, generator=g).to(dtype)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_gradients_match_F_linear():
    g = torch.Generator().manual_seed(2)
    w0, b0, x0 = torch.randn(1030, 1024, generator=g) * 0.05, torch.randn(1030, generator=g), torch.randn(2, 9, 1024,
                                                                                                         generator=g)
    grads = []
    for fn in (linear, F.linear):
        w, b, x = (t.clone().requires_grad_() for t in (w0, b0, x0))
        (fn(x, w, b) ** 2).sum().backward()
        grads.append((x.grad, w.grad, b.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-4)


def test_linear_module_keeps_nn_linear_names_and_state():
    layer = Linear(1024, 1024, bias=True)
    assert isinstance(layer, torch.nn.Linear)
    assert sorted(layer.state_dict()) == ["bias", "weight"]


def test_model_with_large_weights_cached_step_agrees_with_full_forward():
    """A model wide enough for the transposed path: a cached step over an unchanged canvas gives
    the full forward's logits (to float32 rounding), with the cached step's products in the band."""
    cfg = dllm.ModelConfig(family="llada", vocab_size=2048, d_model=1024, n_layers=1, n_heads=8, n_kv_heads=8,
                           mlp_hidden=1536, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=128, mask_token_id=2000, eos_token_id=1999,
                           pad_token_id=1999, bos_token_id=1998, eot_token_id=1997, tie_embeddings=False)
    model = dllm.build_model(cfg, attention="sdpa", seed=0, init_std=0.05)
    g = torch.Generator().manual_seed(3)
    B, L = 2, 37
    x = torch.randint(0, 1990, (B, L), generator=g)
    at = torch.arange(20, 31).expand(B, -1)                           # 11 scored columns per row
    with torch.no_grad():
        cache = KVCache.for_model(model, B, L)
        full = model(x, at, cache=cache)
        positions = torch.arange(16, 32).expand(B, -1)                # 2 x 16 = 32 rows: in the band
        assert LO <= positions.numel() <= HI
        part = model(x, at, positions=positions, cache=cache)
    torch.testing.assert_close(part, full, atol=2e-4, rtol=2e-4)


def test_the_transposed_product_runs_at_padded_row_counts():
    """Fewer than 4 rows run at 4, 5 to 8 as they are, more than 8 at the next multiple of 8; the
    zero padding rows are dropped from the result."""
    assert [transformer.padded_rows(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 48)] == \
        [4, 4, 4, 4, 5, 7, 8, 16, 16, 16, 24, 32, 32, 48]
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1030, 1024, generator=g) * 0.05
    seen = []
    real_mm = torch.mm
    torch.mm = lambda a, b, **k: seen.append(b.shape[1]) or real_mm(a, b, **k)
    try:
        for rows in (3, 13, 31):
            x = torch.randn(rows, 1024, generator=g)
            out = linear(x, w)
            assert out.shape == (rows, 1030)
            torch.testing.assert_close(out.double(), _reference(x, w, None), atol=1e-4, rtol=1e-4)
    finally:
        torch.mm = real_mm
    assert seen == [4, 16, 32]
