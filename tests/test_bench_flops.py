"""`benchmarks/bench_generate.py --count-flops`: the counted FLOPs of a forward equal the
arithmetic of its shapes, written out by hand, for a full forward and a cached partial one."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import dllm
from dllm.cache import KVCache

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_generate_under_test", ROOT / "benchmarks" / "bench_generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def by_hand(cfg, batch, recomputed, keys, scored):
    """Matrix-product and attention FLOPs (2 per multiply-add) of `batch` rows that recompute
    `recomputed` columns against `keys` keys and take logits at `scored` columns: every layer
    computes the keys and values of the recomputed columns, every layer but the last also their
    queries, attention output and MLP, and the last layer those of the scored columns only."""
    d, kv, f = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.mlp_hidden
    keys_values = 2 * 2 * d * kv                                         # k, v
    rest = 2 * (d * d + d * d + 3 * d * f)                               # q, o; gate, up, down

    def attention(queries):
        return 2 * 2 * cfg.n_heads * queries * keys * cfg.head_dim       # scores and weighted values

    layers = (cfg.n_layers - 1) * (recomputed * (keys_values + rest) + attention(recomputed))
    last = recomputed * keys_values + scored * rest + attention(scored)
    return batch * (layers + last + scored * 2 * d * cfg.vocab_size)


@pytest.mark.parametrize("name", ["llada-tiny", "dream-tiny"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_counted_flops_equal_the_shapes_arithmetic(bench, name, attention):
    cfg = dllm.ModelConfig.from_name(name)
    model = dllm.build_model(cfg, attention=attention, seed=0)
    B, L = 3, 23
    x = torch.randint(0, 300, (B, L), generator=torch.Generator().manual_seed(0))
    at = torch.tensor([[4, 9], [5, 10], [6, 11]])            # 2 scored columns per row
    with torch.no_grad():
        _, full = bench.count_flops(lambda: model(x, at))
        assert full == by_hand(cfg, B, L, L, 2)

        cache = KVCache.for_model(model, B, L)
        model(x, at, cache=cache)                               # fills the cache
        # 7 recomputed columns per row; Dream also recomputes the scored columns' left neighbours
        # (3-5, 8-10, of which 5 and 10 are named already), so its plan holds 7 + 2 of them
        positions = torch.tensor([[4, 5, 6, 7, 9, 10, 11]]).expand(B, -1)
        positions = positions + torch.arange(B)[:, None] % 2
        _, part = bench.count_flops(lambda: model(x, at, positions=positions, cache=cache))
    if cfg.logit_shift:
        recomputed = torch.unique(torch.cat([positions, (at - 1).clamp(min=0)], 1)[0]).numel()
    else:
        recomputed = positions.shape[1]
    assert part == by_hand(cfg, B, recomputed, L, 2)
    assert part < full


def test_count_flops_needs_countable_attention(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--caches", "--count-flops", "--attention", "triton"])
    assert "--count-flops" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--count-flops"])
    assert "needs --caches" in capsys.readouterr().err
