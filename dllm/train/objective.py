"""The masked-diffusion objective: the loss on one batch, the structured masks that replace its random
draw in some rows (name binding, whole-name holes, contiguous spans), and the binding probe."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import LOSSES
from .data import Encoded, make_batch, response_sides


def bind_rows(sides: torch.Tensor, share: float, generator: torch.Generator):
    """The name-binding masks of a batch: (fixed (B, G) bool, rows (B, 1) bool) for
    `diffusion_loss`. A row with names is chosen with probability `share`; its mask covers one side
    of every name (first or last, a fair draw per row) and nothing else."""
    B = sides.shape[0]
    rows = (torch.rand(B, 1, generator=generator) < share) & (sides > 0).any(1, keepdim=True)
    side = 1 + ((torch.rand(B, 1, generator=generator) < 0.5) & (sides == 2).any(1, keepdim=True)).long()
    fixed = sides == side
    return fixed, rows


def hole_rows(sides: torch.Tensor, taken: torch.Tensor, share: float, generator: torch.Generator):
    """The whole-name masks of a batch: (fixed (B, G) bool, rows (B, 1) bool) for `diffusion_loss`.
    Among the rows with names not in `taken` (B, 1), one is chosen with probability `share`; its
    mask covers every token of each name (both sides, a list item's run of `sides` > 0) with one
    probability p ~ U(0, 1) per row, at least one name, and nothing else."""
    B, G = sides.shape
    named = sides > 0
    start = named & ~torch.cat([torch.zeros(B, 1, dtype=torch.bool), named[:, :-1]], dim=1)
    item = start.long().cumsum(1) - 1                             # item index of each name token
    n_items = start.sum(1)                                        # (B,)
    rows = (torch.rand(B, 1, generator=generator) < share) & (n_items > 0)[:, None] & ~taken
    p = torch.rand(B, 1, generator=generator)
    k = max(1, int(n_items.max()))
    hit = torch.rand(B, k, generator=generator) < p               # (B, items)
    forced = (torch.rand(B, generator=generator) * n_items.clamp(min=1)).long().clamp(max=k - 1)
    none = ~(hit & (torch.arange(k) < n_items[:, None])).any(1)
    hit[none, forced[none]] = True
    fixed = named & hit.gather(1, item.clamp(min=0))
    return fixed, rows


def span_rows(B: int, G: int, taken: torch.Tensor, share: float, generator: torch.Generator):
    """The contiguous masks of a batch of B rows and G response columns: (fixed (B, G) bool, rows
    (B, 1) bool) for `diffusion_loss`. Among the rows not in `taken` (B, 1), one is chosen with
    probability `share`; its mask is one run [a, b) of the response with a ~ U{0 .. G-1}, running to
    the end (b = G) in half the rows and else ending at b ~ U{a+1 .. G}: everything left of a (and
    right of b) is shown, as when a decode has written the answer up to a."""
    rows = (torch.rand(B, 1, generator=generator) < share) & ~taken
    a = (torch.rand(B, 1, generator=generator) * G).long()
    to_end = torch.rand(B, 1, generator=generator) < 0.5
    b = a + 1 + (torch.rand(B, 1, generator=generator) * (G - a)).long().clamp(max=G - 1 - a)
    b = torch.where(to_end, torch.full_like(b, G), b)
    col = torch.arange(G)[None, :]
    return (col >= a) & (col < b), rows


def end_weights(target: torch.Tensor, end_id: int | None, end_weight: float) -> torch.Tensor | None:
    """Per-token loss weights (B, C) of `target`: `end_weight` on each `end_id` token and on the
    token just before and just after it, 1 elsewhere; None when nothing is reweighted."""
    if end_weight == 1 or end_id is None:
        return None
    end = target == end_id
    near = end.clone()
    near[:, 1:] |= end[:, :-1]
    near[:, :-1] |= end[:, 1:]
    return torch.where(near, float(end_weight), 1.0)


def mask_distances(hidden: torch.Tensor) -> torch.Tensor:
    """(B, L) long: for each column, the distance to the nearest shown (not `hidden`) column of its
    row, either side (0 on shown columns; L + 1 when the whole row is hidden)."""
    B, L = hidden.shape
    col = torch.arange(L, device=hidden.device).expand(B, L)
    far = torch.full_like(col, 2 * L + 2)
    left = torch.cummax(torch.where(hidden, -far, col), 1).values            # nearest shown at or left
    right = torch.cummin(torch.where(hidden, far + L, col).flip(1), 1).values.flip(1)
    return torch.minimum(col - left, right - col).clamp(max=L + 1)


def smoothing_at(distance: torch.Tensor, per_step: float) -> torch.Tensor:
    """The label-smoothing share of masked tokens `distance` columns from the nearest shown one:
    1 - (1 - per_step)^(distance - 1), so 0 next to a shown token and growing with each step away."""
    return 1 - (1 - per_step) ** (distance.to(torch.float32) - 1).clamp(min=0)


def diffusion_loss(model, x, valid, pos, cols, mask_id: int, eps: float, generator: torch.Generator,
                   loss: str = "llada", t_power: float = 1.0, extra_cols: torch.Tensor | None = None,
                   extra_ok: torch.Tensor | None = None, fixed: torch.Tensor | None = None,
                   fixed_rows: torch.Tensor | None = None, head=None, end_id: int | None = None,
                   end_weight: float = 1.0, distance_smoothing: float = 0.0):
    """Masked-diffusion loss on one batch: response tokens masked w.p. t, cross-entropy on them.

    u ~ U[0, 1) per sequence.
    loss="llada": t = eps + (1 - eps) u (`t_power` ignored), per sequence sum(CE on masked) / t / G,
    the batch mean (LLaDA SFT; an unbiased estimate of the ELBO bound, E = log V for uniform logits).
    loss="masked-mean": t = max(u^t_power, eps), the mean CE over all masked tokens of the batch.

    extra_cols (B, E) with extra_ok (B, E): prompt columns (the in-context answers of the rows
    chosen for it) that are masked with the same t as their row's response and join the loss;
    extra_ok False entries are left alone.

    fixed (B, G) bool with fixed_rows (B, 1) bool: in those rows the response mask is `fixed`
    instead of the random draw (the draws are made for every row all the same). Under the
    "llada" loss such a row's response columns are weighted by 1 / (its masked share of the G
    response columns), the t its mask stands for, not by the t drawn for it; its example columns
    keep the drawn t they were masked at.

    head: None when `model(noisy, cols, position_ids=, key_valid=)` returns logits (B, G', V); else
    `model` returns hidden states (B, G', d) (`hidden_at`) and `head` (`head_logits`) maps only the
    masked ones to logits. Same loss; with a large vocabulary most of the LM head's work and the
    (B, G', V) float logits are skipped (with t = u, half of the columns are unmasked on average).

    end_id, end_weight: the end-of-turn token and its two neighbours count `end_weight` times in
    the loss (`end_weights`), where the answer's length is decided.

    distance_smoothing s > 0: the target of a masked token d columns from the nearest shown token
    of its row (prompt included, `mask_distances`) is smoothed toward the uniform distribution by
    `smoothing_at(d, s)`: the model learns to be sure next to what is written and less sure the
    farther it is, so that a confidence-ordered decode writes outward from the shown tokens."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r} is not one of {', '.join(LOSSES)}")
    B, G = cols.shape
    u = torch.rand(B, 1, generator=generator)
    t = eps + (1 - eps) * u if loss == "llada" else u.pow(t_power).clamp(min=eps)
    masked = torch.rand(B, G, generator=generator) < t
    if fixed is not None:
        masked = torch.where(fixed_rows, fixed, masked)
    if extra_cols is not None:
        ex_masked = (torch.rand(extra_cols.shape, generator=generator) < t) & extra_ok
        cols = torch.cat([extra_cols, cols], dim=1)
        masked = torch.cat([ex_masked, masked], dim=1)
    target = x.gather(1, cols)
    noisy = x.clone()
    noisy.scatter_(1, cols, torch.where(masked, torch.full_like(target, mask_id), target))
    out = model(noisy, cols, position_ids=pos, key_valid=valid)          # (B, G', V) or (B, G', d)
    smooth = None
    if distance_smoothing > 0:
        distance = mask_distances((noisy == mask_id) & valid).gather(1, cols)
        smooth = smoothing_at(distance, distance_smoothing)
    if head is None:
        ce = _token_loss(out.float(), target, smooth)                                   # (B, G')
    else:
        picked = _token_loss(head(out[masked]).float(), target[masked], None if smooth is None else smooth[masked])
        ce = torch.zeros(masked.shape, dtype=picked.dtype, device=picked.device).masked_scatter(masked, picked)
    weight = masked.to(ce.dtype)
    extra = end_weights(target, end_id, end_weight)
    if extra is not None:
        weight = weight * extra
    if loss == "llada":
        return ((ce * weight / _column_t(t, G, fixed, fixed_rows, extra_cols)).sum(1) / G).mean()
    return (ce * weight).sum() / weight.sum().clamp(min=1)


def _column_t(t: torch.Tensor, G: int, fixed, fixed_rows, extra_cols) -> torch.Tensor:
    """(B, 1) or (B, E + G): the mask ratio each loss column was masked at under the "llada" loss:
    the row's drawn t, but for a response under a fixed mask its masked share of the G columns
    (the prompt's example columns keep the drawn t they were masked at)."""
    if fixed is None:
        return t
    response_t = torch.where(fixed_rows, fixed.sum(1, keepdim=True).clamp(min=1) / G, t)
    if extra_cols is None:
        return response_t
    return torch.cat([t.expand(-1, extra_cols.shape[1]), response_t.expand(-1, G)], dim=1)


def _token_loss(logits: torch.Tensor, target: torch.Tensor, smooth: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy of `logits` (..., V) against `target` (...), each token's target smoothed toward
    the uniform distribution by `smooth` (...) when given."""
    ce = F.cross_entropy(logits.movedim(-1, 1) if logits.dim() > 2 else logits, target, reduction="none")
    if smooth is None:
        return ce
    uniform = torch.logsumexp(logits, -1) - logits.mean(-1)              # cross-entropy against uniform
    return (1 - smooth) * ce + smooth * uniform


def binding_accuracy(model, mask_id: int, pad_id: int, examples: list[Encoded]) -> float:
    """Content lookup: the share of second-side tokens (last names, b's) predicted exactly in one
    forward with every one of them masked and everything else shown."""
    x, valid, pos, cols = make_batch(examples, pad_id)
    sides = response_sides(examples)
    target = x.gather(1, cols)
    hide = sides == 2
    noisy = x.clone()
    noisy.scatter_(1, cols, torch.where(hide, torch.full_like(target, mask_id), target))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(noisy, cols, position_ids=pos, key_valid=valid)
    model.train(was_training)
    return float(((logits.argmax(-1) == target) & hide).sum() / hide.sum().clamp(min=1))
