"""Generation speed of dllm against a plain LLaDA-reference-style loop, measured in one run.

For every preset (a random-weight model from `dllm.build_model`, seeded, so generation is
deterministic) both loops generate from the same prompt batch with the same model object and the
same step count:

* dllm:      `dllm.generate(..., sampler="low_confidence")`, which scores only the masked
             positions of the active block.
* reference: what ML-GSAI/LLaDA `generate.py` does each step: a full-canvas forward returning
             logits at EVERY position (`model(x)`), a float64 softmax of every position over the
             whole vocabulary, argmax, confidence gather, -inf beyond the block and on unmasked
             positions, a per-row `torch.topk` with LLaDA's per-block transfer counts.

Printed per preset: seconds per forward (median [p20, p80] over repeats; a warm-up run at the same
shapes excluded), generated tokens/s, and the paired ratio dllm s/step / reference s/step (goal:
<= 0.5 at llada-vocab). At temperature 0 both loops must produce the same tokens; if they do not,
the script says so and exits with status 1. Every finished preset is appended to `--out` as one
JSON line (a `BenchRow`), so `--resume` can skip what is already there.

    python benchmarks/bench_generate.py                          # the default run (~4.8 min on 2 idle cores)
    python benchmarks/bench_generate.py --quick                  # tiny + llada-vocab, 1 repeat (~15 s)
    python benchmarks/bench_generate.py --presets tiny,llada-vocab,llada-compute,dream-compute \
        --repeats 3 --out rows.jsonl

The sampler is LLaDA's `low_confidence` for every preset, Dream's included (the reference loop is
LLaDA's); `model(x)` already applies Dream's logit shift, so the rule is the same. As in dllm, the
reference-style loop never takes the mask id as a candidate. CPU timings are only meaningful on an
otherwise idle machine: the `busy` column (Linux PSI) shows contention.

`--caches` measures the KV cache policies instead (`dllm.cache`), on the compute-bound presets by
default (prompt 256, gen 256, block 32):

* policies: every policy (`--policies`) with the same sampler and steps (`low_confidence`,
  `--cache-steps-per-block` steps per block, default 8 = 4 tokens per step): seconds per forward,
  end-to-end seconds, and both as speedups against `none` from the same run; `full` is the mean
  number of full-refresh forwards per row; `same` the share of generated tokens equal to `none`'s
  (the caches are approximate).
* headline (`llada-compute`): `dual` + Fast-dLLM `threshold` (tau 0.9) against `none` + one token
  per step (`low_confidence`, steps = gen_length), end to end; goal >= 10x.

    python benchmarks/bench_generate.py --caches                  # both presets + headline (~13 min on 2 cores)
    python benchmarks/bench_generate.py --caches --presets llada-compute --policies none,dual --no-headline
    python benchmarks/bench_generate.py --caches --quick          # tiny + dream-tiny, every policy (~10 s)
    python benchmarks/bench_generate.py --caches --presets llada-8b,dream-7b   # the published shapes, on a GPU

`--count-flops` runs each configuration once more, untimed, under torch's FlopCounterMode and
adds its matrix-product and attention FLOPs: the FLOP ratio against the baseline is the speedup
an implementation would reach if it ran every forward's products at one rate, so it separates
what the policy saves in arithmetic from how efficiently the hardware runs the smaller products.

On CUDA every configuration runs once untimed before it is timed (`--warmup-runs`): a new shape
compiles Triton kernels and picks cuBLAS plans there. `--cuda-graphs` replays dllm's forwards as
CUDA graphs; the benchmark captures a layout at its first forward (`capture_after=1`), so the
untimed run captures every layout the timed runs meet (the reference loop stays eager).
`llada-8b` and `dream-7b` are the published shapes with random weights drawn on the device (16
and 15 GB in bf16); the headline runs on the first of `llada-8b`, `llada-compute`, `tiny` in
the run.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

import dllm
import dllm.cache
from dllm.attention import get_backend
from dllm.config import ModelConfig
from dllm.provenance import cpu_name, source_commit

RATIO_GOAL = 0.5
GOAL_PRESET = "llada-vocab"
SAMPLER = "low_confidence"
BUSY_WARN = 0.1
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BenchPreset:
    model: str           # dllm ModelConfig preset
    prompt_length: int
    gen_length: int
    block_length: int
    steps: int


# Step counts keep the default run (every preset, 3 repeats) near 5 minutes on 2 CPU cores:
# the compute-bound presets take one step per block, the smallest count LLaDA's schedule allows.
BENCH_PRESETS: dict[str, BenchPreset] = {
    "tiny": BenchPreset("llada-tiny", prompt_length=16, gen_length=64, block_length=16, steps=32),
    "dream-tiny": BenchPreset("dream-tiny", prompt_length=16, gen_length=64, block_length=16, steps=32),
    "llada-vocab": BenchPreset("llada-vocab", prompt_length=64, gen_length=128, block_length=32, steps=16),
    "llada-compute": BenchPreset("llada-compute", prompt_length=256, gen_length=256, block_length=32, steps=8),
    "dream-compute": BenchPreset("dream-compute", prompt_length=256, gen_length=256, block_length=32, steps=8),
    # The published shapes with random weights (16 and 15 GB in bf16): for a GPU, not for CPU runs.
    "llada-8b": BenchPreset("llada-8b", prompt_length=256, gen_length=256, block_length=32, steps=8),
    "dream-7b": BenchPreset("dream-7b", prompt_length=256, gen_length=256, block_length=32, steps=8),
    # LLaDA-MoE: the published layer shape at 4 layers (CPU), and LLaDA-MoE-7B-A1B (a GPU).
    "llada-moe-tiny": BenchPreset("llada-moe-tiny", prompt_length=16, gen_length=64, block_length=16, steps=32),
    "llada-moe-compute": BenchPreset("llada-moe-compute", prompt_length=256, gen_length=256, block_length=32, steps=8),
    "llada-moe-7b": BenchPreset("llada-moe-7b", prompt_length=256, gen_length=256, block_length=32, steps=8),
    # LLaDA2 (block-causal, blocks of 32): the LLaDA2.0-mini layer shape at 4 layers (CPU) and LLaDA2.0-mini.
    # Its decode aligns blocks with its attention blocks, so the reference-style loop (`--caches` off)
    # does not apply; use `--caches`.
    "llada2-tiny": BenchPreset("llada2-tiny", prompt_length=32, gen_length=64, block_length=32, steps=32),
    "llada2-compute": BenchPreset("llada2-compute", prompt_length=256, gen_length=256, block_length=32, steps=8),
    "llada2-mini": BenchPreset("llada2-mini", prompt_length=256, gen_length=256, block_length=32, steps=8),
}
DEFAULT_PRESETS = "tiny,llada-vocab,llada-compute,dream-compute"
QUICK_PRESETS = "tiny,llada-vocab"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Provenance:
    """Provenance and hardware columns shared by every benchmark row."""
    timestamp_utc: str
    git_commit: str | None
    git_dirty: bool | None
    dllm_version: str
    torch_version: str
    triton_version: str | None
    device: str
    device_name: str
    cpu_model: str
    cpu_cores: int
    torch_threads: int
    cuda_device: str | None
    world_size: int
    load_avg_1m: float | None     # other processes on the machine skew CPU timings
    cpu_busy: float | None        # share of this preset's wall time some task waited for a CPU (Linux PSI)


@dataclass
class BenchRow(Provenance):
    # config
    preset: str
    model: str
    family: str
    n_params: int
    vocab_size: int
    batch: int
    prompt_length: int
    gen_length: int
    block_length: int
    steps: int
    dtype: str
    attention: str
    cuda_graphs: bool
    compile: bool
    sampler: str
    cache: str
    score_dtype: str
    ref_softmax_dtype: str
    temperature: float
    init_std: float
    seed: int
    interpreted: bool
    # metrics (seconds; median / p20 / p80 over `repeats`, warm-up excluded)
    repeats: int
    forwards: int
    ref_forwards: int
    nfe: float
    tokens_per_forward: float
    dllm_s_per_forward: float
    dllm_s_per_forward_p20: float
    dllm_s_per_forward_p80: float
    ref_s_per_forward: float
    ref_s_per_forward_p20: float
    ref_s_per_forward_p80: float
    ratio: float                  # dllm s/step / reference s/step, median of the paired repeats
    ratio_p20: float
    ratio_p80: float
    ratio_goal: float | None
    dllm_tokens_per_s: float      # generated tokens (B * G) per second
    ref_tokens_per_s: float
    dllm_loop_s_per_forward: float  # dllm's own GenerationOutput.seconds (decode loop only)
    tokens_match: bool            # quality: both loops wrote the same tokens at temperature 0
    mismatched_tokens: int        # differing positions, summed over the warm-up and every repeat
    dllm_seconds: list[float]
    ref_seconds: list[float]
    warmup_seconds: float
    build_seconds: float


# -- the reference-style loop -----------------------------------------------------------------
def transfer_counts(block_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA `get_num_transfer_tokens`: (B, K) bool -> (B, steps) long; n // steps per step and
    one more for the first n % steps steps."""
    n = block_mask.sum(dim=1, keepdim=True)                                   # (B, 1)
    counts = torch.zeros(n.shape[0], steps, dtype=torch.long, device=block_mask.device) + n // steps
    for row in range(n.shape[0]):
        counts[row, : int(n[row] % steps)] += 1
    return counts


