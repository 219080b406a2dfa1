"""`dllm serve`: an OpenAI-compatible server over a model (docs/serving.md)."""
from __future__ import annotations

import sys

import dllm

from .options import (add_model_option, add_request_options, add_runtime_options, check_before_load,
                      generation_config)


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_model_option(s)
    add_request_options(s)
    add_runtime_options(s)
    g = s.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    g.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    g.add_argument("--max-batch-rows", type=int, default=32, help="rows decoding at once (default 32)")
    g.add_argument("--max-queue", type=int, default=256, help="requests waiting beyond them; more get 429")
    g.add_argument("--timeout", type=float, default=None, help="seconds a request may take (default: no limit)")
    s.set_defaults(func=run)


def run(args) -> int:
    try:
        from dllm.serve import build_app, check_port, serve
    except ImportError as err:
        print(f"error: dllm serve needs the serve extra (pip install -e \".[serve]\"): {err}", file=sys.stderr)
        return 2
    try:
        check_port(args.port)
        defaults = generation_config(args)
        if "seed" not in getattr(args, "given", set()):   # as OpenAI's API: a request without a seed draws anew
            defaults = defaults.replace(seed=None)
        check_before_load(defaults)
        model, tokenizer = dllm.load(args.model, dtype=args.dtype, device=args.device, attention=args.attention,
                                     cuda_graphs=args.cuda_graphs, compile=args.compile)
        name = args.served_model_name or args.model or model.name_or_path
        app = build_app(model, tokenizer, model_name=name, defaults=defaults, max_batch_rows=args.max_batch_rows,
                        max_queue=args.max_queue, timeout=args.timeout, engine_thread=False)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        serve(app, host=args.host, port=args.port, log_level="info")
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0
