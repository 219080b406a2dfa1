"""The denoising loop. It knows nothing about any particular sampler or cache policy:

    prompts -> DecodeState (left-padded prompts + gen_length masks)
    until every row is finished or the forward cap is hit:
        rows      = unfinished rows (finished rows cost nothing)
        positions = the columns the sampler wants scored
        plan      = cache_policy.needs(state, rows, scored, key_end) which columns to recompute
        logits    = model(x[rows], positions, plan)      only at the scored columns
        scores    = token_scores(logits)
        decision  = sampler.step(state, rows, positions, scores)
        apply the decision, enforcing the invariants
"""
from __future__ import annotations

import dataclasses
import numbers
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import samplers
from .cache import CachePolicy, get_policy
from .config import GenerationConfig, ModelConfig
from .dpad import Dropout, SuffixDropout, compact, compact_width
from .kernels import token_scores
from .kernels.head_scoring import head_scores, head_scoring_impl, suppression_bias
from .kernels.scoring import TokenScores
from .models.transformer import hidden_source, source_columns
from .samplers import Sampler
from .state import DecodeState, Decision, SpecialIds, add_at, cover_columns, select_positions

_SCORE_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _score_dtype(name: str, model) -> torch.dtype:
    return model.dtype if name == "logits" else _SCORE_DTYPES[name]


DEFAULT_SAMPLERS = {"llada": "low_confidence", "dream": "entropy", "llada-moe": "low_confidence", "llada2": "llada2"}


@dataclass
class GenerationOutput:
    """Result of `generate`.

    sequences:  (B, Lp + G) the final canvases, left-padded prompts included.
    generated:  (B, G) the generated region.
    texts:      decoded answers, cut at the first EOS/EOT (None without a tokenizer).
    nfe:        forwards per row: the steps it took part in (a row stops costing forwards once
                finished).
    forwards:   batched steps run, each one forward of its rows (a ragged batch may run a step as
                one model call per width group).
    steps:      denoising steps taken (equal to forwards here).
    tokens_per_forward: generated positions committed per forward, per row.
    answer_lengths: tokens before the first EOS/EOT, per row.
    seconds:    wall-clock time of the loop.
    hit_cap:    rows whose remaining masks were flushed at the forward cap.
    trace:      (B, G) step at which each generated position was committed, or last edited (when
                asked for); a position masked again and committed later holds the later step.
    edits:      tokens rewritten per row by an editing sampler (LLaDA2.1's `llada21`).
    remasks:    written tokens masked again per row (`wino`, `remdm`, `rcr`).
    cache, cache_args: the cache policy and its arguments (model-dependent defaults resolved).
    block_length: the blocks it decoded in (resolved: the model's attention blocks, a Learn2PD
                filter's; gen_length for a sampler without blocks).
    """

    sequences: torch.Tensor
    generated: torch.Tensor
    texts: list[str] | None
    nfe: list[int]
    forwards: int
    steps: int
    tokens_per_forward: list[float]
    answer_lengths: list[int]
    seconds: float
    hit_cap: list[bool]
    sampler: str
    sampler_args: dict[str, Any]
    trace: torch.Tensor | None = None
    edits: list[int] | None = None
    remasks: list[int] | None = None
    cache: str = "none"
    cache_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    block_length: int | None = None

    @property
    def mean_tokens_per_forward(self) -> float:
        return sum(self.tokens_per_forward) / max(len(self.tokens_per_forward), 1)

    @property
    def tokens_per_second(self) -> float:
        """Answer tokens (up to the first EOS/EOT) per second, the Fast-dLLM throughput definition."""
        return sum(self.answer_lengths) / self.seconds if self.seconds > 0 else float("inf")


# -- prompt handling -------------------------------------------------------------------------
def special_ids(model) -> SpecialIds:
    c = model.config
    return SpecialIds(mask=c.mask_token_id, eos=c.eos_token_id, pad=c.pad_token_id, eot=c.eot_token_id,
                      bos=c.bos_token_id)


def encode_prompts(tokenizer, prompts: Sequence[str], chat: bool | None) -> list[list[int]]:
    """Token ids of string prompts; with chat, through the tokenizer's chat template as the
    references do (LLaDA: render, then tokenize without adding special tokens)."""
    if tokenizer is None:
        raise ValueError("string prompts need a tokenizer; pass token ids (input_ids) otherwise")
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat and not has_template:
        raise ValueError("chat=True but the tokenizer has no chat template; pass chat=False (--no-chat) for raw "
                         "prompts")
    use_chat = has_template if chat is None else chat
    check_texts(prompts)
    out = []
    for p in prompts:
        if use_chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                 tokenize=False)
            out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        else:
            out.append(list(tokenizer(p)["input_ids"]))
    return out


def check_texts(prompts: Sequence[str]) -> None:
    """A ValueError naming the first prompt that is not a string of valid Unicode (a command-line
    argument that was not UTF-8 arrives with lone surrogates)."""
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ValueError(f"prompts must all be strings, got {type(p).__name__}")
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"prompt {i + 1} is not valid UTF-8 text ({p!r:.60}: {err.reason} at character "
                             f"{err.start})") from None


def _as_rows(prompts, attention_mask) -> list[list[int]]:
    if attention_mask is not None and not isinstance(prompts, torch.Tensor):
        raise ValueError("attention_mask marks the padding of input_ids given as a tensor; prompts given as "
                         "lists of token ids carry their own lengths (leave attention_mask out)")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a tensor of input_ids' shape, got {attention_mask!r:.80} "
                         f"({type(attention_mask).__name__})")
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            prompts = prompts[None]
            if attention_mask is not None and attention_mask.dim() == 1:
                attention_mask = attention_mask[None]
        if prompts.dim() != 2:
            raise ValueError(f"input_ids must be 1-D or 2-D, got shape {tuple(prompts.shape)}")
        if prompts.dtype == torch.bool or prompts.is_floating_point() or prompts.is_complex():
            raise ValueError(f"input_ids must hold integer token ids, got dtype {prompts.dtype}")
        if attention_mask is None:
            return [row.tolist() for row in prompts]
        if attention_mask.shape != prompts.shape:
            raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                             f"{tuple(prompts.shape)}")
        other = ((attention_mask != 0) & (attention_mask != 1)).nonzero()
        if len(other):
            row, col = other[0].tolist()
            raise ValueError(f"attention_mask must hold only 1 (a token) and 0 (padding), got "
                             f"{attention_mask[row, col].item()!r} at row {row}, column {col}")
        return [row[m.bool()].tolist() for row, m in zip(prompts, attention_mask)]
    rows = list(prompts)
    if rows and _token_id(rows[0]) is not None:          # one prompt given as its token ids
        rows = [rows]
    return [_id_row(r, b) for b, r in enumerate(rows)]


def _token_id(value) -> int | None:
    """An integer token id (a Python, numpy or 0-dim torch integer; not a bool) as an int, else None."""
    if isinstance(value, torch.Tensor):
        if value.dim() or value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            return None
        return int(value)
    if isinstance(value, (bool, float)) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _id_row(row, b: int) -> list[int]:
    """Prompt `b` given as token ids (a list or tuple, or a 1-D integer tensor) as a list of ints."""
    if isinstance(row, torch.Tensor) and row.dim() == 1:
        if row.dtype == torch.bool or row.is_floating_point() or row.is_complex():
            raise ValueError(f"prompt {b} must hold integer token ids, got a tensor of dtype {row.dtype}")
        return row.tolist()              # one read, not one per token
    if not isinstance(row, (list, tuple)):
        got = f"a tensor of shape {tuple(row.shape)}" if isinstance(row, torch.Tensor) else \
            f"{row!r:.60} ({type(row).__name__})"
        raise ValueError(f"prompt {b} must be a list of token ids (ints) or a 1-D integer tensor, got {got}")
    ids = [_token_id(t) for t in row]
    bad = next((i for i, t in enumerate(ids) if t is None), None)
    if bad is not None:
        raise ValueError(f"prompt {b}: token {bad} is {row[bad]!r:.40} ({type(row[bad]).__name__}); token ids must "
                         f"be integers")
    return ids