@torch.no_grad()
def reference_generate(model, prompt: torch.Tensor, *, steps: int, gen_length: int, block_length: int,
                       mask_id: int, softmax_dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
    """LLaDA `generate.py` at temperature 0, remasking="low_confidence", no CFG.
    prompt: (B, Lp) long, no padding. softmax_dtype None = the logits dtype (LLaDA HEAD)."""
    B, Lp = prompt.shape
    x = torch.full((B, Lp + gen_length), mask_id, dtype=torch.long, device=prompt.device)  # (B, L)
    x[:, :Lp] = prompt
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for block in range(num_blocks):
        end = Lp + (block + 1) * block_length
        counts = transfer_counts(x[:, end - block_length:end] == mask_id, steps_per_block)  # (B, s)
        for i in range(steps_per_block):
            mask_index = x == mask_id                                         # (B, L)
            logits = model(x)                                                 # (B, L, V) every position
            logits[..., mask_id] = -math.inf  # the mask id is never a candidate, as in dllm
            x0 = torch.argmax(logits, dim=-1)                                 # (B, L)
            p = F.softmax(logits if softmax_dtype is None else logits.to(softmax_dtype), dim=-1)  # (B, L, V)
            x0_p = torch.gather(p, dim=-1, index=x0[..., None]).squeeze(-1)  # (B, L)
            x0_p[:, end:] = -math.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -math.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for row in range(B):
                _, chosen = torch.topk(confidence[row], k=int(counts[row, i]))
                transfer[row, chosen] = True
            x[transfer] = x0[transfer]
    return x


# -- measurement helpers ------------------------------------------------------------------------
def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    gc.collect()
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(fn):
    """(fn(), the FLOPs of the matrix products and attention it ran), by torch's FlopCounterMode,
    which also counts CPU attention (`aten._scaled_dot_product_flash_attention_for_cpu`) here as
    it counts the GPU kernels. Elementwise work (norms, rotary, softmax of the sampler) is not
    counted. Ops the counter cannot see are missed: Triton kernels and CUDA graph replays."""
    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        out = fn()
    return out, counter.get_total_flops()


def load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def psi_cpu_stall_us() -> int | None:
    """Cumulative microseconds during which some task waited for a CPU (/proc/pressure/cpu)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(some.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict:
    commit, dirty = source_commit()
    cuda_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    cpu = cpu_name()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return dict(timestamp_utc="", git_commit=commit, git_dirty=dirty, dllm_version=dllm.__version__,
                torch_version=torch.__version__, triton_version=package_version("triton"),
                device=device.type, device_name=cuda_name or cpu, cpu_model=cpu, cpu_cores=cores,
                torch_threads=torch.get_num_threads(), cuda_device=cuda_name, world_size=1)


@contextlib.contextmanager
def counting_calls(model):
    """Within the block, `model`'s forward calls are counted in the yielded one-element list."""
    calls = [0]
    forward = model.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    model.forward = counted
    try:
        yield calls
    finally:
        del model.forward


def prompt_batch(cfg: ModelConfig, batch: int, length: int, seed: int, device: torch.device) -> torch.Tensor:
    """(B, Lp) random ids below every special id, so no prompt holds a mask, pad or EOS."""
    specials = [i for i in (cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id,
                            cfg.eot_token_id) if i is not None]
    high = min(min(specials), cfg.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (batch, length), generator=gen).to(device)


def resolve_presets(names: str, args) -> list[tuple[str, BenchPreset]]:
    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name not in BENCH_PRESETS:
            raise SystemExit(f"unknown preset {name!r}; available: {', '.join(BENCH_PRESETS)}")
        p = BENCH_PRESETS[name]
        changes = {k: getattr(args, k) for k in ("prompt_length", "gen_length", "block_length", "steps")
                   if getattr(args, k) is not None}
        p = dataclasses.replace(p, **changes)
        if changes.get("gen_length") and "block_length" not in changes and p.block_length > p.gen_length:
            p = dataclasses.replace(p, block_length=p.gen_length)
        if min(p.prompt_length, p.gen_length, p.block_length, p.steps) < 1:
            raise SystemExit(f"{name}: lengths and steps must be >= 1, got {p}")
        if p.gen_length % p.block_length:
            raise SystemExit(f"{name}: gen_length {p.gen_length} is not a multiple of block_length {p.block_length}")
        n_blocks = p.gen_length // p.block_length
        if changes and "steps" not in changes:  # keep the preset's steps per block (at most one token per step)
            base = BENCH_PRESETS[name]
            per_block = base.steps // (base.gen_length // base.block_length)
            p = dataclasses.replace(p, steps=min(per_block, p.block_length) * n_blocks)
        if p.steps % n_blocks or p.steps > p.gen_length:
            raise SystemExit(f"{name}: steps {p.steps} must be a multiple of the number of blocks {n_blocks} "
                             f"and at most gen_length {p.gen_length}")
        out.append((name, p))
    if not out:
        raise SystemExit("no presets given")
    return out


CONFIG_KEY = ("preset", "model", "batch", "prompt_length", "gen_length", "block_length", "steps", "dtype",
              "attention", "device", "score_dtype", "ref_softmax_dtype", "cuda_graphs", "compile", "init_std", "seed")
# What identifies a --caches configuration (its rows, one per policy, are skipped together).
CACHE_CONFIG_KEY = ("preset", "batch", "prompt_length", "gen_length", "block_length", "dtype", "device", "attention",
                    "cuda_graphs", "compile", "init_std", "seed", "steps", "score_dtype")


def config_key(row: dict) -> tuple:
    """The fields that identify a configuration, for --resume."""
    return tuple(row.get(k) for k in CONFIG_KEY)


# -- one preset -------------------------------------------------------------------------------
def bench_preset(name: str, p: BenchPreset, batch: int, args, env: dict, device: torch.device) -> BenchRow:
    dtype = DTYPES[args.dtype]
    stall0, wall0 = psi_cpu_stall_us(), time.perf_counter()
    cfg = ModelConfig.from_name(p.model)
    (model, build_s) = timed(lambda: dllm.build_model(cfg, args.attention, dtype=dtype, device=device,
                                                      seed=args.seed, init_std=args.init_std), device)
    model.set_cuda_graphs(args.cuda_graphs, capture_after=1)
    model.set_compile(args.compile)
    prompt = prompt_batch(cfg, batch, p.prompt_length, args.seed, device)         # (B, Lp)
    ref_softmax = None if args.ref_softmax_dtype == "logits" else torch.float64
    n_blocks = p.gen_length // p.block_length

    def run_dllm(prompt_t, gen_length, steps):
        rows = prompt_t.tolist()
        return timed(lambda: dllm.generate(model, None, rows, gen_length=gen_length, block_length=p.block_length,
                                           steps=steps, sampler=SAMPLER, seed=args.seed, temperature=0.0,
                                           score_dtype=args.score_dtype), device)

    ref_calls = []           # model calls of each reference run, counted

    def run_ref(prompt_t, gen_length, steps):
        with counting_calls(model) as calls:
            result = timed(lambda: reference_generate(model, prompt_t, steps=steps, gen_length=gen_length,
                                                      block_length=p.block_length, mask_id=cfg.mask_token_id,
                                                      softmax_dtype=ref_softmax), device)
        ref_calls.append(calls[0])
        return result

    def compare(out, ref_x, steps, what):
        got, want = out.sequences.cpu(), ref_x.cpu()
        bad = int((got != want).sum())
        if bad:
            first = (got != want).nonzero()[0].tolist()
            print(f"  !! {name} B={batch} {what}: dllm and reference differ at {bad} positions "
                  f"(first (row, col) {first}: dllm {int(got[tuple(first)])}, reference {int(want[tuple(first)])}, "
                  f"{out.forwards} forwards for {steps} steps)", file=sys.stderr, flush=True)
        return bad

    # Warm-up: one block at the same canvas length (prompt + all blocks but one), so every shape
    # of the timed runs has been seen once; excluded from the figures.
    filler = prompt_batch(cfg, batch, p.gen_length - p.block_length, args.seed + 1, device)
    warm_prompt = torch.cat([prompt, filler], dim=1)                              # (B, Lp + G - K)
    warm_steps = p.steps // n_blocks
    (warm_out, t1), (warm_ref, t2) = (run_dllm(warm_prompt, p.block_length, warm_steps),
                                      run_ref(warm_prompt, p.block_length, warm_steps))
    mismatched = compare(warm_out, warm_ref, warm_steps, "warm-up")

    dllm_s, ref_s, loop_s = [], [], []
    out = None
    for r in range(args.repeats):
        order = ("dllm", "ref") if r % 2 == 0 else ("ref", "dllm")  # alternate, so drift hits both alike
        for which in order:
            if which == "dllm":
                out, sec = run_dllm(prompt, p.gen_length, p.steps)
                dllm_s.append(sec)
                loop_s.append(out.seconds)
            else:
                ref_x, sec = run_ref(prompt, p.gen_length, p.steps)
                ref_s.append(sec)
        mismatched += compare(out, ref_x, p.steps, f"repeat {r}")

    forwards = out.forwards
    per_fwd = [s / forwards for s in dllm_s]
    ref_per_fwd = [s / p.steps for s in ref_s]
    ratios = [a / b for a, b in zip(per_fwd, ref_per_fwd)]
    tokens = batch * p.gen_length
    stall1, wall1 = psi_cpu_stall_us(), time.perf_counter()
    busy = None if stall0 is None or stall1 is None else round((stall1 - stall0) / 1e6 / (wall1 - wall0), 3)
    env = dict(env, timestamp_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), load_avg_1m=load_avg(),
               cpu_busy=busy)
    return BenchRow(
        **env, preset=name, model=p.model, family=cfg.family, n_params=cfg.n_params, vocab_size=cfg.vocab_size,
        batch=batch, prompt_length=p.prompt_length, gen_length=p.gen_length, block_length=p.block_length,
        steps=p.steps, dtype=args.dtype, attention=args.attention, cuda_graphs=args.cuda_graphs,
        compile=args.compile, sampler=SAMPLER,
        cache="none",
        score_dtype=args.score_dtype, ref_softmax_dtype=args.ref_softmax_dtype, temperature=0.0,
        init_std=args.init_std, seed=args.seed, interpreted=os.environ.get("TRITON_INTERPRET") == "1",
        repeats=args.repeats, forwards=forwards, ref_forwards=ref_calls[-1], nfe=sum(out.nfe) / len(out.nfe),
        tokens_per_forward=out.mean_tokens_per_forward,
        dllm_s_per_forward=quantile(per_fwd, 0.5), dllm_s_per_forward_p20=quantile(per_fwd, 0.2),
        dllm_s_per_forward_p80=quantile(per_fwd, 0.8),
        ref_s_per_forward=quantile(ref_per_fwd, 0.5), ref_s_per_forward_p20=quantile(ref_per_fwd, 0.2),
        ref_s_per_forward_p80=quantile(ref_per_fwd, 0.8),
        ratio=quantile(ratios, 0.5), ratio_p20=quantile(ratios, 0.2), ratio_p80=quantile(ratios, 0.8),
        ratio_goal=RATIO_GOAL if name == GOAL_PRESET else None,
        dllm_tokens_per_s=tokens / quantile(dllm_s, 0.5), ref_tokens_per_s=tokens / quantile(ref_s, 0.5),
        dllm_loop_s_per_forward=quantile(loop_s, 0.5) / forwards,
        tokens_match=mismatched == 0, mismatched_tokens=mismatched,
        dllm_seconds=[round(s, 6) for s in dllm_s], ref_seconds=[round(s, 6) for s in ref_s],
        warmup_seconds=t1 + t2, build_seconds=build_s)


