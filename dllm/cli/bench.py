"""`dllm bench`: ParallelBench runs, their tables and PB@X, and the generated test sets."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from dllm.distributed import is_main_process
from dllm.eval import data, generators, leaderboard, report, runner
from dllm.eval.names import DEFAULT_SOURCE, NAME_SOURCES

from .options import (Given, add_benchmark_options, add_model_option, add_request_options, add_runtime_options,
                      generation_config, given)


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="run ParallelBench tasks and print per-task scores and PB@X")
    add_model_option(b)
    add_benchmark_options(b)
    b.add_argument("--generated", action="store_true",
                   help="use our seeded generators' held-out test split (Waiting Line and Puzzle tasks); "
                        "the default when no --data-dir is given")
    b.add_argument("--out", default=None, help="results JSONL: one row per sample, appended; a rerun resumes")
    add_request_options(b)
    add_runtime_options(b)
    b.add_argument("--sort-key", action=Given, default="full_name", choices=("full_name", "last_name"),
                   help="generated Sort labels: by the full name as the official files, or by last name as the "
                        "prompt reads")
    b.add_argument("--index-base", action=Given, type=int, default=0, choices=(0, 1),
                   help="generated *_index positions: 0-based as the official files, or 1-based")
    b.add_argument("--names", action=Given, default=DEFAULT_SOURCE, choices=NAME_SOURCES,
                   help="generated Waiting Line people: the project's word lists (one pool for both splits), or "
                        "Faker's names with the test split drawn from a pool held out of the train split (open), or "
                        "made-up names split the same way (pseudo)")
    b.add_argument("--pb", default="80,70,60", help="PB@X levels (default 80,70,60)")
    b.add_argument("--report", action="store_true", help="only print the tables of the runs stored in --out")
    b.add_argument("--format", default="text", choices=("text", "leaderboard"),
                   help="text: per-run tables and PB@X (default); leaderboard: also write the runs stored in --out "
                        "as the public leaderboard's CSV files (<model>/<method>.csv: task,tps,accuracy) to --out-dir")
    b.add_argument("--out-dir", default=None, metavar="DIR", help="folder for --format leaderboard")
    b.add_argument("--compare", default=None, metavar="DIR",
                   help="leaderboard CSV files (<model>/<method>.csv) to put beside the stored runs: PB@X of both")
    b.add_argument("--write-data", default=None, metavar="DIR",
                   help="write the generated test sets in the official layout to DIR and exit")
    b.add_argument("--train-shard", type=int, default=None, metavar="S",
                   help="with --write-data: write records of the train split's shard S (0-999; --limit of them "
                        "per task, default the official count) instead of the test split: a validation set, "
                        "held out of training when S is not a shard the recipe trains on")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=run)


def parse_levels(text: str) -> tuple[float, ...]:
    """PB@X accuracy levels from a comma-separated list such as 80,70,60."""
    try:
        levels = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"error: --pb {text!r} must be comma-separated numbers such as 80,70,60") from None
    if not levels or any(not 0 <= x <= 100 for x in levels):
        raise SystemExit(f"error: --pb {text!r} must list accuracy levels between 0 and 100")
    return levels


def print_report(rows, levels, current=None, args=None, compare=()) -> None:
    """Each run's per-task table (with `current`, the rows of the run just made: its table alone),
    then the PB@X leaderboard of `rows`; with `--format leaderboard` the runs' leaderboard CSV
    files, with `--compare` PB@X beside the leaderboard's files (`compare`, their curves as read)."""
    summaries = report.summarize(rows)
    for s in summaries if current is None else report.summarize(current):
        print(report.format_run(s) + "\n")
    print(f"PB@X: the largest tokens/forward whose average score is >= X, over the {len(summaries)} run(s) stored")
    print(report.format_leaderboard(report.leaderboard(summaries, levels), levels))
    if args is None or (args.format == "text" and not args.compare):
        return
    ours = leaderboard.curves_from_runs(summaries)
    if args.format == "leaderboard":
        for path in leaderboard.write_curves(ours, args.out_dir):
            print(f"wrote {path}")
    if args.compare:
        print(f"\nBeside the leaderboard files under {args.compare} (tps: tokens per forward)")
        print(leaderboard.format_comparison(ours, compare, levels))


def report_rows(path) -> list[dict]:
    """The result rows of `path`; a ValueError when it holds none (an empty file, a sweep's
    summaries)."""
    results = runner.ResultsFile(path)
    rows = results.rows()
    if not rows:
        other = " (it holds other records: a sweep's summaries? its rows are in rows.jsonl)" if results.records() \
            else ""
        raise ValueError(f"--report: {str(path)!r} holds no result rows of dllm bench{other}")
    return rows


def check_report_options(args) -> None:
    """--format leaderboard needs --out-dir, and --out-dir only serves it."""
    if args.format == "leaderboard" and not args.out_dir:
        raise ValueError("--format leaderboard writes CSV files; give their folder with --out-dir DIR")
    if args.out_dir and args.format != "leaderboard":
        raise ValueError(f"--out-dir {args.out_dir!r} is the folder of --format leaderboard; add --format leaderboard")
    if args.compare and not Path(args.compare).is_dir():
        raise FileNotFoundError(f"--compare {args.compare!r}: no such folder of leaderboard CSV files")


