"""Speed of the Triton kernels against the torch paths they replace, at the real models' shapes (CUDA only).

* attention (`dllm.kernels.attention.bidir_attn`, backend `triton`) against the `sdpa` backend: a
  block of 32 queries against 512-4096 cached keys, batch 1, at
    LLaDA-8B  32 query heads / 32 K/V heads x 128
    Dream-7B  28 query heads /  4 K/V heads x 128
  without a key mask and with left padding (10% of the keys invalid; sdpa then takes its masked
  path). Reported: TFLOP/s (4 B H P L D flops), GB/s (q, k, v, out and the mask read or written
  once), the speedup sdpa ms / triton ms, and both max-abs errors against the fp32 reference.
  `triton[tuned ...]` is the launch `DLLM_ATTENTION_LAUNCH=tuned` keeps for the shape (every
  configuration with 1, 2, 4, ... key ranges timed first; the row names the one kept). `--configs` adds one row per launch configuration in `CONFIGS`, with and without split-K, to
  check or retune the launcher's choice.
* token scoring (`token_scores_triton`) against the torch reference at 32 positions of the
  LLaDA (126,464) and Dream (152,064) vocabularies, at temperature 0 and 1. The baseline is the
  LLaDA reference path: a float64 softmax (and float64 Gumbel noise when sampling),
  `token_scores_ref(score_dtype=float64)`; the fp32 reference is shown too. `triton-fwd` is the
  two kernel launches alone, without the finiteness check and dtype casts of the public function.
  Reported: GB/s of logits read, the speedup over the float64 path, the share of tokens equal to
  the reference argmax (temperature 0) and the max-abs error of the probability.
* the LM head with greedy scoring (`dllm.kernels.head_scoring`) at 32 rows of the LLaDA-8B
  (4096 -> 126,464) and Dream-7B (3584 -> 152,064) heads: `unfused` (the head's product, then
  `token_scores_ref` in float32, the unfused path's arithmetic) against the chunked torch
  statement (`torch`) and the Triton kernel (`triton`, and `triton[s=N]` at fixed vocabulary
  splits). Reported: GB/s of head weight read, the speedup over `unfused`, the share of tokens
  equal to `unfused`'s and the max-abs difference of the probability from it.

Times are `triton.testing.do_bench` medians with the 20th/80th percentiles (warm-up excluded,
the device synchronised by do_bench). Rows print as a table and, with `--out`, append to a JSONL
file as `KernelRow`s (provenance columns as in bench_generate.py).

    python benchmarks/bench_kernels.py                       # bfloat16, every shape (~1 min on an H100)
    python benchmarks/bench_kernels.py --dtype float16 --configs --out kernels.jsonl
    python benchmarks/bench_kernels.py --only scoring --batch 4
    python benchmarks/bench_kernels.py --only head_scoring --positions 32,256

Without CUDA it prints that it needs a CUDA GPU and exits 0: the Triton interpreter proves
indexing, not speed (the kernel tests run there).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import Provenance, environment, load_avg  # noqa: E402

QUANTILES = [0.5, 0.2, 0.8]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class AttnCase:
    model: str
    heads: int
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class ScoreCase:
    model: str
    vocab: int


ATTN_CASES = (AttnCase("llada-8b", 32, 32, 128), AttnCase("dream-7b", 28, 4, 128))
SCORE_CASES = (ScoreCase("llada-8b", 126464), ScoreCase("dream-7b", 152064))
HEAD_CASES = ((ScoreCase("llada-8b", 126464), 4096), (ScoreCase("dream-7b", 152064), 3584))
HEAD_SPLITS = (1, 4, 16, 64)
KERNELS = ("attention", "scoring", "head_scoring")
KEYS = "512,1024,2048,4096"


@dataclass
class KernelRow(Provenance):
    # The ordering of the fields is the column order of the output.
    kernel: str                   # "attention" | "scoring" | "head_scoring"
    model: str
    provider: str                 # triton, sdpa, triton[config], triton-fwd, torch-fp64, torch-fp32
    dtype: str
    batch: int
    heads: int | None
    kv_heads: int | None
    queries: int | None
    keys: int | None
    head_dim: int | None
    masked: bool | None
    positions: int | None         # scoring: positions per row
    vocab: int | None
    d_model: int | None           # head_scoring: hidden size
    temperature: float | None
    ms: float                     # median
    ms_p20: float
    ms_p80: float
    tflops: float | None
    gbps: float
    baseline: str                 # the provider `speedup` compares with
    speedup: float                # baseline median / this median (> 1: faster)
    max_abs_err: float | None     # attention: vs the fp32 reference; scoring: prob vs the float64 reference
    tokens_equal: float | None    # scoring at temperature 0: share of tokens equal to the reference argmax


def _bench(fn) -> tuple[float, float, float]:
    import triton.testing
    med, p20, p80 = triton.testing.do_bench(fn, quantiles=QUANTILES)
    return med, p20, p80


def _row(env: dict, **fields) -> KernelRow:
    base = {f.name: None for f in dataclasses.fields(KernelRow)}
    base.update(env, timestamp_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), load_avg_1m=load_avg())
    base.update(fields)
    return KernelRow(**base)


# -- attention -----------------------------------------------------------------------------------
def attention_inputs(case: AttnCase, batch: int, queries: int, keys: int, masked: bool, dtype, device, seed=0):
    """q as the model makes it (a (B, P, H, D) projection seen as (B, H, P, D)), K/V cache buffers
    (B, H_kv, L, D), and a left-padding mask (10% of the keys invalid) or None."""
    g = torch.Generator(device).manual_seed(seed)
    B, H, H_kv, D = batch, case.heads, case.kv_heads, case.head_dim
    q = torch.randn(B, queries, H, D, generator=g, device=device, dtype=dtype).transpose(1, 2)  # (B, H, P, D)
    k = torch.randn(B, H_kv, keys, D, generator=g, device=device, dtype=dtype)                  # (B, H_kv, L, D)
    v = torch.randn(B, H_kv, keys, D, generator=g, device=device, dtype=dtype)                  # (B, H_kv, L, D)
    key_valid = None
    if masked:
        key_valid = torch.ones(B, keys, dtype=torch.bool, device=device)                        # (B, L)
        key_valid[:, : keys // 10] = False
    return q, k, v, key_valid


def bench_attention(case: AttnCase, batch: int, queries: int, keys: int, masked: bool, dtype, device, env: dict,
                    configs: bool, bench=_bench) -> list[KernelRow]:
    from dllm.attention import sdpa_attention
    from dllm.kernels.attention import CONFIGS, bidir_attn, bidir_attn_fwd, bidir_attn_ref, tuned_launch

    q, k, v, key_valid = attention_inputs(case, batch, queries, keys, masked, dtype, device)
    scale = case.head_dim ** -0.5
    ref = bidir_attn_ref(q, k, v, key_valid, scale)                                             # fp32
    B, H, P, D = q.shape
    flops = 4 * B * H * P * keys * D
    nbytes = (2 * q.numel() + k.numel() + v.numel()) * q.element_size() + (B * keys if masked else 0)
    tuned = tuned_launch(q, k, v, key_valid, scale)          # timed here, before the rows' timings
    providers = {"sdpa": lambda: sdpa_attention(q, k, v, key_valid, scale),
                 "triton": lambda: bidir_attn(q, k, v, key_valid, scale),
                 f"triton[tuned {tuned.config.BLOCK_M}x{tuned.config.BLOCK_N} w{tuned.config.num_warps} "
                 f"split={tuned.splits}]": lambda: bidir_attn_fwd(q, k, v, key_valid, scale, config=tuned.config,
                                                                  num_splits=tuned.splits)}
    if configs:
        for cfg in CONFIGS:
            for splits in (1, None):
                name = (f"triton[{cfg.BLOCK_M}x{cfg.BLOCK_N} w{cfg.num_warps} s{cfg.num_stages} "
                        f"{'split=auto' if splits is None else 'split=1'}]")
                providers[name] = (lambda c=cfg, s=splits:
                                   bidir_attn_fwd(q, k, v, key_valid, scale, config=c, num_splits=s))
    rows, base_ms = [], None
    for name, fn in providers.items():
        err = (fn().float() - ref).abs().max().item()
        med, p20, p80 = bench(fn)
        base_ms = med if name == "sdpa" else base_ms
        rows.append(_row(env, kernel="attention", model=case.model, provider=name, dtype=str(dtype).split(".")[-1],
                         batch=B, heads=H, kv_heads=case.kv_heads, queries=P, keys=keys, head_dim=D, masked=masked,
                         ms=med, ms_p20=p20, ms_p80=p80, tflops=flops / med / 1e9, gbps=nbytes / med / 1e6,
                         baseline="sdpa", speedup=base_ms / med, max_abs_err=err))
    return rows


# -- scoring ---------------------------------------------------------------------------------------
def bench_scoring(case: ScoreCase, batch: int, positions: int, temperature: float, dtype, device, env: dict,
                  bench=_bench) -> list[KernelRow]:
    from dllm.kernels.scoring import token_scores_fwd, token_scores_ref, token_scores_triton

    g = torch.Generator(device).manual_seed(0)
    logits = torch.randn(batch, positions, case.vocab, generator=g, device=device, dtype=torch.float32) * 4
    logits = logits.to(dtype)                                                                  # (B, Q, V)
    ref64 = token_scores_ref(logits, score_dtype=torch.float64)
    gen = torch.Generator(device).manual_seed(1)
    seed = torch.tensor([1], device=device)
    providers = {
        "torch-fp64": lambda: token_scores_ref(logits, temperature=temperature, generator=gen,
                                               score_dtype=torch.float64),
        "torch-fp32": lambda: token_scores_ref(logits, temperature=temperature, generator=gen,
                                               score_dtype=torch.float32),
        "triton": lambda: token_scores_triton(logits, temperature=temperature, generator=gen),
        "triton-fwd": lambda: token_scores_fwd(logits, temperature=temperature, seed=seed),
    }
    nbytes = logits.numel() * logits.element_size()
    rows, base_ms = [], None
    for name, fn in providers.items():
        out = fn()
        token, prob = (out[0], out[1]) if isinstance(out, tuple) else (out.token, out.prob)
        same = (token == ref64.token).double().mean().item() if temperature == 0 else None
        err = (prob.double() - ref64.prob).abs().max().item() if temperature == 0 else None
        med, p20, p80 = bench(fn)
        base_ms = med if name == "torch-fp64" else base_ms
        rows.append(_row(env, kernel="scoring", model=case.model, provider=name, dtype=str(dtype).split(".")[-1],
                         batch=batch, positions=positions, vocab=case.vocab, temperature=temperature, ms=med,
                         ms_p20=p20, ms_p80=p80, gbps=nbytes / med / 1e6, baseline="torch-fp64",
                         speedup=base_ms / med, max_abs_err=err, tokens_equal=same))
    return rows


# -- LM head + greedy scoring -----------------------------------------------------------------------
def bench_head_scoring(case: ScoreCase, d_model: int, rows: int, dtype, device, env: dict,
                       bench=_bench) -> list[KernelRow]:
    from dllm.kernels.head_scoring import head_scores_ref, head_scores_triton
    from dllm.kernels.scoring import token_scores_ref

    g = torch.Generator(device).manual_seed(0)
    hidden = torch.randn(rows, d_model, generator=g, device=device).to(dtype)
    weight = (torch.randn(case.vocab, d_model, generator=g, device=device) * 0.05).to(dtype)

    def unfused():
        logits = torch.nn.functional.linear(hidden, weight)[None]
        scores = token_scores_ref(logits, score_dtype=torch.float32, check_finite=False)
        return scores.token[0], scores.prob[0]

    ref = unfused()

    providers = {"unfused": unfused,
                 "torch": lambda: head_scores_ref(hidden, weight)[:2],
                 "triton": lambda: head_scores_triton(hidden, weight)[:2]}
    providers.update({f"triton[s={n}]": (lambda n=n: head_scores_triton(hidden, weight, num_splits=n)[:2])
                      for n in HEAD_SPLITS})
    nbytes = weight.numel() * weight.element_size()
    out, base_ms = [], None
    for name, fn in providers.items():
        token, prob = fn()
        same = (token == ref[0]).double().mean().item()
        err = (prob.double() - ref[1]).abs().max().item()
        med, p20, p80 = bench(fn)
        base_ms = med if name == "unfused" else base_ms
        out.append(_row(env, kernel="head_scoring", model=case.model, provider=name,
                        dtype=str(dtype).split(".")[-1], batch=1, positions=rows, vocab=case.vocab,
                        d_model=d_model, temperature=0.0, ms=med, ms_p20=p20, ms_p80=p80,
                        tflops=2 * rows * d_model * case.vocab / med / 1e9, gbps=nbytes / med / 1e6,
                        baseline="unfused", speedup=base_ms / med, max_abs_err=err, tokens_equal=same))
    return out


# -- output ------------------------------------------------------------------------------------------
def format_row(r: KernelRow) -> str:
    if r.kernel == "attention":
        what = f"{r.model} H{r.heads}/{r.kv_heads} P{r.queries} L{r.keys}{' pad' if r.masked else ''}"
        rate = f"{r.tflops:7.1f} TFLOP/s {r.gbps:7.0f} GB/s"
        check = f"err {r.max_abs_err:.2e}"
    elif r.kernel == "head_scoring":
        what = f"{r.model} head {r.positions}x{r.d_model}x{r.vocab}"
        rate = f"{r.tflops:7.1f} TFLOP/s {r.gbps:7.0f} GB/s"
        check = f"tokens {r.tokens_equal:.1%} err {r.max_abs_err:.1e}"
    else:
        what = f"{r.model} {r.batch}x{r.positions}x{r.vocab} T={r.temperature:g}"
        rate = f"{'':>15} {r.gbps:7.0f} GB/s"
        check = "" if r.tokens_equal is None else f"tokens {r.tokens_equal:.1%} err {r.max_abs_err:.1e}"
    times = f"{r.ms * 1e3:8.1f} us [{r.ms_p20 * 1e3:.1f}, {r.ms_p80 * 1e3:.1f}]"
    return f"{what:<34}{r.provider:<36}{times:<30}{rate}  x{r.speedup:<6.2f} {check}"


def _positive_ints(ap: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    """The comma-separated positive integers of `flag`'s value, or a usage error naming it."""
    try:
        values = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        ap.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        ap.error(f"{flag} must be positive, got {text!r}")
    return values


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=KERNELS, default=None, help="run one kernel's benchmark")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="input dtype (default bfloat16)")
    ap.add_argument("--batch", type=int, default=1, help="attention and scoring: batch rows (default 1); the head "
                    "scoring's rows are --positions")
    ap.add_argument("--queries", type=int, default=32, help="attention: queries per row and head (a block; 32)")
    ap.add_argument("--keys", default=KEYS, help=f"attention: comma-separated key lengths (default {KEYS})")
    ap.add_argument("--positions", default="32", help="scoring: positions per row; head_scoring: rows "
                    "(comma-separated; default 32)")
    ap.add_argument("--configs", action="store_true", help="attention: also time every launch configuration")
    ap.add_argument("--out", default=None, help="append one JSON line per row here")
    args = ap.parse_args(argv)
    args.key_lengths = _positive_ints(ap, "--keys", args.keys)
    args.position_counts = _positive_ints(ap, "--positions", args.positions)
    for name in ("batch", "queries"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.only == "head_scoring" and args.batch != 1:
        ap.error("--batch does not apply to --only head_scoring, whose rows are --positions")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA GPU (it times GPU kernels with triton.testing.do_bench); "
              "none is available here, so nothing was measured.")
        return 0
    from dllm.kernels import HAS_TRITON
    if not HAS_TRITON:
        print("bench_kernels.py needs triton: pip install 'dllm[triton]'", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    dtype = DTYPES[args.dtype]
    env = environment(device)
    print(f"dllm {env['dllm_version']} | torch {env['torch_version']} | triton {env['triton_version']} | "
          f"git {(env['git_commit'] or '?')[:10]}{' (dirty)' if env['git_dirty'] else ''} | {env['device_name']} | "
          f"{args.dtype}, batch {args.batch}", flush=True)
    print("median [p20, p80] of triton.testing.do_bench; x = baseline time / this time (attention: sdpa; "
          "scoring: the float64 torch path; head_scoring: unfused)", flush=True)
    jobs = []
    if args.only in (None, "attention"):
        jobs += [lambda c=c, n=n, m=m: bench_attention(c, args.batch, args.queries, n, m, dtype, device, env,
                                                       args.configs)
                 for c in ATTN_CASES for n in args.key_lengths for m in (False, True)]
    if args.only in (None, "scoring"):
        jobs += [lambda c=c, t=t, n=n: bench_scoring(c, args.batch, n, t, dtype, device, env)
                 for c in SCORE_CASES for t in (0.0, 1.0) for n in args.position_counts]
    if args.only in (None, "head_scoring"):
        jobs += [lambda c=c, d=d, n=n: bench_head_scoring(c, d, n, dtype, device, env)
                 for c, d in HEAD_CASES for n in args.position_counts]
    for job in jobs:
        rows = job()
        for r in rows:
            print(format_row(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows)
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
