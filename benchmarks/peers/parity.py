"""The tally of a parity run (`dream_parity.py`, `dinfer_parity.py`, `dparallel_parity.py`): dllm's
and a peer's results, case by case; and the options of the runs whose two sides share one process."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable


def compare(cases: list[dict], ours: list[dict], theirs: list[dict], group: Callable[[dict], str],
            peer: str = "peer") -> dict:
    """Per group of cases (`group(case)`): cases, identical tokens, equal forwards; prints each
    case that differs with its first differing position."""
    counts: dict[str, list[int]] = {}
    for case, a, b in zip(cases, ours, theirs):
        tally = counts.setdefault(group(case), [0, 0, 0])
        tally[0] += 1
        tally[1] += a["tokens"] == b["tokens"]
        tally[2] += a["forwards"] == b["forwards"]
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
            print(f"differs: {json.dumps(case)} first differing position {first}, forwards dllm {a['forwards']} "
                  f"{peer} {b['forwards']}")
    for key, (n, same, forwards) in counts.items():
        print(f"{key}: {n} cases, {same} identical tokens, {forwards} equal forwards")
    return counts


def in_process_parser(description: str, checkout: str, checkout_help: str, modes: tuple[str, ...]):
    """Options of a parity run with both sides in this process: the peer's checkout (`--<checkout>`),
    cases per model and mode, the modes, the seed and the models' dtype."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(f"--{checkout}", type=Path, required=True, help=checkout_help)
    p.add_argument("--cases", type=int, default=8, help="cases per model and mode")
    p.add_argument("--modes", default=",".join(modes), help=f"comma list of {', '.join(modes)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's dtype")
    return p


def parse_in_process(argv, description: str, checkout: str, checkout_help: str, modes: tuple[str, ...],
                     float32_modes: tuple[str, ...] = (), add_options: Callable | None = None):
    """(args, chosen modes) of a parity run with both sides in this process (`in_process_parser`,
    plus what `add_options(parser)` adds); the parser's error names a mode that is not one of
    `modes`, and a `float32_modes` one (run on the written-out reference transformer) asked for in
    another dtype. Puts the repository root on sys.path for `tests.reference`."""
    parser = in_process_parser(description, checkout, checkout_help, modes)
    if add_options is not None:
        add_options(parser)
    args = parser.parse_args(argv)
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not chosen or any(m not in modes for m in chosen):
        parser.error(f"--modes {args.modes!r}: give a comma list of {', '.join(modes)}")
    reference = [m for m in chosen if m in float32_modes]
    if reference and args.dtype != "float32":
        parser.error(f"--modes {', '.join(reference)} run the written-out reference transformer on the peer side: "
                     f"float32 only")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    return args, chosen


# Tiny random models of the in-process parity runs: near-uniform and peaked weights, two seeds.
TINY_MODELS = {"std0.3": dict(init_std=0.3), "std1": dict(init_std=1.0), "std1-seed3": dict(init_std=1.0, seed=3)}


def tiny_models(families: tuple[str, ...], dtype: str) -> dict:
    """(name, family) -> the `<family>-tiny` dllm model of each TINY_MODELS setting, in `dtype`."""
    import torch
    import dllm
    return {(name, family): dllm.build_model(dllm.ModelConfig.from_name(f"{family}-tiny"), dtype=getattr(torch, dtype),
                                             seed=kw.get("seed", 0), init_std=kw["init_std"])
            for name, kw in TINY_MODELS.items() for family in families}


def exit_code(cases: list[dict], ours: list[dict], theirs: list[dict], peer: str) -> int:
    """Tally the cases per model and mode (`compare`); 0 when every case matched in tokens and forwards."""
    counts = compare(cases, ours, theirs, lambda case: f"{case['model']} {case['mode']}", peer=peer)
    return 0 if all(n == same == forwards for n, same, forwards in counts.values()) else 1
