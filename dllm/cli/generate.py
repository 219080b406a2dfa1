"""`dllm generate`: decode prompts and print the answers, with an optional live canvas."""
from __future__ import annotations

import argparse
import json
import sys

import dllm
from dllm.decode import check_texts

from .options import (add_model_option, add_request_options, add_runtime_options, check_before_load,
                      generation_config)

MASK_GLYPH = "\u2591"  # light shade: a still-masked position in --show


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text from one or more prompts")
    g.add_argument("prompt", nargs="+", help="prompt text (several prompts decode as one batch)")
    add_model_option(g)
    add_request_options(g)
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="apply the chat template (default: when the tokenizer has one)")
    add_runtime_options(g)
    g.add_argument("--show", action="store_true", help="redraw the canvas in the terminal as tokens are unmasked")
    g.add_argument("--format", choices=("text", "jsonl"), default="text",
                   help="text: each answer on its own line (default); jsonl: one JSON object per prompt with its "
                        "answer, forwards, answer length and whether it hit the forward cap")
    g.set_defaults(func=run)


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


def _summary(out) -> str:
    rate = sum(out.answer_lengths) / out.seconds if out.seconds else float("inf")
    cache = "" if out.cache == "none" else ", cache " + out.cache
    cap = " (forward cap hit)" if any(out.hit_cap) else ""
    return (f"[{out.forwards} forwards, {out.mean_tokens_per_forward:.2f} tokens/forward, {rate:.1f} tokens/s, "
            f"{out.seconds:.2f} s, sampler {out.sampler}{cache}{cap}]")


def run(args) -> int:
    try:
        request = generation_config(args)
        check_texts(args.prompt)
        check_before_load(request)
        model, tokenizer = dllm.load(args.model, dtype=args.dtype, device=args.device, attention=args.attention,
                                     cuda_graphs=args.cuda_graphs, compile=args.compile)
        on_step = _show(tokenizer, sys.stdout) if args.show else None
        out = dllm.generate(model, tokenizer, args.prompt, request, on_step=on_step)
    except (ValueError, FileNotFoundError, FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for i, text in enumerate(out.texts):
        print(text if args.format == "text" else json.dumps(
            {"prompt": args.prompt[i], "text": text, "nfe": out.nfe[i], "answer_length": out.answer_lengths[i],
             "hit_cap": out.hit_cap[i]}, ensure_ascii=False))
    print(_summary(out), file=sys.stderr)
    return 0
