"""Where a confidence-ordered decode writes: each committed token's neighbours at the time.

    python benchmarks/decode_order.py --model M --names open --task waiting_line/copy --limit 24

Decodes the first `--limit` samples of a generated task one token per step with `trace=True` (the
step at which each position was committed) and sorts every committed token but the end padding by
which of its two neighbours were already written: the left only, the right only, both, or none
(the prompt counts as written, left of the first column; nothing lies right of the last). A model
that finds each token from the one before it writes nearly everything "left"; one that places
tokens by counting positions writes many "none".
"""
from __future__ import annotations

import argparse
import sys

import torch

import dllm
from dllm.cli.options import positive_int
from dllm.eval import runner
from dllm.eval.names import NAME_SOURCES
from dllm.eval.tasks import encode_messages

KINDS = ("left", "right", "both", "none")


def neighbour_kinds(trace: list[int], skip: list[bool]) -> dict[str, int]:
    """Counts of KINDS over the positions of one decode not in `skip`: position j is "left" when
    j - 1 (or the prompt, for j = 0) was committed at an earlier step and j + 1 was not, and so on."""
    counts = dict.fromkeys(KINDS, 0)
    last = len(trace) - 1
    for j, step in enumerate(trace):
        if skip[j]:
            continue
        left = j == 0 or trace[j - 1] < step
        right = j < last and trace[j + 1] < step
        counts["both" if left and right else "left" if left else "right" if right else "none"] += 1
    return counts


def decode_counts(model_dir: str, task: str, limit: int, names: str, gen_length: int, sampler: str,
                  batch_size: int) -> dict[str, int]:
    """neighbour_kinds summed over the first `limit` samples of `task`, end padding skipped."""
    cfg = runner.config_from_dict(dict(model=model_dir, tasks=task, limit=limit, generated=True, names=names,
                                       sampler=sampler, tokens_per_step=1, gen_length=gen_length))
    samples = runner.load_dataset(cfg).samples[task]
    model, tok = dllm.load(model_dir, dtype="float32", device="cpu")
    eos = model.config.eos_token_id
    prompts = [encode_messages(tok, s.messages()) for s in samples]
    total = dict.fromkeys(KINDS, 0)
    for i in range(0, len(prompts), batch_size):
        out = dllm.generate(model, tok, prompts[i:i + batch_size], gen_length=gen_length, block_length=gen_length,
                            steps=gen_length, sampler=sampler, trace=True)
        for ids, trace in zip(out.generated.tolist(), out.trace.tolist()):
            for k, n in neighbour_kinds(trace, [t == eos for t in ids]).items():
                total[k] += n
    return total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--task", default="waiting_line/copy")
    p.add_argument("--limit", type=positive_int, default=24)
    p.add_argument("--names", default="open", choices=NAME_SOURCES)
    p.add_argument("--gen-length", type=positive_int, default=64)
    p.add_argument("--sampler", default="low_confidence")
    p.add_argument("--batch-size", type=positive_int, default=8)
    args = p.parse_args(argv)
    try:
        with torch.no_grad():
            counts = decode_counts(args.model, args.task, args.limit, args.names, args.gen_length, args.sampler,
                                   args.batch_size)
    except (ValueError, FileNotFoundError) as err:   # a task, sampler or model folder named wrongly
        p.error(str(err))
    n = sum(counts.values())
    print(f"| model | task | tokens | {' | '.join(KINDS)} |\n|---|---|---|{'---|' * len(KINDS)}")
    shares = " | ".join(f"{counts[k] / max(n, 1):.0%}" for k in KINDS)
    print(f"| {args.model} | {args.task} | {n} | {shares} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
