"""Accuracy of a model on our generated ParallelBench test split at several tokens per step.

    python benchmarks/eval_model.py --model runs/pb-tiny/model --out runs/pb-tiny/eval.jsonl
    python benchmarks/eval_model.py --model M --tokens-per-step 1,2,4,8 --sampler low_confidence
    python benchmarks/eval_model.py --model M --out F --names open                # held-out names
    python benchmarks/eval_model.py --model M --out F --data-dir PB/data          # the official files

Runs `dllm bench` (the generated test split, or the official files of `--data-dir`) once per
tokens-per-step value (one block over the canvas, greedy,
the sampler's fixed schedule), appending to one results file (so an interrupted run resumes), and
prints a Markdown table: tasks as rows, one column per setting, the average and tokens/forward.
"""
from __future__ import annotations

import argparse
import sys

from dllm.eval import report, runner
from dllm.eval.names import DEFAULT_SOURCE, NAME_SOURCES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True, help="results JSONL (appended; resumes)")
    p.add_argument("--tasks", default=None, help="default: the 12 Waiting Line and Puzzle tasks")
    p.add_argument("--tokens-per-step", default="1,2,4,8")
    p.add_argument("--sampler", default="low_confidence")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--names", default=DEFAULT_SOURCE, choices=NAME_SOURCES, help="generated Waiting Line people")
    p.add_argument("--gen-length", type=int, default=None,
                   help="default: the checkpoint's generation length, else each task's max_tokens")
    p.add_argument("--data-dir", default=None, help="a ParallelBench data folder (official files) instead")
    args = p.parse_args(argv)
    try:
        ks = [int(k) for k in args.tokens_per_step.split(",")]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        print(f"error: --tokens-per-step {args.tokens_per_step!r} must be comma-separated positive integers",
              file=sys.stderr)
        return 2
    if args.data_dir and args.names != DEFAULT_SOURCE:
        print("error: --names shapes the generated records; the official files under --data-dir fix their own",
              file=sys.stderr)
        return 2
    runs = []
    try:
        for k in ks:
            source = dict(data_dir=args.data_dir) if args.data_dir else dict(generated=True, names=args.names)
            cfg = runner.config_from_dict(dict(model=args.model, tasks=args.tasks, limit=args.limit, out=args.out,
                                               sampler=args.sampler, tokens_per_step=k, gen_length=args.gen_length,
                                               batch_size=args.batch_size, dtype=args.dtype, **source))
            rows = runner.run_bench(cfg)
            runs.append((k, rows[0]["run_id"]))
    except (ValueError, OSError) as err:       # a k that does not divide a task's length, a missing file
        print(f"error: {err}", file=sys.stderr)
        return 2
    summaries = {s.run_id: s for s in report.summarize(runner.ResultsFile(args.out).rows())}
    requested = {run_id: k for k, run_id in runs}
    chosen = [summaries[run_id] for _, run_id in runs]
    print(report.markdown_table(chosen, label=lambda s: f"{s.sampler} k={requested[s.run_id]}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