# -- cache policies -----------------------------------------------------------------------------
CACHE_PRESETS = "llada-compute,dream-compute"
CACHE_QUICK_PRESETS = "tiny,dream-tiny"
HEADLINE_PRESETS = ("llada-8b", "llada-compute", "tiny")    # the headline runs on the first of these in the run
HEADLINE_GOAL = 10.0
FLOP_COUNTED_ATTENTION = ("sdpa", "eager")   # backends made of torch ops FlopCounterMode counts
HEADLINE_TAU = 0.9


@dataclass
class CacheBenchRow(Provenance):
    # config
    comparison: str               # "policies" (same sampler and steps) | "headline"
    preset: str
    model: str
    family: str
    n_params: int
    batch: int
    prompt_length: int
    gen_length: int
    block_length: int
    dtype: str
    score_dtype: str
    attention: str
    cuda_graphs: bool
    compile: bool
    init_std: float
    seed: int
    sampler: str
    sampler_args: dict
    steps: int | None
    cache: str
    cache_args: dict
    baseline: str                 # what the speedups are relative to
    # metrics (seconds: median / p20 / p80 over `repeats`; warm-up excluded)
    repeats: int
    forwards: int
    full_forwards: float          # full-refresh forwards per row (mean over rows)
    tokens_per_forward: float
    seconds: float
    seconds_p20: float
    seconds_p80: float
    s_per_forward: float
    baseline_forwards: int
    baseline_seconds: float
    baseline_s_per_forward: float
    speedup: float                # end to end: baseline seconds / seconds
    forward_speedup: float        # baseline s/forward / s/forward
    tokens_same_as_baseline: float  # share of generated tokens equal to the baseline's
    goal: float | None
    all_seconds: list[float]
    # --count-flops (else None): matrix-product and attention FLOPs of one run, counted in an extra
    # untimed run; flop_speedup = baseline FLOPs / FLOPs, the end-to-end speedup of an
    # implementation that ran every forward's products at one rate.
    flops: float | None = None
    baseline_flops: float | None = None
    flop_speedup: float | None = None
    gflop_per_s: float | None = None
    baseline_gflop_per_s: float | None = None