_RECORD_SHAPES = {"sort_key": "--sort-key", "index_base": "--index-base", "names": "--names"}


def _decoding_options(args, keep: set[str]) -> list[str]:
    """The options given on the command line that describe a run to decode (model, request,
    runtime, samples), but those in `keep` (destinations)."""
    flags = {"grammar_url": "--grammar-server"}
    named = [flags.get(d, "--" + d.replace("_", "-")) for d in sorted(given(args) - keep - set(_RECORD_SHAPES))]
    named += [flag for flag, value in (("--sampler-arg", args.sampler_arg), ("--cache-arg", args.cache_arg),
                                       ("--suffix-dropout", args.suffix_dropout)) if value]
    return named


def _record_options(args) -> list[str]:
    """The options given that shape the generated records."""
    return [flag for flag, value in (("--generated", args.generated), ("--train-shard", args.train_shard is not None))
            if value] + _record_shapes(args)


def _record_shapes(args) -> list[str]:
    """The options given that shape each generated record (how its people and labels are made)."""
    return [flag for dest, flag in _RECORD_SHAPES.items() if dest in given(args)]


def check_mode_options(args) -> None:
    """Options that the chosen mode (--write-data, --report) would ignore are errors naming them."""
    if args.write_data:
        unused = [name for name, given_ in (("--out", args.out), ("--report", args.report),
                                            ("--compare", args.compare),
                                            ("--format leaderboard", args.format != "text")) if given_]
        unused += _decoding_options(args, keep={"tasks", "limit"})
        if unused:
            raise ValueError(f"--write-data writes the generated records and exits; {', '.join(unused)} do(es) not "
                             f"apply")
        if os.path.exists(args.write_data) and not os.path.isdir(args.write_data):
            raise ValueError(f"--write-data {args.write_data!r} is a file; give a folder (new or existing) to write "
                             f"the records into")
    elif args.report:
        unused = _decoding_options(args, keep=set()) + _record_options(args)
        if unused:
            raise ValueError(f"--report prints every run stored in --out; {', '.join(unused)} describe(s) a run to "
                             f"decode and do(es) not apply")
    elif args.data_dir and (shaping := _record_shapes(args)):
        raise ValueError(f"{', '.join(shaping)} shape(s) the generated records; the official files "
                         f"under --data-dir {args.data_dir!r} fix their own")


def _write_data(args) -> int:
    cfg = bench_config(args)
    opts = runner.generator_options(cfg)
    if args.train_shard is not None:
        opts.update(split="train", shard=args.train_shard, num_samples=args.limit)
    recs = {t: generators.make_records(t, **opts)[:args.limit] for t in runner.generated_tasks(cfg)}
    folder = data.write_official_layout(args.write_data, recs, generated=opts)
    print(f"wrote {sum(map(len, recs.values()))} records of {len(recs)} task(s) to {folder}")
    return 0


def bench_config(args) -> runner.BenchConfig:
    """The run the options in `args` describe."""
    return runner.BenchConfig(
        model=args.model, tasks=args.tasks, data_dir=args.data_dir, generated=args.generated, limit=args.limit,
        out=args.out, generation=generation_config(args), batch_size=args.batch_size, dtype=args.dtype,
        device=args.device, attention=args.attention, cuda_graphs=args.cuda_graphs, compile=args.compile,
        grammar_url=args.grammar_url,
        bertscore_model=args.bertscore_model, sort_key=args.sort_key, index_base=args.index_base,
        names=args.names)


def run(args) -> int:
    levels = parse_levels(args.pb)
    try:
        check_mode_options(args)
        if args.write_data:
            return _write_data(args)
        if args.train_shard is not None:
            raise ValueError(f"--train-shard {args.train_shard} selects the records --write-data writes; "
                             "add --write-data DIR")
        check_report_options(args)
        compare = leaderboard.read_curves(args.compare) if args.compare else []   # before anything is decoded
        if args.report:
            if not args.out:
                raise ValueError("--report prints the tables of a results file; give it with --out FILE")
            if not Path(args.out).is_file():
                raise FileNotFoundError(f"--report: no results file {args.out!r}")
            print_report(report_rows(args.out), levels, args=args, compare=compare)
            return 0
        if args.compare:   # the comparison needs each task's leaderboard id: known before anything is decoded
            for task in runner.load_dataset(bench_config(args)).tasks:
                leaderboard.task_id(task)
        rows = runner.run_bench(bench_config(args), progress=not args.no_progress)
    except (ValueError, OSError, FloatingPointError, RuntimeError, ImportError) as err:
        # OSError: files it cannot read or write; ImportError: an optional package a task's score needs
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not is_main_process():
        return 0
    if not rows:
        print("no samples selected")
        return 0
    stored = runner.ResultsFile(args.out).rows() if args.out else rows
    try:
        print_report(stored, levels, current=rows, args=args, compare=compare)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
