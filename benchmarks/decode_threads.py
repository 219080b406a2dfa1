"""Decoding in a second thread while the first one's OpenMP team lives, on CPU.

    python benchmarks/decode_threads.py --threads 2 --prompts 8 --cache dual --block-length 32

Decodes the same prompts alone with `dllm.generate` (the shipped model by default), each round
timed: in the main thread, in a new thread (the main thread's OpenMP team alive beside it), in the
main thread again, and in a new thread of a process whose main thread never ran a parallel region
(a child process, so that only one team exists there). torch's OpenMP runtime keeps one team of
worker threads per thread that runs parallel regions; this shows what a second team costs, the
reason `dllm.serve.serve` steps its batches in the main thread. Prints seconds per round and
each round's ratio to the first; every round must give the same texts.
"""
from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import threading
import time

import torch

import dllm
from dllm.cache import available_policies
from dllm.cli.options import positive_int
from dllm.eval import generators
from dllm.eval.tasks import encode_messages, messages


def task_prompt_ids(tokenizer, task: str, count: int) -> list[list[int]]:
    return [encode_messages(tokenizer, messages(task, r)) for r in generators.make_records(task, num_samples=count)]


def timed_round(model, tokenizer, prompts, config) -> tuple[float, list[str]]:
    start = time.perf_counter()
    texts = [dllm.generate(model, tokenizer, [p], config).texts[0] for p in prompts]
    return time.perf_counter() - start, texts


def in_new_thread(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def load_and_config(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = dllm.load(args.model, dtype="float32")
    config = dllm.GenerationConfig(gen_length=args.gen_length, block_length=args.block_length, cache=args.cache,
                                   seed=0)
    return model, tokenizer, task_prompt_ids(tokenizer, args.task, args.prompts), config


def fresh_process_round(args, out) -> None:
    """In a child: load (no parallel region in the main thread), then a warm-up and one timed round
    in a new thread."""
    model, tokenizer, prompts, config = load_and_config(args)

    def warm_then_timed():
        timed_round(model, tokenizer, prompts[:1], config)
        return timed_round(model, tokenizer, prompts, config)

    out.put(in_new_thread(warm_then_timed))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder or name (default: the shipped model)")
    p.add_argument("--task", default="waiting_line/copy")
    p.add_argument("--prompts", type=positive_int, default=8)
    p.add_argument("--gen-length", type=positive_int, default=64)
    p.add_argument("--block-length", type=positive_int, default=None, help="default: min(32, --gen-length)")
    p.add_argument("--cache", default="dual", choices=available_policies())
    p.add_argument("--threads", type=positive_int, default=None)
    args = p.parse_args(argv)
    if args.block_length is None:
        args.block_length = min(32, args.gen_length)
    try:
        model, tokenizer, prompts, config = load_and_config(args)
        timed_round(model, tokenizer, prompts[:1], config)                 # warm up
    except (ValueError, FileNotFoundError) as err:   # settings, a task or a model folder named wrongly
        p.error(str(err))
    rounds = [("main thread", timed_round(model, tokenizer, prompts, config)),
              ("new thread, main thread's team alive", in_new_thread(lambda: timed_round(model, tokenizer, prompts,
                                                                                         config))),
              ("main thread again", timed_round(model, tokenizer, prompts, config))]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=fresh_process_round, args=(args, out))
    child.start()
    while True:   # a child that dies would otherwise leave this process waiting for ever
        try:
            rounds.append(("new thread, no other team (child process)", out.get(timeout=1.0)))
            break
        except queue.Empty:
            if not child.is_alive():
                try:   # what it put just before it ended
                    rounds.append(("new thread, no other team (child process)", out.get(timeout=1.0)))
                    break
                except queue.Empty:
                    raise SystemExit(f"the child process ended (exit code {child.exitcode}) without its "
                                     f"round") from None
    child.join()
    first = rounds[0][1][0]
    print(f"torch threads {torch.get_num_threads()}, {len(prompts)} prompts of {args.task}, cache {args.cache}")
    for name, (seconds, _) in rounds:
        print(f"  {name:50s} {seconds:7.2f} s  {seconds / first:5.2f}x")
    same = all(texts == rounds[0][1][1] for _, (_, texts) in rounds)
    print("same texts in every round:", "yes" if same else "NO")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
