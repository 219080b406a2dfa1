"""Wall time of single forwards, eager and as CUDA graphs, on a random-weight preset.

Three calls on a 512-column canvas (prompt 256 + generation 256), logits at one 32-column block:

* `full`:    a full refresh through a KV cache (every column recomputed and stored),
* `step32`:  a cached step recomputing the 32 block columns, logits at 16 of them,
* `nocache`: a full forward without a cache (what `none` runs).

Each call runs 3 times untimed, then 20 times timed; the ratios printed (eager / graphs, full /
step32) come from the same run, and each graphed call's logits are compared with the eager ones.

    python benchmarks/bench_forward.py --presets llada-compute,llada-8b          # on a GPU
    python benchmarks/bench_forward.py --presets llada-compute --device cpu      # eager only
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import dllm
from dllm.cache import KVCache
from dllm.config import PRESETS, ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import DTYPES, sync  # noqa: E402


def bench(name: str, device: torch.device, dtype: torch.dtype, calls_timed: int) -> None:
    cfg = ModelConfig.from_name(name)
    model = dllm.build_model(cfg, "sdpa", dtype=dtype, device=device, seed=0, init_std=0.02)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, min(1000, cfg.vocab_size - 30), (1, 512), generator=gen).to(device)
    cache = KVCache.for_model(model, 1, 512)
    block = torch.arange(256, 288, device=device)[None]
    half = torch.arange(256, 272, device=device)[None]
    calls = {"full": lambda: model(x, block, cache=cache),
             "step32": lambda: model(x, half, positions=block, cache=cache),
             "nocache": lambda: model(x, block)}
    modes = (False, True) if device.type == "cuda" else (False,)
    res = {}
    with torch.no_grad():
        for graphs in modes:
            model.set_cuda_graphs(graphs, capture_after=1)
            for what, fn in calls.items():
                for _ in range(3):
                    fn()
                sync(device)
                start = time.perf_counter()
                for _ in range(calls_timed):
                    out = fn()
                sync(device)
                res[graphs, what] = ((time.perf_counter() - start) / calls_timed, out.float())
                mode = "graphs" if graphs else "eager"
                print(f"{name:<14}{mode:<8}{what:<8} {res[graphs, what][0] * 1e3:9.2f} ms/call", flush=True)
    for graphs in modes:
        mode = "graphs" if graphs else "eager"
        print(f"{name:<14}{mode:<8}full/step32 {res[graphs, 'full'][0] / res[graphs, 'step32'][0]:.2f}x")
    if len(modes) == 2:
        for what in calls:
            same = torch.equal(res[False, what][1], res[True, what][1])
            print(f"{name:<14}{what:<8} eager/graphs {res[False, what][0] / res[True, what][0]:.2f}x, "
                  f"logits equal: {same}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="llada-compute", help=f"comma-separated, from {', '.join(PRESETS)}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=tuple(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--calls", type=int, default=20, help="timed calls of each kind (default 20)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    if args.calls < 1:
        ap.error(f"--calls must be >= 1, got {args.calls}")
    names = [n.strip() for n in args.presets.split(",") if n.strip()]
    for n in names:
        if n not in PRESETS:
            ap.error(f"unknown preset {n!r}; available: {', '.join(PRESETS)}")
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    for n in names:
        bench(n, device, dtype, args.calls)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
