"""The speed/quality sweep: a grid of decoding configurations run on ParallelBench, with one
summary per configuration, Pareto plots, PB@X and a Markdown report.

    dllm sweep --grid benchmarks/grids/default.yaml --out-dir runs/sweep
    dllm sweep --out-dir runs/s --tasks waiting_line --limit 5 \\
        --sampler 'low_confidence tokens_per_step=1,2,4,8' --sampler 'threshold tau=0.7,0.8,0.9' \\
        --cache none --cache 'dkv-decode refresh=4,8'
    torchrun --nproc_per_node 2 -m dllm.cli sweep --grid grid.yaml --out-dir runs/sweep

A *configuration* is one model, one sampler with its arguments, one cache policy with its
arguments, a block length, a generation length (None: the checkpoint's generation length when it
names one, else each task's `max_tokens`), a step count
or tokens per step, and a suffix dropout (None: off); the grid is the cartesian product of the axes, and each sampler's argument
lists multiply out. Every configuration is run over the same tasks and samples (generated test
split by default, the official files with `data_dir`), through `dllm.eval.runner.run_bench`, so its
rows are the bench rows and its run id the bench run id.

Grid file (YAML or TOML; the command line builds the same structure)::

    tasks: pure                  # task ids, patterns or groups; default: the 12 Waiting Line + Puzzle tasks
    limit: 8                     # samples per task
    models: [null]               # null (TOML: "default") = the shipped default model
    block_lengths: [null]        # null = one block over the generation
    gen_lengths: [null]          # null = the checkpoint's length, else each task's max_tokens
    suffix_dropouts: [null, {window: 32}]   # DPad's suffix dropout: null = off (docs/suffix-dropout.md)
    caches: [none, {name: dkv-decode, args: {refresh: [4, 8]}}]
    samplers:
      - {name: low_confidence, tokens_per_step: [1, 2, 4, 8]}
      - {name: threshold, args: {tau: [0.7, 0.8, 0.9]}}
      - {name: learn2pd, block_lengths: [32], args: {filter: [null, none]}}
    grids:                       # optional: the union of several products (below)
      - {}                               # the axes above as they are
      - {samplers: [threshold], caches: [prefix, dual]}

With `grids`, the axes at the top level are only the defaults of each entry, which overrides
some of them; an entry `{}` runs the top-level product itself. A list is a list of alternatives;
an argument whose value is itself a list is written as a list of lists
(`thresholds: [[7.5, 5.0, 2.5]]`). Unknown keys, names, arguments and out-of-range values are
errors naming the value and what is allowed, raised before any model is loaded.

Outputs in `out_dir`:
  rows.jsonl        one bench row per (configuration, sample), appended as each finishes;
  summaries.jsonl   one row per configuration (kind "summary"), rewritten atomically and replaced
                    by id, so a configuration never has two; failed configurations get a row with
                    status "failed" and the error, and are retried by the next run;
  report.md         per-configuration table, PB@X, the best configuration per accuracy level,
                    failed configurations;
  accuracy_vs_tokens_per_forward.png, accuracy_vs_tokens_per_second.png, accuracy_per_task.png.

Killed and restarted, the sweep skips finished configurations, resumes the interrupted one where
its rows end and redoes nothing. A configuration that fails (a Learn2PD filter that does not exist,
a block length the sampler refuses, ...) is tried once on one sample with a single forward before
its run, reported, and skipped. Under `torchrun` / `accelerate launch --multi_gpu` the runner
splits each configuration's batches over the processes; only the main process writes.
"""

from __future__ import annotations

from .grid import (AXES, CACHE_KEYS, SAMPLER_KEYS, Grid, SweepPoint, SweepSettings, grid_from_args, load_grid_file,
                   model_names, parse_grid, parse_spec, point_label)
from .pareto import best_per_level, pareto_front
from .plots import PLOT_TASKS, PLOT_TPF, PLOT_TPS, write_plots
from .report import REPORT_FILE, markdown_report, write_report
from .run import CONFIG_ERRORS, SweepResult, error_text, run_sweep, same_run_as
from .summaries import (ROWS_FILE, SUMMARIES_FILE, SUMMARY_VERSION, expected_run_id, failed_summary, read_summaries,
                        summarize_point, summary_id, task_names, write_summary)

__all__ = [
    "AXES", "CACHE_KEYS", "CONFIG_ERRORS", "PLOT_TASKS", "PLOT_TPF", "PLOT_TPS", "REPORT_FILE", "ROWS_FILE",
    "SAMPLER_KEYS", "SUMMARIES_FILE", "SUMMARY_VERSION", "Grid", "SweepPoint", "SweepResult", "SweepSettings",
    "best_per_level", "error_text", "expected_run_id", "failed_summary", "grid_from_args",
    "load_grid_file", "markdown_report", "model_names", "pareto_front", "parse_grid", "parse_spec", "point_label",
    "read_summaries", "run_sweep", "same_run_as", "summarize_point", "summary_id", "task_names", "write_plots", "write_report",
    "write_summary",
]