def prompt_problem(ids: list[int], config: ModelConfig, mask_id: int) -> str | None:
    """What makes a prompt's token ids undecodable by a model of `config`, worded to follow
    "prompt ...", or None: an id outside the vocabulary, the mask token (a prompt is given, not
    decoded), or no token at all for a model whose logits are shifted (Dream)."""
    bad = [t for t in ids if not 0 <= t < config.vocab_size]
    if bad:
        return f"holds token id {bad[0]} outside the vocabulary [0, {config.vocab_size})"
    if mask_id in ids:
        return (f"contains the mask token id {mask_id} at position {ids.index(mask_id)}; masks inside prompts are "
                f"not allowed (remove it, or mask the generation region only)")
    if config.logit_shift and not ids:
        return f"is empty; {config.family} predicts token i from position i-1 and needs at least one prompt token"
    return None


def build_state(model, rows: list[list[int]], cfg: GenerationConfig, block_length: int) -> DecodeState:
    mc = model.config
    ids = special_ids(model)
    if not rows:
        raise ValueError("no prompts given")
    for b, r in enumerate(rows):
        problem = prompt_problem(r, mc, ids.mask)
        if problem:
            raise ValueError(f"prompt {b} {problem}")
    lp = max(len(r) for r in rows)
    if lp + cfg.gen_length > mc.max_seq_len:
        raise ValueError(f"prompt length {lp} + gen_length {cfg.gen_length} = {lp + cfg.gen_length} exceeds the "
                         f"model's maximum sequence length {mc.max_seq_len}")
    tails = _block_tails(rows, cfg.gen_length, mc.attention_block)
    longest_tail = max(tails)
    B, L = len(rows), lp + cfg.gen_length + longest_tail
    x = torch.full((B, L), ids.mask, dtype=torch.long)
    pad_len = torch.tensor([lp - len(r) for r in rows], dtype=torch.long)
    for b, r in enumerate(rows):
        x[b, :lp - len(r)] = ids.pad
        x[b, lp - len(r):lp] = torch.tensor(r, dtype=torch.long)
    device = model.device
    gen = None
    if cfg.seed is not None:
        gen = torch.Generator(device=device).manual_seed(cfg.seed)
    state = DecodeState(x=x.to(device), gen_start=lp, gen_length=L - lp, block_length=block_length,
                        pad_len=pad_len.to(device), padded=lp > min(len(r) for r in rows), ids=ids,
                        temperature=float(cfg.temperature), generator=gen,
                        score_dtype=_score_dtype(cfg.score_dtype, model), steps=cfg.resolved_steps,
                        family=mc.family, aligned_blocks=mc.attention_block is not None, vocab_size=mc.vocab_size,
                        source=model_source(model),
                        answer_length=cfg.gen_length)
    short = [b for b, tail in enumerate(tails) if tail < longest_tail]
    if short:      # a row's region ends with its last attention block
        state.truncate(torch.tensor(short, device=device),
                       torch.tensor([lp + cfg.gen_length + tails[b] - 1 for b in short], device=device))
    return state


def _block_tails(rows: list[list[int]], gen_length: int, attention_block: int | None) -> list[int]:
    """Per row, the columns past the answer to the end of its last attention block (0 without
    attention blocks): the reference pads its canvas to whole blocks and decodes those columns too."""
    if attention_block is None:
        return [0] * len(rows)
    return [-(len(r) + gen_length) % attention_block for r in rows]


def with_instances(cfg: GenerationConfig) -> GenerationConfig:
    """`cfg` with a sampler and a cache policy given by name replaced by their instances, built
    from `sampler_kwargs` / `cache_kwargs`: unknown names and bad arguments raise ValueError here,
    before any model is loaded. A sampler left None stays None (it is chosen per model)."""
    changes: dict[str, Any] = {}
    if isinstance(cfg.sampler, str):
        changes.update(sampler=samplers.get(cfg.sampler, **cfg.sampler_kwargs), sampler_kwargs={})
    elif isinstance(cfg.sampler, Sampler) and cfg.sampler_kwargs:
        raise ValueError("sampler_kwargs are only used with a sampler given by name, not an instance")
    elif cfg.sampler is not None and not isinstance(cfg.sampler, Sampler):
        raise ValueError(f"sampler must be a registered name or a Sampler instance, got {type(cfg.sampler).__name__}")
    if not isinstance(cfg.cache, CachePolicy) or cfg.cache_kwargs:
        changes.update(cache=get_policy(cfg.cache, **cfg.cache_kwargs), cache_kwargs={})
    return cfg.replace(**changes) if changes else cfg


def resolve_sampler(model, cfg: GenerationConfig) -> Sampler:
    """The request's sampler. Without one: the `alg` of the checkpoint's generation_config.json
    when it names a registered sampler (Dream's published default is `origin`, with the generation
    config's values of the arguments it takes: `eps`, `top_p`, `top_k`), else the family's
    reference rule (`DEFAULT_SAMPLERS`: LLaDA and LLaDA-MoE `low_confidence`, Dream `entropy`,
    LLaDA2 `llada2`)."""
    cfg = with_instances(cfg)
    if cfg.sampler is not None:
        return cfg.sampler
    defaults = getattr(model, "generation_defaults", None) or {}
    alg = defaults.get("alg")
    if isinstance(alg, str) and alg in samplers.available():
        accepted = samplers.signature(alg)
        kwargs = {k: v for k, v in defaults.items() if k in accepted and v is not None} | cfg.sampler_kwargs
        return samplers.get(alg, **kwargs)
    return samplers.get(DEFAULT_SAMPLERS[model.config.family], **cfg.sampler_kwargs)


@dataclass(frozen=True)
class Request:
    """A GenerationConfig resolved against a model: the sampler and cache policy instances the
    decode uses, and the block length it runs (the whole generation for samplers without blocks)."""

    config: GenerationConfig
    sampler: Sampler
    policy: CachePolicy
    block_length: int


def model_source(model) -> str | None:
    """Where the model was loaded from: its checkpoint folder, else the name it was loaded by."""
    return getattr(model, "checkpoint_dir", None) or getattr(model, "name_or_path", None)


def checkpoint_gen_length(model) -> int | None:
    """The generation length the checkpoint's generation_config.json names (`max_new_tokens`, as
    Hugging Face's `generate` reads it; a dllm-trained model names the canvas it was trained on),
    or None. Requests that give no `gen_length` decode with it."""
    length = (getattr(model, "generation_defaults", None) or {}).get("max_new_tokens")
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        return length
    return None


def model_lengths(model, cfg: GenerationConfig) -> GenerationConfig:
    """`cfg` with the lengths `model` runs it at: a block_length equal to a block-causal model's
    attention block dropped (the model's own blocks, whatever gen_length), a gen_length left None
    fixed to the checkpoint's (`checkpoint_gen_length`, else `DEFAULT_GEN_LENGTH`), and the two
    checked together (`GenerationConfig.for_length`)."""
    block = model.config.attention_block
    if block is not None and cfg.block_length == block:
        cfg = cfg.replace(block_length=None)
    return cfg.for_length(checkpoint_gen_length(model))


