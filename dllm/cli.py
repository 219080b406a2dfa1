"""The `dllm` command: `dllm generate`, `dllm samplers`."""
from __future__ import annotations

import argparse
import ast
import json
import sys

MASK_GLYPH = "\u2591"  # light shade: a still-masked position in --show


def parse_kv(items: list[str] | None, what: str) -> dict:
    """`key=value` pairs; values are read as Python literals (numbers, True/False/None, lists)
    and fall back to strings."""
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
            out[key] = {"true": True, "false": False, "none": None, "null": None}.get(value.lower(), value)
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
        model, tokenizer = dllm.load(args.model, dtype=args.dtype, device=device, attention=args.attention)
        prompts = args.prompt
        on_step = _show(tokenizer, sys.stdout) if args.show else None
        out = dllm.generate(model, tokenizer, prompts, cfg, on_step=on_step)
    except (ValueError, FileNotFoundError, FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for text in out.texts:
        print(text)
    generated = sum(out.answer_lengths)
    print(f"[{out.forwards} forwards, {out.mean_tokens_per_forward:.2f} tokens/forward, "
          f"{generated / out.seconds if out.seconds else float('inf'):.1f} tokens/s, {out.seconds:.2f} s, "
          f"sampler {out.sampler}{' (forward cap hit)' if any(out.hit_cap) else ''}]", file=sys.stderr)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm", description="Run masked-diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from one or more prompts")
    g.add_argument("prompt", nargs="+", help="prompt text (several prompts decode as one batch)")
    g.add_argument("--model", required=True, help="checkpoint folder or hub id (e.g. GSAI-ML/LLaDA-8B-Instruct)")
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
    g.add_argument("--attention", default="sdpa", help="attention backend: eager | sdpa")
    g.add_argument("--show", action="store_true", help="redraw the canvas in the terminal as tokens are unmasked")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("samplers", help="list the registered samplers and their arguments")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_samplers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
