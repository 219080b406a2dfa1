"""KV storage at absolute canvas positions, and the cache policies that choose what to recompute.

Keys are stored after RoPE at their canvas column in preallocated per-layer buffers
`(B, H_kv, L, D)`. A step recomputes the columns of its plan, scatters their fresh K/V into the
buffers and lets those queries attend over the whole canvas. Rotary positions count from each row's
first real token, so a stored key is never re-rotated, also when rows joining a batch re-pad it
and move the stored K/V with their columns. Every cache of the literature is a policy choosing the recomputed set
(docs/caches.md §Policies):

| policy     | recomputed each step                                 | full refresh                           |
|------------|------------------------------------------------------|----------------------------------------|
| none       | everything (no storage at all)                       | every step                             |
| prefix     | current block + everything after it                  | at each block start                    |
| dual       | current block                                        | at each block start                    |
| dkv-decode | masked positions + tokens committed at the last step | first `warmup` steps, every `refresh`  |
| dkv-greedy | scored positions + last step's commits + a window    | every `refresh` steps of a block       |
| vicinity   | current block + `prefix_look` / `after_look` around it | first `warmup_steps` forwards, block start |

Every storing policy also takes `twins` (False by default): recompute as well the columns holding
the same token as a column that changed since the row's last forward, and `guard` (None by
default): run a step as a full refresh for a row whose best candidate is not confident enough
(see `StoringPolicy`). Both are dllm's own; their defaults keep the published rules.

A full refresh recomputes every column and writes K/V for all of them; it is also a decoding step
(its logits are scored). Whatever a plan says, the forward also recomputes the columns whose
hidden state produces the scored logits (the scored columns; for Dream, their left neighbours), so
a policy only names what must be fresh in the cache.

Policy lifecycle (the generation loop calls these and nothing else):

* `setup(state, model)` once per request, before the first step: resolves model-dependent
  defaults, (re)allocates `self.kv` (a `KVCache`, or None for `none`) and resets the per-row state.
  Idempotent: a policy instance can serve many requests.
* `needs(state, rows, scored)` once or more per step, before the forward, for the unfinished
  rows `rows` (B',) (finished rows drop out and never come back): a `Needs` (which rows refresh
  every column, and the (B', L) bool columns each row recomputes), or None for a policy that
  stores nothing. `scored` (B', L) bool marks the columns whose logits the sampler asked for.
  It changes nothing, and reads nothing back from the device but where a policy says so
  (`dual twins=true` counts the changed columns, `dkv-greedy` reads its window's columns), so the
  loop can fold its sizes into the one read of the step.
* `advance(state, rows, needs)` once per step, for the `Needs` the forward follows: the
  policy's per-row bookkeeping (the canvas `state.x[rows]` is exactly what the forward sees).

* `observe(state, rows, positions, valid, prob)` once per step, after the scoring and before the
  commits: the confidence `prob` (B', Q) of the candidate at each scored column. Only called
  when `wants_confidence` (a storing policy with a `guard`); the loop then computes `prob` for
  every sampler.

Per-row bookkeeping needs no other hook: a storing policy keeps the canvas each row's
last forward saw (`seen`), so the columns whose token changed since then (the commits, fills or
re-masks of the previous step) are `state.x[rows] != seen[rows]`. Rows are ragged (different
block starts, steps within the block, finished rows); plans are padded per row by repeating the
row's first column, which the forward collapses.
"""
from __future__ import annotations

import bisect
import importlib
import inspect
from dataclasses import dataclass

import torch

from .state import MAX_INTEGER_ARGUMENT, DecodeState, add_at, pad_columns_left, plain_number, select_positions


