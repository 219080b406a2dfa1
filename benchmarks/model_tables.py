"""The README's sampler and KV-cache tables for one model, measured in one run.

    python benchmarks/model_tables.py --out runs/tables.jsonl                    # the shipped model
    python benchmarks/model_tables.py --model runs/pb-tiny/model --out runs/t.jsonl --limit 8
    python benchmarks/model_tables.py --out runs/tables.jsonl --only samplers    # or caches, twins, guard
    python benchmarks/model_tables.py --out runs/tables.jsonl --only samplers --samplers wino,remdm

Each row of a table is one `dllm bench --generated --tasks pure --dtype float32` run (greedy, one
block over the answer; `learn2pd` at block length 32, the length its filter is trained for, and
`dus` at 32, its published block length). All
runs append to one results file, so a stopped script resumes where it was. Prints four Markdown
tables: every sampler at its defaults, per task; the caches under one token per step and under
`threshold`, with the summed per-sample decode seconds and the speedup against the same sampler
without a cache; the same caches with `twins`; the caches with a `guard`. "zero-dep" is the mean
over copy, reverse, insert_index, remove_index and replace_index.
"""
from __future__ import annotations

import argparse
import sys

from dllm.eval import report, runner

TASK_ORDER = ("copy", "reverse", "insert_index", "remove_index", "replace_index", "insert_random",
              "remove_random", "replace_random", "shuffle", "sort", "latin_square_n4", "sudoku_n4_12")
ZERO_DEP = TASK_ORDER[:5]
ONE = ("low_confidence", {"tokens_per_step": 1}, "low_confidence, 1 token/step")

# (label, sampler, run settings)
SAMPLERS = [
    ("low_confidence, 1 token/step", "low_confidence", {"tokens_per_step": 1}),
    ("random, 1 token/step", "random", {"tokens_per_step": 1}),
    ("threshold", "threshold", {}),
    ("factor", "factor", {}),
    ("adablock", "adablock", {}),
    ("localleap", "localleap", {}),
    ("learn2pd (block 32)", "learn2pd", {"block_length": 32}),
    ("prophet", "prophet", {}),
    ("eb", "eb", {}),
    ("margin_topk, 1 token/step", "margin_topk", {"tokens_per_step": 1}),
    ("entropy_topk, 1 token/step", "entropy_topk", {"tokens_per_step": 1}),
    ("left_to_right, 1 token/step", "left_to_right", {"tokens_per_step": 1}),
    ("dus (block 32)", "dus", {"block_length": 32}),
    ("klass, 1 token/step", "klass", {"tokens_per_step": 1}),
    ("slowfast", "slowfast", {}),
    ("wino", "wino", {}),
    ("remdm, 1 token/step", "remdm", {"tokens_per_step": 1}),
    ("rcr, 64 steps", "rcr", {"steps": 64}),
    ("hierarchy", "hierarchy", {}),
    ("credit", "credit", {}),
    ("dparallel", "dparallel", {}),
    ("freedave", "freedave", {}),
    ("pc_sampler, 1 token/step", "pc_sampler", {"tokens_per_step": 1}),
    ("certainty_prior, 1 token/step", "certainty_prior", {"tokens_per_step": 1}),
]
# (sampler label, sampler, run settings, cache label, cache, cache args)
CACHES = [
    *[(ONE[2], ONE[0], ONE[1], label, cache, args) for label, cache, args in (
        ("none", "none", {}),
        ("dkv-decode (refresh 2)", "dkv-decode", {"refresh": 2}),
        ("dkv-decode (refresh 4)", "dkv-decode", {"refresh": 4}),
        ("dkv-decode (refresh 8, default)", "dkv-decode", {}))],
    *[("threshold", "threshold", {}, cache, cache, {}) for cache in ("none", "prefix", "dual", "dkv-decode", "dkv-greedy")],
]
# the same rows with `twins` on every storing policy
TWINS = [row if row[4] == "none" else (*row[:3], f"{row[3]}, twins", row[4], {**row[5], "twins": True})
         for row in CACHES]
# `guard` (a full refresh where the best candidate was less confident than the guard) on every
# storing policy: one token per step with dkv-decode at its default refresh and guard 0.99, alone
# and with twins; every cache under `threshold` (tau 0.9) with guard 0.9, so that a step refreshes
# where the sampler would fall back to its single best candidate (a guard above tau would refresh
# every step).
GUARD, THRESHOLD_GUARD = 0.99, 0.9
GUARDED = [
    *[(ONE[2], ONE[0], ONE[1], label, cache, args) for label, cache, args in (
        ("none", "none", {}),
        (f"dkv-decode (refresh 8, default), guard {GUARD}", "dkv-decode", {"guard": GUARD}),
        (f"dkv-decode (refresh 8, default), guard {GUARD}, twins", "dkv-decode", {"guard": GUARD, "twins": True}))],
    ("threshold", "threshold", {}, "none", "none", {}),
    *[("threshold", "threshold", {}, f"{cache}, guard {THRESHOLD_GUARD}", cache, {"guard": THRESHOLD_GUARD})
      for cache in ("prefix", "dual", "dkv-decode", "dkv-greedy")],
]
TABLES = ("samplers", "caches", "twins", "guard")