def resolve_request(model, cfg: GenerationConfig) -> Request:
    """Resolve `cfg` once for `model`: its lengths (`model_lengths`), sampler and cache policy."""
    block = model.config.attention_block
    cfg = with_instances(cfg)
    sampler = resolve_sampler(model, cfg)
    cfg = model_lengths(model, cfg.replace(sampler=sampler, sampler_kwargs={}))
    if block is not None:
        if cfg.suffix_dropout is not None:
            raise ValueError(f"suffix_dropout drops masks after the active block from the attention of a "
                             f"bidirectional model; {model.config.family} attends block-causally and never sees "
                             f"them: leave suffix_dropout out")
        return _block_causal_request(model, cfg, sampler)
    if not sampler.uses_blocks and cfg.block_length not in (None, cfg.gen_length):
        warnings.warn(f"sampler {sampler.name!r} decodes the whole generation region at once; "
                      f"block_length {cfg.block_length} is ignored", stacklevel=3)
    if not sampler.uses_blocks and cfg.suffix_dropout is not None:
        warnings.warn(f"sampler {sampler.name!r} decodes the whole generation region as one block, after which "
                      f"no column is left to drop; suffix_dropout changes nothing", stacklevel=3)
    _warn_unused_schedule(cfg, sampler, stacklevel=3)
    own = sampler.block_length_for(model_source(model)) if sampler.uses_blocks and cfg.block_length is None else None
    if own is not None and cfg.gen_length % own == 0:
        cfg = cfg.replace(block_length=own)
    block_length = cfg.resolved_block_length if sampler.uses_blocks else cfg.gen_length
    return Request(cfg.replace(sampler=sampler), sampler, cfg.cache, block_length)


def _warn_unused_schedule(cfg: GenerationConfig, sampler: Sampler, stacklevel: int) -> None:
    """A warning naming `steps` / `tokens_per_step` when the sampler decides its own steps, shown
    at the line `stacklevel` frames up from the caller."""
    if sampler.uses_steps:
        return
    for name in ("steps", "tokens_per_step"):
        if getattr(cfg, name) is not None:
            warnings.warn(f"sampler {sampler.name!r} decides its own number of steps; {name} {getattr(cfg, name)} "
                          f"is ignored", stacklevel=stacklevel + 1)


def _block_causal_request(model, cfg: GenerationConfig, sampler: Sampler) -> Request:
    """A block-causal model (LLaDA2) decodes in its attention blocks: a block sampler, and a block
    length equal to the model's (the decode's blocks are aligned with them, `DecodeState.aligned_blocks`)."""
    block = model.config.attention_block
    if not sampler.uses_blocks:
        raise ValueError(f"sampler {sampler.name!r} decodes the whole generation region at once, but "
                         f"{model.config.family} attends block-causally in blocks of {block}; use a block sampler "
                         f"(llada2, llada21, threshold, ...)")
    length = block if cfg.block_length is None else cfg.block_length
    if length != block:
        use = (f"leave it out (it is then {block}, whatever gen_length)" if cfg.gen_length < block else
               f"use block_length={block} or leave it out (it is then {block}, whatever gen_length)")
        raise ValueError(f"block_length {cfg.block_length} differs from the {block}-column attention blocks of "
                         f"{model.config.family}; {use}")
    _warn_unused_schedule(cfg, sampler, stacklevel=4)
    return Request(cfg.replace(sampler=sampler, block_length=block), sampler, cfg.cache, block)


# -- the loop ---------------------------------------------------------------------------------
def _stale_blocks(state: DecodeState, rows: torch.Tensor) -> torch.Tensor:
    """(B',) bool: unfinished rows whose active block has no mask and is not held open by the
    sampler (`Decision.hold`); `_open_blocks` moves them."""
    return ~(state.masked_in_block(rows).any(1) | state.finished[rows] | state.block_hold[rows])


def _open_blocks(state: DecodeState, sampler, rows: torch.Tensor, dropout: Dropout | None = None,
                 eos_stop: bool = False) -> None:
    """Move the rows whose active block has no mask left to their next block (or finish them), for
    every row at once without reading the device. A row whose next block has no mask either is
    moved again at the loop's next read (`_stale_blocks`). `dropout`: the decode's suffix dropout,
    which draws the opened blocks' kept suffixes; `eos_stop`: finish the rows whose generation so
    far holds an EOS or EOT, their later masks filled with EOS (`GenerationConfig.eos_early_stop`)."""
    done = _stale_blocks(state, rows)                                              # (B',)
    end, row_end = state.block_end[rows], state.row_end[rows]
    if eos_stop:
        stop = done & state.holds_stop_id(rows, end)
        state.fill_eos_after(rows, stop, end)
        row_end = torch.where(stop, end, row_end)      # nothing left to open
    opening = done & (end < row_end)            # a done row's next block starts at its block's end
    state.block_start[rows] = torch.where(done, end, state.block_start[rows])
    state.block_end[rows] = torch.where(opening, torch.minimum(end + state.block_length, row_end), end)
    state.step_in_block[rows] = state.step_in_block[rows].masked_fill(done, 0)
    state.finished[rows] = state.finished[rows] | (done ^ opening)
    sampler.begin_blocks(state, rows, opening)
    if dropout is not None:
        dropout.begin_blocks(state, rows, opening)


def _apply(state: DecodeState, sampler, rows, positions, valid, scores, dec: Decision, flush: bool) -> torch.Tensor:
    """Write the allowed commits of `dec`; with `flush`, returns (B',) bool, the rows whose masks
    the cap flushed (None otherwise)."""
    cols_masked = state.is_mask[rows].gather(1, positions)                        # (B', Q)
    # The sampler's tokens where it committed; commits the loop forces (progress, cap flush) take
    # the scored candidate.
    tokens = scores.token if dec.tokens is None else torch.where(dec.commit, dec.tokens, scores.token)
    if dec.block_end is not None:  # a moved block end (AdaBlock) already bounds this step's commits
        state.block_end[rows] = torch.minimum(dec.block_end, state.row_end[rows])
    in_block = state.in_block(rows).gather(1, positions)                          # (B', Q)
    writable = state.writable(rows).gather(1, positions)
    allowed = valid & cols_masked & writable
    commit = dec.commit & allowed
    if sampler.uses_blocks and sampler.reaches_back:    # it also commits before its block
        commit &= positions < state.block_end[rows, None]
    elif sampler.uses_blocks:
        commit &= in_block
    if dec.fill_all is not None:
        commit |= dec.fill_all[:, None] & allowed
    forced = None
    if flush is True:
        forced = (allowed & ~commit).any(1)
        commit = allowed
    elif flush is not False:  # (B',) the rows at their cap fill every allowed position
        forced = flush & (allowed & ~commit).any(1)
        commit = torch.where(flush[:, None], allowed, commit)
    if flush is not True and not sampler.fixed_schedule:
        # Progress: a row that commits nothing commits its most confident candidate (worked out
        # for every row, so that no host sync decides whether any row is stuck).
        candidates = allowed & in_block
        stuck = ~commit.any(1) & candidates.any(1)
        best = scores.prob.masked_fill(~candidates, float("-inf")).argmax(1, keepdim=True)   # (B', 1)
        commit |= stuck[:, None] & (state.columns()[:commit.shape[1]] == best)
    _write_commits(state, rows, positions, commit, tokens)
    if dec.remask is not None and sampler.remasks and flush is not True:
        reach = (state.columns()[None, :] < state.block_end[rows, None] if sampler.reaches_back
                 else state.in_block(rows))
        keep = ~state.is_mask[rows] & reach & state.in_generation()[None, :]
        _remask(state, rows, dec.remask & keep & (flush is False or ~flush[:, None]))
    if dec.edit is not None:
        _write_edits(state, rows, positions, dec.edit & valid & ~cols_masked & in_block & writable, tokens)
    if dec.hold is None or flush is True:
        state.block_hold[rows] = False
    else:
        state.block_hold[rows] = dec.hold if flush is False else dec.hold & ~flush
    if dec.truncate_at is not None:  # after the commits: a cut may keep a position committed just now
        state.truncate(rows, dec.truncate_at)
    return forced


