import pytest
import torch

from dllm.attention import available_backends, get_backend


def _reference(q, k, v, key_valid, scale):
    """fp64 attention written out per head, independent of the backends."""
    B, H, P, D = q.shape
    group = H // k.shape[1]
    out = torch.empty(B, H, P, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            s = q[b, h].double() @ k[b, h // group].double().T * scale       # (P, L)
            if key_valid is not None and key_valid.dim() == 2:
                s[:, ~key_valid[b]] = float("-inf")
            elif key_valid is not None:                                      # a mask per query (P, L)
                s = s.masked_fill(~key_valid[b], float("-inf"))
            out[b, h] = torch.softmax(s, -1) @ v[b, h // group].double()
    return out


@pytest.mark.parametrize("B,H,H_kv,P,L,D", [(1, 4, 4, 7, 13, 16), (3, 4, 1, 5, 17, 8), (2, 7, 7, 3, 9, 32),
                                            (2, 14, 2, 6, 11, 16)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_backends_match_fp64_reference(backend, B, H, H_kv, P, L, D):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, P, D, generator=g)
    k = torch.randn(B, H_kv, L, D, generator=g)
    v = torch.randn(B, H_kv, L, D, generator=g)
    pad = torch.randint(0, L // 2, (B,), generator=g)
    key_valid = torch.arange(L)[None, :] >= pad[:, None]
    out = get_backend(backend)(q, k, v, key_valid, D ** -0.5)
    assert out.shape == (B, H, P, D) and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), _reference(q, k, v, key_valid, D ** -0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_backends_take_a_mask_per_query(backend):
    """Block-causal masks (LLaDA2): query p sees the keys before the end of its block."""
    g = torch.Generator().manual_seed(2)
    B, H, H_kv, P, L, D = 2, 4, 2, 6, 12, 8
    q, k, v = torch.randn(B, H, P, D, generator=g), torch.randn(B, H_kv, L, D, generator=g), torch.randn(B, H_kv, L, D, generator=g)
    columns = torch.tensor([[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]])
    key_valid = torch.arange(L) < ((columns // 4 + 1) * 4)[..., None]        # (B, P, L), blocks of 4
    key_valid[1, :, 0] = False                                                 # and a padding key
    out = get_backend(backend)(q, k, v, key_valid, D ** -0.5)
    torch.testing.assert_close(out.double(), _reference(q, k, v, key_valid, D ** -0.5), atol=1e-5, rtol=1e-5)


def test_eager_equals_sdpa_without_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=g) for _ in range(3))
    a = get_backend("eager")(q, k, v, None, 0.25)
    b = get_backend("sdpa")(q, k, v, None, 0.25)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_unknown_backend_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'.*eager, sdpa"):
        get_backend("flash")
    assert {"eager", "sdpa"} <= set(available_backends())