def _run_policy(model, prompt_rows, p: BenchPreset, args, device, *, sampler, sampler_args, steps, cache):
    policy = dllm.cache.get_policy(cache)
    out, sec = timed(lambda: dllm.generate(model, None, prompt_rows, gen_length=p.gen_length,
                                           block_length=p.block_length, steps=steps, sampler=sampler,
                                           sampler_kwargs=sampler_args, seed=args.seed, temperature=0.0,
                                           score_dtype=args.score_dtype, cache=policy), device)
    refreshes = getattr(policy, "refreshes", None)
    full = float(refreshes.float().mean()) if refreshes is not None else float(sum(out.nfe) / len(out.nfe))
    return out, sec, full


def _measure(model, prompt_rows, p, args, device, repeats, **kw):
    for _ in range(args.warmup_runs):               # untimed: kernel compiles and library plans for its shapes
        _run_policy(model, prompt_rows, p, args, device, **kw)
    runs = [_run_policy(model, prompt_rows, p, args, device, **kw) for _ in range(repeats)]
    out, _, full = runs[-1]
    flops = None
    if args.count_flops:   # untimed: the counter intercepts every op
        (counted, _, _), flops = count_flops(lambda: _run_policy(model, prompt_rows, p, args, device, **kw))
        if not torch.equal(counted.generated, out.generated):
            raise RuntimeError(f"the FLOP-counting run of {kw} generated other tokens than the timed runs")
    return out, [sec for _, sec, _ in runs], full, flops


