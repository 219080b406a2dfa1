"""The model's products with few rows on CPU: F.linear (x @ W^T) against dllm's `linear`, which
takes W @ x^T for float32 inputs of `SMALL_ROWS` rows and weights of at least
`SMALL_ROWS_MIN_WEIGHT` entries (dllm/models/transformer.py), measured in one run.

For each weight shape of a preset (q/o, k/v, gate/up, down, the LM head) and each row count, the
median of `--repeats` calls of both, and their ratio (> 1: `linear` is faster). Row counts outside
the band run F.linear in both columns, so their ratio shows the noise of the machine.
`--generate` also times `dual` + `threshold` (tau 0.9) generation at batch 1 on the preset's
random-weight model and shape with the band on and off, alternating, and reports the share of equal tokens.

    python benchmarks/bench_linear.py                               # llada-compute shapes (~1 min on 2 cores)
    python benchmarks/bench_linear.py --presets llada-8b --rows 8,13,32,64   # the 8B shapes (needs ~6 GB)
    python benchmarks/bench_linear.py --generate --repeats 5        # + end to end (~4 min)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dllm  # noqa: E402
import dllm.cache  # noqa: E402
from dllm.config import ModelConfig  # noqa: E402
from dllm.models import transformer  # noqa: E402
from bench_generate import BENCH_PRESETS, HEADLINE_TAU, environment, prompt_batch, quantile  # noqa: E402

OFF = (1, 0)   # an empty band: every product is F.linear


def shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    kv = cfg.n_kv_heads * cfg.head_dim
    named = {"q, o": (cfg.d_model, cfg.d_model), "k, v": (kv, cfg.d_model),
             "gate, up": (cfg.mlp_hidden, cfg.d_model), "down": (cfg.d_model, cfg.mlp_hidden),
             "head": (cfg.vocab_size, cfg.d_model)}
    out = {}
    for name, shape in named.items():
        out.setdefault(shape, []).append(name)
    return {", ".join(v): k for k, v in out.items()}


def median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return quantile(times, 0.5)


def bench_products(cfg, rows: list[int], repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    print(f"{'weight':<22}{'N x K':>16}{'rows':>6}{'F.linear ms':>13}{'linear ms':>11}{'ratio':>8}  path")
    for name, (n, k) in shapes(cfg).items():
        w = torch.randn(n, k, generator=g) * 0.02
        reps = max(3, repeats // 4) if w.numel() > 1 << 26 else repeats
        for m in rows:
            x = torch.randn(m, k, generator=g)
            base = median_seconds(lambda: F.linear(x, w), reps)
            ours = median_seconds(lambda: transformer.linear(x, w), reps)
            path = "W @ x^T" if transformer.takes_transposed_product(x, w) else "F.linear"
            print(f"{name:<22}{f'{n} x {k}':>16}{m:>6}{base * 1e3:>13.2f}{ours * 1e3:>11.2f}{base / ours:>8.2f}  {path}",
                  flush=True)
        del w


def bench_generation(name: str, repeats: int, seed: int) -> None:
    p = BENCH_PRESETS[name]
    cfg = ModelConfig.from_name(p.model)
    model = dllm.build_model(cfg, "sdpa", dtype=torch.float32, device=torch.device("cpu"), seed=seed, init_std=0.3)
    prompt = prompt_batch(cfg, 1, p.prompt_length, seed, torch.device("cpu")).tolist()

    def run():
        return dllm.generate(model, None, prompt, gen_length=p.gen_length, block_length=p.block_length, steps=None,
                             sampler="threshold", sampler_kwargs={"tau": HEADLINE_TAU}, seed=seed, temperature=0.0,
                             cache=dllm.cache.get_policy("dual"))

    band = transformer.SMALL_ROWS
    seconds = {"on": [], "off": []}
    outs = {}
    try:
        for i in range(repeats + 1):                       # the first round is an untimed warm-up
            for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
                transformer.SMALL_ROWS = band if mode == "on" else OFF
                start = time.perf_counter()
                outs[mode] = run()
                if i:
                    seconds[mode].append(time.perf_counter() - start)
    finally:
        transformer.SMALL_ROWS = band
    on, off = quantile(seconds["on"], 0.5), quantile(seconds["off"], 0.5)
    same = float((outs["on"].generated == outs["off"].generated).float().mean())
    print(f"{name}: dual + threshold(tau={HEADLINE_TAU}), batch 1, prompt {p.prompt_length}, gen {p.gen_length}, "
          f"block {p.block_length}, {repeats} repeat(s) each: "
          f"band off {off:.2f} s, on {on:.2f} s -> {off / on:.2f}x; {outs['on'].forwards} and "
          f"{outs['off'].forwards} forwards; {same:.1%} of the tokens equal")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="llada-compute",
                    help=f"comma-separated bench_generate presets ({', '.join(BENCH_PRESETS)})")
    ap.add_argument("--rows", default="1,4,8,13,16,24,32,48,64,128", help="comma-separated row counts")
    ap.add_argument("--repeats", type=int, default=20,
                    help="timed calls per product (weights over 2**26 entries: a quarter, at least 3; generation: "
                         "runs per mode, 3 when this is above 5)")
    ap.add_argument("--generate", action="store_true", help="also time generation with the band on and off")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",") if r.strip()]
    except ValueError:
        ap.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if not rows or min(rows) < 1:
        ap.error(f"--rows must be >= 1, got {args.rows!r}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    names = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [n for n in names if n not in BENCH_PRESETS]
    if unknown or not names:
        ap.error(f"--presets: unknown {', '.join(unknown) or '(none given)'}; available: {', '.join(BENCH_PRESETS)}")
    configs = [(n, ModelConfig.from_name(BENCH_PRESETS[n].model)) for n in names]
    env = environment(torch.device("cpu"))
    print(f"dllm {env['dllm_version']} | torch {env['torch_version']} | git {(env['git_commit'] or '?')[:10]} | "
          f"{env['cpu_model']} | {env['cpu_cores']} cores, {env['torch_threads']} torch threads | float32 | band "
          f"{transformer.SMALL_ROWS[0]}-{transformer.SMALL_ROWS[1]} rows, weights >= "
          f"{transformer.SMALL_ROWS_MIN_WEIGHT} entries", flush=True)
    for name, cfg in configs:
        print(f"\n{name}")
        bench_products(cfg, rows, args.repeats)
        if args.generate:
            bench_generation(name, args.repeats if args.repeats <= 5 else 3, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
