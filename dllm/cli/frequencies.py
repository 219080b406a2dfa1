"""`dllm token-frequencies`: count a reference corpus with a model's tokenizer into the token
frequency table PC-Sampler's calibrated confidence reads (`dllm.token_frequencies`)."""
from __future__ import annotations

import itertools
import sys

from dllm import token_frequencies
from dllm.eval import generators
from dllm.eval.names import DEFAULT_SOURCE, NAME_SOURCES
from dllm.eval.tasks import messages, select_tasks
from dllm.models.loading import detect_family, load_tokenizer, read_config, resolve_checkpoint
from dllm.train.data import answer_text

from .options import add_model_option

DEFAULT_SHARD = 7    # a generators' train-split shard the shipped recipe does not train on


def add_parser(sub) -> None:
    p = sub.add_parser("token-frequencies",
                       help="count a corpus with a model's tokenizer into a token frequency table (pc_sampler)")
    add_model_option(p)
    p.add_argument("--out", required=True, help="table to write (.json, the layout PC-Sampler's corpus files use)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", nargs="+", metavar="FILE",
                     help="corpus files: .jsonl or .json records (see --keys) or plain text, one text per line")
    src.add_argument("--tasks", help="generated ParallelBench tasks (ids, patterns or groups, comma-separated): each "
                                     "train-split record's prompt turns and answer")
    p.add_argument("--keys", default="",
                   help="comma-separated record fields to count (default: every string field of a record)")
    p.add_argument("--samples-per-task", type=int, default=200, help="records per generated task (default 200)")
    p.add_argument("--shard", type=int, default=DEFAULT_SHARD,
                   help=f"generators' train-split shard, 0..999 (default {DEFAULT_SHARD})")
    p.add_argument("--names", default=DEFAULT_SOURCE, choices=NAME_SOURCES, help="generated Waiting Line people")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def task_texts(tasks: list[str], samples_per_task: int, shard: int, names: str):
    """Each generated train-split record's turns (in-context examples and question) and its answer,
    joined by spaces."""
    for task in tasks:
        for record in generators.make_records(task, split="train", num_samples=samples_per_task, shard=shard,
                                              names=names):
            turns = [turn["content"] for turn in messages(task, record)]
            yield " ".join([*turns, answer_text(record)])


def _texts(args) -> tuple[object, int | None, dict]:
    """The texts to count, how many (when known) and where they came from."""
    if args.data:
        keys = tuple(k.strip() for k in args.keys.split(",") if k.strip())
        texts = itertools.chain.from_iterable(token_frequencies.corpus_texts(f, keys) for f in args.data)
        return texts, None, {"sources": list(args.data), "keys": list(keys)}
    if args.samples_per_task < 1:
        raise ValueError(f"--samples-per-task must be >= 1, got {args.samples_per_task}")
    if not 0 <= args.shard <= 999:
        raise ValueError(f"--shard must lie in 0..999, got {args.shard}")
    tasks = select_tasks(args.tasks, generators.generator_tasks())
    source = {"tasks": tasks, "samples_per_task": args.samples_per_task, "shard": args.shard, "names": args.names}
    return task_texts(tasks, args.samples_per_task, args.shard, args.names), len(tasks) * args.samples_per_task, source


def run(args) -> int:
    try:
        folder = resolve_checkpoint(args.model)
        cfg, raw = read_config(folder)
        tokenizer = load_tokenizer(folder, detect_family(raw))
        texts, total, source = _texts(args)
        table = token_frequencies.count(tokenizer, texts, progress=not args.no_progress, total=total)
        table.probabilities(cfg.vocab_size)          # every counted id fits the model's vocabulary
        table.metadata.update(tokenizer=args.model or folder.name, vocab_size=cfg.vocab_size, **source)
        path = table.save(args.out)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"token frequencies written to {path}: {table.total} tokens of {table.metadata['texts']} texts, "
          f"{len(table.counts)} distinct ids")
    return 0