def _write_commits(state: DecodeState, rows, positions, commit, tokens) -> None:
    """Write `tokens` (B', Q) where `commit`, and the step, without reading the device: each row's
    changes are added at its columns, zero where nothing is committed, so the padding entries
    (repeated columns, never committed) change nothing."""
    x_rows = state.x[rows]                                                        # (B', L)
    state.x[rows] = x_rows.scatter_add(1, positions, (tokens - x_rows.gather(1, positions)) * commit)
    steps = state.commit_step[rows]                                               # (B', G)
    cols = (positions - state.gen_start).clamp(min=0)
    state.commit_step[rows] = steps.scatter_add(1, cols, (state.global_step - steps.gather(1, cols)) * commit)


def _remask(state: DecodeState, rows, remask: torch.Tensor) -> None:
    """Mask the canvas columns `remask` (B', L) of rows `rows` again; they count as uncommitted."""
    state.x[rows] = state.x[rows].masked_fill(remask, state.ids.mask)
    state.remasks[rows] += remask.sum(1)
    gen = remask[:, state.gen_start:state.gen_end]
    state.commit_step[rows] = state.commit_step[rows].masked_fill(gen, -1)


def _write_edits(state: DecodeState, rows, positions, edit, tokens) -> None:
    """Rewrite written positions where `edit` (B', Q) with `tokens`, count them per row, and record
    the step in the trace (the step of a position's last write)."""
    changed = edit & (tokens != state.x[rows].gather(1, positions))
    _write_commits(state, rows, positions, changed, tokens)
    state.edits[rows] += changed.sum(1)


def _narrow_rows(counts: torch.Tensor, width):
    """(B',) columns each row recomputes, padded to `width` -> the rows that need at most half of
    it (B',) bool, how many there are and the most columns one of them needs (0-dim tensors)."""
    narrow = counts <= width // 2
    return narrow, narrow.sum(), counts.masked_fill(~narrow, 0).max()


def _width_groups(plan: torch.Tensor, sizes: tuple[int, int] | None = None) -> list[tuple[torch.Tensor, int]] | None:
    """Split the rows of a cache plan (B', P) into a wide and a narrow group, each with the width
    its own forward needs, when one forward would make the narrow rows compute at most half of
    the width they are padded to; None to run the rows together.

    A plan lists each row's columns in increasing order and pads a shorter row by repeating its
    first column, so a row needs 1 + (entries after the first that differ from it) columns. In a
    ragged batch the rows reach their block starts (full refreshes) at different steps; without
    the split every such step costs every row the whole canvas. `sizes`: the number of narrow
    rows and their width (`_narrow_rows`), when the caller has read them already."""
    B, P = plan.shape
    if B < 2:
        return None
    counts = 1 + (plan[:, 1:] != plan[:, :1]).sum(1)                  # (B',) columns each row needs
    narrow, n_narrow, narrow_width = _narrow_rows(counts, P)
    n_narrow, narrow_width = sizes if sizes is not None else torch.stack([n_narrow, narrow_width]).tolist()
    if n_narrow in (0, B):
        return None
    return [(narrow.logical_not().nonzero(as_tuple=True)[0], P), (narrow.nonzero(as_tuple=True)[0], narrow_width)]


def _key_mask(state: DecodeState, rows, width: int, padded: bool, key_end,
              visible: torch.Tensor | None = None) -> torch.Tensor | None:
    """(B', W) bool, the keys the rows' forward attends to (padding, columns from `key_end` and
    columns not `visible` (B', L) hidden), or None when every key counts."""
    key_valid = state.key_valid[rows, :width] if padded else None
    for shown in (None if key_end is None else state.columns()[None, :width] < key_end[:, None],
                  None if visible is None else visible[:, :width]):
        if shown is not None:
            key_valid = shown if key_valid is None else key_valid & shown
    return key_valid


def _forward(model, state: DecodeState, rows, positions, plan, padded: bool, kv, cfg_scale: float,
             width: int | None = None, logits_from: torch.Tensor | None = None,
             group_sizes: tuple[int, int] | None = None, hidden_only: bool = False,
             key_end: torch.Tensor | None = None, visible: torch.Tensor | None = None, kept_width: int = 0):
    """Logits (B', Q, V) at `positions` for the rows `rows`, on the canvas columns [0, width)
    (truncated rows need no more); keys at columns >= `key_end` (B',) are hidden from this forward
    when given (`Sampler.key_end`), and so are the columns not `visible` (B', L) (suffix dropout):
    without a cache the forward then runs on the visible columns alone, `kept_width` of them per
    row (`dllm.dpad.compact`); with classifier-free guidance the prompt-masked copy runs in the
    same batched forward."""
    width = state.length if width is None else width
    x = state.x[rows, :width]                                                       # (B', W)
    pos_ids = state.position_ids[rows, :width]
    key_valid = _key_mask(state, rows, width, padded, key_end, visible)
    if visible is not None and kv is None:
        x, pos_ids, key_valid, positions = compact(visible[:, :width], kept_width, x, pos_ids, key_valid, positions)
    if kv is not None and width < kv.length:
        kv = kv.narrow(width)
    if cfg_scale <= 0:
        groups = _width_groups(plan, group_sizes) if kv is not None and plan is not None else None
        if groups is None:
            return model(x, positions, positions=plan, position_ids=pos_ids, key_valid=key_valid, cache=kv,
                         rows=rows if kv is not None else None, logits_from=logits_from, hidden_only=hidden_only)
        logits = None
        for g, w in groups:  # rows refreshing every column apart from rows recomputing a few
            part = model(x[g], positions[g], positions=plan[g, :w], position_ids=pos_ids[g],
                         key_valid=None if key_valid is None else key_valid[g], cache=kv, rows=rows[g],
                         logits_from=None if logits_from is None else logits_from[g], hidden_only=hidden_only)
            if logits is None:
                logits = part.new_empty(len(rows), *part.shape[1:])
            logits[g] = part
        return logits
    uncond = x.clone()
    uncond[:, :state.gen_start] = state.ids.mask  # the whole prompt region, padding included, as LLaDA does
    two = lambda t: None if t is None else torch.cat([t, t])  # noqa: E731
    both = model(torch.cat([x, uncond]), two(positions), positions=two(plan), position_ids=two(pos_ids),
                 key_valid=two(key_valid))
    cond, unc = both.chunk(2)
    return unc + (cfg_scale + 1) * (cond - unc)


@dataclass
class _Step:
    """What one step decides before its read: the scored columns and the cache policy's needs."""

    score_mask: torch.Tensor               # (B', L) bool
    row_end: torch.Tensor                  # (B',)
    needs: Any = None                      # dllm.cache.Needs, or None without stored K/V
    recompute: torch.Tensor | None = None  # (B', L) bool: the needs' columns plus the logit sources
    key_end: torch.Tensor | None = None    # (B',) keys hidden from this column on (`Sampler.key_end`)
    visible: torch.Tensor | None = None    # (B', L) bool: the columns suffix dropout keeps (`dllm.dpad`)
    drafting: torch.Tensor | None = None   # 0-dim bool: some row has drafts to run (`Sampler.drafting`)


