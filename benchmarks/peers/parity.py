"""The tally of a parity run (`dream_parity.py`, `dinfer_parity.py`): dllm's and a peer's results,
case by case."""
from __future__ import annotations

import json
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