@dataclass
class Needs:
    """What a storing policy recomputes at a step, for rows `rows` (B',) of `CachePolicy.needs`.

    full:    (B',) bool, rows that refresh every column (their K/V are all rewritten).
    columns: (B', L) bool, the columns each row recomputes (all of them where `full`).
    unsure:  (B',) bool, rows refreshed by the `guard` only (None without a guard).
    hidden:  (B',) bool, rows whose forward hides keys (`Sampler.key_end`; None when none can).
    """

    full: torch.Tensor
    columns: torch.Tensor
    unsure: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class KVCache:
    """Per-layer key/value buffers of shape (B, H_kv, L, D).

    `update(layer, rows, positions, k, v)` writes the fresh K/V of `positions` (B', P) for the
    batch rows `rows` (B',) and returns the full K/V of those rows (B', H_kv, L, D) for attention;
    `layout(rows, positions)` is what it tests about them, asked once per forward.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (batch, n_kv_heads, length, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = length
        self.head_index = torch.arange(n_kv_heads, device=device).view(1, -1, 1)    # (1, H_kv, 1)

    @classmethod
    def for_model(cls, model, batch: int, length: int, holder: object | None = None) -> "KVCache":
        """Zeroed buffers for `batch` rows of `length` columns of `model`. With CUDA graphs on
        (`model.set_cuda_graphs`), requests of one layout get the same buffers, reset: a graph
        replays the addresses it captured, so only then does a request replay the graphs an earlier
        one captured. The kept buffers are leased to `holder` (the decode's cache policy) while it
        lives; a decode interleaved with it (another batch, rows about to join it) gets buffers of
        its own."""
        cfg = model.config

        def make():
            with torch.inference_mode(False):   # kept buffers must stay writable by a later request outside it
                return cls(cfg.n_layers, batch, cfg.n_kv_heads, length, cfg.head_dim, model.dtype, model.device)

        graphs = getattr(model, "cuda_graphs", None)
        if graphs is None:
            return make()
        kv = graphs.persistent((cls, batch, length, model.dtype, model.device), make, holder)
        kv.reset()
        return kv

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.k[0].shape)

    def fits(self, model, batch: int, length: int) -> bool:
        """Whether these buffers have the layout `for_model(model, batch, length)` would allocate."""
        cfg, k = model.config, self.k[0]
        return (len(self.k) == cfg.n_layers and self.shape == (batch, cfg.n_kv_heads, length, cfg.head_dim)
                and k.dtype == model.dtype and k.device == model.device)

    def narrow(self, width: int) -> "KVCache":
        """A view of the columns [0, width) sharing these buffers: a forward on a canvas cut to
        `width` columns (truncated rows) writes and reads through it."""
        if width == self.length:
            return self
        view = object.__new__(KVCache)
        view.k = [t[:, :, :width] for t in self.k]       # (B, H_kv, W, D) views
        view.v = [t[:, :, :width] for t in self.v]
        view.length = width
        view.head_index = self.head_index
        return view

    def _storage(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The buffers `k` and `v` view the first rows of (all of them, unless rows left)."""
        return getattr(self, "store_k", self.k), getattr(self, "store_v", self.v)

    def _first_rows(self, store_k: list[torch.Tensor], store_v: list[torch.Tensor], n: int) -> "KVCache":
        out = object.__new__(KVCache)
        out.store_k, out.store_v = store_k, store_v
        out.k, out.v = [t[:n] for t in store_k], [t[:n] for t in store_v]
        out.length, out.head_index = self.length, self.head_index
        return out

    def keep_rows(self, rows: list[int]) -> "KVCache":
        """The rows `rows` of this cache, in that order. When every listed row stays where it is or
        comes from past the kept count (rows leaving a batch, as `Decoder.drop_finished` orders
        the rest), the moved rows are copied inside these buffers and the result views their first
        len(rows) rows; otherwise new buffers hold them."""
        n = len(rows)
        moves = [(j, r) for j, r in enumerate(rows) if r != j]
        if any(r < n for _, r in moves):
            return self.rows_view(torch.tensor(rows, device=self.k[0].device))
        store_k, store_v = self._storage()
        if moves:
            dst, src = (torch.tensor(side, device=self.k[0].device) for side in zip(*moves))
            for t in store_k + store_v:
                t.index_copy_(0, dst, t.index_select(0, src))
        return self._first_rows(store_k, store_v, n)

    def append(self, other: "KVCache", left: int, other_left: int) -> "KVCache":
        """This cache's rows moved `left` columns to the right, then those of `other` moved
        `other_left`, each behind zeroed columns (both lengths then equal). Written into the rows
        these buffers have spare (rows that left the batch) when this side does not move and there
        are enough of them, else into new buffers."""
        n, m = self.k[0].shape[0], other.k[0].shape[0]
        store_k, store_v = self._storage()
        if left or store_k[0].shape[0] < n + m:
            return KVCache.concat(self.rows_view(left=left), other.rows_view(left=other_left))
        for mine, theirs in zip(store_k + store_v, other.k + other.v):
            mine[n:n + m, :, :other_left].zero_()
            mine[n:n + m, :, other_left:].copy_(theirs)
        return self._first_rows(store_k, store_v, n + m)

    def repeated_rows(self, rows: torch.Tensor, times: int, into: "KVCache | None" = None) -> "KVCache":
        """A cache of the rows `rows` (B',), each repeated `times` times in a row (row b's copies
        first), for forwards that read these rows' K/V and write their own (a sampler's drafts).
        Written into `into` when it has that shape, dtype and device (its buffers then keep their
        addresses, which CUDA graphs replay), else into new buffers."""
        shape = (len(rows) * times, *self.k[0].shape[1:])
        if into is None or into.shape != shape or into.k[0].dtype != self.k[0].dtype \
                or into.k[0].device != self.k[0].device or len(into.k) != len(self.k):
            into = object.__new__(KVCache)
            into.k = [t.new_empty(shape) for t in self.k]
            into.v = [t.new_empty(shape) for t in self.v]
            into.length, into.head_index = self.length, self.head_index
        for copy, t in zip(into.k + into.v, self.k + self.v):
            copy.view(len(rows), times, *shape[1:]).copy_(t.index_select(0, rows)[:, None])
        return into

    def write_rows(self, rows: torch.Tensor, source: "KVCache", stride: int) -> None:
        """Write rows 0, stride, 2 stride, ... of `source` (of this cache's length) into this cache's
        rows `rows`, in place: what a forward through `repeated_rows(rows, stride)` wrote for the
        first copy of each row."""
        for mine, theirs in zip(self.k + self.v, source.k + source.v):
            mine.index_copy_(0, rows, theirs[::stride])

    def rows_view(self, rows: torch.Tensor | None = None, left: int = 0) -> "KVCache":
        """New buffers holding the rows `rows` (all when None), each moved `left` columns to the
        right behind zeroed columns (rows joining or leaving a running batch)."""
        def take(t: torch.Tensor) -> torch.Tensor:
            t = t if rows is None else t.index_select(0, rows)     # a plain copy, faster than t[rows] on CPU
            if left:
                t = torch.cat([t.new_zeros((*t.shape[:2], left, t.shape[3])), t], 2)
            return t

        out = object.__new__(KVCache)
        out.k, out.v = [take(t) for t in self.k], [take(t) for t in self.v]
        out.length, out.head_index = self.length + left, self.head_index
        return out

    @staticmethod
    def concat(first: "KVCache", second: "KVCache") -> "KVCache":
        """The rows of both (of equal length), first's then second's."""
        out = object.__new__(KVCache)
        out.k = [torch.cat([a, b]) for a, b in zip(first.k, second.k)]
        out.v = [torch.cat([a, b]) for a, b in zip(first.v, second.v)]
        out.length, out.head_index = first.length, first.head_index
        return out

    def reset(self) -> None:
        """Zero every buffer (a fresh request)."""
        for t in self.k + self.v:
            t.zero_()

    def layout(self, rows: torch.Tensor, positions: torch.Tensor, *, every_column: bool | None = None,
               every_row: bool | None = None) -> tuple[bool, bool]:
        """(every column is fresh, `rows` are all the buffers' rows in order) for a forward that
        writes `positions` (B', P) of `rows` (B',), distinct and increasing. A forward asks once
        and hands the answer to each layer's `update`. The rows are all rows exactly when there
        are as many as the buffers hold (no sync); a column test it does not already know is a
        host-device sync on a GPU."""
        if every_column is None:
            every_column = positions.shape[1] == self.length and bool(
                (positions == torch.arange(self.length, device=positions.device)).all())
        if every_row is None:
            every_row = rows.shape[0] == self.k[0].shape[0]
        return every_column, every_row

    def write_index(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The index of the buffer entries (B', H_kv, P) that `update` writes for `positions` (B', P)
        of `rows` (B',); a forward builds it once for all its layers."""
        return rows.view(-1, 1, 1), self.head_index, positions.unsqueeze(1)

    def update(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               layout: tuple[bool, bool] | None = None, index: tuple[torch.Tensor, ...] | None = None):
        """Write k, v (B', H_kv, P, D) at `positions` of `rows` and return the K/V the rows attend
        over; `layout` and `index` (`write_index`) when the forward has them already."""
        kb, vb = self.k[layer], self.v[layer]
        every_column, every_row = layout if layout is not None else self.layout(rows, positions)
        if every_column:
            # every column is fresh: store whole rows and attend over the fresh K/V as they are
            if every_row:
                kb.copy_(k)
                vb.copy_(v)
            else:
                kb.index_copy_(0, rows, k)
                vb.index_copy_(0, rows, v)
            return k, v
        index = self.write_index(rows, positions) if index is None else index
        kb.index_put_(index, k)                         # entries (B', H_kv, P) <- (B', H_kv, P, D)
        vb.index_put_(index, v)
        return self.attended(layer, rows, every_row)

    def buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V buffers (rows, H_kv, L, D) of `layer`, for a writer of its own (the fused
        rotary + K/V write kernel); `attended` then gives what the rows attend over."""
        return self.k[layer], self.v[layer]

    def attended(self, layer: int, rows: torch.Tensor, every_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V (B', H_kv, L, D) of `rows` in `layer`, after a partial write: the buffers
        themselves when `rows` are all of them (`layout`), else a copy of those rows."""
        kb, vb = self.k[layer], self.v[layer]
        if every_row:
            return kb, vb
        return kb[rows], vb[rows]


# -- policies -----------------------------------------------------------------------------------
def _check_int(policy: str, name: str, value, low: int, allow_none: bool = False):
    if value is None and allow_none:
        return None
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        what = f"an integer >= {low}" + (" or None" if allow_none else "")
        raise ValueError(f"cache policy {policy!r}: {name} must be {what}, got {value!r}")
    if value > MAX_INTEGER_ARGUMENT:
        raise ValueError(f"cache policy {policy!r}: {name} must be <= {MAX_INTEGER_ARGUMENT}, got {value!r}")
    return value


def plan_columns(need: torch.Tensor) -> torch.Tensor:
    """(B', L) bool -> (B', P) columns in increasing order, P = the largest count of any row; a
    shorter row is padded by repeating its first column (recomputing a column twice is harmless)."""
    cols, valid = select_positions(need)
    return torch.where(valid, cols, cols[:, :1])


def same_token_columns(x: torch.Tensor, marked: torch.Tensor) -> torch.Tensor:
    """(B, L) tokens, (B, L) bool -> (B, L) bool: the columns whose token equals the token of a
    marked column of the same row. Compares against the K marked tokens of each row, (B, L, K)."""
    cols, valid = select_positions(marked)                                   # (B, K)
    ids = x.gather(1, cols)
    return ((x[:, :, None] == ids[:, None, :]) & valid[:, None, :]).any(-1)


class CachePolicy:
    """Chooses which canvas columns to recompute at each step (see the module docstring).

    Class attributes: `name` (registry name), `needs_storage` (the forward keeps K/V between
    steps in `self.kv`), `needs_block_causal` (only a block-causal model runs it; `policies_for`),
    `joinable` (rows of another request may join a running batch: `append_rows`, `keep_rows`).
    """

    name = "base"
    needs_storage = False
    wants_confidence = False
    needs_block_causal = False      # runs only on a block-causal model (`block`)
    joinable = True
    kv: KVCache | None = None

    def __init__(self):
        self.kv: KVCache | None = None
        self._args: dict = {}

    def setup(self, state: DecodeState, model) -> None:
        """Prepare for a request (idempotent); storing policies allocate or reset `self.kv`."""

    def needs(self, state: DecodeState, rows: torch.Tensor, scored: torch.Tensor | None = None,
              key_end: torch.Tensor | None = None) -> Needs | None:
        """This step's `Needs` for `rows`, or None when the policy stores nothing (every step is full);
        `key_end` (B',): the column from which the step's forward hides keys (`Sampler.key_end`)."""
        raise NotImplementedError

    def advance(self, state: DecodeState, rows: torch.Tensor, needs: Needs | None) -> None:
        """Record the step whose forward follows `needs`."""

    def observe(self, state: DecodeState, rows: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                prob: torch.Tensor) -> None:
        """This step's candidate confidences (B', Q) at the scored `positions` (B', Q) of `rows`."""

    def keep_rows(self, rows: torch.Tensor, order: list[int]) -> None:
        """Keep the per-row state of the rows `rows` only (`DecodeState.keep_rows`); `order` is
        `rows` on the host, so that no policy reads it back from the device."""

    def append_rows(self, other: "CachePolicy", left: int, other_left: int, pad_id: int) -> None:
        """Append the per-row state of `other` (a policy of the same settings, set up for the joining
        rows), this side's columns moved `left` to the right and other's `other_left`, as
        `DecodeState.append_rows` moves the canvases (behind `pad_id` padding)."""

    def arguments(self) -> dict:
        """The policy's arguments, model-dependent defaults resolved once `setup` ran."""
        return dict(self._args)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments().items())
        return f"{type(self).__name__}({args})"


class NoCache(CachePolicy):
    """Recompute every position at every step (the reference behaviour)."""

    name = "none"
    needs_storage = False

    def needs(self, state, rows, scored=None, key_end=None):
        return None


class StoringPolicy(CachePolicy):
    """Base of the policies that keep K/V between steps.

    Visible state, per request: `kv` (the buffers), `seen` (B, L), the canvas each row's last
    forward saw; `refreshes` / `partial_steps` (B,), how many full and partial forwards each row
    took. Subclasses define `_full(state, rows) -> (B',) bool` (rows refreshed this step) and
    `_columns(state, rows, changed, scored) -> (B', L) bool` (what a partial step recomputes).

    twins (every storing policy; False by default, the published rules): a partial step also
    recomputes every column that holds the same token as a column changed since the row's last
    forward. A bidirectional model can mark a prompt token as used once its copy appears in the
    answer (through same-token attention, say); without this, those prompt columns keep their
    state from before the copy was written until the next refresh (docs/caches.md §4).

    guard (every storing policy; None by default, the published rules): a probability in [0, 1].
    A row whose step would be partial runs a full refresh instead when none of the masked columns
    the sampler scores now had a candidate at least `guard` confident when last scored (a column
    never scored counts as 0). Cached logits are approximate; a decision between near-equal
    candidates is where that error changes a token, and a confident one is where it does not. The
    confidences come from the previous forward of the row (`observe`), so the test costs nothing.
    `guard=0` never triggers; the refreshes it adds are counted in `guarded` (B,).

    A forward that hides the keys from a column on (`Sampler.key_end`, SlowFast's fast phase)
    computes K/V of a cut canvas: it recomputes no column from there, is never a full refresh, and
    the row's next forward that hides nothing refreshes fully (`hidden_kv` (B,): the row's last
    forward hid keys), so no such forward reads K/V of a cut canvas.
    """

    needs_storage = True

    def __init__(self, twins: bool = False, guard: float | None = None):
        super().__init__()
        if not isinstance(twins, bool):
            raise ValueError(f"cache {self.name!r}: twins must be true or false, got {twins!r}")
        if guard is not None and (isinstance(guard, bool) or not isinstance(guard, (int, float))
                                  or not 0 <= guard <= 1):
            raise ValueError(f"cache {self.name!r}: guard must be a probability in [0, 1] or None, got {guard!r}")
        self.twins = twins
        self.guard = None if guard is None else float(guard)

    @property
    def wants_confidence(self) -> bool:
        return self.guard is not None

    def setup(self, state, model):
        B, L = state.batch_size, state.length
        if self.kv is not None and self.kv.fits(model, B, L):
            self.kv.reset()
        else:
            self.kv = KVCache.for_model(model, B, L, holder=self)
        self.seen = state.x.clone()
        zeros = torch.zeros(B, dtype=torch.long, device=state.x.device)
        self.refreshes, self.partial_steps, self.guarded = zeros, zeros.clone(), zeros.clone()
        self.confidence = torch.zeros(B, L, dtype=torch.float32, device=state.x.device)
        self.hidden_kv = torch.zeros(B, dtype=torch.bool, device=state.x.device)
        self.shift = bool(model.config.logit_shift)

    _ROW_STATE = ("seen", "refreshes", "partial_steps", "guarded", "confidence", "hidden_kv")

    def keep_rows(self, rows, order):
        self.kv = self.kv.keep_rows(order)
        for name in self._ROW_STATE:
            setattr(self, name, getattr(self, name)[rows])

    def append_rows(self, other, left, other_left, pad_id):
        self.kv = self.kv.append(other.kv, left, other_left)
        for name in self._ROW_STATE:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine.dim() == 2:   # (B, L): seen (padding columns hold pad_id) and confidence (0)
                fill = pad_id if name == "seen" else 0
                mine, theirs = pad_columns_left(mine, left, fill), pad_columns_left(theirs, other_left, fill)
            setattr(self, name, torch.cat([mine, theirs]))

    def observe(self, state, rows, positions, valid, prob):
        # Without a host read: padding entries point at column 0 (`select_positions`) and write
        # what column 0 holds after the step, its new confidence where it was scored.
        scored0 = valid[:, :1] & (positions[:, :1] == 0)
        col0 = torch.where(scored0, prob[:, :1].float(), self.confidence[rows, :1])
        values = torch.where(valid, prob.float(), col0)
        self.confidence[rows[:, None].expand_as(positions), positions] = values

    def needs(self, state, rows, scored=None, key_end=None):
        x = state.x[rows]                                                   # (B', L)
        changed = x != self.seen[rows]
        hidden = None if key_end is None else key_end < state.length       # (B',)
        full = self._full(state, rows)                                      # (B',)
        if hidden is not None:
            full = full | (self.hidden_kv[rows] & ~hidden)                  # back from a cut canvas
        unsure = None
        if self.guard is not None:
            unsure = self._unsure(state, rows, scored) & ~full
            full = full | unsure
        columns = self._columns(state, rows, changed, scored) | full[:, None]  # (B', L)
        if self.twins:
            columns |= same_token_columns(x, changed)
        if hidden is not None:
            columns &= state.columns()[None, :] < key_end[:, None]
            full = full & ~hidden
            unsure = None if unsure is None else unsure & ~hidden     # a hiding row takes no refresh
        return Needs(full, columns, unsure, hidden)

    def advance(self, state, rows, needs):
        self.seen[rows] = state.x[rows]
        if needs.hidden is not None:
            self.hidden_kv[rows] = needs.hidden
        if needs.unsure is not None:
            add_at(self.guarded, rows, needs.unsure.long())
        full = needs.full.long()
        add_at(self.refreshes, rows, full)
        add_at(self.partial_steps, rows, 1 - full)

    def _unsure(self, state, rows, scored) -> torch.Tensor:
        """(B',) bool: no masked column the sampler scores now was `guard` confident when last scored."""
        masked = state.is_mask[rows]
        cand = masked & (scored if scored is not None else state.in_generation()[None, :])
        best = self.confidence[rows].masked_fill(~cand, -1.0).amax(1)
        return (best < self.guard) & cand.any(1)

    # -- helpers for subclasses -------------------------------------------------------------
    def _periodic(self, state, rows, refresh: int | None) -> torch.Tensor:
        """(B',) bool: block start, or every `refresh` steps inside the block."""
        i = state.step_in_block[rows]
        return i == 0 if refresh is None else i % refresh == 0

    def _from_block_start(self, state, rows) -> torch.Tensor:
        """(B', L) bool: columns >= each row's block start (from the start of the attention block for
        a block-causal model, `DecodeState.block_first_column`). A shifted model's column before
        the block, which predicts the block's first position, is recomputed while that position
        is scored: the loop adds the scored columns' sources to every plan (`cover_columns`)."""
        cols = state.columns()[None, :]
        return cols >= state.block_first_column(rows)[:, None]


class PrefixCache(StoringPolicy):
    """Fast-dLLM PrefixCache: full refresh at each block start, then recompute the current block and
    everything after it (the prefix before the block is served from the cache).

    refresh: also refresh every `refresh` steps inside a block (None: only at block starts, as
        Fast-dLLM; 1 recomputes everything every step, which equals `none`).
    On Dream the column left of the block is recomputed too while the block's first position, which
    its hidden state predicts, is scored (Fast-dLLM's Dream code commits that position outright at
    the block's full forward and never recomputes that column: `threshold`'s `commit_block_start`).
    twins, guard: see `StoringPolicy` (False, None: Fast-dLLM's rule).
    """

    name = "prefix"

    def __init__(self, *, refresh: int | None = None, twins: bool = False, guard: float | None = None):
        super().__init__(twins, guard)
        self.refresh = _check_int(self.name, "refresh", refresh, 1, allow_none=True)
        self._args = dict(refresh=self.refresh, twins=twins, guard=guard)

    def _full(self, state, rows):
        return self._periodic(state, rows, self.refresh)

    def _columns(self, state, rows, changed, scored):
        return self._from_block_start(state, rows) | _changed_before_block(state, rows, changed)


class DualCache(PrefixCache):
    """Fast-dLLM DualCache: full refresh at each block start, then recompute only the current block
    (prefix and masked suffix are served from the cache).

    refresh: as for `prefix`. The block is read at every step, so a block whose end a sampler moves
    is recomputed up to its new end. On Dream the column left of the block is recomputed as for
    `prefix`.
    twins, guard: see `StoringPolicy` (False, None: Fast-dLLM's rule).
    """

    name = "dual"

    def _columns(self, state, rows, changed, scored):
        if self.shift or state.aligned_blocks:
            end = state.block_end_column(rows)
            block = self._from_block_start(state, rows) & (state.columns()[None, :] < end[:, None])
        else:
            block = state.in_block(rows)
        return block | _changed_before_block(state, rows, changed)


class VicinityCache(DualCache):
    """dInfer's vicinity cache: `dual` whose partial steps recompute a window around the block, the
    block with `prefix_look` columns before it and `after_look` after it (clipped to the canvas).
    A row's first `warmup_steps` forwards and the one after them run over the whole canvas, then a
    full refresh at each block start (dInfer's `VicinityCacheDiffusionLLM`).

    prefix_look, after_look, warmup_steps: 16, 16 and 4 as dInfer's evaluation guide runs them
    (0, 0, 0 is `dual`). refresh, twins, guard: as for `dual`.
    """

    name = "vicinity"

    def __init__(self, *, prefix_look: int = 16, after_look: int = 16, warmup_steps: int = 4,
                 refresh: int | None = None, twins: bool = False, guard: float | None = None):
        super().__init__(refresh=refresh, twins=twins, guard=guard)
        self.prefix_look = _check_int(self.name, "prefix_look", prefix_look, 0)
        self.after_look = _check_int(self.name, "after_look", after_look, 0)
        self.warmup_steps = _check_int(self.name, "warmup_steps", warmup_steps, 0)
        self._args = dict(prefix_look=self.prefix_look, after_look=self.after_look, warmup_steps=self.warmup_steps,
                          refresh=self.refresh, twins=twins, guard=guard)

    def _full(self, state, rows):
        return super()._full(state, rows) | (state.nfe[rows] <= self.warmup_steps)

    def _columns(self, state, rows, changed, scored):
        cols = state.columns()[None, :]
        start = state.block_first_column(rows) - self.prefix_look
        end = state.block_end_column(rows) + self.after_look
        window = (cols >= start[:, None]) & (cols < end[:, None])
        return window | _changed_before_block(state, rows, changed)


def _changed_before_block(state: DecodeState, rows, changed: torch.Tensor) -> torch.Tensor:
    """(B', L) bool: the columns before each row's block whose token changed since its last forward;
    only a sampler that reaches back (RCR) changes any, and `prefix`/`dual` recompute them."""
    return changed & (state.columns()[None, :] < state.block_start[rows, None])


class BlockCache(StoringPolicy):
    """Block diffusion's exact cache, for a block-causal model (LLaDA2): one full forward at a row's
    first step (the prompt's prefill), then every step recomputes the attention blocks from the
    first one holding a column changed since the row's last forward (at a block's first step, the
    block just finished, whose K/V hold its final tokens from then on) or the active block's start,
    to the end of the one holding the active block's end. Under block-causal attention the K/V of
    an attention block depend only on it and the blocks before it, and later blocks are never
    seen, so the tokens are those of recomputing everything (`none`), also for a sampler that
    rewrites earlier blocks (RCR) or blocks that do not follow the attention blocks (AdaBlock)."""

    name = "block"
    needs_block_causal = True
    joinable = False

    def __init__(self):
        super().__init__(twins=False, guard=None)
        self._args = {}

    def setup(self, state, model):
        if model.config.attention_block is None:
            raise ValueError(f"cache 'block' is exact only under block-causal attention (LLaDA2); "
                             f"{model.config.family} attends to every column: use 'dual' or 'prefix'")
        super().setup(state, model)
        self.attention_block = model.config.attention_block

    def _full(self, state, rows):
        return self.refreshes[rows] == 0

    def _columns(self, state, rows, changed, scored):
        cols = state.columns()
        first_changed = torch.where(changed, cols[None, :], state.length).amin(1)              # (B',)
        start, end = state.to_attention_blocks(torch.minimum(state.block_start[rows], first_changed),
                                               state.block_end[rows], self.attention_block, rows)
        return (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])


# Per family: (refresh, warm-up full forwards per block). dKV-Cache's LLaDA loop refreshes every 8
# steps and runs full forwards at the first two steps of a block (the first builds nothing); its
# Dream loop (the paper's Dream table) refreshes every 4 steps from step 0.
DKV_DECODE_DEFAULTS = {"llada": (8, 2), "dream": (4, 1)}


class DKVDecode(StoringPolicy):
    """dKV-Cache-Decode: a token's K/V are cached one step after it is committed.

    Each partial step recomputes every still-masked position of the generation region (future
    blocks included) and the tokens committed at the previous step (now with their real ids);
    everything else is served from the cache. Full refresh at steps i < warmup of each block and
    whenever i % refresh == 0 (i counts the row's steps in its block; samplers without blocks count
    steps over the whole generation).

    refresh: default by model family, 8 for LLaDA and 4 for Dream (dKV-Cache's paper settings).
    warmup:  full forwards at the start of each block; default by family, 2 for LLaDA and 1 for
             Dream (dKV-Cache's loops).
    twins, guard: see `StoringPolicy` (False, None: dKV-Cache's rule).
    On Dream a column is recomputed when the token it predicts (the next column's) is, not its own:
    dKV-Cache's default `shift_type="un"`, under which a masked column whose next token is decoded is
    served from the cache.
    """

    name = "dkv-decode"

    def __init__(self, *, refresh: int | None = None, warmup: int | None = None, twins: bool = False,
                 guard: float | None = None):
        super().__init__(twins, guard)
        self._given = dict(refresh=_check_int(self.name, "refresh", refresh, 1, allow_none=True),
                           warmup=_check_int(self.name, "warmup", warmup, 0, allow_none=True))
        self.refresh, self.warmup = self._given["refresh"], self._given["warmup"]
        self._args = dict(self._given, twins=twins, guard=guard)

    def setup(self, state, model):
        super().setup(state, model)
        refresh, warmup = DKV_DECODE_DEFAULTS.get(model.config.family, DKV_DECODE_DEFAULTS["llada"])
        self.refresh = refresh if self._given["refresh"] is None else self._given["refresh"]
        self.warmup = warmup if self._given["warmup"] is None else self._given["warmup"]
        self._args = dict(refresh=self.refresh, warmup=self.warmup, twins=self.twins, guard=self.guard)

    def _full(self, state, rows):
        i = state.step_in_block[rows]
        return (i < self.warmup) | (i % self.refresh == 0)

    def _columns(self, state, rows, changed, scored):
        due = state.masked_in_generation(rows) | changed
        # dKV-Cache's shift_type "un": column j follows the token it predicts, j + 1 (the last
        # column follows column 0, as the published loop rolls its cache positions)
        return torch.roll(due, -1, dims=1) if self.shift else due


class DKVGreedy(StoringPolicy):
    """dKV-Cache-Greedy: recompute only the positions due now, last step's commits and a window.

    Full refresh every `refresh` steps of a block (from step 0). Otherwise the step recomputes the
    due positions, the tokens committed at the previous step, and for each due position (in column
    order) up to `window` still-masked columns not yet chosen, nearest first, the left one first on
    equal distance (dKV-Cache's alternating left/right search); everything else, masked positions
    included, is served from the cache, stale.

    Generalised to every sampler: the due positions are the columns the sampler asks scores for.
    dKV-Cache pairs the policy with `random` remasking whose decoding order is drawn once per block,
    so the due positions are exactly the ones committed at the step; with that kind of sampler this
    policy is dKV-Cache-Greedy. With a sampler that scores every masked position of its block
    (`low_confidence`, `threshold`, ...) the due set is the block's masked positions and the policy
    is a block cache with a one-step delay, a window and periodic refreshes. Paper settings:
    refresh 2, window 4 (MBPP: window 2). twins, guard: see `StoringPolicy` (False, None:
    dKV-Cache's rule).
    """

    name = "dkv-greedy"

    def __init__(self, *, refresh: int = 2, window: int = 4, twins: bool = False, guard: float | None = None):
        super().__init__(twins, guard)
        self.refresh = _check_int(self.name, "refresh", refresh, 1)
        self.window = _check_int(self.name, "window", window, 0)
        self._args = dict(refresh=self.refresh, window=self.window, twins=twins, guard=guard)

    def _full(self, state, rows):
        return self._periodic(state, rows, self.refresh)

    def _columns(self, state, rows, changed, scored):
        if scored is None:
            raise ValueError(f"cache policy {self.name!r} needs the scored columns: call needs(state, rows, scored)")
        need = scored | changed
        if self.window:
            masked = state.masked_in_generation(rows)
            need = window_columns(need, scored, masked, self.window)
        return need


def window_columns(chosen: torch.Tensor, due: torch.Tensor, masked: torch.Tensor, window: int) -> torch.Tensor:
    """Add, for each due column in increasing order, up to `window` masked columns not chosen yet,
    nearest first and the left one first on equal distance. All arguments (B, L) bool.

    The search runs on the host: one read of the due and free columns, then the picks are
    written back in one indexed write (from pinned memory on CUDA, so the copy does not wait)."""
    chosen = chosen.clone()
    if window <= 0:
        return chosen
    due_rows, free_rows = torch.stack([due, masked & ~chosen]).tolist()
    rows, cols = [], []
    for r, (due_row, free_row) in enumerate(zip(due_rows, free_rows)):
        free = [c for c, f in enumerate(free_row) if f]                  # ascending
        for p in (c for c, d in enumerate(due_row) if d):
            picks = _nearest(free, p, window)
            rows += [r] * len(picks)
            cols += picks
            for c in picks:
                free.pop(bisect.bisect_left(free, c))
    if rows:
        index = torch.tensor([rows, cols], dtype=torch.long)
        if chosen.is_cuda:
            index = index.pin_memory().to(chosen.device, non_blocking=True)
        chosen[index[0], index[1]] = True
    return chosen


def _nearest(free: list[int], p: int, n: int) -> list[int]:
    """The `n` columns of the ascending list `free` nearest to column p (not in it), the left one
    first on equal distance."""
    right = bisect.bisect_right(free, p)
    left = right - 1
    picks = []
    while len(picks) < n and (left >= 0 or right < len(free)):
        if right >= len(free) or (left >= 0 and p - free[left] <= free[right] - p):
            picks.append(free[left])
            left -= 1
        else:
            picks.append(free[right])
            right += 1
    return picks


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    path: str
    description: str


_POLICIES: dict[str, PolicyInfo] = {
    "none": PolicyInfo("none", "dllm.cache:NoCache", "recompute everything every step"),
    "prefix": PolicyInfo("prefix", "dllm.cache:PrefixCache",
                         "Fast-dLLM prefix cache: refresh at block start, recompute the block and the suffix"),
    "dual": PolicyInfo("dual", "dllm.cache:DualCache",
                       "Fast-dLLM dual cache: refresh at block start, recompute the block"),
    "block": PolicyInfo("block", "dllm.cache:BlockCache",
                        "block diffusion (block-causal models): prefill once, recompute the active block "
                        "and, at its first step, the block just finished; exact"),
    "dkv-decode": PolicyInfo("dkv-decode", "dllm.cache:DKVDecode",
                             "dKV-Cache-Decode: recompute masks and last step's commits, periodic refresh"),
    "dkv-greedy": PolicyInfo("dkv-greedy", "dllm.cache:DKVGreedy",
                             "dKV-Cache-Greedy: recompute scored positions, last commits and a window"),
    "vicinity": PolicyInfo("vicinity", "dllm.cache:VicinityCache",
                           "dInfer vicinity cache: refresh at block start, recompute the block and the "
                           "columns near it"),
}


def register_policy(name: str, path: str, description: str = "") -> None:
    """Register a cache policy class under `name`, resolved lazily from `"module:Class"`."""
    _POLICIES[name] = PolicyInfo(name, path, description)


def policies_for(cfg) -> list[str]:
    """The registered policies a model of ModelConfig `cfg` runs: all of them for a block-causal
    model, all but those that need block-causal attention otherwise."""
    return [n for n in available_policies() if cfg.attention_block is not None or not policy_class(n).needs_block_causal]


def available_policies() -> list[str]:
    return sorted(_POLICIES)


def policy_class(name: str) -> type[CachePolicy]:
    if not isinstance(name, str) or name not in _POLICIES:
        raise ValueError(f"unknown cache policy {name!r}; valid options: {', '.join(available_policies())}")
    module, attr = _POLICIES[name].path.split(":")
    return getattr(importlib.import_module(module), attr)


def policy_signature(name: str) -> dict:
    """Argument name -> default of a registered policy."""
    params = inspect.signature(policy_class(name).__init__).parameters
    return {p: v.default for p, v in params.items() if p != "self"}


def get_policy(name: str | CachePolicy = "none", /, **kwargs) -> CachePolicy:
    """A cache policy by registered name and keyword arguments, or a policy instance as is.

    >>> get_policy("dual"), get_policy("dkv-decode", refresh=4)
    Unknown names and unknown or out-of-range arguments raise ValueError naming what is allowed.
    """
    if isinstance(name, CachePolicy):
        if kwargs:
            raise ValueError(f"cache arguments {kwargs!r} are only used with a policy given by name, "
                             f"not an instance ({name!r})")
        return name
    cls = policy_class(name)
    allowed = policy_signature(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        listed = ", ".join(f"{k}={v!r}" for k, v in allowed.items()) or "(none)"
        raise ValueError(f"cache policy {name!r} has no argument(s) {', '.join(map(repr, unknown))}; "
                         f"its arguments: {listed}")
    return cls(**{key: plain_number(value) for key, value in kwargs.items()})