def _prepare(model, state: DecodeState, sampler, policy, rows, flush: bool, dropout: Dropout | None = None) -> _Step:
    score_mask = sampler.score_mask(state, rows)
    if flush is True:  # last allowed forward: score every remaining mask so it can be filled
        score_mask = score_mask | state.masked_in_generation(rows)
    elif flush is not False:  # (B',) the rows at their cap
        score_mask = score_mask | (flush[:, None] & state.masked_in_generation(rows))
    # Columns after a truncation cut are gone: never scored, and the forward stops at the longest kept row.
    row_end = state.row_end[rows]
    score_mask = score_mask & state.in_reach(rows)
    key_end = sampler.key_end(state, rows)
    step = _Step(score_mask, row_end, policy.needs(state, rows, score_mask, key_end), key_end=key_end,
                 drafting=sampler.drafting(state, rows) if sampler.drafts else None)
    if step.needs is None and dropout is None:
        return step
    # The forward also computes the columns whose hidden states give the scored logits; a row
    # that scores nothing reads column 0.
    nothing = ~score_mask.any(1, keepdim=True) & state.first_column()
    sources = source_columns(score_mask | nothing, model.config.logit_shift)
    if dropout is not None:
        step.visible = dropout.visible(state, rows, score_mask, sources)
    if step.needs is not None:
        step.recompute = (step.needs.columns | sources) & state.in_any_reach(rows)
        if step.visible is not None:   # hidden columns are not computed; columns shown anew are
            step.recompute = (step.recompute | dropout.newly_visible(rows, step.visible)) & step.visible
    return step


def _read(state: DecodeState, rows, step: _Step, finite: torch.Tensor) -> dict[str, int]:
    """The step's one host read: whether some or all rows finished or must move blocks, whether the last
    scores were finite, whether some row has drafts to run (1 for a sampler without drafts), the
    shortest and longest kept row, the most columns a row scores, and the widths of the recompute
    plan."""
    finished = state.finished[rows]
    flags = {"finished": finished.any(), "all_finished": finished.all(), "stale": _stale_blocks(state, rows).any(),
             "finite": finite}
    if step.drafting is not None:
        flags["drafting"] = step.drafting
    shortest, width = torch.aminmax(step.row_end)
    sizes = {"shortest": shortest, "width": width, "most": step.score_mask.sum(1).max()}
    if step.visible is not None:
        sizes["kept"] = step.visible.sum(1).max()
    if step.recompute is not None:
        counts = step.recompute.sum(1)
        widest = counts.max()
        _, n_narrow, narrow_width = _narrow_rows(counts, widest)
        flags["all_full"] = step.needs.full.all()
        if step.visible is not None:    # a column suffix dropout hides is never recomputed
            flags["all_full"] = flags["all_full"] & (step.visible | ~state.in_reach(rows)).all()
        sizes.update(plan_width=widest, plan_min=counts.min(), n_narrow=n_narrow, narrow_width=narrow_width)
    values = torch.cat([torch.stack(list(flags.values())).long(), torch.stack(list(sizes.values()))]).tolist()
    read = dict(zip([*flags, *sizes], values))
    read.setdefault("drafting", 1)
    if step.recompute is None:     # no plan: every row runs its whole canvas
        read.update(all_full=1, plan_width=1, plan_min=1, n_narrow=0, narrow_width=0)
    return read


def fill_from_the_end(kept: list[int]) -> list[int]:
    """The kept rows (ascending) of a batch, reordered to move the fewest: each one below
    len(kept) keeps its place, and those past it fill, in order, the places of the rows that left."""
    n = len(kept)
    staying = {r for r in kept if r < n}
    movers = iter(r for r in kept if r >= n)
    return [j if j in staying else next(movers) for j in range(n)]


NOT_FINITE = ("model produced NaN/inf logits (or every logit -inf) during the decode; check the dtype (float16 "
              "can overflow) and the checkpoint weights")


