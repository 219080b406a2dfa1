"""Wall time of single forwards, eager and as CUDA graphs, on a random-weight preset.

Three calls on a 512-column canvas (prompt 256 + generation 256), logits at one 32-column block:

* `full`:    a full refresh through a KV cache (every column recomputed and stored),
* `step32`:  a cached step recomputing the 32 block columns, logits at 16 of them (their places
             among the recomputed columns given, as the decode loop gives them),
* `nocache`: a full forward without a cache (what `none` runs).

Each call runs 3 times untimed, then 20 times timed; the ratios printed (eager / graphs, full /
step32) come from the same run, and each graphed call's logits are compared with the eager ones.
`--compile` runs the forwards through `model.set_compile` (the untimed calls compile). `--count`
prints each call's aten operations and host synchronisations (`dllm.overhead.DispatchCounter`);
`--profile` prints the kernels and host time of three eager `step32` calls (torch.profiler).
For a mixture-of-experts preset (`llada-moe-*`), the share of each eager call's time spent in
the MoE MLPs is printed too (timed between hooks around them, the device synchronised at each).

    python benchmarks/bench_forward.py --presets llada-compute,llada-8b          # on a GPU
    python benchmarks/bench_forward.py --presets llada-compute --device cpu      # eager only
    python benchmarks/bench_forward.py --presets llada-8b --count --profile      # where the time goes
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
from dllm.overhead import DispatchCounter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import DTYPES, sync  # noqa: E402


def count(name: str, calls: dict) -> None:
    """Print the aten operations and host synchronisations of one call of each kind."""
    for what, fn in calls.items():
        with torch.no_grad(), DispatchCounter() as counter:
            fn()
        bucket = counter.counts[counter.kind]
        print(f"{name:<18}count   {what:<8} {bucket.ops:6d} ops {bucket.syncs:3d} syncs", flush=True)


def moe_share(name: str, calls: dict, modules: list, device: torch.device, repeats: int = 3) -> None:
    """Print the share of each eager call's time spent inside `modules` (the MoE MLPs)."""
    spent = [0.0]

    def enter(module, args):
        sync(device)
        module._entered = time.perf_counter()

    def leave(module, args, output):
        sync(device)
        spent[0] += time.perf_counter() - module._entered

    handles = [h for m in modules for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    try:
        with torch.no_grad():
            for what, fn in calls.items():
                fn()
                spent[0] = 0.0
                sync(device)
                start = time.perf_counter()
                for _ in range(repeats):
                    fn()
                sync(device)
                total = time.perf_counter() - start
                print(f"{name:<18}moe     {what:<8} {spent[0] / total:6.1%} of {total / repeats * 1e3:.2f} ms/call",
                      flush=True)
    finally:
        for h in handles:
            h.remove()


def profile(name: str, fn, device: torch.device) -> None:
    """Print the heaviest kernels and the host time of three eager calls of `fn`."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            fn()
        sync(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"{name}: three eager step32 calls, by {sort}")
    print(prof.key_averages().table(sort_by=sort, row_limit=18, max_name_column_width=60), flush=True)


def bench(name: str, device: torch.device, dtype: torch.dtype, calls_timed: int, compiled: bool = False,
          counted: bool = False, profiled: bool = False) -> None:
    cfg = ModelConfig.from_name(name)
    model = dllm.build_model(cfg, "sdpa", dtype=dtype, device=device, seed=0, init_std=0.02)
    model.set_compile(compiled)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, min(1000, cfg.vocab_size - 30), (1, 512), generator=gen).to(device)
    cache = KVCache.for_model(model, 1, 512)
    block = torch.arange(256, 288, device=device)[None]
    half = torch.arange(256, 272, device=device)[None]
    calls = {"full": lambda: model(x, block, cache=cache),
             "step32": lambda: model(x, half, positions=block, cache=cache, logits_from=half - 256),
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
                mode = ("graphs" if graphs else "eager") + ("+c" if compiled else "")
                print(f"{name:<18}{mode:<8}{what:<8} {res[graphs, what][0] * 1e3:9.2f} ms/call", flush=True)
    # counted and profiled after the timing: the profiler's hooks slow the calls timed after it
    model.set_cuda_graphs(False)
    if counted:
        count(name, calls)
    if profiled:
        profile(name, calls["step32"], device)
    moe_layers = [layer.mlp for i, layer in enumerate(model.layers) if cfg.is_moe_layer(i)]
    if moe_layers:
        moe_share(name, calls, moe_layers, device)
    for graphs in modes:
        mode = ("graphs" if graphs else "eager") + ("+c" if compiled else "")
        print(f"{name:<18}{mode:<8}full/step32 {res[graphs, 'full'][0] / res[graphs, 'step32'][0]:.2f}x")
    if len(modes) == 2:
        for what in calls:
            same = torch.equal(res[False, what][1], res[True, what][1])
            print(f"{name:<18}{what:<8} eager/graphs {res[False, what][0] / res[True, what][0]:.2f}x, "
                  f"logits equal: {same}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="llada-compute", help=f"comma-separated, from {', '.join(PRESETS)}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=tuple(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--calls", type=int, default=20, help="timed calls of each kind (default 20)")
    ap.add_argument("--compile", action="store_true", help="run the forwards through model.set_compile")
    ap.add_argument("--count", action="store_true", help="print each call's aten operations and host syncs")
    ap.add_argument("--profile", action="store_true", help="print the kernels of three eager step32 calls")
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
        bench(n, device, dtype, args.calls, args.compile, args.count, args.profile)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
