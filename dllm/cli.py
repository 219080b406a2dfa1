"""The `dllm` command: `dllm generate`, `dllm bench`, `dllm sweep`, `dllm train`, `dllm train-filter`, `dllm samplers`."""
from __future__ import annotations

import argparse
import ast
import json
import sys

MASK_GLYPH = "\u2591"  # light shade: a still-masked position in --show


def parse_kv(items: list[str] | None, what: str) -> dict:
    """`key=value` pairs; values are read as Python literals (numbers, True/False/None, lists),
    `true`/`false`/`null` in any case, and fall back to strings. Lower-case `none` stays the string
    "none" (as in the sweep's YAML), the value some arguments take literally (learn2pd filter=none)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"error: {what} {item!r} must look like key=value")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if not key:
            raise SystemExit(f"error: {what} {item!r} has an empty key")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = {"true": True, "false": False, "null": None}.get(value.lower(), value)
    return out


def _canvas_text(tokenizer, row: list[int], mask_id: int) -> str:
    parts = []
    for t in row:
        parts.append(MASK_GLYPH if t == mask_id else tokenizer.decode([t], skip_special_tokens=False))
    return "".join(parts)


def _show(tokenizer, stream):
    def on_step(state):
        rows = state.generated().tolist()
        masks = int(state.is_mask[:, state.gen_start:state.gen_end].sum())
        text = "\n\n".join(_canvas_text(tokenizer, r, state.ids.mask) for r in rows)
        stream.write(f"\x1b[H\x1b[2J[step {state.global_step}  masks left {masks}]\n{text}\n")
        stream.flush()
    return on_step


def cmd_generate(args) -> int:
    import dllm
    from dllm.config import GenerationConfig

    from dllm import samplers

    sampler_kwargs = parse_kv(args.sampler_arg, "--sampler-arg")
    cache_kwargs = parse_kv(args.cache_arg, "--cache-arg")
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cfg = GenerationConfig(gen_length=args.gen_length, block_length=args.block_length, steps=args.steps,
                               temperature=args.temperature, cfg_scale=args.cfg_scale, sampler=args.sampler,
                               sampler_kwargs=sampler_kwargs, seed=args.seed, max_forwards=args.max_forwards,
                               chat=args.chat, score_dtype=args.score_dtype)
        if args.sampler is not None:  # a typo must not cost a model load
            samplers.get(args.sampler, **sampler_kwargs)
        from dllm.cache import get_policy
        if get_policy(args.cache, **cache_kwargs).needs_storage and args.cfg_scale > 0:  # before the model load
            raise ValueError(f"--cfg-scale {args.cfg_scale} > 0 is not supported with --cache {args.cache}; use "
                             f"--cache none or --cfg-scale 0")
        model, tokenizer = dllm.load(args.model, dtype=args.dtype, device=device, attention=args.attention,
                                     cuda_graphs=args.cuda_graphs)
        prompts = args.prompt
        on_step = _show(tokenizer, sys.stdout) if args.show else None
        out = dllm.generate(model, tokenizer, prompts, cfg, on_step=on_step, cache=args.cache,
                            cache_kwargs=cache_kwargs)
    except (ValueError, FileNotFoundError, FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for text in out.texts:
        print(text)
    generated = sum(out.answer_lengths)
    print(f"[{out.forwards} forwards, {out.mean_tokens_per_forward:.2f} tokens/forward, "
          f"{generated / out.seconds if out.seconds else float('inf'):.1f} tokens/s, {out.seconds:.2f} s, "
          f"sampler {out.sampler}{'' if out.cache == 'none' else ', cache ' + out.cache}"
          f"{' (forward cap hit)' if any(out.hit_cap) else ''}]", file=sys.stderr)
    return 0


def _levels(text: str) -> tuple[float, ...]:
    try:
        levels = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"error: --pb {text!r} must be comma-separated numbers such as 80,70,60") from None
    if not levels or any(not 0 <= x <= 100 for x in levels):
        raise SystemExit(f"error: --pb {text!r} must list accuracy levels between 0 and 100")
    return levels


def _print_report(rows, levels, run_ids=None) -> None:
    from dllm.eval import report

    summaries = report.summarize(rows)
    for s in summaries:
        if run_ids is None or s.run_id in run_ids:
            print(report.format_run(s) + "\n")
    print(f"PB@X: the largest tokens/forward whose average score is >= X, over the {len(summaries)} run(s) stored")
    print(report.format_leaderboard(report.leaderboard(summaries, levels), levels))


def cmd_bench(args) -> int:
    from dllm.eval import runner

    levels = _levels(args.pb)
    try:
        if args.write_data:
            from dllm.eval import data, generators
            from dllm.eval.tasks import GROUPS, TASKS, select_tasks

            can = [t for t in TASKS if t in set(generators.generator_tasks())]
            chosen = select_tasks(args.tasks, can) if args.tasks else [t for t in can if t in GROUPS["pure"]]
            opts = {k: v for k, v in (("sort_key", args.sort_key), ("index_base", args.index_base))
                    if v != {"sort_key": "full_name", "index_base": 0}[k]}
            recs = {t: generators.make_records(t, split="test", **opts)[:args.limit] for t in chosen}
            folder = data.write_official_layout(args.write_data, recs)
            print(f"wrote {sum(map(len, recs.values()))} records of {len(recs)} task(s) to {folder}")
            return 0
        if args.report:
            if not args.out:
                raise ValueError("--report prints the tables of a results file; give it with --out FILE")
            _print_report(runner.ResultsFile(args.out).rows(), levels)
            return 0
        cfg = runner.BenchConfig(
            model=args.model, tasks=args.tasks, data_dir=args.data_dir, generated=args.generated, limit=args.limit,
            out=args.out, sampler=args.sampler, sampler_args=parse_kv(args.sampler_arg, "--sampler-arg"),
            cache=args.cache, cache_args=parse_kv(args.cache_arg, "--cache-arg"), gen_length=args.gen_length,
            block_length=args.block_length, steps=args.steps, tokens_per_step=args.tokens_per_step,
            temperature=args.temperature, seed=args.seed, max_forwards=args.max_forwards,
            batch_size=args.batch_size, dtype=args.dtype, device=args.device, attention=args.attention,
            cuda_graphs=args.cuda_graphs, grammar_url=args.grammar_server, bertscore_model=args.bertscore_model,
            sort_key=args.sort_key, index_base=args.index_base)
        rows = runner.run_bench(cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, FloatingPointError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not runner.is_main_process():
        return 0
    if not rows:
        print("no samples selected")
        return 0
    stored = runner.ResultsFile(args.out).rows() if args.out else rows
    _print_report(stored, levels, run_ids={rows[0]["run_id"]})
    return 0


def cmd_train(args) -> int:
    from dllm import train

    opts = {k: v for k, v in vars(args).items() if k in train.TRAIN_FIELDS and v is not None}
    try:
        cfg = train.config_from_args(opts)
        folder = train.train(cfg, progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"model written to {folder}")
    return 0


def cmd_train_filter(args) -> int:
    import dllm
    from dllm import filter_train

    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        tasks = filter_train.DEFAULT_TASKS
        if args.tasks:
            from dllm.eval import generators
            from dllm.eval.tasks import select_tasks
            tasks = tuple(select_tasks(args.tasks, generators.generator_tasks()))
        opts = dict(tasks=tasks, samples_per_task=args.samples_per_task, shard=args.shard,
                    block_length=args.block_length, epochs=args.epochs, lr=args.lr, seed=args.seed,
                    batch_size=args.batch_size, accept_thres=args.accept_thres)
        for name in ("samples_per_task", "block_length", "epochs", "batch_size"):
            if opts[name] < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {opts[name]}")
        model, tokenizer = dllm.load(args.model, dtype=args.dtype, device=device)
        path, meta = filter_train.train_filter_for_model(model, tokenizer, args.out, progress=not args.no_progress,
                                                         **opts)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    val, counts = meta["validation"] or {}, meta["counts"]
    print(f"filter written to {path} (+ {path.with_suffix('.json').name}): {counts['records']} records from "
          f"{counts['prompts']} prompts; validation accuracy {val.get('accuracy', float('nan')):.4f} at sigmoid > "
          f"{filter_train.VALIDATION_THRESHOLD}")
    return 0


def cmd_samplers(args) -> int:
    from dllm import samplers

    rows = []
    for name in samplers.available():
        cls = samplers.sampler_class(name)
        rows.append({"name": name, "arguments": {k: v for k, v in samplers.signature(name).items()},
                     "description": cls.describe()})
    if args.json:
        print(json.dumps(rows, default=repr, indent=2))
        return 0
    for r in rows:
        arg_text = ", ".join(f"{k}={v!r}" for k, v in r["arguments"].items()) or "(no arguments)"
        print(f"{r['name']:<16} {r['description']}\n{'':<16} {arg_text}")
    return 0


def cmd_sweep(args) -> int:
    from dllm import sweep

    return sweep.main_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm", description="Run masked-diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from one or more prompts")
    g.add_argument("prompt", nargs="+", help="prompt text (several prompts decode as one batch)")
    g.add_argument("--model", default=None,
                   help="checkpoint folder, shipped model name or hub id (e.g. GSAI-ML/LLaDA-8B-Instruct); "
                        "default: the shipped llada-pb-tiny")
    g.add_argument("--sampler", default=None, help="sampler name (see `dllm samplers`); default: the family's")
    g.add_argument("--sampler-arg", action="append", metavar="KEY=VALUE", help="sampler argument (repeatable)")
    g.add_argument("--gen-length", type=int, default=128)
    g.add_argument("--block-length", type=int, default=None)
    g.add_argument("--steps", type=int, default=None)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--cfg-scale", type=float, default=0.0, help="classifier-free guidance scale (LLaDA; 0 = off)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-forwards", type=int, default=None)
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="apply the chat template (default: when the tokenizer has one)")
    g.add_argument("--dtype", default="auto", help="auto | float32 | float16 | bfloat16")
    g.add_argument("--device", default="auto", help="auto (cuda when available) | cpu | cuda | cuda:N")
    g.add_argument("--score-dtype", default="logits", choices=("logits", "float32", "float64"),
                   help="precision of confidences (logits = the model dtype, as LLaDA)")
    g.add_argument("--attention", default="auto",
                   help="attention backend: auto (the fastest measured: sdpa) | sdpa | eager | triton")
    g.add_argument("--cuda-graphs", action="store_true",
                   help="replay the model's forwards as CUDA graphs, one per input layout (CUDA only)")
    g.add_argument("--show", action="store_true", help="redraw the canvas in the terminal as tokens are unmasked")
    g.add_argument("--cache", default="none",
                   help="KV cache policy: none | prefix | dual | dkv-decode | dkv-greedy (default none)")
    g.add_argument("--cache-arg", action="append", metavar="KEY=VALUE",
                   help="cache policy argument, e.g. refresh=4, twins=true, guard=0.99 (repeatable)")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="run ParallelBench tasks and print per-task scores and PB@X")
    b.add_argument("--model", default=None,
                   help="checkpoint folder, shipped model name or hub id; default: the shipped llada-pb-tiny")
    b.add_argument("--tasks", default=None,
                   help="comma-separated task ids, patterns (puzzle/*) or groups (all, waiting_line, puzzle, text, "
                        "pure); default: the benchmark tasks available")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--data-dir", default=None, help="folder with the official ParallelBench test files")
    src.add_argument("--generated", action="store_true",
                     help="use our seeded generators' held-out test split (Waiting Line and Puzzle tasks); "
                          "the default when no --data-dir is given")
    b.add_argument("--limit", type=int, default=None, help="the first N samples of each task")
    b.add_argument("--out", default=None, help="results JSONL: one row per sample, appended; a rerun resumes")
    b.add_argument("--sampler", default=None, help="sampler name (see `dllm samplers`)")
    b.add_argument("--sampler-arg", action="append", metavar="KEY=VALUE", help="sampler argument (repeatable)")
    b.add_argument("--cache", default="none", help="cache policy name")
    b.add_argument("--cache-arg", action="append", metavar="KEY=VALUE", help="cache policy argument (repeatable)")
    b.add_argument("--gen-length", type=int, default=None, help="default: the task's max_tokens (32/64/128)")
    b.add_argument("--block-length", type=int, default=None, help="default: one block over the generation")
    steps = b.add_mutually_exclusive_group()
    steps.add_argument("--steps", type=int, default=None, help="denoising steps (fixed schedules)")
    steps.add_argument("--tokens-per-step", type=int, default=None, help="k: steps = gen_length / k")
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--max-forwards", type=int, default=None)
    b.add_argument("--batch-size", type=int, default=8, help="samples of one task decoded together")
    b.add_argument("--dtype", default="auto")
    b.add_argument("--device", default="auto")
    b.add_argument("--attention", default="auto", help="auto | sdpa | eager | triton")
    b.add_argument("--cuda-graphs", action="store_true",
                   help="replay the model's forwards as CUDA graphs, one per input layout (CUDA only)")
    b.add_argument("--grammar-server", default=None,
                   help="LanguageTool server URL for the Text Writing grammar score (or DLLM_LANGUAGETOOL_URL)")
    b.add_argument("--bertscore-model", default=None, help="local roberta-large folder for BERTScore (optional)")
    b.add_argument("--sort-key", default="full_name", choices=("full_name", "last_name"),
                   help="generated Sort labels: by the full name as the official files, or by last name as the "
                        "prompt reads")
    b.add_argument("--index-base", type=int, default=0, choices=(0, 1),
                   help="generated *_index positions: 0-based as the official files, or 1-based")
    b.add_argument("--pb", default="80,70,60", help="PB@X levels (default 80,70,60)")
    b.add_argument("--report", action="store_true", help="only print the tables of the runs stored in --out")
    b.add_argument("--write-data", default=None, metavar="DIR",
                   help="write the generated test sets in the official layout to DIR and exit")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=cmd_bench)

    t = sub.add_parser("train", help="masked-diffusion training of a small LLaDA model on generated ParallelBench data")
    from dllm.train import add_train_arguments
    add_train_arguments(t)
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_train)

    f = sub.add_parser("train-filter", help="collect Learn2PD labels with a model and train its acceptance filter")
    f.add_argument("--model", default=None,
                   help="checkpoint folder, shipped model name or hub id; default: the shipped llada-pb-tiny")
    f.add_argument("--out", required=True, help="filter file to write (.safetensors; metadata beside it as .json)")
    f.add_argument("--tasks", default=None,
                   help="comma-separated generated task ids, patterns or groups (default: the Waiting Line and "
                        "Puzzle tasks)")
    f.add_argument("--samples-per-task", type=int, default=40, help="train-split prompts per task (default 40)")
    f.add_argument("--shard", type=int, default=1, help="generators' train-split shard (default 1)")
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
    f.set_defaults(func=cmd_train_filter)

    w = sub.add_parser("sweep", help="run a grid of models x samplers x caches x lengths on ParallelBench; write "
                                     "rows, summaries, Pareto plots, PB@X and a Markdown report")
    from dllm.sweep import add_arguments as add_sweep_arguments
    add_sweep_arguments(w)
    w.set_defaults(func=cmd_sweep)

    s = sub.add_parser("samplers", help="list the registered samplers and their arguments")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_samplers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
