"""The tally of a parity run (`dream_parity.py`, `dinfer_parity.py`, `dparallel_parity.py`): dllm's
and a peer's results, case by case; and the options of the runs whose two sides share one process."""
from __future__ import annotations

import argparse
import json
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


def chosen_modes(parser: argparse.ArgumentParser, text: str, modes: tuple[str, ...]) -> list[str]:
    """The modes of a `--modes` comma list; the parser's error names any other."""
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    if not chosen or any(m not in modes for m in chosen):
        parser.error(f"--modes {text!r}: give a comma list of {', '.join(modes)}")
    return chosen


def exit_code(cases: list[dict], ours: list[dict], theirs: list[dict], peer: str) -> int:
    """Tally the cases per model and mode (`compare`); 0 when every case matched in tokens and forwards."""
    counts = compare(cases, ours, theirs, lambda case: f"{case['model']} {case['mode']}", peer=peer)
    return 0 if all(n == same == forwards for n, same, forwards in counts.values()) else 1
