"""Command-line options shared by several `dllm` commands, each defined once with one default,
and what turns them into a request.

Every option added here records, when it is given on the command line, its name in
`args.given` (see `given`): `dllm sweep` lets a grid file's value stand unless the option was
given."""
from __future__ import annotations

import argparse
import ast

from dllm.cache import available_policies
from dllm.config import GenerationConfig
from dllm.decode import with_instances


class Given(argparse.Action):
    """Store the value, and remember that the option was given."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = set(getattr(namespace, "given", set())) | {self.dest}


def _flag(group, *names, help: str) -> None:
    group.add_argument(*names, action=Given, nargs=0, const=True, default=False, help=help)


def positive_int(text: str) -> int:
    """An argparse `type`: an integer >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def given(args: argparse.Namespace) -> set[str]:
    """The destinations of the shared options given on the command line."""
    return set(getattr(args, "given", set()))


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
        if key in out:
            raise SystemExit(f"error: {what} {key!r} is given twice ({item!r}); give each key once")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = {"true": True, "false": False, "null": None}.get(value.lower(), value)
    return out


def add_model_option(p) -> None:
    p.add_argument("--model", action=Given, default=None,
                   help="checkpoint folder, shipped model name or hub id (e.g. GSAI-ML/LLaDA-8B-Instruct); "
                        "default: the shipped llada-pb-tiny")


def add_runtime_options(p) -> None:
    """Where and how the model runs: --dtype, --device, --attention, --cuda-graphs, --compile."""
    g = p.add_argument_group("model runtime")
    g.add_argument("--dtype", action=Given, default="auto", help="auto | float32 | float16 | bfloat16")
    g.add_argument("--device", action=Given, default="auto",
                   help="auto (cuda when available) | cpu | cuda | cuda:N")
    g.add_argument("--attention", action=Given, default="auto",
                   help="attention backend: auto (the fastest measured: sdpa) | sdpa | eager | triton")
    _flag(g, "--cuda-graphs", help="replay the model's forwards as CUDA graphs, one per input layout (CUDA only)")
    _flag(g, "--compile", help="run the model's forwards through torch.compile, one graph per input layout "
                               "(each layout's first forward compiles it)")


def add_sampling_options(p) -> None:
    """--temperature, --seed, --max-forwards, --eos-early-stop."""
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", action=Given, type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", action=Given, type=int, default=0, help="seed of every random draw (default 0)")
    g.add_argument("--max-forwards", action=Given, type=int, default=None,
                   help="hard cap on forwards; remaining masks are then filled (default: max(steps, gen length), steps "
                        "counting for samplers that use them, plus the columns a block-causal model decodes to the "
                        "end of its attention block, plus the forwards a sampler that re-masks or edits tokens may "
                        "add)")
    _flag(g, "--eos-early-stop", help="stop a row once a block it completes holds an EOS or end-of-turn token "
                                      "(its later masks become EOS)")


def add_request_options(p) -> None:
    """The decoding request of `generate` and `bench`: sampler, cache, lengths, schedule,
    guidance and confidence precision, plus the sampling options."""
    g = p.add_argument_group("decoding")
    g.add_argument("--sampler", action=Given, default=None,
                   help="sampler name (see `dllm samplers`); default: the checkpoint's or the family's")
    g.add_argument("--sampler-arg", action="append", metavar="KEY=VALUE", help="sampler argument (repeatable)")
    g.add_argument("--cache", action=Given, default="none",
                   help=f"KV cache policy: {' | '.join(available_policies())} (default none)")
    g.add_argument("--cache-arg", action="append", metavar="KEY=VALUE",
                   help="cache policy argument, e.g. refresh=4, twins=true, guard=0.99 (repeatable)")
    g.add_argument("--suffix-dropout", action="append", metavar="KEY=VALUE",
                   help="DPad's suffix dropout setting, e.g. window=256, sigma=4, scale=2, distribution=uniform, "
                        "keep=64, seed=0 (repeatable; window turns it on)")
    g.add_argument("--gen-length", action=Given, type=int, default=None,
                   help="tokens to generate (default: the checkpoint's max_new_tokens when its generation "
                        "config names one, else 128 for generate; each task's max_tokens for bench)")
    g.add_argument("--block-length", action=Given, type=int, default=None,
                   help="semi-autoregressive block length (default: one block over the generation; a Learn2PD "
                        "filter's blocks; a block-causal model's attention blocks)")
    steps = g.add_mutually_exclusive_group()
    steps.add_argument("--steps", action=Given, type=int, default=None,
                       help="denoising steps of fixed schedules (default: the generation length)")
    steps.add_argument("--tokens-per-step", action=Given, type=int, default=None, help="k: steps = gen length / k")
    g.add_argument("--cfg-scale", action=Given, type=float, default=0.0,
                   help="classifier-free guidance scale (LLaDA; 0 = off)")
    g.add_argument("--score-dtype", action=Given, default="logits", choices=("logits", "float32", "float64"),
                   help="precision of confidences (logits = the model dtype, as LLaDA)")
    add_sampling_options(p)


def add_benchmark_options(p) -> None:
    """What `bench` and `sweep` evaluate on: tasks, data, samples, batch, text-metric backends."""
    g = p.add_argument_group("benchmark")
    g.add_argument("--tasks", action=Given, default=None,
                   help="comma-separated task ids, patterns (puzzle/*) or groups (all, waiting_line, puzzle, text, "
                        "pure); default: the Waiting Line and Puzzle tasks, or every benchmark task in --data-dir")
    g.add_argument("--data-dir", action=Given, default=None,
                   help="folder with the official ParallelBench test files (default: our generators' test split)")
    g.add_argument("--limit", action=Given, type=int, default=None, help="the first N samples of each task")
    g.add_argument("--batch-size", action=Given, type=int, default=8, help="samples decoded together (default 8)")
    g.add_argument("--grammar-server", action=Given, dest="grammar_url", default=None,
                   help="LanguageTool server URL for the Text Writing grammar score (or DLLM_LANGUAGETOOL_URL)")
    g.add_argument("--bertscore-model", action=Given, default=None,
                   help="local roberta-large folder for BERTScore (optional)")


_REQUEST_FIELDS = ("gen_length", "block_length", "steps", "tokens_per_step", "temperature", "cfg_scale", "sampler",
                   "cache", "seed", "max_forwards", "chat", "score_dtype", "eos_early_stop")


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    """The request of the decoding options in `args` (sampler and cache by name, with their
    `--sampler-arg` / `--cache-arg` dicts, and the `--suffix-dropout` settings)."""
    fields = {name: getattr(args, name) for name in _REQUEST_FIELDS if hasattr(args, name)}
    dropout = parse_kv(getattr(args, "suffix_dropout", None), "--suffix-dropout")
    return GenerationConfig(**fields, sampler_kwargs=parse_kv(args.sampler_arg, "--sampler-arg"),
                            cache_kwargs=parse_kv(args.cache_arg, "--cache-arg"), suffix_dropout=dropout or None)


def check_before_load(cfg: GenerationConfig) -> None:
    """The request's names and arguments, and its lengths when `--gen-length` is given, checked
    before the model loads (without it the length is the checkpoint's, known after the load)."""
    with_instances(cfg if cfg.gen_length is None else cfg.for_length())