def bench_caches(name: str, p: BenchPreset, batch: int, args, env: dict, device: torch.device,
                 headline: bool) -> list[CacheBenchRow]:
    """Every cache policy against `none` on one preset (and the headline when asked); one row each."""
    dtype = DTYPES[args.dtype]
    stall0, wall0 = psi_cpu_stall_us(), time.perf_counter()
    cfg = ModelConfig.from_name(p.model)
    model = dllm.build_model(cfg, args.attention, dtype=dtype, device=device, seed=args.seed, init_std=args.init_std)
    model.set_cuda_graphs(args.cuda_graphs, capture_after=1)
    model.set_compile(args.compile)
    prompt_rows = prompt_batch(cfg, batch, p.prompt_length, args.seed, device).tolist()
    n_blocks = p.gen_length // p.block_length
    # Warm-up at the same canvas length: one full and one partial forward per kind of step.
    filler = prompt_batch(cfg, batch, p.gen_length - p.block_length, args.seed + 1, device)
    warm = torch.cat([torch.tensor(prompt_rows, device=device), filler], dim=1).tolist()
    warm_p = dataclasses.replace(p, gen_length=p.block_length)
    warm_start = time.perf_counter()
    for cache in ("none", "dual"):
        _run_policy(model, warm, warm_p, args, device, sampler=SAMPLER, sampler_args={}, steps=2, cache=cache)
    if args.compile:
        print(f"{name}: warm-up with compilation {time.perf_counter() - warm_start:.1f} s", flush=True)

    rows = []
    base_env = dict(env, load_avg_1m=None, cpu_busy=None)
    common = dict(preset=name, model=p.model, family=cfg.family, n_params=cfg.n_params, batch=batch,
                  prompt_length=p.prompt_length, gen_length=p.gen_length, block_length=p.block_length,
                  dtype=args.dtype, score_dtype=args.score_dtype, attention=args.attention,
                  cuda_graphs=args.cuda_graphs, compile=args.compile, init_std=args.init_std, seed=args.seed)

    def row(comparison, out, secs, full, flops, sampler, sampler_args, steps, baseline_name, base_out, base_secs,
            base_flops, goal):
        fwd, base_fwd = out.forwards, base_out.forwards
        sec, base_sec = quantile(secs, 0.5), quantile(base_secs, 0.5)
        counted = {}
        if flops is not None:
            counted = dict(flops=flops, baseline_flops=base_flops, flop_speedup=base_flops / flops,
                           gflop_per_s=flops / sec / 1e9, baseline_gflop_per_s=base_flops / base_sec / 1e9)
        same = float((out.generated == base_out.generated).float().mean())
        return CacheBenchRow(
            **base_env, comparison=comparison, **common, sampler=sampler, sampler_args=sampler_args, steps=steps,
            cache=out.cache, cache_args=out.cache_args, baseline=baseline_name, repeats=len(secs), forwards=fwd,
            full_forwards=full, tokens_per_forward=out.mean_tokens_per_forward, seconds=sec,
            seconds_p20=quantile(secs, 0.2), seconds_p80=quantile(secs, 0.8), s_per_forward=sec / fwd,
            baseline_forwards=base_fwd, baseline_seconds=base_sec, baseline_s_per_forward=base_sec / base_fwd,
            speedup=base_sec / sec, forward_speedup=(base_sec / base_fwd) / (sec / fwd), tokens_same_as_baseline=same,
            goal=goal, all_seconds=[round(x, 6) for x in secs], **counted)

    steps = n_blocks * min(args.cache_steps_per_block, p.block_length)
    kw = dict(sampler=SAMPLER, sampler_args={}, steps=steps)
    base = _measure(model, prompt_rows, p, args, device, args.repeats, cache="none", **kw)
    base_out, base_secs, _, base_flops = base
    baseline = f"none + {SAMPLER}, steps={steps}"
    for cache in args.policies:
        if not args.policies_given and cache not in dllm.cache.policies_for(model.config):
            continue                     # a policy this model cannot run (`block` off block-causal models)
        out, secs, full, flops = (base if cache == "none" else
                                  _measure(model, prompt_rows, p, args, device, args.repeats, cache=cache, **kw))
        rows.append(row("policies", out, secs, full, flops, SAMPLER, {}, steps, baseline, base_out, base_secs,
                        base_flops, None))
        print(format_cache_row(rows[-1]), flush=True)

    if headline:
        slow_out, slow_secs, _, slow_flops = _measure(model, prompt_rows, p, args, device, args.headline_repeats,
                                                      cache="none", sampler=SAMPLER, sampler_args={},
                                                      steps=p.gen_length)
        for tau in args.taus:
            fast_args = {"tau": tau}
            fast_out, fast_secs, fast_full, fast_flops = _measure(
                model, prompt_rows, p, args, device, args.headline_repeats, cache="dual", sampler="threshold",
                sampler_args=fast_args, steps=None)
            rows.append(row("headline", fast_out, fast_secs, fast_full, fast_flops, "threshold", fast_args, None,
                            f"none + {SAMPLER}, steps={p.gen_length} (1 token/step)", slow_out, slow_secs,
                            slow_flops, HEADLINE_GOAL))
            print(format_cache_row(rows[-1]), flush=True)

    stall1, wall1 = psi_cpu_stall_us(), time.perf_counter()
    busy = None if stall0 is None or stall1 is None else round((stall1 - stall0) / 1e6 / (wall1 - wall0), 3)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for r in rows:
        r.timestamp_utc, r.load_avg_1m, r.cpu_busy = stamp, load_avg(), busy
    return rows


