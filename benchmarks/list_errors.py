"""How the wrong answers of list tasks are wrong, from a `dllm bench` results file.

    python benchmarks/list_errors.py runs/eval.jsonl [--tasks waiting_line/copy,waiting_line/reverse]
    python benchmarks/list_errors.py runs/eval.jsonl --tasks waiting_line/insert_index --by-length

Per run and task, of the answers the benchmark scores below 1: *run-on* (a list of another length
than the reference), *misspelt* (the right length, some item differs from the reference item at
its place) and *unparsable* (not a JSON list). For copy and reverse, whose answer is fixed, a
misspelt list holds every name but spells one wrong or puts one in the wrong place.
`--by-length` splits each task's counts by the length of its reference answer list.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

from dllm.eval.runner import ResultsFile


def error_kind(prediction: str, answer: str) -> str:
    """"right", "unparsable", "run-on" or "misspelt" for one prediction against its answer list."""
    if prediction.strip() == answer.strip():
        return "right"
    try:
        predicted = json.loads(prediction)
    except json.JSONDecodeError:
        return "unparsable"
    if not isinstance(predicted, list):
        return "unparsable"
    reference = json.loads(answer)
    if len(predicted) != len(reference):
        return "run-on"
    return "right" if predicted == reference else "misspelt"


def count_errors(rows: list[dict], tasks: set[str] | None = None,
                 by_length: bool = False) -> dict[tuple, Counter]:
    """{(run_id, task): Counter of error kinds} over the result rows of list-answer tasks; a row
    scored 1 is right (the benchmark's parse forgives stray quotes that `error_kind` does not).
    With `by_length` the keys are (run_id, task, length of the reference answer list)."""
    counts: dict[tuple, Counter] = {}
    for row in rows:
        if tasks is not None and row["task"] not in tasks:
            continue
        kind = "right" if row["score"] == 1 else error_kind(row["prediction"], row["answer"])
        key = (row["run_id"], row["task"]) + ((len(json.loads(row["answer"])),) if by_length else ())
        counts.setdefault(key, Counter())[kind] += 1
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results JSONL of dllm bench or benchmarks/eval_model.py")
    parser.add_argument("--tasks", default="waiting_line/copy,waiting_line/reverse",
                        help="comma-separated task ids with list answers")
    parser.add_argument("--by-length", action="store_true", help="one row per length of the reference answer")
    args = parser.parse_args(argv)
    counts = count_errors(ResultsFile(args.results).rows(), set(args.tasks.split(",")), args.by_length)
    if not counts:
        raise SystemExit(f"no rows of {args.tasks} in {args.results}")
    length = " answer length |" if args.by_length else ""
    print(f"| run | task |{length} samples | right | run-on | misspelt | unparsable |")
    print("|---|---|" + ("---|" if args.by_length else "") + "---|---|---|---|---|")
    for key, c in sorted(counts.items()):
        print(f"| {' | '.join(map(str, key))} | {sum(c.values())} | {c['right']} | {c['run-on']} | "
              f"{c['misspelt']} | {c['unparsable']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
