"""The sampler contract (docs/architecture.md §5).

A sampler is built from a name and keyword arguments (`dllm.samplers.get("low_confidence")`).
For each step the generation loop asks it which canvas columns it needs scores for, runs the
model there, and hands it `TokenScores` for those columns; the sampler answers with a `Decision`
(which of them to commit, and optionally a new block end or fill-all). The loop, not the sampler,
enforces the invariants: prompt tokens never change, commits land only on masked positions of the
generation region, a hard cap on forwards, finished rows stop costing compute, and progress (at
least one commit per unfinished row per step) for every sampler that is not a fixed reference
schedule.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from dllm.kernels.scoring import TokenScores
from dllm.state import MAX_INTEGER_ARGUMENT, Decision, DecodeState, plain_number


class Sampler:
    """Base class of unmasking samplers.

    Class attributes a sampler declares:
      name:            registry name.
      uses_blocks:     True for semi-autoregressive samplers (commit only inside the active block);
                       False means the whole generation region is one block.
      fixed_schedule:  True for a reference schedule with a fixed number of steps that may commit
                       nothing in a step (LLaDA's and Dream's own samplers); the step count bounds it.
      whole_blocks:    it spreads its schedule over gen_length / block_length whole blocks (LLaDA's
                       rule, gen_length a multiple of block_length): on a block-causal model every
                       prompt must then fill whole attention blocks.
      uses_steps:      the request's `steps` / `tokens_per_step` set its schedule; False for a
                       sampler that decides its own number of steps (a request giving them is
                       warned that they are ignored).
      needs_logits:    the loop passes the (B, Q, V) logits in `scores.logits` (for a sampler that
                       needs them only for some requests: `logits_needed`).
      gumbel_candidates: the loop draws the candidate token by Gumbel-max at the request temperature;
                       samplers that sample themselves (Dream's) set this False.
      score_fields:    TokenScores statistics the sampler reads ("prob", "margin", "entropy",
                       "logit_gap"); the candidate token is always there.
      row_state:       what rows joining a running batch carry (below); None: they cannot join.
      draws:           it draws from the request's generator at temperature 0 too (a random order):
                       its tokens then depend on the rows decoded beside it, which share the stream.
      file_arguments:  its arguments that name a file on the machine (a server request may not).
      remasks:         the sampler may mask written tokens again (`Decision.remask`), so a row's
                       mask count may grow between steps.
      reaches_back:    its commits and re-masks may also land on generated columns before the
                       active block (RCR's running confidence covers every earlier block).
      shadow_block:    every forward also runs shadow copies of canvas columns (`shadow_columns`,
                       `read_shadow`; WINO's verification block): a full forward without a cache,
                       without guidance, of a model without shifted logits or attention blocks.
      drafts:          every forward also runs draft canvases of each row as batch rows
                       (`draft_canvases`, `read_drafts`; FreeDave's verification); with a storing
                       cache policy they read a copy of their canvas's stored K/V. Not with guidance.
    """

    name: ClassVar[str] = "base"
    uses_blocks: ClassVar[bool] = True
    fixed_schedule: ClassVar[bool] = False
    whole_blocks: ClassVar[bool] = False
    uses_steps: ClassVar[bool] = True
    needs_logits: ClassVar[bool] = False
    gumbel_candidates: ClassVar[bool] = True
    score_fields: ClassVar[frozenset] = frozenset({"prob"})
    # Rows joining a running batch (`dllm.serve`): the keys of `state.extra` this sampler keeps one
    # entry per row of (first dimension), for a sampler whose greedy decision for a row depends on
    # that row alone; None (the default): rows cannot join a running batch of this sampler.
    row_state: ClassVar[tuple[str, ...] | None] = None
    # Whether the sampler may rewrite written tokens (`Decision.edit`): then a finished prefix of
    # the canvas is not final until the whole row is.
    rewrites_tokens: ClassVar[bool] = False
    draws: ClassVar[bool] = False
    # Arguments that name a file (Learn2PD's filter, PC-Sampler's table): a server request may not.
    file_arguments: ClassVar[tuple[str, ...]] = ()
    remasks: ClassVar[bool] = False
    reaches_back: ClassVar[bool] = False
    shadow_block: ClassVar[bool] = False
    drafts: ClassVar[bool] = False

    def setup(self, state: DecodeState) -> None:
        """Called once per request before the first step; validate against the request here."""

    def begin_block(self, state: DecodeState, rows: torch.Tensor) -> None:
        """Called when the rows `rows` open a new block (their block bounds are already set)."""

    def begin_blocks(self, state: DecodeState, rows: torch.Tensor, opening: torch.Tensor) -> None:
        """Called after every step for the rows `rows` (B',); `opening` (B',) bool marks the ones
        that have just opened a new block. The default runs `begin_block` on those rows, which
        selects them with a host sync when the sampler defines one; a sampler whose block setup can
        be computed for every row and kept where `opening` holds overrides this (no sync)."""
        if type(self).begin_block is not Sampler.begin_block:
            self.begin_block(state, rows[opening])

    def process_logits(self, state: DecodeState, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Transform the (B', Q, V) logits before scoring (may edit them in place). Default: none."""
        return logits

    def key_end(self, state: DecodeState, rows: torch.Tensor) -> torch.Tensor | None:
        """(B',) long: the column from which this step's forward hides the keys of each row, as if
        the canvas ended there (SlowFast's truncated forwards); None (the default): none hidden."""
        return None

    def shadow_columns(self, state: DecodeState, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For a `shadow_block` sampler: the canvas columns (B', K) long whose shadow copies this
        step's forward appends, and which entries are real (B', K) bool (the others pad a row).
        A copy holds the mask token at its column's rotary position and attends to every key of
        the canvas but its own column, and to the other real copies; no canvas column attends to
        a copy, so the canvas logits are those of a forward without copies."""
        raise NotImplementedError(f"sampler {self.name!r} declares shadow_block but no shadow_columns")

    def read_shadow(self, state: DecodeState, rows: torch.Tensor, columns: torch.Tensor, valid: torch.Tensor,
                    logits: torch.Tensor) -> None:
        """The logits (B', K, V) of this step's shadow copies (the mask token's suppressed), before
        `step` and before the step's commits."""

    def draft_canvases(self, state: DecodeState, rows: torch.Tensor) -> torch.Tensor:
        """For a `drafts` sampler: (B', D, L) long, the D canvases this step's forward runs beside
        each row's canvas, each as a batch row of its own (its padding, rotary positions and key
        mask those of the row), scored at the row's scored columns."""
        raise NotImplementedError(f"sampler {self.name!r} declares drafts but no draft_canvases")

    def drafting(self, state: DecodeState, rows: torch.Tensor) -> torch.Tensor:
        """For a `drafts` sampler: a 0-dim bool tensor, whether some row has a draft worth running
        this step (read with the step's one host read; False: the forward runs the canvases alone).
        Default: always."""
        return torch.ones((), dtype=torch.bool, device=state.x.device)

    def read_drafts(self, state: DecodeState, rows: torch.Tensor, scores: TokenScores,
                    usable: torch.Tensor | None = None) -> None:
        """The `TokenScores` (B' * D, Q) of this step's drafts, row-major (row b's drafts first),
        at the row's scored columns, before `step` and before the step's commits (not called at a
        step that `drafting` says has none to run). `usable` (B',)
        bool, or None for every row: the rows whose drafts score what their canvases would score
        as canvases (False: a stored column the drafts recompute differs from the one a later step
        would read)."""

    def forward_allowance(self, state: DecodeState) -> int:
        """Forwards beyond one per generated token that the default forward cap grants (a sampler
        that keeps full blocks open to edit them). Default: 0."""
        return 0

    def planned_widths(self, state: DecodeState) -> list[int] | None:
        """For a fixed schedule: the most columns any row scores at each step of the request, or
        an upper bound of it, known before the first step (the loop then reads nothing until the
        schedule is done). Called after `setup`. Default: None (the loop reads it every step)."""
        return None

    def block_length_for(self, source: str | None) -> int | None:
        """The block length a request decodes with when it gives none, for the checkpoint folder
        `source` (when it divides gen_length); None (the default): the whole generation region."""
        return None

    def logits_needed(self, state: DecodeState) -> bool:
        """Whether this request's steps pass the (B', Q, V) logits in `scores.logits`.
        Default: `needs_logits`."""
        return self.needs_logits

    @property
    def edits_logits(self) -> bool:
        """Whether `process_logits` may change the logits (then the loop scores full logits rather
        than fusing the LM head into the scoring). Default: whether a subclass overrides it."""
        return type(self).process_logits is not Sampler.process_logits

    def score_mask(self, state: DecodeState, rows: torch.Tensor) -> torch.Tensor:
        """(B', L) bool: the columns of rows `rows` that need scores this step.
        Default: the masked positions of the active block."""
        return state.masked_in_block(rows)

    def step(self, state: DecodeState, rows: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
             scores: TokenScores) -> Decision:
        """Decide the commits of one step for the rows `rows` (B',).

        positions/valid: (B', Q) the scored columns (padding entries have valid False);
        scores: TokenScores at those columns.
        """
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------------------------
    @classmethod
    def describe(cls) -> str:
        """The first paragraph of the class docstring, on one line."""
        first = (cls.__doc__ or "").strip().split("\n\n", 1)[0]
        return " ".join(line.strip() for line in first.splitlines())

    def arguments(self) -> dict[str, Any]:
        """The constructor arguments of this instance (logged with every result)."""
        return dict(getattr(self, "_args", {}))

    def resolved_arguments(self, state: DecodeState) -> dict[str, Any]:
        """The arguments a request ran with: `arguments()`, with what `setup` resolved for it from the
        model (`state.extra["resolved_arguments"]`, e.g. a filter shipped in its checkpoint folder)."""
        return {**self.arguments(), **state.extra.get("resolved_arguments", {})}


def top_k_mask(score: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, Q) bool selecting the k[b] highest scores of each row; ties go to the lower index.

    torch.topk's tie order is backend-defined; a stable descending sort makes it deterministic.
    """
    order = torch.sort(score, dim=1, descending=True, stable=True).indices   # (B, Q)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(score.shape[1], device=score.device).expand_as(order))
    return rank < k[:, None]


def column_index(rows: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, first, spare: int):
    """(at, cols), each (B', Q) long, indexing a sampler's per-row store of columns (B, spare + 1, ...)
    at the scored columns: column `positions - first` of row `rows`, and the spare column `spare`
    for padding entries, whose writes land there and are never read."""
    cols = torch.where(valid, positions - first, spare)
    return rows[:, None].expand_as(cols), cols


def sum_p_log_p(probs: torch.Tensor, floor: float) -> torch.Tensor:
    """sum p log(p + floor) over the last dimension, in the probabilities' dtype (the negative
    entropy the references compute); a term of p = 0 counts 0 (in float16 a floor of 1e-8 or less
    rounds to 0, and 0 log 0 would be NaN)."""
    return torch.where(probs > 0, probs * torch.log(probs + floor), 0).sum(-1)


def check_number(name: str, value, *, low=None, high=None, integer=False, allow_none=False,
                 low_open=False, sampler: str = ""):
    """Validate one sampler argument; the error names the sampler, the argument and the range."""
    where = f"sampler {sampler!r}: " if sampler else ""
    if value is None and allow_none:
        return None
    value = plain_number(value)
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ValueError(f"{where}{name} must be {kind}, got {value!r}")
    if value != value:  # NaN
        raise ValueError(f"{where}{name} must be {kind}, got NaN")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{where}{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is None and integer:
        high = MAX_INTEGER_ARGUMENT
    if high is not None and value > high:
        raise ValueError(f"{where}{name} must be <= {high}, got {value!r}")
    return value


def loaded_once(cache: dict, path, load):
    """`load(path)`, read once per file and kept in `cache` (a sampler's files shipped with models)."""
    if str(path) not in cache:
        cache[str(path)] = load(path)
    return cache[str(path)]


def missing_from_checkpoint(sampler: str, source: str | None, what: str, file_name: str, remedy: str) -> ValueError:
    """The error of a sampler whose file (a filter, a table) neither its arguments give nor the
    model's checkpoint folder holds."""
    where = f"model {source!r}" if source else "this model"
    return ValueError(f"sampler {sampler!r} needs {what} and {where} ships none (no {file_name} in its checkpoint "
                      f"folder): {remedy}")


def block_region(state: DecodeState) -> tuple[str, str]:
    """How error messages name the region a block schedule covers, and a note when it runs past
    gen_length (to the end of a block-causal model's attention blocks)."""
    G = state.gen_length
    if state.answer_length == G:
        return f"gen_length {G}", ""
    return f"{G} columns", f"; gen_length {state.answer_length} runs on to the end of the model's attention blocks"


def steps_per_block(name: str, state: DecodeState, *, at_least: int = 1) -> int:
    """The steps each block gets when the request's steps are split evenly over gen_length /
    block_length whole blocks (LLaDA's rule), checked: gen_length a multiple of block_length, steps
    a multiple of the number of blocks, and at least `at_least` of them per block."""
    G, K, steps = state.gen_length, state.block_length, state.steps
    if G % K:
        raise ValueError(f"sampler {name!r}: gen_length {G} must be a multiple of block_length {K}")
    n_blocks = G // K
    region, note = block_region(state)
    if steps % n_blocks:
        raise ValueError(f"sampler {name!r}: steps {steps} must be a multiple of the number of blocks "
                         f"{n_blocks} ({region} / block_length {K}{note})")
    if steps < at_least * n_blocks:
        raise ValueError(f"sampler {name!r}: steps {steps} give {steps // n_blocks} per block over the {n_blocks} "
                         f"blocks ({region} / block_length {K}{note}); it needs at least {at_least} per block")
    return steps // n_blocks