class Decoder:
    """The denoising loop of `request` on `state`, one forward at a time: `step()` runs until the next
    forward is done (True) or every row is finished (False). `decode` runs it to the end; a server
    interleaves the steps of several decoders.

    A step reads the device once (`_read`); at batch 1 that is the only read, and a batch reads
    once more each time rows finish (to drop them). A fixed schedule whose widths the host knows
    (`_planned_widths`) reads nothing until its last step is done."""

    @torch.no_grad()
    def __init__(self, model, state: DecodeState, request: Request):
        self.model, self.state, self.request = model, state, request
        sampler, policy, cfg = request.sampler, request.policy, request.config
        if not sampler.uses_blocks:
            state.block_length = state.gen_length
            state.block_end = (state.block_start + state.gen_length).clamp(max=state.gen_end)
        if state.aligned_blocks and sampler.whole_blocks:
            _check_whole_blocks_fit(state, sampler)
        sampler.setup(state)
        self.rows = torch.arange(state.batch_size, device=state.x.device)
        sampler.begin_block(state, self.rows)
        policy.setup(state, model)
        if sampler.shadow_block:
            _check_shadow_block(model, sampler, policy, cfg)
        if sampler.drafts:
            _check_drafts(sampler, cfg)
        self.dropout = None
        if cfg.suffix_dropout is not None:
            self.dropout = Dropout(SuffixDropout.from_value(cfg.suffix_dropout), state)
            self.dropout.begin_blocks(state, self.rows, torch.ones_like(state.finished))
        # a planned schedule runs every row to its end: not when rows draw columns or may stop early
        self.planned = None if self.dropout is not None or cfg.eos_early_stop else _planned_widths(sampler, policy,
                                                                                                    state, cfg)
        self.fused = _fuses_head_scoring(model, sampler, state, cfg, policy.wants_confidence)
        self.forwards = 0
        self.finite = state.finished.new_ones(())   # every score so far finite (0-dim bool)
        schedule = cfg if sampler.uses_steps else cfg.replace(steps=None, tokens_per_step=None)
        tail = state.gen_length - state.answer_length       # columns decoded past the answer (block-causal)
        self.cap = cfg.max_forwards or schedule.resolved_max_forwards + tail + sampler.forward_allowance(state)
        self.starts = None      # (B,) the forward count at which each row joined; None: all at the first
        self.done = False
        _open_blocks(state, sampler, self.rows, self.dropout, cfg.eos_early_stop)

    @property
    def joinable(self) -> bool:
        """Whether rows of another request with the same settings can join this batch between steps
        (`join`) and decode as they would alone: greedy, no guidance, a cache policy that can take
        rows in (`CachePolicy.joinable`), and a sampler that says what it keeps per row
        (`Sampler.row_state`)."""
        request = self.request
        return (request.sampler.row_state is not None and request.policy.joinable
                and self.state.temperature == 0 and request.config.cfg_scale <= 0)

    def join(self, other: "Decoder") -> None:
        """Append the rows of `other`, a fresh decoder of a request with the same settings, to this
        batch; they take part from the next step on, each with its own forward cap."""
        if not (self.joinable and other.joinable) or other.forwards:
            raise ValueError("only fresh rows of a joinable request can join a running batch")
        if (other.state.gen_length, other.state.block_length) != (self.state.gen_length, self.state.block_length):
            raise ValueError(f"cannot join rows of gen_length {other.state.gen_length}, block_length "
                             f"{other.state.block_length} to a batch of gen_length {self.state.gen_length}, "
                             f"block_length {self.state.block_length}")
        mine, theirs = self.request, other.request
        if ((mine.sampler.name, mine.sampler.arguments(), mine.policy.name, mine.policy.arguments())
                != (theirs.sampler.name, theirs.sampler.arguments(), theirs.policy.name, theirs.policy.arguments())
                or mine.config.replace(sampler=None, cache="none", seed=None)
                != theirs.config.replace(sampler=None, cache="none", seed=None)):
            raise ValueError(f"cannot join rows of another request's settings ({theirs.sampler.name} with "
                             f"{theirs.policy.name}) to a batch of {mine.sampler.name} with {mine.policy.name}: "
                             f"only a request with the same settings (its seed aside) can join")
        n, state = self.state.batch_size, self.state
        start = max(state.gen_start, other.state.gen_start)
        self.request.policy.append_rows(other.request.policy, start - state.gen_start,
                                        start - other.state.gen_start, state.ids.pad)
        if self.dropout is not None:
            self.dropout.append_rows(other.dropout, start - state.gen_start, start - other.state.gen_start)
        state.append_rows(other.state, self.request.sampler.row_state)
        starts = self.starts if self.starts is not None else torch.zeros(n, dtype=torch.long, device=self.rows.device)
        self.starts = torch.cat([starts, torch.full((other.state.batch_size,), self.forwards, dtype=torch.long,
                                                    device=starts.device)])
        self.rows = (~self.state.finished).nonzero(as_tuple=True)[0]
        self.planned = None      # the rows no longer share one schedule
        self.done = False

    def drop_finished(self) -> list[int]:
        """Remove the finished rows from the batch; returns the indices of the rows kept, in their new
        order: a kept row stays where it was unless it sat past the kept count, and such rows
        take the places of the rows that left (`fill_from_the_end`), so the stored K/V move least."""
        finished, padded = torch.stack([self.state.finished, self.state.pad_len > 0]).tolist()     # the one read
        order = fill_from_the_end([r for r, done in enumerate(finished) if not done])
        keep = torch.tensor(order, dtype=torch.long, device=self.state.x.device)
        self.state.keep_rows(keep, self.request.sampler.row_state or (), padded=any(padded[r] for r in order))
        self.request.policy.keep_rows(keep, order)
        if self.dropout is not None:
            self.dropout.keep_rows(keep)
        if self.starts is not None:
            self.starts = self.starts[keep]
        self.rows = torch.arange(len(order), device=keep.device)
        self.done = self.done or not order
        return order

    def _flush(self):
        """The rows whose forward cap is reached at this forward: True (all) or False for a batch whose
        rows started together, else (B',) bool."""
        if self.starts is None:
            return self.forwards == self.cap - 1
        return self.forwards - self.starts[self.rows] == self.cap - 1

    def check_finite(self) -> None:
        """Raise the decode's FloatingPointError now when a score so far was not finite. The loop
        checks at its next read; a caller that hands out rows finished before it (`dllm.serve`)
        checks here first."""
        if not bool(self.finite):
            raise FloatingPointError(NOT_FINITE)

    @torch.no_grad()
    def step(self) -> bool:
        """Run one forward with its scoring and commits; False (and nothing run) once every row is done."""
        state, sampler, policy = self.state, self.request.sampler, self.request.policy
        while not self.done:
            flush = self._flush()
            step = _prepare(self.model, state, sampler, policy, self.rows, flush, self.dropout)
            if self.planned is not None and self.forwards < len(self.planned):
                read = _planned_read(state, self.planned[self.forwards])
            else:
                read = _read(state, self.rows, step, self.finite)
                if not read["finite"]:
                    raise FloatingPointError(NOT_FINITE)
                if read["all_finished"]:
                    self.done = True
                    break
                if read["stale"]:
                    _open_blocks(state, sampler, self.rows, self.dropout, self.request.config.eos_early_stop)
                    continue
                if read["finished"]:
                    self.rows = (~state.finished).nonzero(as_tuple=True)[0]
                    continue
            scores = _step(self.model, state, self.request, self.rows, step, read, flush, self.fused, self.dropout)
            self.finite = self.finite & scores.finite()
            self.forwards += 1
            return True
        return False


def decode(model, state: DecodeState, request: Request,
           on_step: Callable[[DecodeState], None] | None = None) -> int:
    """Run the denoising loop of `request` on `state` in place (`Decoder` to the end); returns the
    number of batched forwards. `on_step` is called with the state after every forward."""
    decoder = Decoder(model, state, request)
    while decoder.step():
        if on_step is not None:
            on_step(state)
    return decoder.forwards


def _check_shadow_block(model, sampler, policy, cfg: GenerationConfig) -> None:
    """A sampler with shadow copies runs full forwards with one key mask per query."""
    why = ("a cache policy that stores K/V" if policy.needs_storage else
           "classifier-free guidance" if cfg.cfg_scale > 0 else
           "a model with shifted logits (Dream)" if model.config.logit_shift else
           "a block-causal model" if model.config.attention_block is not None else None)
    if why is not None:
        raise ValueError(f"sampler {sampler.name!r} runs shadow copies of its block in every full forward, which "
                         f"does not work with {why}; use cache 'none', cfg_scale 0 and a LLaDA-family model")


def _check_drafts(sampler, cfg: GenerationConfig) -> None:
    """A sampler with drafts runs them as batch rows beside the canvas."""
    if cfg.cfg_scale > 0:
        raise ValueError(f"sampler {sampler.name!r} runs its drafts as batch rows of every forward, which does not "
                         f"work with classifier-free guidance; use cfg_scale 0")


def _forward_drafts(model, state: DecodeState, request: Request, rows, at, width: int, padded: bool, key_end,
                    observe: bool, kv=None, plan=None, logits_from=None, full=None, visible=None) -> torch.Tensor:
    """One forward of the rows' canvas [0, width) and of their drafts (`Sampler.draft_canvases`,
    (B', D, L)), each a batch row of its own, with the canvas's plan `plan`: the canvas logits at
    `at` (B', Q, V); the drafts' scores at `at` go to `Sampler.read_drafts`, (B' * D, Q) in
    row-major order. With stored K/V `kv` the batch runs through D + 1 copies of each row's K/V
    (`KVCache.repeated_rows`, kept in `state.extra["draft_kv"]` from step to step), so each draft
    reads what its canvas reads and writes only its copy, and the canvas's copy is written back.
    On a model with shifted logits a partial step's plan holds the column left of the block while
    the block's first column is masked, and later steps keep the K/V computed there then: the
    drafts of those rows (`full` (B'): the rows refreshing every column) are not usable. Columns not
    `visible` (B', L) (suffix dropout) are hidden keys of the canvas and its drafts."""
    sampler = request.sampler
    drafts = sampler.draft_canvases(state, rows)[..., :width]                              # (B', D, W)
    n, D = drafts.shape[:2]
    x = torch.cat([state.x[rows, :width][:, None], drafts], 1).flatten(0, 1)             # (B' (D + 1), W)
    each = lambda t: None if t is None else t.repeat_interleave(D + 1, 0)                 # noqa: E731
    copies = None
    if kv is not None:
        kv = kv.narrow(width) if width < kv.length else kv
        copies = state.extra["draft_kv"] = kv.repeated_rows(rows, D + 1, into=state.extra.get("draft_kv"))
    logits = model(x, each(at), positions=each(plan), position_ids=each(state.position_ids[rows, :width]),
                   key_valid=each(_key_mask(state, rows, width, padded, key_end, visible)), cache=copies,
                   logits_from=each(logits_from))
    if copies is not None:
        kv.write_rows(rows, copies, D + 1)
    logits = logits.unflatten(0, (n, D + 1))
    if D:
        usable = None
        if kv is not None and model.config.logit_shift:
            usable = full | (state.x[rows].gather(1, state.block_start[rows, None]).squeeze(1) != state.ids.mask)
        sampler.read_drafts(state, rows, _score(state, sampler, rows.repeat_interleave(D),
                                                logits[:, 1:].flatten(0, 1), observe), usable)
    return logits[:, 0]


