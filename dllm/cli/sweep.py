"""`dllm sweep`: a grid of decoding configurations on ParallelBench (see `dllm.sweep`)."""
from __future__ import annotations

import sys

from dllm.distributed import is_main_process
from dllm.sweep import CONFIG_ERRORS, error_text, grid_from_args, run_sweep, same_run_as

from .options import add_benchmark_options, add_runtime_options, add_sampling_options


def add_parser(sub) -> None:
    w = sub.add_parser("sweep", help="run a grid of models x samplers x caches x lengths on ParallelBench; write "
                                     "rows, summaries, Pareto plots, PB@X and a Markdown report")
    add_arguments(w)
    w.set_defaults(func=run)


def add_arguments(p) -> None:
    """The `dllm sweep` options: the grid's axes, then the settings every configuration shares (a
    setting given here replaces the grid file's)."""
    p.add_argument("--grid", default=None, help="grid file (.yaml/.yml/.toml); see benchmarks/grids/default.yaml")
    p.add_argument("--out-dir", required=True, help="folder for rows.jsonl, summaries.jsonl, report.md and the plots; "
                                                     "a rerun resumes")
    axes = p.add_argument_group("grid axes (each replaces the grid file's axis)")
    axes.add_argument("--model", action="append", default=None,
                      help="model axis (repeatable): checkpoint folder, shipped model name or hub id; 'default' = "
                           "the shipped default model")
    axes.add_argument("--sampler", action="append", default=None, metavar="'NAME key=v1,v2 ...'",
                      help="sampler axis (repeatable): a name and argument lists, e.g. 'threshold tau=0.8,0.9' or "
                           "'low_confidence tokens_per_step=1,2,4'; keys tokens_per_step, steps, block_lengths, "
                           "gen_lengths set that sampler's schedule and lengths")
    axes.add_argument("--cache", action="append", default=None, metavar="'NAME key=v1,v2 ...'",
                      help="cache axis (repeatable), e.g. none, dual or 'dkv-decode refresh=4,8'")
    axes.add_argument("--block-length", default=None,
                      help="block length axis, comma-separated ('default' = the request's default: one block, "
                           "or the sampler's or model's own)")
    axes.add_argument("--gen-length", default=None,
                      help="generation length axis, comma-separated ('default' = the checkpoint's length when "
                           "it names one, else the task's max_tokens)")
    add_benchmark_options(p)
    add_runtime_options(p)
    add_sampling_options(p)
    p.add_argument("--pb", default=None, help="accuracy levels for PB@X and the best-configuration list "
                                              "(default 80,70,60)")
    p.add_argument("--dry-run", action="store_true", help="list the configurations and exit")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rewrite report.md and the plots from the stored summaries")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--compare", default=None, metavar="DIR",
                   help="leaderboard CSV files (<model>/<method>.csv: task,tps,accuracy) to put beside the sweep in "
                        "the report (PB@X) and the tokens/forward plot")
    p.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    """`dllm sweep`; returns the exit status."""
    try:
        grid = grid_from_args(args)
        if args.dry_run:
            unused = [flag for flag, value in (("--report-only", args.report_only), ("--compare", args.compare),
                                               ("--no-plots", args.no_plots)) if value]
            if unused:
                raise ValueError(f"--dry-run lists the configurations and exits; {', '.join(unused)} do(es) not "
                                 f"apply")
            return print_configurations(grid)
        result = run_sweep(grid, args.out_dir, progress=not args.no_progress, plots=not args.no_plots,
                           report_only=args.report_only, compare=args.compare)
    except CONFIG_ERRORS as err:
        print(f"error: {error_text(err)}", file=sys.stderr)
        return 2
    if not is_main_process():
        return 0
    print(result.report)
    print(f"written to {result.out_dir}", file=sys.stderr)
    return 0


def print_configurations(grid) -> int:
    """`--dry-run`: each configuration's label, marking those that decode the same run as an
    earlier one (the sweep runs it once), then the counts; returns the exit status (2 when the
    tasks' samples, needed for the run ids, cannot be loaded: the run would stop there too)."""
    try:
        first = same_run_as(grid)
    except CONFIG_ERRORS as err:
        for p in grid.points:
            print(p.label)
        print(f"{len(grid.points)} configuration(s)")
        print(f"error: {error_text(err)}", file=sys.stderr)
        return 2
    for i, p in enumerate(grid.points):
        print(p.label if first[i] == i else f"{p.label}  (the same run as {grid.points[first[i]].label})")
    print(f"{len(grid.points)} configuration(s), {len(set(first))} distinct run(s)")
    return 0
