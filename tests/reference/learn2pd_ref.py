"""Plain re-statements of Learn2PD's published rule (docs/samplers.md §10), used as oracles for
`dllm.samplers.learn2pd` and the loop's canvas truncation.

* :func:`learn2pd_rule_ref`: one step of one row, on Python lists over the canvas columns.
* :func:`learn2pd_generate_ref`: the batch-1 decoding loop with the canvas physically cut, as the
  published loop does (`x = x[:, :cut + 1]`), so every later forward runs on the shorter canvas.

Written from the published rule, step for step; deliberate differences from the published code: top-k ties go
to the lowest column (stable sort) and a top-k larger than the masked count selects only masked
positions (the published `topk` then picks already-decoded columns, which changes nothing).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


def learn2pd_rule_ref(conf: list[float], cand: list[int], masked: list[bool], block: tuple[int, int],
                      gen: tuple[int, int], K: int, filter_fn: Callable[[list[float]], list[float]] | None,
                      thres: float, k: int, eos: int, eotp: bool) -> tuple[set[int], int | None]:
    """One step of one row. conf/cand/masked: per canvas column; block = [s, e) (e - s <= K);
    gen = [gen_start, row_end): the kept generation region. filter_fn maps K float32 confidences to
    K logits (None: no filter). Returns (committed columns, column to cut after or None)."""
    s, e = block
    accepted: list[int] = []
    if filter_fn is not None:
        feats = [conf[s + j] if s + j < e else 0.0 for j in range(K)]
        logits = filter_fn(feats)
        for j in range(e - s):
            c = s + j
            if masked[c] and _sigmoid(logits[j]) > thres:
                accepted.append(c)
    due = [c for c in range(s, e) if masked[c]]
    ranked = sorted(due, key=lambda c: (-conf[c], c))
    commits = set(accepted) | set(ranked[:k])
    cut = None
    if eotp:
        a = [c for c in accepted if cand[c] == eos]
        if a:
            cut = min(a)
        else:
            b = [c for c in range(gen[0], gen[1]) if masked[c] and cand[c] == eos]
            if b:
                cut = sorted(b, key=lambda c: (-conf[c], c))[0]
    return commits, cut


def learn2pd_generate_ref(logits_fn: Callable[[torch.Tensor], torch.Tensor], prompt: list[int], *, gen_length: int,
                          block_length: int, steps: int, filter_module, accept_thres: float, eotp: bool,
                          eos_id: int, mask_id: int) -> tuple[list[int], int]:
    """Batch-1 Learn2PD (+ EoTP) at temperature 0. logits_fn(x (1, L)) -> aligned logits (1, L, V).
    Returns (the final canvas, shorter than prompt + gen_length after a cut; the number of forwards)."""
    P, K = len(prompt), block_length
    x = torch.tensor([prompt + [mask_id] * gen_length])
    n_blocks = gen_length // K
    per_block = steps // n_blocks
    forwards = 0
    for nb in range(n_blocks):
        s, e = P + nb * K, P + (nb + 1) * K
        if s >= x.shape[1]:
            break                                   # blocks past the cut vanish
        n = int((x[0, s:e] == mask_id).sum())
        counts = [n // per_block + (1 if j < n % per_block else 0) for j in range(per_block)]
        i = 0
        while bool((x[0, s:e] == mask_id).any()):
            logits = logits_fn(x)[0]
            forwards += 1
            probs = torch.softmax(logits.float(), dim=-1)
            cand = probs.argmax(-1)
            conf = probs.gather(-1, cand[:, None]).squeeze(-1)
            L = x.shape[1]
            masked = (x[0] == mask_id).tolist()
            fn = None
            if filter_module is not None:
                def fn(feats):
                    with torch.no_grad():
                        return filter_module(torch.tensor([feats], dtype=torch.float32))[0].tolist()
            commits, cut = learn2pd_rule_ref(conf.tolist(), cand.tolist(), masked, (s, min(e, L)), (P, L), K, fn,
                                             accept_thres, counts[min(i, per_block - 1)], eos_id, eotp)
            for c in commits:
                x[0, c] = cand[c]
            if cut is not None:
                x = x[:, :cut + 1]
            i += 1
    return x[0].tolist(), forwards