def _short(task: str) -> str:
    return task.rsplit("/", 1)[-1]


def _cell(t: report.TaskSummary | None) -> str:
    if t is None or t.score is None:
        return "n/a"
    return f"{t.score:.0f}" if t.n % 100 == 0 else f"{t.score:.1f}"


def _zero_dep(s: report.RunSummary) -> float | None:
    xs = [t.score for t in s.tasks if _short(t.task) in ZERO_DEP and t.score is not None]
    return sum(xs) / len(xs) if xs else None


_num = report.format_number


def _run(args, loaded, sampler: str, settings: dict, cache: str = "none", cache_args: dict | None = None
         ) -> report.RunSummary:
    cfg = runner.config_from_dict(dict(model=args.model, tasks="pure", generated=True, limit=args.limit,
                                       out=args.out, sampler=sampler, cache=cache, cache_kwargs=dict(cache_args or {}),
                                       batch_size=args.batch_size, dtype="float32", **settings))
    model, tokenizer = loaded
    return report.summarize(runner.run_bench(cfg, model=model, tokenizer=tokenizer, progress=not args.quiet))[0]


def sampler_table(runs: list[tuple[str, report.RunSummary]]) -> str:
    head = "| sampler | " + " | ".join(t.replace("_square_n4", "").replace("_n4_12", "") for t in TASK_ORDER) + \
        " | average | zero-dep | tokens/forward |"
    lines = [head, "|---" * (len(TASK_ORDER) + 4) + "|"]
    for label, s in runs:
        by = {_short(t.task): t for t in s.tasks}
        cells = [_cell(by.get(t)) for t in TASK_ORDER]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {_num(s.average)} | {_num(_zero_dep(s))} | "
                     f"{s.tokens_per_forward:.2f} |")
    return "\n".join(lines)


def cache_table(runs: list[tuple[str, str, report.RunSummary]]) -> str:
    lines = ["| sampler | cache | average | zero-dep | tokens/forward | decode seconds | "
             "speedup vs same sampler without cache |", "|---|---|---|---|---|---|---|"]
    base = {}
    for sampler, cache, s in runs:
        seconds = sum(t.seconds for t in s.tasks)
        if cache == "none":
            base[sampler] = seconds
        speed = base[sampler] / seconds if sampler in base and seconds > 0 else None
        lines.append(f"| {sampler} | {cache} | {_num(s.average)} | {_num(_zero_dep(s))} | {s.tokens_per_forward:.2f} | "
                     f"{seconds:.1f} | {_num(speed, '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint folder (default: the shipped model)")
    p.add_argument("--out", required=True, help="results JSONL (appended; resumes)")
    p.add_argument("--only", default=",".join(TABLES), help=f"comma-separated subset of {', '.join(TABLES)}")
    p.add_argument("--limit", type=int, default=None, help="first N samples per task (default: all)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--samplers", default=None,
                   help="comma-separated sampler names: only their rows of the sampler table (default: all)")
    args = p.parse_args(argv)
    names = {name for _, name, _ in SAMPLERS}
    picked = None if args.samplers is None else [n.strip() for n in args.samplers.split(",") if n.strip()]
    if picked is not None and (not picked or set(picked) - names):
        print(f"error: --samplers {args.samplers!r}: choose from {', '.join(sorted(names))}", file=sys.stderr)
        return 2
    chosen = [t.strip() for t in args.only.split(",") if t.strip()]
    bad = [t for t in chosen if t not in TABLES]
    if bad or not chosen:
        print(f"error: --only {args.only!r}: choose from {', '.join(TABLES)}", file=sys.stderr)
        return 2
    if picked is not None and "samplers" not in chosen:
        print("error: --samplers picks rows of the samplers table; add samplers to --only", file=sys.stderr)
        return 2
    import dllm

    loaded = dllm.load(args.model, dtype="float32", device="cpu")      # once, for every run
    if "samplers" in chosen:
        runs = [(label, _run(args, loaded, sampler, settings)) for label, sampler, settings in SAMPLERS
                if picked is None or sampler in picked]
        print(sampler_table(runs) + "\n")
    for name, spec in (("caches", CACHES), ("twins", TWINS), ("guard", GUARDED)):
        if name in chosen:
            runs = [(sl, cl, _run(args, loaded, sampler, settings, cache, cargs))
                    for sl, sampler, settings, cl, cache, cargs in spec]
            print(cache_table(runs) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
