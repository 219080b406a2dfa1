"""Operations dispatched and host-device synchronisations per step type of a decode, counted with
`dllm.overhead` (a torch dispatch mode). The counts do not depend on the machine.

    python benchmarks/bench_overhead.py                                   # tiny presets, the default grid
    python benchmarks/bench_overhead.py --presets llada-compute --batch 1,8 --sites
    python benchmarks/bench_overhead.py --out overhead.jsonl              # one JSON row per configuration
    python benchmarks/bench_overhead.py --checkpoint llada-pb-tiny --time 10   # the shipped model, timed
    TRITON_INTERPRET=1 DLLM_ROPE_WRITE=triton python benchmarks/bench_overhead.py   # the fused rotary + K/V write

Per configuration it prints the calls, operations per call and synchronisations per call of the
full forward, the cached forward and the rest of a step (scoring + sampler + commit + loop
bookkeeping, per step), and with --sites where each synchronisation comes from. With --time N it
also times the decode on this machine (no counting mode active): each of N decodes measures its
wall time and the time inside the model's forwards (wall time on a CPU; GPU time between CUDA
events around each forward on CUDA); the row gives the fastest decode's time outside the forwards
per step (`loop_us`, microseconds), its `decode_s`, `forwards_s` and `decode_over_forwards` (the
whole decode against the sum of its forwards). Models are built with random weights on
`--device` (CPU by default) in `--dtype`; the prompt is `--prompt-length` tokens, the same in every
row (ids from 1 up without the special ones, repeated past the vocabulary; row b rotated by b).
A Triton kernel launch counts as one operation; rows name the rotary + K/V write path the
cached forwards took (`rope_write`: DLLM_ROPE_WRITE resolved for the model's device and dtype;
"triton" on a CPU runs the kernel through Triton's interpreter, which needs TRITON_INTERPRET=1
before dllm is imported).

    python benchmarks/bench_overhead.py --presets llada-8b --device cuda --dtype bfloat16 --prompt-length 256 \
        --gen-length 256 --block-length 32 --grid threshold+dual --time 3 --cuda-graphs   # decode vs forwards on a GPU
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import dllm
from dllm import provenance
from dllm.config import GenerationConfig, ModelConfig
from dllm.decode import build_state, decode, resolve_request
from dllm.kernels.rope_write import rope_write_impl
from dllm.overhead import KINDS, count_decode

DEFAULT_GRID = (("low_confidence", "none"), ("threshold", "none"), ("threshold", "dual"), ("threshold", "prefix"),
                ("low_confidence", "dkv-decode"), ("threshold", "dkv-greedy"))


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: {what} {text!r} must be comma-separated positive integers") from None
    if not values or min(values) < 1:
        raise SystemExit(f"error: {what} {text!r} must be comma-separated positive integers")
    return values


def _grid(text: str | None) -> list[tuple[str, str]]:
    if text is None:
        return list(DEFAULT_GRID)
    pairs = []
    for item in text.split(","):
        if "+" not in item:
            raise SystemExit(f"error: --grid item {item!r} must look like SAMPLER+CACHE, e.g. threshold+dual")
        sampler, cache = item.split("+", 1)
        pairs.append((sampler.strip(), cache.strip()))
    return pairs


class ForwardClock:
    """Time spent inside the model's forwards during a decode: wall time on a CPU; on CUDA the GPU
    time between events recorded before and after each forward (read once, after the decode, so
    the decode runs as it would untimed)."""

    def __init__(self, model, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list = []
        self.hooks = [model.register_forward_pre_hook(lambda m, a: self._mark()),
                      model.register_forward_hook(lambda m, a, o: self._mark())]

    def _mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.spans.append(event)
        else:
            self.spans.append(time.perf_counter())

    def seconds(self) -> float:
        """The forwards' time since the last `seconds()` (the caller synchronises CUDA first)."""
        marks, self.spans = self.spans, []
        pairs = zip(marks[0::2], marks[1::2])
        if self.cuda:
            return sum(start.elapsed_time(end) for start, end in pairs) / 1e3
        return sum(end - start for start, end in pairs)

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()


def timed_decode(model, prompts: list[list[int]], request, clock: ForwardClock) -> tuple[float, float, int]:
    """One decode from a fresh state: (wall seconds, seconds inside the forwards, steps)."""
    device = next(model.parameters()).device
    state = build_state(model, prompts, request.config, request.block_length)
    if clock.cuda:
        torch.cuda.synchronize(device)
    clock.seconds()
    start = time.perf_counter()
    with torch.no_grad():
        steps = decode(model, state, request)
    if clock.cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, clock.seconds(), steps


