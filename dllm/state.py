"""DecodeState: the canvas of one batched generation and its per-row bookkeeping.

Layout of a row: `[left padding | prompt | generation region]`. Every row shares the padded prompt
length `gen_start`, so the generation region is the same column range `[gen_start, gen_start + G)`
in every row; rotary positions are recounted from each row's first real token, so a row computes
the same thing alone or in a batch (up to the rounding of reductions over a padded width).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_INTEGER_ARGUMENT = 2 ** 31 - 1     # the largest integer argument a sampler or cache policy takes


def plain_number(value):
    """`value` as a Python int or float when it is an integer or real of another type (a NumPy
    scalar); anything else (bools, Python numbers, non-numbers) as it is, for the caller to check."""
    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


@dataclass
class SpecialIds:
    mask: int
    eos: int
    pad: int
    eot: int | None = None
    bos: int | None = None

    @property
    def stop_ids(self) -> list[int]:
        return [self.eos] + ([self.eot] if self.eot is not None and self.eot != self.eos else [])


@dataclass
class Decision:
    """A sampler's answer for one step, over the rows it was given.

    commit:   (B', Q) bool, which of the scored positions to commit.
    tokens:   (B', Q) long, the token to write there (default: the scores' candidate token).
    fill_all: (B',) bool, rows whose every remaining mask is filled now: committed positions with
              `tokens`, the others with the scored candidate (all masked positions must then
              have been scored).
    block_end:(B',) long, a new end column for the rows' active block (AdaBlock); it already
              bounds this step's commits.
    truncate_at: (B',) long, the last column each row keeps (-1: no cut). After this step's
              commits every later column of the row's generation region is thrown away: filled
              with EOS (counted as committed at this step), no longer attended to, left out of
              later forwards, and the row's blocks end at the cut (Learn2PD's end-of-text
              prediction). A cut never reaches into the prompt.
    edit:     (B', Q) bool, scored positions already written whose token is replaced by `tokens`
              (LLaDA2.1's token-to-token editing). Only generated positions of the active block
              change; masks are committed through `commit`, never through `edit`.
    hold:     (B',) bool, rows whose active block stays open for another step though it holds no
              mask (more edits may follow); the sampler bounds how long, the forward cap too.
    remask:   (B', L) bool, written canvas columns masked again after this step's commits (WINO's
              narrow-out, ReMDM's revision steps). Only generated columns of the active block
              change (and the earlier ones for a sampler that `reaches_back`, RCR), and none at
              the forward cap's last step.
    """

    commit: torch.Tensor
    tokens: torch.Tensor | None = None
    fill_all: torch.Tensor | None = None
    block_end: torch.Tensor | None = None
    truncate_at: torch.Tensor | None = None
    edit: torch.Tensor | None = None
    hold: torch.Tensor | None = None
    remask: torch.Tensor | None = None


@dataclass
class DecodeState:
    x: torch.Tensor                 # (B, L) canvas
    gen_start: int                  # first generated column (the padded prompt length)
    gen_length: int                 # G
    block_length: int
    pad_len: torch.Tensor           # (B,) left padding of each row
    ids: SpecialIds
    temperature: float = 0.0
    generator: torch.Generator | None = None
    score_dtype: torch.dtype = torch.float32
    steps: int = 0                  # denoising steps requested (fixed schedules)
    family: str | None = None       # model family ("llada", "dream", ...), for family-specific sampler defaults
    tokenizer: Any = None           # the request's tokenizer, if any (samplers that resolve strings to ids)
    source: str | None = None       # the local checkpoint folder the model came from (files shipped with it)
    vocab_size: int | None = None   # the model's vocabulary (token ids a sampler argument may name)
    block_start: torch.Tensor = None   # (B,) active block, absolute columns [start, end)
    block_end: torch.Tensor = None
    step_in_block: torch.Tensor = None  # (B,) steps spent in the active block
    nfe: torch.Tensor = None           # (B,) forwards each row took part in
    finished: torch.Tensor = None      # (B,) rows with nothing left to do
    commit_step: torch.Tensor = None   # (B, G) step at which each generated position was committed, -1 if not
    row_end: torch.Tensor = None       # (B,) end of each row's canvas: gen_end, or one past a truncation cut
    global_step: int = 0
    extra: dict = field(default_factory=dict)   # sampler-owned state
    padded: bool | None = None         # whether any row is left-padded (None: read from pad_len)
    # Blocks aligned with the model's attention blocks (LLaDA2): counted from each row's first real
    # token, so a row's first block ends at the next multiple of block_length after its prompt.
    aligned_blocks: bool = False
    # The answer's columns, [gen_start, gen_start + answer_length) (None: the whole generation
    # region). A block-causal decode's region runs on to the end of each row's last attention block,
    # as the reference pads its canvas to whole blocks; the columns past the answer are decoded and
    # then dropped (`generated`).
    answer_length: int | None = None       # None: gen_length

    def __post_init__(self):
        B, dev = self.x.shape[0], self.x.device
        if self.answer_length is None:
            self.answer_length = self.gen_length
        if self.padded is None:
            self.padded = bool((self.pad_len > 0).any())
        zeros = lambda: torch.zeros(B, dtype=torch.long, device=dev)  # noqa: E731
        self.block_start = torch.full((B,), self.gen_start, dtype=torch.long, device=dev)
        first = self.block_length
        if self.aligned_blocks:
            prompt_lengths = self.gen_start - self.pad_len.to(dev)
            first = self.block_length - prompt_lengths % self.block_length                # (B,), 1..block_length
        self.block_end = (self.block_start + first).clamp(max=self.gen_end)
        self.step_in_block, self.nfe = zeros(), zeros()
        self.finished = torch.zeros(B, dtype=torch.bool, device=dev)
        self.block_hold = torch.zeros(B, dtype=torch.bool, device=dev)     # Decision.hold of the last step
        self.edits = zeros()                                                # tokens rewritten per row
        self.remasks = zeros()                                              # tokens masked again per row
        self.commit_step = torch.full((B, self.gen_length), -1, dtype=torch.long, device=dev)
        self.row_end = torch.full((B,), self.gen_end, dtype=torch.long, device=dev)
        cols = torch.arange(self.x.shape[1], device=dev)
        self.key_valid = cols[None, :] >= self.pad_len[:, None]                     # (B, L)
        self.position_ids = (cols[None, :] - self.pad_len[:, None]).clamp(min=0)   # (B, L)

    # -- views ---------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.x.shape[0]

    @property
    def length(self) -> int:
        return self.x.shape[1]

    @property
    def gen_end(self) -> int:
        return self.gen_start + self.gen_length

    @property
    def is_mask(self) -> torch.Tensor:
        """(B, L) bool: the masked columns (shared while the canvas is unchanged: do not modify it)."""
        return self.derived("is_mask", (self.x,), lambda: self.x == self.ids.mask)

    def derived(self, name: str, sources: tuple, make):
        """`make()`, made once and returned again while every tensor of `sources` is the same object,
        unmodified since (torch's version counter; inference tensors keep none, so from them it is
        made at every call). A decode step asks for the same masks several times; this computes
        them once. The result is shared: do not modify it in place."""
        if any(t.is_inference() for t in sources):
            return make()
        versions = tuple(t._version for t in sources)
        memo = self.__dict__.setdefault("_derived", {})
        held = memo.get(name)
        if held is not None and held[1] == versions and all(a is b for a, b in zip(held[0], sources)):
            return held[2]
        value = make()
        memo[name] = (sources, versions, value)
        return value

    def columns(self) -> torch.Tensor:
        """(L,) the canvas column indices; one tensor per state (read-only: do not modify it)."""
        cols = self.__dict__.get("_columns")
        if cols is None or cols.shape[0] != self.length or cols.device != self.x.device:
            cols = self.__dict__["_columns"] = torch.arange(self.length, device=self.x.device)
        return cols

    def in_block(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B', L) bool: the columns of each row's active block."""
        rows = self._rows(rows)

        def make():
            cols = self.columns()[None, :]
            return (cols >= self.block_start[rows, None]) & (cols < self.block_end[rows, None])
        return self.derived("in_block", (rows, self.block_start, self.block_end), make)

    def in_generation(self) -> torch.Tensor:
        """(L,) bool: the generation region's columns; one tensor per state (read-only)."""
        key = (self.length, self.gen_start, self.gen_end, self.x.device)
        cached = self.__dict__.get("_in_generation")
        if cached is None or cached[0] != key:
            cols = self.columns()
            cached = self.__dict__["_in_generation"] = (key, (cols >= self.gen_start) & (cols < self.gen_end))
        return cached[1]

    def in_reach(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B', L) bool: the columns before each row's end (`row_end`; a truncation cut ends it)."""
        rows = self._rows(rows)
        return self.derived("in_reach", (rows, self.row_end),
                            lambda: self.columns()[None, :] < self.row_end[rows, None])

    def in_any_reach(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(L,) bool: the columns before the end of some row of `rows` (the longest kept row)."""
        rows = self._rows(rows)
        return self.derived("in_any_reach", (rows, self.row_end), lambda: self.in_reach(rows).any(0))

    def first_column(self) -> torch.Tensor:
        """(L,) bool: column 0 alone (a row that scores nothing reads it)."""
        return self.derived("first_column", (self.columns(),), lambda: self.columns() == 0)

    def writable(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B', L) bool: the generation region's columns before each row's end (`row_end`)."""
        rows = self._rows(rows)
        return self.derived("writable", (rows, self.row_end),
                            lambda: self.in_generation()[None, :] & self.in_reach(rows))

    def to_attention_blocks(self, first: torch.Tensor, end: torch.Tensor, size: int,
                            rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B',) columns `first` and `end` of rows `rows` rounded out to attention blocks of `size`
        columns, counted from each row's first real token: the start of the block holding `first`
        and the end of the one holding column `end - 1`."""
        pad = self.pad_len[self._rows(rows)]
        return (first - pad).clamp(min=0) // size * size + pad, (end - pad + size - 1) // size * size + pad

    def block_first_column(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B',) the first column attending as part of each row's active block: its start, or with
        `aligned_blocks` the start of its attention block (the first block also holds the prompt's
        tail, whose keys then change with the block, and a sampler may move a block's bounds)."""
        rows = self._rows(rows)
        start = self.block_start[rows]
        if not self.aligned_blocks:
            return start
        return self.to_attention_blocks(start, self.block_end[rows], self.block_length, rows)[0]

    def block_end_column(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B',) the end of the columns attending as part of each row's active block: its end, or
        with `aligned_blocks` the end of the attention block holding its last column."""
        rows = self._rows(rows)
        end = self.block_end[rows]
        if not self.aligned_blocks:
            return end
        return self.to_attention_blocks(self.block_start[rows], end, self.block_length, rows)[1]

    def masked_in_generation(self, rows: torch.Tensor) -> torch.Tensor:
        """(B', L) bool: the masked columns of the generation region of rows `rows`."""
        return self.is_mask[rows] & self.in_generation()[None, :]

    def masked_in_block(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        rows = self._rows(rows)
        return self.derived("masked_in_block", (rows, self.x, self.block_start, self.block_end),
                            lambda: self.is_mask[rows] & self.in_block(rows))

    @property
    def answer_end(self) -> int:
        return self.gen_start + self.answer_length

    def generated(self) -> torch.Tensor:
        """(B, answer_length) the answer's columns."""
        return self.x[:, self.gen_start:self.answer_end]

    def truncate(self, rows: torch.Tensor, cut: torch.Tensor) -> None:
        """Throw away the generated columns after column `cut` (B',) of rows `rows` (B',); -1, or a
        cut at or past a row's end, leaves the row as it is. See `Decision.truncate_at`."""
        cut = cut.to(device=self.x.device, dtype=torch.long)
        act = (cut >= 0) & (cut + 1 < self.row_end[rows])
        if not bool(act.any()):
            return
        rows, cut = rows[act], cut[act].clamp(min=self.gen_start - 1)
        cols = self.columns()[None, :]
        gone = (cols > cut[:, None]) & (cols < self.gen_end)                      # (B', L)
        self._write_eos(rows, gone, self.global_step)
        self.key_valid[rows] = self.key_valid[rows] & ~gone
        self.row_end[rows] = cut + 1
        self.block_end[rows] = torch.minimum(self.block_end[rows], cut + 1)
        self.block_start[rows] = torch.minimum(self.block_start[rows], cut + 1)

    def holds_stop_id(self, rows: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """(B',) bool: the rows `rows` whose generated columns before `end` (B',) hold an EOS or
        end-of-turn token."""
        x = self.x[rows]
        stop = x == self.ids.eos
        if self.ids.eot is not None:
            stop |= x == self.ids.eot
        cols = self.columns()[None, :]
        return (stop & self.in_generation()[None, :] & (cols < end[:, None])).any(1)

    def fill_eos_after(self, rows: torch.Tensor, fill: torch.Tensor, start: torch.Tensor) -> None:
        """For the rows `rows` marked `fill` (B',) bool: every masked generated column from `start`
        (B',) on becomes EOS, committed at the last step (the one that completed what decides the
        fill); without reading the device."""
        cols = self.columns()[None, :]
        gone = fill[:, None] & (cols >= start[:, None]) & self.is_mask[rows] & self.in_generation()[None, :]
        self._write_eos(rows, gone, max(self.global_step - 1, 0))

    def _write_eos(self, rows: torch.Tensor, gone: torch.Tensor, step: int) -> None:
        """EOS into the columns `gone` (B', L) bool of the rows `rows`, those not yet committed
        recorded as committed at `step`."""
        self.x[rows] = self.x[rows].masked_fill(gone, self.ids.eos)
        steps = self.commit_step[rows]                                              # (B', G)
        fresh = gone[:, self.gen_start:self.gen_end] & (steps < 0)
        self.commit_step[rows] = steps.masked_fill(fresh, step)

    def _rows(self, rows):
        return torch.arange(self.batch_size, device=self.x.device) if rows is None else rows

    # -- rows joining and leaving (continuous batching) ---------------------------------------
    _ROW_TENSORS = ("x", "pad_len", "block_start", "block_end", "step_in_block", "nfe", "finished", "block_hold",
                    "edits", "remasks", "commit_step", "row_end", "key_valid", "position_ids")
    _ROW_EXTRA = ("hit_cap",)      # per-row entries of `extra` the loop itself keeps

    def keep_rows(self, rows: torch.Tensor, row_extra: tuple = (), padded: bool | None = None) -> None:
        """Keep only the rows `rows` (in that order), in place; `row_extra`: the keys of `extra`
        that hold one entry per row (a sampler's `row_state`); `padded`: whether a kept row is
        left-padded, when the caller knows it (else read from the device)."""
        for name in self._ROW_TENSORS:
            setattr(self, name, getattr(self, name)[rows])
        for key in self._ROW_EXTRA + tuple(row_extra):
            if key in self.extra:
                self.extra[key] = self.extra[key][rows]
        self.padded = bool((self.pad_len > 0).any()) if padded is None else padded

    def append_rows(self, other: "DecodeState", row_extra: tuple = ()) -> None:
        """Append the rows of `other` (a state of the same request settings and gen_length), in
        place. The shorter prompt side is left-padded to the longer one's `gen_start`; rotary
        positions count from each row's first real token, so every row computes as it did alone.
        `row_extra`: as in `keep_rows`; other entries of `extra` are shared and kept from self."""
        if other.gen_length != self.gen_length or other.block_length != self.block_length:
            raise ValueError(f"cannot join rows of gen_length {other.gen_length}, block_length {other.block_length} "
                             f"to a batch of gen_length {self.gen_length}, block_length {self.block_length}")
        sizes = (self.batch_size, other.batch_size)
        start = max(self.gen_start, other.gen_start)
        self._pad_left(start - self.gen_start)
        other._pad_left(start - other.gen_start)
        for name in self._ROW_TENSORS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        for key in self._ROW_EXTRA + tuple(row_extra):
            parts = [self.extra.get(key), other.extra.get(key)]
            like = next((p for p in parts if p is not None), None)
            if like is None:
                continue
            parts = [p if p is not None else torch.zeros((n, *like.shape[1:]), dtype=like.dtype, device=like.device)
                     for p, n in zip(parts, sizes)]
            self.extra[key] = torch.cat(parts)
        self.padded = bool((self.pad_len > 0).any())

    def _pad_left(self, d: int) -> None:
        """Move every row `d` columns to the right behind more left padding."""
        if d <= 0:
            return
        self.x = pad_columns_left(self.x, d, self.ids.pad)
        self.key_valid = pad_columns_left(self.key_valid, d, False)
        self.position_ids = pad_columns_left(self.position_ids, d, 0)
        for name in ("pad_len", "block_start", "block_end", "row_end"):
            setattr(self, name, getattr(self, name) + d)
        self.gen_start += d
        self.__dict__.pop("_columns", None)
        self.__dict__.pop("_in_generation", None)


def add_at(t: torch.Tensor, rows: torch.Tensor, value) -> None:
    """`t[rows] += value` for a 1-D integer tensor `t` and distinct `rows` (B',); `value` a tensor
    that broadcasts to (B',), or a number. One `index_add_`: on CUDA one kernel of atomic adds,
    exact for integers (an accumulating `index_put_` would sort its indices first)."""
    if not isinstance(value, torch.Tensor):
        value = t.new_full((), value)      # filled on t's device: no copy from the host
    t.index_add_(0, rows, value.expand(rows.shape))


def pad_columns_left(t: torch.Tensor, columns: int, fill) -> torch.Tensor:
    """(B, L) -> (B, columns + L): `columns` new first columns holding `fill`."""
    if not columns:
        return t
    return torch.cat([torch.full((t.shape[0], columns), fill, dtype=t.dtype, device=t.device), t], 1)


def select_positions(mask: torch.Tensor, most: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn a (B, L) bool mask into padded column indices.

    Returns positions (B, Q) with the selected columns in increasing order, then padding that
    repeats column 0, and valid (B, Q) bool; Q = the largest count in any row (at least 1).
    `most`: that largest count when the caller has already read it (no device sync here).
    """
    counts = mask.sum(1)
    if most is None:
        most = int(counts.max()) if mask.numel() else 0
    q = max(most, 1)
    # Selected columns first, in order: a stable descending sort of the mask, as uint8 (older
    # torch cannot sort bool tensors on CUDA).
    order = torch.sort(mask.view(torch.uint8), dim=1, descending=True, stable=True).indices[:, :q]   # (B, Q)
    valid = torch.arange(q, device=mask.device) < counts[:, None]
    return order * valid, valid


def cover_columns(need: torch.Tensor, sources: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns a forward recomputes, and where its logit sources sit among them.

    need: (B, L) bool, every column to recompute, `sources` included; width: the largest count
    of any row (read by the caller, so nothing here reads the device); sources: (B, Q) columns.
    Returns columns (B, width) in increasing order, a shorter row padded by repeating its first
    column, and index (B, Q): the position of each source in its row's columns.
    """
    cols, valid = select_positions(need, width)
    ordered = cols.masked_fill(~valid, need.shape[1]).contiguous()    # padding sorts last
    index = torch.searchsorted(ordered, sources.contiguous())
    return torch.where(valid, cols, cols[:, :1]), index
