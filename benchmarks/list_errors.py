"""How the wrong answers of list tasks are wrong, from a `dllm bench` results file.

    python benchmarks/list_errors.py runs/eval.jsonl [--tasks waiting_line/copy,waiting_line/reverse]
    python benchmarks/list_errors.py runs/eval.jsonl --tasks waiting_line/insert_index --by-length

Per run and task, of the answers the benchmark scores below 1: *run-on* (a list of another length
than the reference), *misspelt* (the right length, some item differs from the reference item at
its place) and *unparsable* (not a JSON list). For copy and reverse, whose answer is fixed, a
misspelt list holds every name but spells one wrong or puts one in the wrong place.
`--by-length` splits each task's counts by the length of its reference answer list.

    python benchmarks/list_errors.py runs/eval.jsonl --tasks waiting_line/insert_index --rare-pieces MODEL_DIR

`--rare-pieces` counts, per task, the samples and the wrong answers with and without a held-out
word made of a rare name piece of MODEL_DIR's tokenizer: a piece that fewer than `--below` (3)
words of the training side hold (`dllm.train.cover`; first names counted bare, last names after a
space). Any task with people works (its answer may be a list or a record).
"""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from dllm.eval.names import open_pool
from dllm.eval.runner import ResultsFile

WORD = re.compile(r"[A-Z][a-z]+")


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


def list_answer(row: dict) -> list:
    """The row's reference answer as a list; ValueError naming the task when its answers are not
    lists (Sudoku grids, the record tasks' objects)."""
    try:
        answer = json.loads(row["answer"])
    except (json.JSONDecodeError, TypeError):
        answer = None
    if not isinstance(answer, list):
        raise ValueError(f"task {row['task']!r} has answers that are not lists; this script counts the errors of "
                         f"list-answer tasks (the Waiting Line's copy, reverse, sort, ...)")
    return answer


def count_errors(rows: list[dict], tasks: set[str] | None = None,
                 by_length: bool = False) -> dict[tuple, Counter]:
    """{(run_id, task): Counter of error kinds} over the result rows of list-answer tasks; a row
    scored 1 is right (the benchmark's parse forgives stray quotes that `error_kind` does not).
    With `by_length` the keys are (run_id, task, length of the reference answer list)."""
    counts: dict[tuple, Counter] = {}
    for row in rows:
        if tasks is not None and row["task"] not in tasks:
            continue
        reference = list_answer(row)
        kind = "right" if row["score"] == 1 else error_kind(row["prediction"], row["answer"])
        key = (row["run_id"], row["task"]) + ((len(reference),) if by_length else ())
        counts.setdefault(key, Counter())[kind] += 1
    return counts


def rare_words(tokenizer, below: int) -> frozenset[str]:
    """The held-out ("open" test pool) words holding a name piece that fewer than `below` words of the
    training side hold, each counted in its place (first names bare, last names after a space)."""
    from dllm.train import cover

    counts = cover.piece_counts(tokenizer, *cover.training_words())
    test = open_pool("test")
    return frozenset(w for side, words in (("first", test.firsts), ("last", test.lasts))
                     for w, ids in zip(words, cover.word_ids(tokenizer, words, side))
                     if min(counts[i] for i in ids) < below)


def count_by_rare_words(rows: list[dict], tasks: set[str], rare: frozenset[str]) -> dict[tuple, Counter]:
    """{(run_id, task, "yes"/"no"): Counter of "samples" and "wrong"}: whether the sample's answer
    holds a word of `rare`, and how many such samples the benchmark scores below 1."""
    counts: dict[tuple, Counter] = {}
    for row in rows:
        if row["task"] not in tasks:
            continue
        answer = row["answer"] if isinstance(row["answer"], str) else json.dumps(row["answer"])
        holds = "yes" if set(WORD.findall(answer)) & rare else "no"
        c = counts.setdefault((row["run_id"], row["task"], holds), Counter())
        c["samples"] += 1
        c["wrong"] += row["score"] < 1
    return counts


def _print_rare(counts: dict[tuple, Counter]) -> None:
    print("| run | task | holds a rare piece | samples | wrong |")
    print("|---|---|---|---|---|")
    for key, c in sorted(counts.items()):
        print(f"| {' | '.join(key)} | {c['samples']} | {c['wrong']} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results JSONL of dllm bench or benchmarks/eval_model.py")
    parser.add_argument("--tasks", default="waiting_line/copy,waiting_line/reverse",
                        help="comma-separated task ids with list answers")
    parser.add_argument("--by-length", action="store_true", help="one row per length of the reference answer")
    parser.add_argument("--rare-pieces", metavar="MODEL_DIR",
                        help="split the counts by held-out words made of rare name pieces of this tokenizer")
    parser.add_argument("--below", type=int, default=3,
                        help="with --rare-pieces: a piece is rare in fewer training words than this")
    args = parser.parse_args(argv)
    if args.rare_pieces and args.by_length:
        parser.error("--by-length splits the error table; --rare-pieces makes another table: give one of them")
    if args.below != 3 and not args.rare_pieces:
        parser.error("--below applies only with --rare-pieces")
    if not Path(args.results).is_file():
        raise SystemExit(f"no results file {args.results!r}")
    try:
        return _tables(args)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def _tables(args) -> int:
    if args.rare_pieces:
        from transformers import PreTrainedTokenizerFast

        rare = rare_words(PreTrainedTokenizerFast.from_pretrained(args.rare_pieces), args.below)
        counts = count_by_rare_words(ResultsFile(args.results).rows(), set(args.tasks.split(",")), rare)
        if not counts:
            raise SystemExit(f"no rows of {args.tasks} in {args.results}")
        _print_rare(counts)
        return 0
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