CACHE_HEADER = (f"{'preset':<14}{'B':>3} {'comparison':<10} {'cache':<11}{'sampler':<24}{'fwd':>5}{'full':>6}"
                f"{'tok/fwd':>8}  {'s/fwd':>7} {'seconds [p20, p80]':<26}{'x per fwd':>10}{'x end-to-end':>13}"
                f"{'same':>7}")


def format_cache_row(r: CacheBenchRow) -> str:
    args = ",".join(f"{k}={v}" for k, v in r.sampler_args.items())
    sampler = r.sampler + (f"({args})" if args else "")
    sampler += "" if r.steps is None else f" s={r.steps}"
    secs = f"{r.seconds:.2f} [{r.seconds_p20:.2f}, {r.seconds_p80:.2f}]"
    return (f"{r.preset:<14}{r.batch:>3} {r.comparison:<10} {r.cache:<11}{sampler:<24}{r.forwards:>5}"
            f"{r.full_forwards:>6.1f}{r.tokens_per_forward:>8.2f}  {r.s_per_forward:>7.3f} {secs:<26}"
            f"{r.forward_speedup:>10.2f}{r.speedup:>13.2f}{r.tokens_same_as_baseline:>7.0%}"
            + ("" if r.flops is None else
               f"\n{'':<18}counted: {r.flops / 1e9:.1f} GFLOP at {r.gflop_per_s:.1f} GFLOP/s, baseline "
               f"{r.baseline_flops / 1e9:.1f} GFLOP at {r.baseline_gflop_per_s:.1f} GFLOP/s; FLOP ratio "
               f"{r.flop_speedup:.2f}x"))


def main_caches(args, device) -> int:
    start = time.perf_counter()
    presets = resolve_presets(args.presets, args)
    for name, p in presets:   # policies given by name must run on every preset (the default set is fitted)
        runs = dllm.cache.policies_for(ModelConfig.from_name(p.model))
        refused = [c for c in args.policies if c not in runs] if args.policies_given else []
        if refused:
            raise SystemExit(f"{name}: cache policy {', '.join(refused)} does not run on this model "
                             f"(its policies: {', '.join(runs)})")
    get_backend(args.attention)
    for name in args.policies:
        dllm.cache.policy_class(name)  # unknown names fail here, listing the valid ones
    env = environment(device)
    stored: dict[tuple, set] = {}      # configuration -> its policies already in --out
    if args.resume and Path(args.out).is_file():
        for r in (json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()):
            if r.get("comparison") == "policies":
                stored.setdefault(tuple(r.get(k) for k in CACHE_CONFIG_KEY), set()).add(r.get("cache"))
    print(f"dllm {env['dllm_version']} | torch {env['torch_version']} | git {(env['git_commit'] or '?')[:10]}"
          f"{' (dirty)' if env['git_dirty'] else ''} | {env['device_name']} | {env['cpu_cores']} cores, "
          f"{env['torch_threads']} torch threads | {args.dtype}, attention {args.attention}, init_std "
          f"{args.init_std} | load {load_avg()}", flush=True)
    print("x per fwd / x end-to-end = speedup over the baseline (policies: `none` with the same sampler and steps; "
          f"headline: `none` + 1 token/step); full = full-refresh forwards per row; same = tokens equal to the "
          f"baseline's; {args.repeats} repeat(s) (headline {args.headline_repeats}), warm-up excluded", flush=True)
    print(CACHE_HEADER, flush=True)
    rows: list[CacheBenchRow] = []
    headline_preset = next((n for n, _ in presets if n in HEADLINE_PRESETS), None) if args.headline else None
    for name, p in presets:
        for batch in args.batches:
            steps = p.gen_length // p.block_length * min(args.cache_steps_per_block, p.block_length)
            key = (name, batch, p.prompt_length, p.gen_length, p.block_length, args.dtype, device.type, args.attention,
                   args.cuda_graphs, args.compile, args.init_std, args.seed, steps, args.score_dtype)
            runs = dllm.cache.policies_for(ModelConfig.from_name(p.model))
            wanted = {c for c in args.policies if args.policies_given or c in runs}   # as bench_caches runs them
            if wanted <= stored.get(key, set()):
                print(f"{name:<14}{batch:>3} (already in {args.out}, skipped)", flush=True)
                continue
            new = bench_caches(name, p, batch, args, env, device, headline=name == headline_preset)
            rows.extend(new)
            if args.out:
                with open(args.out, "a") as f:
                    for r in new:
                        f.write(json.dumps(dataclasses.asdict(r)) + "\n")
            gc.collect()
    for r in rows:
        if r.goal is not None:
            verdict = "met" if r.speedup >= r.goal else "NOT met"
            print(f"headline: {r.cache} + {r.sampler}(tau={r.sampler_args.get('tau')}) vs {r.baseline} at {r.preset} "
                  f"(B={r.batch}): {r.speedup:.2f}x end to end ({r.baseline_seconds:.1f} s -> {r.seconds:.1f} s, "
                  f"{r.baseline_forwards} -> {r.forwards} forwards, {r.forward_speedup:.2f}x per forward); "
                  f"goal >= {r.goal:g}x -> {verdict}")
            if r.flop_speedup is not None:
                print(f"  FLOP ratio {r.flop_speedup:.2f}x: the end-to-end speedup if both runs did their matrix "
                      f"products and attention at one rate ({r.baseline_gflop_per_s:.1f} and {r.gflop_per_s:.1f} "
                      f"GFLOP/s measured)")
    busy = [f"{r.preset} {r.cpu_busy:.0%}" for r in rows if r.cpu_busy is not None and r.cpu_busy > BUSY_WARN]
    if busy:
        print(f"warning: other processes competed for the CPU ({', '.join(sorted(set(busy)))} of the wall time some "
              f"task waited for a core); these timings are unreliable, rerun on a quiet machine")
    print(f"total wall time {time.perf_counter() - start:.1f} s")
    return 0


