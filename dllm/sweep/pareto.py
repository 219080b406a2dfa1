"""The Pareto front of accuracy against speed, and the best configuration per accuracy level."""
from __future__ import annotations

import math
from typing import Iterable, Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point dominates, both coordinates maximised: j dominates
    i when x_j >= x_i and y_j >= y_i with at least one strict. Equal points are all kept. Returned
    in increasing x (then increasing index). Coordinates must be finite numbers."""
    for i, (x, y) in enumerate(points):
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"pareto_front: point {i} = ({x!r}, {y!r}) is not finite")
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], i))
    front: list[int] = []
    best_right = -math.inf          # the best y among points with a strictly larger x
    k = 0
    while k < len(order):
        x = points[order[k]][0]
        group = []
        while k < len(order) and points[order[k]][0] == x:
            group.append(order[k])
            k += 1
        top = max(points[i][1] for i in group)
        if top > best_right:
            front += [i for i in group if points[i][1] == top]
        best_right = max(best_right, top)
    return sorted(front, key=lambda i: (points[i][0], i))


def best_per_level(summaries: list[dict], levels: Iterable[float]) -> list[tuple[float, dict | None]]:
    """For each level X: the configuration with the most tokens/forward whose average accuracy is
    >= X (ties: higher average, then more tokens/s), or None."""
    out = []
    for x in levels:
        ok = [s for s in summaries if s.get("average") is not None and s["average"] >= x]
        best = max(ok, key=lambda s: (s["tokens_per_forward"], s["average"], s.get("tokens_per_second") or 0.0),
                   default=None)
        out.append((x, best))
    return out
