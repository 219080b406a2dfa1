"""Suffix dropout (DPad, `dllm.dpad`) against the same decode without it, measured in one run.

For each random-weight preset (seeded, so decoding is deterministic), one batch of random prompts
is decoded with `low_confidence` at a fixed number of tokens per step, so that a decode takes the
same forwards with and without the dropout and the ratio is what the dropout saves per forward.
Each cache policy (`--caches`) runs plain and with the dropout, alternating, `--repeats` times.
Printed per configuration: the median seconds per decode, the forwards, the mean canvas columns a
forward ran through the model (all of them without a cache; the recomputed ones with one), the
time ratio dropout / plain of the same policy, and the share of generated tokens equal to the plain
decode's (random weights: how much the dropout changed, not a quality measure). Rows go to `--out`
as JSON lines.

    python benchmarks/bench_dpad.py                                    # llada-compute, prompt 128, gen 512
    python benchmarks/bench_dpad.py --presets llada-tiny --gen-length 64 --block-length 8 --repeats 1   # seconds
    python benchmarks/bench_dpad.py --presets llada-8b --device cuda --dtype bfloat16 \\
        --prompt-length 256 --gen-length 1024 --block-length 32 --tokens-per-step 4

The default dropout is DPad's setting for LLaDA-1.5 at 1024 tokens (window 256, sigma 3,
scale 1.6); `--dropout KEY=VALUE` (repeatable) gives others.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import dllm
from dllm.cli.options import parse_kv
from dllm.provenance import hardware, source_commit, timestamp, versions

DPAD_1024 = {"window": 256, "sigma": 3.0, "scale": 1.6}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_decode(model, prompts, cfg: dllm.GenerationConfig):
    """(output, seconds, mean columns per model forward) of one decode."""
    columns = []
    handle = model.embed.register_forward_hook(lambda mod, args, out: columns.append(args[0].numel()))
    try:
        _sync(model.device)
        start = time.perf_counter()
        out = dllm.generate(model, None, prompts, cfg)
        _sync(model.device)
        seconds = time.perf_counter() - start
    finally:
        handle.remove()
    return out, seconds, sum(columns) / len(columns) / len(prompts)


def bench_preset(preset: str, args, dropout: dict) -> list[dict]:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = dllm.build_model(dllm.ModelConfig.from_name(preset), seed=0, device=device, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(1)
    vocab = min(model.config.vocab_size, model.config.mask_token_id)
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_length), generator=gen).tolist()
    rows = []
    for cache in args.caches.split(","):
        base = dllm.GenerationConfig(gen_length=args.gen_length, block_length=args.block_length,
                                     tokens_per_step=args.tokens_per_step, sampler="low_confidence", cache=cache)
        configs = {"plain": base, "dpad": base.replace(suffix_dropout=dropout)}
        for cfg in configs.values():            # untimed: first-use costs at every shape
            if args.warmup:
                dllm.generate(model, None, prompts, cfg.replace(gen_length=args.block_length * 2))
        seconds = {name: [] for name in configs}
        outputs, columns = {}, {}
        for _ in range(args.repeats):
            for name, cfg in configs.items():
                out, s, cols = timed_decode(model, prompts, cfg)
                seconds[name].append(s)
                outputs[name], columns[name] = out, cols
        plain_s = statistics.median(seconds["plain"])
        for name in configs:
            out = outputs[name]
            same = (out.generated == outputs["plain"].generated).float().mean().item()
            row = dict(preset=preset, cache=cache, config=name, suffix_dropout=configs[name].suffix_dropout,
                       batch=args.batch, prompt_length=args.prompt_length, gen_length=args.gen_length,
                       block_length=args.block_length, tokens_per_step=args.tokens_per_step,
                       device=str(device), dtype=args.dtype, forwards=out.forwards,
                       columns_per_forward=round(columns[name], 1), seconds=[round(s, 3) for s in seconds[name]],
                       median_s=round(statistics.median(seconds[name]), 3),
                       ratio=round(statistics.median(seconds[name]) / plain_s, 3), same_tokens=round(same, 4))
            rows.append(row)
            print(f"{preset:14s} {cache:6s} {name:6s} forwards {out.forwards:4d}  columns/forward "
                  f"{row['columns_per_forward']:8.1f}  median {row['median_s']:8.3f} s  dpad/plain {row['ratio']:.3f}"
                  f"  same tokens {same:.3f}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="llada-compute")
    p.add_argument("--caches", default="none,prefix,dual")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--gen-length", type=int, default=512)
    p.add_argument("--block-length", type=int, default=64)
    p.add_argument("--tokens-per-step", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dropout", action="append", metavar="KEY=VALUE",
                   help="suffix dropout setting (repeatable); default window=256 sigma=3 scale=1.6")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--out", default=None, help="append the rows here as JSON lines")
    args = p.parse_args(argv)
    dropout = parse_kv(args.dropout, "--dropout") or DPAD_1024
    machine = {**hardware(device=args.device), **versions(), "commit": source_commit()[0], "date": timestamp()}
    print(json.dumps(machine), flush=True)
    rows = []
    for preset in args.presets.split(","):
        rows += bench_preset(preset, args, dropout)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps({**row, "machine": machine}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
