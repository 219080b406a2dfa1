"""`dllm train` (a small LLaDA model on generated ParallelBench data) and `dllm train-filter`
(a Learn2PD acceptance filter for a model)."""
from __future__ import annotations

import sys

import dllm
from dllm import filter_train, train
from dllm.distributed import refuse_several_processes
from dllm.eval import generators
from dllm.eval.names import DEFAULT_SOURCE, NAME_SOURCES
from dllm.eval.tasks import select_tasks

from .options import add_model_option


def add_parsers(sub) -> None:
    t = sub.add_parser("train", help="masked-diffusion training of a small LLaDA model on generated ParallelBench data")
    train.add_train_arguments(t)
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=run_train)

    f = sub.add_parser("train-filter", help="collect Learn2PD labels with a model and train its acceptance filter")
    add_model_option(f)
    f.add_argument("--out", required=True, help="filter file to write (.safetensors; metadata beside it as .json)")
    f.add_argument("--tasks", default=None,
                   help="comma-separated generated task ids, patterns or groups (default: the Waiting Line and "
                        "Puzzle tasks)")
    f.add_argument("--samples-per-task", type=int, default=40, help="train-split prompts per task (default 40)")
    f.add_argument("--shard", type=int, default=filter_train.DEFAULT_SHARD,
                   help="generators' train-split shard (default 3, one the shipped recipe does not train on)")
    f.add_argument("--names", default=DEFAULT_SOURCE, choices=NAME_SOURCES,
                   help="generated Waiting Line people (default open: Faker's names of the train pool; lists: the "
                        "project's word lists)")
    f.add_argument("--block-length", type=int, default=32, help="the filter's block size (default 32)")
    f.add_argument("--epochs", type=int, default=40000, help="full-batch epochs (default 40000)")
    f.add_argument("--lr", type=float, default=0.003, help="AdamW learning rate (default 0.003)")
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--accept-thres", type=float, default=0.96,
                   help="acceptance threshold recorded as the filter's default (default 0.96)")
    f.add_argument("--batch-size", type=int, default=16, help="prompts decoded together while collecting labels")
    f.add_argument("--dtype", default="auto")
    f.add_argument("--device", default="auto")
    f.add_argument("--no-progress", action="store_true")
    f.set_defaults(func=run_train_filter)


def run_train(args) -> int:
    opts = {k: v for k, v in vars(args).items() if k in train.TRAIN_FIELDS and v is not None}
    try:
        unused = [f"--{k.replace('_', '-')}" for k in train.THEN_FIELDS if k != "then_steps" and k in opts]
        if unused and "then_steps" in opts and not train.then_values("then_steps", opts["then_steps"], int):
            raise ValueError(f"{', '.join(unused)} set(s) later phases, and --then-steps gives none")
        cfg = train.config_from_args(opts)
        folder = train.train(cfg, progress=not args.no_progress)
    except (ValueError, OSError) as err:          # OSError: an --out that cannot be a folder
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"model written to {folder}")
    return 0


def _filter_options(args) -> dict:
    tasks = filter_train.DEFAULT_TASKS
    if args.tasks is not None:
        tasks = tuple(select_tasks(args.tasks, generators.generator_tasks()))
    opts = dict(tasks=tasks, samples_per_task=args.samples_per_task, shard=args.shard, names=args.names,
                block_length=args.block_length, epochs=args.epochs, lr=args.lr, seed=args.seed,
                batch_size=args.batch_size, accept_thres=args.accept_thres)
    for name in ("samples_per_task", "block_length", "epochs", "batch_size"):
        if opts[name] < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {opts[name]}")
    return opts


def run_train_filter(args) -> int:
    try:
        refuse_several_processes("train-filter")           # every process would write the same file
        opts = _filter_options(args)
        filter_train.check_filter_path(args.out)          # before the model loads
        model, tokenizer = dllm.load(args.model, dtype=args.dtype, device=args.device)
        path, meta = filter_train.train_filter_for_model(model, tokenizer, args.out, progress=not args.no_progress,
                                                         **opts)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    val, counts = meta["validation"] or {}, meta["counts"]
    accuracy = (f"validation accuracy {val['accuracy']:.4f} at sigmoid > {filter_train.VALIDATION_THRESHOLD}"
                if "accuracy" in val else "no validation records (too few samples to hold some out)")
    print(f"filter written to {path} (+ {path.with_suffix('.json').name}): {counts['records']} records from "
          f"{counts['prompts']} prompts; {accuracy}")
    return 0