# -- output -----------------------------------------------------------------------------------
HEADER = (f"{'preset':<14}{'B':>3} {'Lp/G/K/steps':<16}{'fwd':>4}  {'dllm s/fwd [p20, p80]':<27}"
          f"{'ref s/step [p20, p80]':<27}{'dllm tok/s':>11}{'ref tok/s':>10}  {'ratio [p20, p80]':<22}{'tokens':<8}{'busy':>5}")


def format_row(r: BenchRow) -> str:
    def med(m, lo, hi):
        return f"{m:.4f} [{lo:.4f}, {hi:.4f}]"

    shape = f"{r.prompt_length}/{r.gen_length}/{r.block_length}/{r.steps}"
    ratio = f"{r.ratio:.3f} [{r.ratio_p20:.3f}, {r.ratio_p80:.3f}]"
    return (f"{r.preset:<14}{r.batch:>3} {shape:<16}{r.forwards:>4}  "
            f"{med(r.dllm_s_per_forward, r.dllm_s_per_forward_p20, r.dllm_s_per_forward_p80):<27}"
            f"{med(r.ref_s_per_forward, r.ref_s_per_forward_p20, r.ref_s_per_forward_p80):<27}"
            f"{r.dllm_tokens_per_s:>11.1f}{r.ref_tokens_per_s:>10.1f}  {ratio:<22}"
            f"{'same' if r.tokens_match else 'DIFFER':<8}{'?' if r.cpu_busy is None else f'{r.cpu_busy:.0%}':>5}")