def _forward_shadowed(model, state: DecodeState, rows, at, width: int, padded: bool, key_end, shadow, visible=None):
    """A full forward of the rows' canvas [0, width) with the shadow copies `shadow` = (columns
    (B', K), valid (B', K)) appended (`Sampler.shadow_columns`): the logits at `at` (B', Q, V) and
    those of the copies (B', K, V). Columns not `visible` (B', L) (suffix dropout) are hidden keys."""
    columns, valid = shadow
    n, K = columns.shape
    cols = state.columns()[:width]
    keys = _key_mask(state, rows, width, padded, key_end, visible)
    if keys is None:
        keys = torch.ones(n, width, dtype=torch.bool, device=cols.device)
    x = torch.cat([state.x[rows, :width], torch.full_like(columns, state.ids.mask)], 1)        # (B', W + K)
    pos_ids = state.position_ids[rows, :width]
    pos_ids = torch.cat([pos_ids, pos_ids.gather(1, columns)], 1)
    real = torch.cat([keys[:, None, :].expand(n, width, width),
                      torch.zeros(n, width, K, dtype=torch.bool, device=cols.device)], 2)      # (B', W, W + K)
    copies = torch.cat([keys[:, None, :] & (cols[None, None, :] != columns[..., None]),
                        valid[:, None, :].expand(n, K, K)], 2)                                # (B', K, W + K)
    wanted = torch.cat([at, width + torch.arange(K, device=cols.device).expand(n, K)], 1)
    logits = model(x, wanted, position_ids=pos_ids, key_valid=torch.cat([real, copies], 1))
    return logits[:, :at.shape[1]], logits[:, at.shape[1]:]


def _check_whole_blocks_fit(state: DecodeState, sampler) -> None:
    """A `whole_blocks` sampler spreads its steps over gen_length / block_length blocks; blocks
    aligned with a model's attention blocks add a partial first block unless every prompt fills
    whole blocks."""
    lengths = (state.gen_start - state.pad_len).tolist()
    problem = partial_block_problem(sampler, lengths, state.block_length)
    if problem:
        raise ValueError(problem)


def partial_block_problem(sampler: Sampler, prompt_lengths: list[int], block: int | None) -> str | None:
    """Why a `whole_blocks` sampler cannot decode prompts of `prompt_lengths` tokens on a model of
    `block`-column attention blocks (a prompt that leaves a partial first block), or None."""
    partial = [n for n in prompt_lengths if block and n % block]
    if not sampler.whole_blocks or not partial:
        return None
    return (f"sampler {sampler.name!r} spreads its step schedule over gen_length / block_length blocks, but a "
            f"prompt of {partial[0]} tokens leaves a partial first block of the model's {block}-column attention "
            f"blocks; use llada2, llada21 or threshold, or prompts of a multiple of {block} tokens")


def _step(model, state: DecodeState, request: Request, rows, step: _Step, read: dict, flush: bool,
          fused: bool, dropout: Dropout | None = None) -> TokenScores:
    """One forward (`flush`: the cap's last; `fused`: the LM head fused into the scoring; `dropout`:
    the decode's suffix dropout), its scoring and the commits it decides; returns the scores."""
    sampler, policy, cfg = request.sampler, request.policy, request.config
    kv = policy.kv if policy.needs_storage else None
    policy.advance(state, rows, step.needs)
    positions, valid = select_positions(step.score_mask, read["most"])
    # With stored K/V every column the forward runs is re-stored: padding entries repeat a
    # scored column rather than column 0, so a row's cache never depends on its batch.
    at = positions if kv is None else torch.where(valid, positions, positions[:, :1])
    plan = logits_from = None
    width = read["width"]
    if kv is not None and not read["all_full"] and read["plan_min"] < width:
        sources = hidden_source(at, model.config.logit_shift)
        plan, logits_from = cover_columns(step.recompute, sources, read["plan_width"])
    mask_keys = state.padded or read["shortest"] < width   # without padding or cuts, no attention mask
    if sampler.shadow_block:
        shadow = sampler.shadow_columns(state, rows)
        out, shadow_logits = _forward_shadowed(model, state, rows, at, width, mask_keys, step.key_end, shadow,
                                               step.visible)
        shadow_logits[..., state.ids.mask] = float("-inf")
        sampler.read_shadow(state, rows, *shadow, shadow_logits)
    elif sampler.drafts and read["drafting"]:
        out = _forward_drafts(model, state, request, rows, at, width, mask_keys, step.key_end,
                              policy.wants_confidence, kv, plan, logits_from,
                              None if step.needs is None else step.needs.full, step.visible)
    else:
        out = _forward(model, state, rows, at, plan, mask_keys, kv, cfg.cfg_scale, width, logits_from,
                       (read["n_narrow"], read["narrow_width"]), hidden_only=fused, key_end=step.key_end,
                       visible=step.visible, kept_width=compact_width(read.get("kept", 0), width))
    add_at(state.nfe, rows, 1)
    if kv is not None and step.visible is not None:
        dropout.show(rows, step.visible)
    scores = _score_hidden(model, state, out) if fused else _score(state, sampler, rows, out,
                                                                    policy.wants_confidence)
    if policy.wants_confidence:
        policy.observe(state, rows, positions, valid, scores.prob)
    dec = sampler.step(state, rows, positions, valid, scores)
    flushed = _apply(state, sampler, rows, positions, valid, scores, dec, flush)
    if flush is not False:
        hit = state.extra.get("hit_cap")
        if hit is None:
            hit = state.extra["hit_cap"] = torch.zeros_like(state.finished)
        hit[rows] |= flushed
    add_at(state.step_in_block, rows, 1)
    state.global_step += 1
    _open_blocks(state, sampler, rows, dropout, cfg.eos_early_stop)
    # A row with no mask left in its generation region is done, unless its sampler holds its block.
    left = state.masked_in_generation(rows).any(1)
    state.finished[rows] = state.finished[rows] | ~(left | state.block_hold[rows])
    return scores


def _planned_widths(sampler, policy, state: DecodeState, cfg: GenerationConfig) -> list[int] | None:
    """The most columns any row scores at each step of a fixed schedule the host can follow: the
    sampler states them (`Sampler.planned_widths`, an upper bound is enough: extra columns are
    padding), nothing is stored between steps, no guidance, and the forward cap does not end the
    schedule early (its flush scores every mask). None when the loop has to read them."""
    if not sampler.fixed_schedule or policy.needs_storage or cfg.cfg_scale > 0:
        return None
    widths = sampler.planned_widths(state)
    return None if widths is None or len(widths) > cfg.resolved_max_forwards else widths


def _planned_read(state: DecodeState, most: int) -> dict[str, int]:
    """What `_read` would bring, known on the host for a step of a planned schedule."""
    length = state.length
    return dict(finished=0, all_finished=0, stale=0, finite=1, drafting=1, shortest=length, width=length, most=most,
                all_full=1, plan_width=length, plan_min=length, n_narrow=0, narrow_width=0)