def time_loop(model, prompts: list[list[int]], config: GenerationConfig, runs: int) -> dict:
    """The fastest (by wall time) of `runs` decodes (after one untimed decode): `loop_us`, its
    microseconds per step outside the model's forwards (wall time minus the forwards' time, per
    step), with its `decode_s`, `forwards_s` and `decode_over_forwards`."""
    request = resolve_request(model, config)
    clock, best = ForwardClock(model, next(model.parameters()).device), None
    try:
        for run in range(runs + 1):
            wall, inside, steps = timed_decode(model, prompts, request, clock)
            if run and (best is None or wall < best[0]):
                best = (wall, inside, steps)
    finally:
        clock.remove()
    wall, inside, steps = best
    return {"loop_us": round((wall - inside) / steps * 1e6, 1), "decode_s": round(wall, 6),
            "forwards_s": round(inside, 6), "decode_over_forwards": round(wall / inside, 4)}


def profile_decode(model, prompts: list[list[int]], config: GenerationConfig, path: Path) -> dict:
    """One more decode under torch.profiler: writes its operator table (by self device time on CUDA,
    self CPU time otherwise) to `path` and returns, per step, the wall time, the time inside the
    forwards and the time the device spent in kernels (`device_busy_us`, CUDA only): what a step
    costs beyond its forwards, split into device work and device idle time."""
    from torch.profiler import ProfilerActivity, profile

    request = resolve_request(model, config)
    clock = ForwardClock(model, next(model.parameters()).device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if clock.cuda else [])
    try:
        with profile(activities=activities) as prof:
            wall, inside, steps = timed_decode(model, prompts, request, clock)
    finally:
        clock.remove()
    events = prof.key_averages()
    sort = "self_device_time_total" if clock.cuda else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(events.table(sort_by=sort, row_limit=60) + "\n")
    out = {"profiled_steps": steps, "profiled_wall_us": round(wall / steps * 1e6, 1),
           "profiled_forwards_us": round(inside / steps * 1e6, 1)}
    if clock.cuda:
        out["device_busy_us"] = round(device_busy_us(events) / steps, 1)
    return out


def device_busy_us(events) -> float:
    """Microseconds the device spent in kernels: the sum over the kernels' own rows, as the
    profiler's table totals it (an operator's self device time counts the kernels it launched,
    which have rows of their own)."""
    from torch.autograd import DeviceType

    return sum(e.self_device_time_total for e in events
               if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False))