def parse_args(argv=None):
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=None,
                    help=f"comma-separated, from {', '.join(BENCH_PRESETS)} (default {DEFAULT_PRESETS})")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per loop (default 3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help=f"presets {QUICK_PRESETS}, 1 repeat")
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes, e.g. 1,4 (default 1)")
    ap.add_argument("--prompt-length", type=int, help="override every preset's prompt length")
    ap.add_argument("--gen-length", type=int, help="override every preset's generation length")
    ap.add_argument("--block-length", type=int, help="override every preset's block length")
    ap.add_argument("--steps", type=int, help="override every preset's step count (a multiple of the blocks)")
    ap.add_argument("--device", default="cuda" if cuda else "cpu", help="default: cuda if available, else cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                    help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--attention", default="sdpa", help="attention backend (dllm.attention.available_backends())")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="replay dllm's forwards as CUDA graphs (model.set_cuda_graphs; CUDA only)")
    ap.add_argument("--compile", action="store_true",
                    help="run dllm's forwards through torch.compile (model.set_compile); the warm-up compiles")
    ap.add_argument("--score-dtype", choices=("logits", "float32", "float64"), default="logits",
                    help="dllm's confidence softmax precision (GenerationConfig.score_dtype)")
    ap.add_argument("--ref-softmax-dtype", choices=("float64", "logits"), default="float64",
                    help="reference confidence softmax: float64 (LLaDA before f51cb17, Fast-dLLM) or the "
                         "logits dtype (LLaDA HEAD)")
    ap.add_argument("--init-std", type=float, default=0.3, help="random-weight std (large = confident, stable argmax)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--caches", action="store_true",
                    help=f"measure the cache policies against `none` instead (default presets {CACHE_PRESETS})")
    ap.add_argument("--policies", default=None,
                    help="--caches: comma-separated cache policies (default: every registered one the model runs)")
    ap.add_argument("--cache-steps-per-block", type=int, default=8,
                    help="--caches: low_confidence steps per block in the policy table (default 8)")
    ap.add_argument("--headline", action=argparse.BooleanOptionalAction, default=True,
                    help="--caches: also run dual + threshold vs none + 1 token/step on llada-compute (or tiny)")
    ap.add_argument("--headline-repeats", type=int, default=1, help="--caches: repeats of the headline runs")
    ap.add_argument("--warmup-runs", type=int, default=None,
                    help="--caches: untimed runs of each configuration before its timed ones (default 1 on CUDA, "
                         "where a new shape compiles kernels and picks library plans; 0 on CPU)")
    ap.add_argument("--count-flops", action="store_true",
                    help="--caches: count each configuration's matrix-product and attention FLOPs in one extra "
                         "untimed run (FlopCounterMode) and report the FLOP ratio against the baseline")
    ap.add_argument("--tau", default=str(HEADLINE_TAU),
                    help=f"--caches: threshold(s) of the headline sampler, comma-separated (default {HEADLINE_TAU}, "
                         f"Fast-dLLM's); the `none` baseline is shared")
    ap.add_argument("--out", default=None, help="append one JSON line per preset here")
    ap.add_argument("--resume", action="store_true", help="skip configurations already present in --out")
    args = ap.parse_args(argv)
    mode_options = (("--policies", "policies"), ("--cache-steps-per-block", "cache_steps_per_block"),
                    ("--headline-repeats", "headline_repeats"), ("--warmup-runs", "warmup_runs"), ("--tau", "tau"),
                    ("--no-headline", "headline"), ("--ref-softmax-dtype", "ref_softmax_dtype"))
    given = [(flag, dest) for flag, dest in mode_options if getattr(args, dest) != ap.get_default(dest)]
    unused = [flag for flag, dest in given if (dest == "ref_softmax_dtype") == args.caches]
    if unused:
        ap.error(f"{', '.join(unused)} appl(ies) only {'without' if args.caches else 'with'} --caches")
    try:
        get_backend(args.attention)
        for name in (args.policies or "").split(","):
            if name.strip():
                dllm.cache.policy_class(name.strip())
    except ValueError as err:
        ap.error(str(err))
    if args.presets is None:
        if args.caches:
            args.presets = CACHE_QUICK_PRESETS if args.quick else CACHE_PRESETS
        else:
            args.presets = QUICK_PRESETS if args.quick else DEFAULT_PRESETS
    if args.repeats is None:
        args.repeats = 1 if args.quick or args.caches else 3
    args.policies_given = args.policies is not None
    policies = [c.strip() for c in (args.policies or ",".join(dllm.cache.available_policies())).split(",")
                if c.strip()]
    args.policies = ["none"] + [c for c in policies if c != "none"]   # the baseline first
    try:
        args.taus = [float(t) for t in args.tau.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--tau must be comma-separated numbers, got {args.tau!r}")
    if not args.taus or not all(0 <= t <= 1 for t in args.taus):
        ap.error(f"--tau values must lie in [0, 1], got {args.tau!r}")
    if args.warmup_runs is None:
        args.warmup_runs = 1 if torch.device(args.device).type == "cuda" else 0
    if args.warmup_runs < 0:
        ap.error(f"--warmup-runs must be >= 0, got {args.warmup_runs}")
    if args.cache_steps_per_block < 1 or args.headline_repeats < 1:
        ap.error("--cache-steps-per-block and --headline-repeats must be >= 1")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        ap.error("--device cuda but torch.cuda.is_available() is False")
    if args.cuda_graphs and device.type != "cuda":
        ap.error(f"--cuda-graphs needs --device cuda, got --device {args.device}")
    if args.count_flops and not args.caches:
        ap.error("--count-flops needs --caches")
    if args.count_flops and (args.cuda_graphs or args.attention not in FLOP_COUNTED_ATTENTION):
        ap.error(f"--count-flops sees only eager torch ops: it needs --attention in "
                 f"{', '.join(FLOP_COUNTED_ATTENTION)} (got {args.attention!r}) and no --cuda-graphs")
    if args.dtype is None:
        args.dtype = "bfloat16" if device.type == "cuda" else "float32"
    try:
        args.batches = [int(b) for b in args.batch.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batch must be comma-separated integers, got {args.batch!r}")
    if not args.batches or min(args.batches) < 1:
        ap.error(f"--batch sizes must be >= 1, got {args.batch!r}")
    if args.resume and not args.out:
        ap.error("--resume needs --out")
    return args, device


def main(argv=None) -> int:
    start = time.perf_counter()
    args, device = parse_args(argv)
    if args.caches:
        return main_caches(args, device)
    presets = resolve_presets(args.presets, args)
    block_causal = [n for n, p in presets if ModelConfig.from_name(p.model).attention_block is not None]
    if block_causal:
        raise SystemExit(f"{', '.join(block_causal)}: a block-causal model decodes in its attention blocks, which the "
                         f"reference-style loop does not; measure it with --caches")
    get_backend(args.attention)  # unknown names fail here, listing the valid ones
    env = environment(device)
    done = set()
    if args.resume and Path(args.out).is_file():
        done = {config_key(json.loads(line)) for line in Path(args.out).read_text().splitlines() if line.strip()}

    print(f"dllm {env['dllm_version']} | torch {env['torch_version']} | git {(env['git_commit'] or '?')[:10]}"
          f"{' (dirty)' if env['git_dirty'] else ''} | {env['device_name']} | {env['cpu_cores']} cores, "
          f"{env['torch_threads']} torch threads | {args.dtype}, attention {args.attention}, sampler {SAMPLER}, "
          f"score {args.score_dtype} (reference softmax {args.ref_softmax_dtype}) | load {load_avg()}", flush=True)
    print(f"ratio = dllm s/step / reference s/step (same model, prompts, steps); goal <= {RATIO_GOAL} at "
          f"{GOAL_PRESET}; {args.repeats} repeat(s), warm-up excluded; busy = share of the time some task waited "
          f"for a CPU", flush=True)
    print(HEADER, flush=True)
    rows: list[BenchRow] = []
    for name, p in presets:
        for batch in args.batches:
            key = config_key(dict(dataclasses.asdict(p), preset=name, batch=batch, dtype=args.dtype,
                                  attention=args.attention, device=device.type, score_dtype=args.score_dtype,
                                  ref_softmax_dtype=args.ref_softmax_dtype, cuda_graphs=args.cuda_graphs,
                                  compile=args.compile, init_std=args.init_std, seed=args.seed))
            if key in done:
                print(f"{name:<14}{batch:>3} (already in {args.out}, skipped)", flush=True)
                continue
            row = bench_preset(name, p, batch, args, env, device)
            rows.append(row)
            print(format_row(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(dataclasses.asdict(row)) + "\n")
            gc.collect()

    for r in rows:
        if r.ratio_goal is not None:
            verdict = "met" if r.ratio <= r.ratio_goal else "NOT met"
            print(f"goal: ratio <= {r.ratio_goal} at {r.preset} (B={r.batch}): {r.ratio:.3f} -> {verdict}")
    busy = [f"{r.preset} {r.cpu_busy:.0%}" for r in rows if r.cpu_busy is not None and r.cpu_busy > BUSY_WARN]
    if busy:
        print(f"warning: other processes competed for the CPU ({', '.join(busy)} of the wall time some task waited "
              f"for a core); these timings are unreliable, rerun on a quiet machine")
    bad = [f"{r.preset} (B={r.batch}, {r.mismatched_tokens} tokens)" for r in rows if not r.tokens_match]
    if not rows:
        print("nothing run: every configuration is in --out already")
    else:
        verdict = "dllm and reference DIFFER: " + ", ".join(bad) if bad else "identical in every run"
        print(f"tokens at temperature 0: {verdict}")
    print(f"total wall time {time.perf_counter() - start:.1f} s")
    if bad:
        print(f"FAIL: dllm and the reference loop produced different tokens for {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
