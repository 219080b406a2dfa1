"""Suffix dropout (DPad, arXiv:2508.14148): a forward keeps the canvas up to the end of each row's
active block and only a few of the masked columns after it.

The masks after a row's active block carry nothing but their positions, and attention to the far
ones is weak. DPad drops most of them before the forward: when a row opens a block, each suffix
column at offset d = 0, 1, ... from the block's end is kept or dropped for the whole block. A
dropped column is no key of any forward (and, without a cache, no query either: the forward runs on
the kept columns alone, which keep their rotary positions), so the forward's cost follows the kept
canvas rather than the whole generation length. Only masks are dropped: a written column after the
block, and the columns the step scores (with Dream's shift, the ones before them too), stay.

Distributions (`SuffixDropout`):
- "gaussian" (DPad's distance-decay dropout): offset d < window is kept with probability
  p(d) = scale * phi(sigma * d / (window - 1)), phi the standard normal density (p(0) = 0.80 at
  scale 2), and d >= window never: about scale * window / (2 * sigma) columns of the window.
- "uniform": `keep` of the first `window` suffix columns, chosen uniformly without replacement
  (all of them when fewer remain); keep = window is a plain sliding window of the next `window`.

The draws depend on the settings (`seed` included) and on which of its blocks a row is in (its
n-th), not on the batch or the request's seed: every row with the same settings sees the same pattern at
its n-th block, so a row decodes as it would alone and rows can join a running batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .state import MAX_INTEGER_ARGUMENT, DecodeState, cover_columns, pad_columns_left, plain_number

DISTRIBUTIONS = ("gaussian", "uniform")
COMPACT_MULTIPLE = 16     # a kept canvas is padded to a multiple of this many columns (fewer layouts to compile)


@dataclass(frozen=True)
class SuffixDropout:
    """Settings of DPad's suffix dropout (see the module docstring).

    window: how many suffix columns after the active block may be kept (later ones never are).
    distribution: "gaussian" (default) or "uniform".
    sigma, scale: the gaussian's range and height (DPad's k and scale; 4 and 2 by default, its
        GSM8K settings); unused by "uniform".
    keep: "uniform" only, how many of the window's columns are kept (default: the window).
    seed: the draws' seed (0).
    """

    window: int
    distribution: str = "gaussian"
    sigma: float = 4.0
    scale: float = 2.0
    keep: int | None = None
    seed: int = 0

    def __post_init__(self):
        for name in ("window", "keep", "seed", "sigma", "scale"):
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        if isinstance(self.window, bool) or not isinstance(self.window, int) \
                or not 1 <= self.window <= MAX_INTEGER_ARGUMENT:
            raise ValueError(f"suffix_dropout window must be a positive integer, got {self.window!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"suffix_dropout distribution must be one of {', '.join(DISTRIBUTIONS)}, got "
                             f"{self.distribution!r}")
        for name in ("sigma", "scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"suffix_dropout {name} must be a finite number > 0, got {value!r}")
            object.__setattr__(self, name, float(value))     # 4 and 4.0 are one setting
        if self.keep is not None:
            if self.distribution != "uniform":
                raise ValueError(f"suffix_dropout keep ({self.keep!r}) is for distribution 'uniform'; the gaussian "
                                 f"keeps columns by sigma and scale")
            if isinstance(self.keep, bool) or not isinstance(self.keep, int) or not 0 <= self.keep <= self.window:
                raise ValueError(f"suffix_dropout keep must be an integer in [0, window={self.window}], got "
                                 f"{self.keep!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"suffix_dropout seed must be an integer in [0, 2**63), got {self.seed!r}")

    @classmethod
    def from_value(cls, value) -> "SuffixDropout | None":
        """None, a SuffixDropout, or a dict of its fields (`GenerationConfig.suffix_dropout`)."""
        if value is None or isinstance(value, SuffixDropout):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"suffix_dropout must be None or a dict of its settings (window, distribution, sigma, "
                             f"scale, keep, seed), got {type(value).__name__}")
        if "window" not in value:
            raise ValueError(f"suffix_dropout needs a window (how many columns after the block may be kept), got "
                             f"{value!r}")
        unknown = sorted(set(value) - {"window", "distribution", "sigma", "scale", "keep", "seed"})
        if unknown:
            raise ValueError(f"suffix_dropout has no setting {unknown[0]!r}; its settings are window, distribution, "
                             f"sigma, scale, keep, seed")
        return cls(**value)

    def arguments(self) -> dict:
        """The settings as a plain dict (what `from_value` takes)."""
        out = dict(window=self.window, distribution=self.distribution, seed=self.seed)
        if self.distribution == "gaussian":
            out.update(sigma=self.sigma, scale=self.scale)
        else:
            out["keep"] = self.window if self.keep is None else self.keep
        return out

    def probabilities(self, width: int | None = None) -> torch.Tensor:
        """(width,) float64: the gaussian's keep probability of the first `width` offsets (default
        the window; capped at 1)."""
        width = self.window if width is None else min(width, self.window)
        x = self.sigma * torch.arange(width, dtype=torch.float64) / max(self.window - 1, 1)   # 0 .. sigma
        return (self.scale * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)).clamp(max=1.0)

    def uniforms(self, blocks: int, width: int) -> torch.Tensor:
        """(blocks, width) float64 in [0, 1): the draws of the first `width` offsets, row n for a
        row's n-th block."""
        gen = torch.Generator().manual_seed(self.seed)
        return torch.rand(blocks, width, generator=gen, dtype=torch.float64)

    def kept(self, draws: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
        """The kept offsets (B, W) bool of rows with the draws `draws` (B, W) of the first W offsets
        and `remaining` (B,) suffix columns after their block (at most W of them count)."""
        W = draws.shape[1]
        present = torch.arange(W, device=draws.device)[None, :] < remaining[:, None]
        if self.distribution == "gaussian":
            return present & (draws < self.probabilities(W).to(draws.device))
        keep = self.window if self.keep is None else self.keep
        rank = draws.masked_fill(~present, 2.0).argsort(1).argsort(1)        # present draws first, ascending
        return present & (rank < keep)


class Dropout:
    """A decode's suffix dropout and its per-row state: the kept offsets of each row's block
    (`kept` (B, W)), how many blocks it opened (`blocks` (B,)), and the columns its last forward
    showed (`shown` (B, L)). `begin_blocks` draws when rows open blocks, `visible` gives a step's
    columns, `newly_visible` those a stored K/V may lack; `keep_rows` / `append_rows` follow the
    batch's rows as the policies' do."""

    def __init__(self, settings: SuffixDropout, state: DecodeState):
        self.settings = settings
        device = state.x.device
        # the offsets past the generation are never present; a row opens at most one block per column
        width = min(settings.window, state.gen_length)
        self.draws = settings.uniforms(state.gen_length + 1, width).to(device)
        self.kept = torch.zeros(state.batch_size, width, dtype=torch.bool, device=device)
        self.blocks = torch.zeros(state.batch_size, dtype=torch.long, device=device)
        self.shown = torch.zeros(state.batch_size, state.length, dtype=torch.bool, device=device)

    def begin_blocks(self, state: DecodeState, rows: torch.Tensor, opening: torch.Tensor) -> None:
        """Draw the kept suffix of the rows `rows` (B',) marked `opening` (B',) bool, without a host read."""
        blocks = self.blocks[rows]
        remaining = state.row_end[rows] - state.block_end[rows]
        kept = self.settings.kept(self.draws[blocks.clamp(max=len(self.draws) - 1)], remaining)
        self.kept[rows] = torch.where(opening[:, None], kept, self.kept[rows])
        self.blocks[rows] = blocks + opening.long()

    def visible(self, state: DecodeState, rows: torch.Tensor, score_mask: torch.Tensor,
                sources: torch.Tensor) -> torch.Tensor:
        """(B', L) bool, the columns this step's forward keeps: those before the block's end, the
        kept suffix masks, every written column, and the scored columns and their logit sources
        (`sources`, (B', L) bool); none past a row's end."""
        W = self.kept.shape[1]
        offset = state.columns()[None, :] - state.block_end[rows, None]           # (B', L)
        kept = self.kept[rows].gather(1, offset.clamp(0, W - 1)) & (offset >= 0) & (offset < W)
        keep = (offset < 0) | kept | ~state.is_mask[rows] | score_mask | sources
        return keep & state.in_reach(rows)

    def newly_visible(self, rows: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """(B', L) bool: the `visible` columns the rows' last forward hid (a block that opened, an end
        that moved, a column scored past the window): their stored K/V may be stale or never written."""
        return visible & ~self.shown[rows]

    def show(self, rows: torch.Tensor, visible: torch.Tensor) -> None:
        """Record the columns the rows' forward showed."""
        self.shown[rows] = visible

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep the rows `rows` only (`DecodeState.keep_rows`)."""
        self.kept, self.blocks, self.shown = self.kept[rows], self.blocks[rows], self.shown[rows]

    def append_rows(self, other: "Dropout", left: int, other_left: int) -> None:
        """Append the rows of `other` (the same settings and generation length), this side's columns
        moved `left` to the right and other's `other_left` (`DecodeState.append_rows`)."""
        self.kept = torch.cat([self.kept, other.kept])
        self.blocks = torch.cat([self.blocks, other.blocks])
        self.shown = torch.cat([pad_columns_left(self.shown, left, False), pad_columns_left(other.shown, other_left,
                                                                                            False)])


def compact_width(count: int, width: int) -> int:
    """The columns of a kept canvas of at most `count` kept columns per row: `count` rounded up
    to a multiple of COMPACT_MULTIPLE, at most the canvas `width`."""
    return min(width, -(-count // COMPACT_MULTIPLE) * COMPACT_MULTIPLE)


def compact(visible: torch.Tensor, width: int, x: torch.Tensor, position_ids: torch.Tensor,
            key_valid: torch.Tensor | None, at: torch.Tensor):
    """The kept canvas of a forward without a cache: the visible columns (B', W) bool of the canvas
    `x` (B', W) gathered in order into `width` columns (shorter rows padded with hidden keys).
    Returns its tokens, rotary positions, key mask (B', width), and `at` (B', Q), columns of x
    (all visible), as indices into it."""
    cols, index = cover_columns(visible, at, width)
    valid = torch.arange(width, device=x.device) < visible.sum(1, keepdim=True)
    keys = valid if key_valid is None else key_valid.gather(1, cols) & valid
    return x.gather(1, cols), position_ids.gather(1, cols), keys, index
