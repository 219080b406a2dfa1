"""`dllm samplers`: the registered samplers with their arguments."""
from __future__ import annotations

import json

from dllm import samplers


def add_parser(sub) -> None:
    s = sub.add_parser("samplers", help="list the registered samplers and their arguments")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=run)


def run(args) -> int:
    rows = []
    for name in samplers.available():
        rows.append({"name": name, "arguments": dict(samplers.signature(name)),
                     "description": samplers.sampler_class(name).describe()})
    if args.json:
        print(json.dumps(rows, default=repr, indent=2))
        return 0
    for r in rows:
        arg_text = ", ".join(f"{k}={v!r}" for k, v in r["arguments"].items()) or "(no arguments)"
        print(f"{r['name']:<16} {r['description']}\n{'':<16} {arg_text}")
    return 0
