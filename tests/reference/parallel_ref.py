"""Plain re-statements of the published parallel-unmasking rules, used as oracles for dllm's
samplers (docs/samplers.md §4-§9).

Each function decides ONE step for ONE row, on Python lists, in the order the publication states
the rule (loops, no tensors), so that it shares no code path with the vectorised samplers:

* :func:`threshold_ref`: Fast-dLLM threshold (paper Alg. 1 line 8).
* :func:`factor_ref`: Fast-dLLM factor rule, transcribed from the control flow of the reference
  `get_transfer_index_dynamic` (break at the first failing rank, then the `top_i += 1` quirk).
* :func:`localleap_ref`: LocalLeap anchors and relaxed radius.
* :func:`eb_ref`: EB-Sampler entropy bound.
* :func:`adablock_block_length_ref`: AdaBlock's block length at a block opening.
* :func:`prophet_fill_ref`: Prophet's early-commit test.

Inputs are the candidates of one row: confidences c (the probability of the candidate token),
their absolute columns, entropies, etc. Returned commit sets hold candidate indices (positions
in the input lists). Ties go to the LOWER column, the convention dllm fixes (docs/samplers.md §Ties).
"""
from __future__ import annotations

import math


def _rank_order(keys: list[float], cols: list[int]) -> list[int]:
    """Candidate indices by key descending, ties by column ascending."""
    return sorted(range(len(keys)), key=lambda i: (-keys[i], cols[i]))


def threshold_ref(conf: list[float], cols: list[int], tau: float) -> set[int]:
    """Commit the most confident candidate, and every other one with c >= tau."""
    if not conf:
        return set()
    order = _rank_order(conf, cols)
    chosen = {order[0]}
    for i in order[1:]:
        if conf[i] >= tau:
            chosen.add(i)
    return chosen


def factor_ref(conf: list[float], cols: list[int], f: float, last_rank_quirk: bool = True) -> set[int]:
    """Sorted c_(1) >= ... >= c_(n); thresholds 1 - f/(n+1) for ranks n = 1..N, the first forced;
    stop at the first failing rank; the reference then adds one when it stopped at index 0 or at
    the last index (so a failure at the last rank still commits everything)."""
    n_tok = len(conf)
    if n_tok == 0:
        return set()
    order = _rank_order(conf, cols)
    threshs = [1 - f / (n + 1) for n in range(1, n_tok + 1)]
    threshs[0] = -1
    top_i = 0
    for top_i in range(n_tok):
        if conf[order[top_i]] < threshs[top_i]:
            break
    if last_rank_quirk:
        if top_i == 0 or top_i == n_tok - 1:
            top_i += 1
    else:
        failed = any(conf[order[r]] < threshs[r] for r in range(n_tok))
        if not failed:
            top_i = n_tok
        top_i = max(top_i, 1)
    return set(order[:top_i])


def localleap_ref(conf: list[float], cols: list[int], kappa: float, tau: float | None, radius: int) -> set[int]:
    """Rank 1 always; anchors = c >= kappa; with tau and an anchor, a candidate commits iff
    c >= tau within `radius` columns of some anchor, c >= kappa elsewhere; else threshold kappa."""
    if not conf:
        return set()
    order = _rank_order(conf, cols)
    anchors = [cols[i] for i in range(len(conf)) if conf[i] >= kappa]
    chosen = {order[0]}
    for i in range(len(conf)):
        if tau is not None and anchors:
            near = any(abs(cols[i] - a) <= radius for a in anchors)
            if conf[i] >= (tau if near else kappa):
                chosen.add(i)
        elif conf[i] >= kappa:
            chosen.add(i)
    return chosen


def eb_ref(entropy_bits: list[float], keys: list[float], cols: list[int], gamma: float) -> set[int]:
    """Sort by `keys` descending (for the entropy order pass keys = -H); grow the set while
    sum(H) - max(H) <= gamma; at least one."""
    if not entropy_bits:
        return set()
    order = _rank_order(keys, cols)
    chosen: list[int] = []
    total, biggest = 0.0, -math.inf
    for i in order:
        h = entropy_bits[i]
        if (total + h) - max(biggest, h) > gamma:
            break
        chosen.append(i)
        total, biggest = total + h, max(biggest, h)
    return set(chosen or order[:1])


def adablock_block_length_ref(tokens: list[int], conf: list[float], cols: list[int], start: int, remaining: int,
                              window: int, delimiters: set[int], tau_d: float, base_block: int) -> int:
    """AdaBlock's length for the block opening at column `start` (docs/samplers.md §6, steps 1-3)."""
    win = min(window, remaining)
    best = None
    for i in range(len(tokens)):
        if start <= cols[i] < start + win and tokens[i] in delimiters:
            if best is None or conf[i] > conf[best] or (conf[i] == conf[best] and cols[i] < cols[best]):
                best = i
    if best is not None and conf[best] >= tau_d:
        return cols[best] - start + 1
    return min(base_block, remaining)


def prophet_fill_ref(gaps_in_answer: list[float], step: int, total_steps: int,
                     thresholds=(7.5, 5.0, 2.5), switches=(0.33, 0.67)) -> bool:
    """Prophet's test: mean top-2 logit gap over the answer region >= the staged threshold of the
    progress step / total_steps, `step` counted from 1 (the published loop counts a step before it
    tests)."""
    progress = step / total_steps
    if progress < switches[0]:
        tau = thresholds[0]
    elif progress < switches[1]:
        tau = thresholds[1]
    else:
        tau = thresholds[2]
    return sum(gaps_in_answer) / len(gaps_in_answer) >= tau