def _fuses_head_scoring(model, sampler, state: DecodeState, cfg: GenerationConfig, observe: bool) -> bool:
    """Whether the step scores the final hidden states with the LM head fused in
    (`dllm.kernels.head_scores`, chosen with DLLM_HEAD_SCORING; by default on CUDA): a model with
    a head weight, and a greedy sampler that reads only the candidate and its probability and
    leaves the logits as they are, without guidance."""
    head_weight = getattr(model, "head_weight", None)
    if head_weight is None or head_scoring_impl(None, state.x.device, head_weight().dtype) == "unfused":
        return False
    return (_score_fields(sampler, observe) <= {"prob"} and not sampler.logits_needed(state)
            and state.temperature == 0 and cfg.cfg_scale <= 0 and not sampler.edits_logits and not sampler.shadow_block
            and not sampler.drafts)


def _score_fields(sampler, observe: bool) -> frozenset:
    """The statistics a step computes: the sampler's, and the candidate's probability for the
    progress rule (samplers without a fixed schedule) or a policy's guard (`observe`)."""
    return sampler.score_fields | ({"prob"} if not sampler.fixed_schedule or observe else set())


def _score_hidden(model, state: DecodeState, hidden: torch.Tensor) -> TokenScores:
    """`TokenScores` (token, prob) of normed hidden states (B', Q, d), the LM head fused into the
    scoring; the mask token is suppressed."""
    weight = model.head_weight()
    bias = state.extra.get("head_bias")
    if bias is None:
        bias = state.extra["head_bias"] = suppression_bias(weight.shape[0], [state.ids.mask], weight.device)
    token, prob, top = head_scores(hidden.reshape(-1, hidden.shape[-1]), weight, bias, score_dtype=state.score_dtype)
    shape = hidden.shape[:2]
    return TokenScores(token=token.view(shape), prob=prob.view(shape), top=top.view(shape))


def _score(state: DecodeState, sampler, rows, logits, observe: bool):
    """The step's `TokenScores`; their finiteness is checked at the next read."""
    # The mask token is never a candidate: a trained model gives it no mass, and committing
    # it would leave the position masked (the references then end with a mask on the canvas).
    logits[..., state.ids.mask] = float("-inf")
    logits = sampler.process_logits(state, rows, logits)
    return token_scores(logits, temperature=state.temperature if sampler.gumbel_candidates else 0.0,
                        generator=state.generator, score_dtype=state.score_dtype,
                        fields=_score_fields(sampler, observe),
                        keep_logits=sampler.logits_needed(state), check_finite=False)


def generate(model, tokenizer=None, prompts=None, config: GenerationConfig | None = None, *,
             attention_mask: torch.Tensor | None = None, on_step: Callable[[DecodeState], None] | None = None,
             **overrides) -> GenerationOutput:
    """Generate with a masked-diffusion model.

    prompts: a string, a list of strings (tokenized, through the chat template when `chat`), a
        list of token ids (Python, numpy or 0-dim torch integers), a list of such lists or of 1-D
        integer tensors (ragged: left-padded here), or an input_ids tensor (B, L) or (L,) with an
        optional `attention_mask` of its shape marking its padding (only with a tensor: lists
        carry their own lengths).
    config: a GenerationConfig; keyword overrides (gen_length=..., sampler=..., cache=...,
        cache_kwargs=...) replace its fields.
    on_step: called with the DecodeState after every step (progress display).

    Example::

        out = dllm.generate(model, tok, ["Hi!", "Name three colours."], gen_length=64, block_length=32,
                            sampler="threshold", sampler_kwargs={"tau": 0.9}, cache="dual")
        print(out.texts, out.nfe, out.mean_tokens_per_forward)
    """
    if not isinstance(getattr(model, "config", None), ModelConfig):
        raise ValueError(f"model must be a dllm model (from dllm.load or dllm.build_model), got "
                         f"{type(model).__name__}; the call is generate(model, tokenizer, prompts, ...)")
    if config is not None and not isinstance(config, GenerationConfig):
        raise ValueError(f"config must be a dllm.GenerationConfig, got {config!r:.80} ({type(config).__name__}; "
                         f"keyword options go as keywords: generate(model, tok, prompts, gen_length=64, ...))")
    cfg = (config or GenerationConfig()).replace(**overrides)
    if on_step is not None and not callable(on_step):
        raise ValueError(f"on_step must be a function called with the state after every step, or None, got "
                         f"{on_step!r:.60} ({type(on_step).__name__})")
    if prompts is None:
        raise ValueError("no prompts given")
    if not isinstance(prompts, (str, list, tuple, torch.Tensor)):
        raise ValueError(f"prompts must be a string, a list of strings or of token ids, or an input_ids tensor, got "
                         f"{prompts!r:.80} ({type(prompts).__name__})")
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
        if attention_mask is not None:
            raise ValueError("attention_mask marks the padding of input_ids given as a tensor; string prompts are "
                             "tokenized here (leave attention_mask out)")
        rows = encode_prompts(tokenizer, prompts, cfg.chat)
    else:
        rows = _as_rows(prompts, attention_mask)
        if cfg.chat:
            warnings.warn("chat=True renders string prompts with the chat template; prompts given as token ids "
                          "are decoded as given", stacklevel=2)
    request = resolve_request(model, cfg)
    state = build_state(model, rows, request.config, request.block_length)
    state.tokenizer = tokenizer
    start = time.perf_counter()
    forwards = decode(model, state, request, on_step=on_step)
    if state.x.device.type == "cuda":
        torch.cuda.synchronize(state.x.device)
    seconds = time.perf_counter() - start
    return _output(state, tokenizer, request, forwards, seconds)


def check_request(model, cfg: GenerationConfig, tokenizer=None) -> None:
    """Raise the ValueError `generate` raises at its start for `cfg` on `model` (the lengths, the
    sampler's and the cache policy's checks against the request), without a forward: the decode
    of a prompt of one token (one attention block on a block-causal model) is set up, not run.
    `tokenizer`: the one `generate` will get (samplers such as AdaBlock read token ids from it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # warnings about ignored settings are shown when decoding
        request = resolve_request(model, cfg)
    token = 0 if special_ids(model).mask != 0 else 1
    state = build_state(model, [[token] * (model.config.attention_block or 1)], request.config,
                        request.block_length)
    state.tokenizer = tokenizer
    Decoder(model, state, request)


def answer_length(tokens: list[int], stop_ids: list[int]) -> int:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return i
    return len(tokens)


def _output(state: DecodeState, tokenizer, request: Request, forwards: int, seconds: float) -> GenerationOutput:
    generated = state.generated()
    stop = state.ids.stop_ids
    lengths, texts = [], [] if tokenizer is not None else None
    for row in generated.tolist():
        n = answer_length(row, stop)
        lengths.append(n)
        if texts is not None:
            texts.append(tokenizer.decode(row[:n], skip_special_tokens=True))
    answer_steps = state.commit_step[:, :generated.shape[1]]
    committed = (answer_steps >= 0).sum(1)
    nfe = state.nfe.tolist()
    hit = state.extra.get("hit_cap")
    capped = set() if hit is None else set(hit.nonzero().flatten().tolist())
    return GenerationOutput(
        sequences=state.x[:, :state.answer_end], generated=generated, texts=texts, nfe=nfe, forwards=forwards,
        steps=forwards,
        tokens_per_forward=[c / max(n, 1) for c, n in zip(committed.tolist(), nfe)], answer_lengths=lengths,
        seconds=seconds, hit_cap=[b in capped for b in range(state.batch_size)], sampler=request.sampler.name,
        sampler_args=request.sampler.resolved_arguments(state), trace=answer_steps if request.config.trace else None,
        cache=request.policy.name, cache_args=request.policy.arguments(), edits=state.edits.tolist(),
        remasks=state.remasks.tolist(), block_length=request.block_length)