def row(preset: str, batch: int, sampler: str, cache: str, args, model) -> dict:
    """Count one configuration: a batch of `batch` equal-length prompts."""
    c = model.config
    special = {c.mask_token_id, c.pad_token_id, c.eos_token_id, c.bos_token_id, c.eot_token_id}
    pool = [t for t in range(1, c.vocab_size) if t not in special]
    tokens = (pool * (args.prompt_length // len(pool) + 1))[:args.prompt_length]   # no special id, cycled
    prompts = [tokens[b:] + tokens[:b] for b in range(batch)]
    config = GenerationConfig(gen_length=args.gen_length, block_length=args.block_length, sampler=sampler,
                              cache=cache, seed=0)
    counts = count_decode(model, prompts, config)
    out = {"preset": preset, "batch": batch, "sampler": sampler, "cache": cache, "gen_length": args.gen_length,
           "block_length": args.block_length, "prompt_length": args.prompt_length, "forwards": counts.forwards}
    for kind in KINDS:
        ops, syncs = counts.per_call(kind)
        c = counts.counts[kind]
        out[kind] = {"calls": counts.steps if kind == "loop" else c.calls, "ops_per_call": round(ops, 2),
                     "syncs_per_call": round(syncs, 2), "sync_sites": dict(c.sync_sites.most_common())}
    if args.time:
        if args.cuda_graphs:
            model.set_cuda_graphs(True, capture_after=1)     # timed decodes only: counting runs eagerly
        try:
            out.update(time_loop(model, prompts, config, args.time), threads=torch.get_num_threads(),
                       cuda_graphs=args.cuda_graphs)
            if args.profile:
                name = f"{preset}-B{batch}-{sampler}-{cache}.txt"
                out.update(profile_decode(model, prompts, config, Path(args.profile) / name))
        finally:
            if args.cuda_graphs:
                model.set_cuda_graphs(False)
    return out


def _print(r: dict, sites: bool) -> None:
    cells = "  ".join(f"{k} {r[k]['calls']:>3}x {r[k]['ops_per_call']:7.1f} ops {r[k]['syncs_per_call']:5.2f} syncs"
                      for k in KINDS)
    timed = (f"  loop {r['loop_us']:8.1f} us/step  decode/forwards {r['decode_over_forwards']:.3f}"
             if "loop_us" in r else "")
    if "profiled_wall_us" in r:
        timed += (f"  profiled: {r['profiled_wall_us']:.1f} us/step, forwards {r['profiled_forwards_us']:.1f}"
                  + (f", device busy {r['device_busy_us']:.1f}" if "device_busy_us" in r else ""))
    print(f"{r['preset']:<14} B={r['batch']:<3} {r['sampler']:<15} {r['cache']:<11} {r['forwards']:>4} fwd  {cells}{timed}")
    if sites:
        for kind in KINDS:
            for site, n in r[kind]["sync_sites"].items():
                print(f"{'':<20}{kind:<7} {n / max(r[kind]['calls'], 1):6.2f}/call  {site}")


def _models(args, device: torch.device, dtype: torch.dtype):
    """(name, model) pairs: the checkpoint's, or a random-weight model of each preset."""
    if args.checkpoint:
        yield Path(args.checkpoint).name, dllm.load(args.checkpoint, dtype=dtype, device=device)[0]
        return
    for preset in [p.strip() for p in args.presets.split(",") if p.strip()]:
        yield preset, dllm.build_model(ModelConfig.from_name(preset), seed=0, device=device, dtype=dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="llada-tiny,dream-tiny", help="model presets (dllm.config.PRESETS)")
    ap.add_argument("--checkpoint", default=None,
                    help="a checkpoint folder or shipped model name (dllm.load) instead of the presets")
    ap.add_argument("--batch", default="1", help="batch sizes, comma-separated")
    ap.add_argument("--grid", default=None, help="SAMPLER+CACHE pairs, comma-separated (default: "
                    + ",".join(f"{s}+{c}" for s, c in DEFAULT_GRID) + ")")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--block-length", type=int, default=16)
    ap.add_argument("--prompt-length", type=int, default=16)
    ap.add_argument("--sites", action="store_true", help="list where each synchronisation comes from")
    ap.add_argument("--time", type=int, default=0, metavar="N",
                    help="also time the loop outside the forwards: the fastest of N decodes, us per step")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="where the model runs (default cpu; cuda for the GPU timings)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="--time: replay the forwards as CUDA graphs (captured at a layout's first forward)")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="--time: profile one more decode per configuration; its operator table goes to DIR, "
                         "and the row gets the profiled step's wall, forward and (CUDA) device-busy time")
    ap.add_argument("--out", default=None, help="append one JSON row per configuration to this file")
    args = ap.parse_args(argv)
    if args.time < 0:
        raise SystemExit(f"error: --time {args.time} must be a number of decodes >= 0")
    for flag, value in (("--prompt-length", args.prompt_length), ("--gen-length", args.gen_length),
                        ("--block-length", args.block_length)):
        if value < 1:
            raise SystemExit(f"error: {flag} {value} must be >= 1")
    try:
        torch.device(args.device)
    except RuntimeError:
        raise SystemExit(f"error: --device {args.device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if args.profile and not args.time:
        raise SystemExit("error: --profile needs --time N (it profiles one more decode after the timed ones)")
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"error: --threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.cuda_graphs and device.type != "cuda":
        raise SystemExit(f"error: --cuda-graphs needs --device cuda, got --device {args.device}")
    batches, grid = _ints(args.batch, "--batch"), _grid(args.grid)
    rope = rope_write_impl(None, device, dtype)
    print(f"rotary + K/V write of cached forwards: {rope} (DLLM_ROPE_WRITE)")
    common = {"torch": torch.__version__, "rope_write": rope, "device": str(device), "dtype": args.dtype,
              "versions": provenance.versions(), "hardware": provenance.hardware(device=device)}
    common["git_commit"], common["git_dirty"] = provenance.source_commit()
    try:
        for preset, model in _models(args, device, dtype):
            for batch in batches:
                for sampler, cache in grid:
                    r = row(preset, batch, sampler, cache, args, model)
                    _print(r, args.sites)
                    if args.out:   # each row as it is made: a run stopped later keeps it
                        with open(args.out, "a", encoding="utf-8") as fh:
                            fh.write(json.dumps({**r, **common, "timestamp": provenance.timestamp()}) + "\n")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
