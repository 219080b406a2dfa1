"""AdaBlock-dLLM: adaptive block size (arXiv:2509.26432, ICLR 2026; the authors' AdaBlock-dLLM
`llada/generate_adablock.py` and `dream/model/generation_utils_adablock.py`, built on Fast-dLLM).

Semi-autoregressive, but each block's length is chosen at its opening step, once, from the same
forward that also commits the block's first tokens:
1. start = the block's first column, remaining = generation columns left from there;
   window = min(window, remaining) columns from start (they may reach past any fixed block).
2. D = window positions whose candidate token is a delimiter. Empty: block length
   min(base_block, remaining).
3. Else p* = the delimiter position of D with the highest confidence (ties: lowest position);
   the block ends right after p* (length p* - start + 1) if c_{p*} >= tau_d, else it has length
   min(base_block, remaining).
4. The block is then filled with the Fast-dLLM threshold rule (commit every masked block position
   with c >= tau, and always the most confident one), starting with the opening step's scores.
The first block is adaptive too. c is the un-tempered probability of the candidate, in the
request's `score_dtype`, compared with tau and tau_d in that dtype (tau rounded to it, as a
PyTorch `c >= tau` compares). The reference computes the delimiters' c as exp(l - logsumexp(l)) in
the logits dtype (and, on Dream, the threshold rule's confidences in it too): on bf16 logits its
values round differently (many delimiters reach exactly 1.0, the first of them winning), so block
lengths there can differ from the reference's; in float32 the two agree.

Delimiters. The delimiter set is token ids: `delimiter_ids` (an int or a list of ints), plus the
ids of the `delimiters` strings, each of which must be a single token of the request's tokenizer.
`delimiters` is a list of strings, or one string whose every character is a delimiter (so
`"\\n,."` means newline, comma and full stop); the escapes \\n \\t \\r \\\\ written literally (as a
shell passes them to `--sampler-arg delimiters=\\n`) are understood. When neither is given the
delimiter is the newline. Strings are resolved in `setup` through the tokenizer `generate` was
called with (`DecodeState.tokenizer`); generating from token ids without a tokenizer needs
`delimiter_ids`. Note that a BPE tokenizer may merge a newline with its neighbours (Qwen2's
"\\n\\n", ".\\n", ...): the published Dream configuration lists 24 such ids (198, 271, 280, 319,
340, 382, 401, 532, 624, 630, 692, 698, 921, 1248, 1837, 1939, 2219, 2533, 3276, 3876, 4894, 5267,
14750, 68327), which can be passed as `delimiter_ids`.

Published defaults: tau 0.9; tau_d 0.3 for LLaDA and 0.5 for Dream (chosen from the model family
in `setup` when not given); base_block 32 ("suggested: 16, 32, or 64"; None = the request's
block_length); window int(0.25 * gen_length) (None); delimiter "\\n" (LLaDA id 198); gen_length 512.
"""
from __future__ import annotations

import re

import torch

from .base import Sampler, check_number
from .threshold import masked_confidence, rounded_to, threshold_commit, top1
from dllm.state import Decision

TAU_D_DEFAULTS = {"llada": 0.3, "dream": 0.5}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def parse_delimiters(value) -> list[str] | None:
    """`delimiters` argument -> list of delimiter strings (None stays None)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], value)
        items = list(dict.fromkeys(text))          # one delimiter per character, first-seen order
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ValueError(f"sampler 'adablock': delimiters must be a string (each character one delimiter) or a "
                         f"list of strings, got {value!r}")
    if not items or any(v == "" for v in items):
        raise ValueError(f"sampler 'adablock': delimiters must be non-empty strings, got {value!r}")
    return items


def parse_ids(value) -> list[int] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)) or not items or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        raise ValueError(f"sampler 'adablock': delimiter_ids must be a non-negative token id or a non-empty list "
                         f"of them, got {value!r}")
    return list(items)


class AdaBlock(Sampler):
    """AdaBlock-dLLM: each block ends after a confident delimiter in a look-ahead window; threshold rule inside."""

    name = "adablock"
    uses_steps = False
    uses_blocks = True
    score_fields = frozenset({"prob"})

    def __init__(self, *, tau: float = 0.9, tau_d: float | None = None, base_block: int | None = 32,
                 window: int | None = None, delimiters: str | list[str] | None = None,
                 delimiter_ids: int | list[int] | None = None):
        n = self.name
        check_number("tau", tau, low=0, high=1, sampler=n)
        check_number("tau_d", tau_d, low=0, high=1, allow_none=True, sampler=n)
        check_number("base_block", base_block, low=1, integer=True, allow_none=True, sampler=n)
        check_number("window", window, low=0, integer=True, allow_none=True, sampler=n)
        self.tau, self.tau_d = float(tau), tau_d
        self.base_block, self.window = base_block, window
        self.delimiters = parse_delimiters(delimiters)
        self.delimiter_ids = parse_ids(delimiter_ids)
        self._args = dict(tau=tau, tau_d=tau_d, base_block=base_block, window=window,
                          delimiters=self.delimiters, delimiter_ids=self.delimiter_ids)

    # -- per request ---------------------------------------------------------------------------
    def resolve_delimiter_ids(self, tokenizer) -> list[int]:
        """The delimiter token ids: `delimiter_ids` plus the single-token encodings of `delimiters`
        (default newline when neither is given)."""
        ids = list(self.delimiter_ids or [])
        strings = self.delimiters if self.delimiters is not None else (["\n"] if self.delimiter_ids is None else [])
        if strings and tokenizer is None:
            raise ValueError(f"sampler {self.name!r}: delimiters {strings!r} need the tokenizer to find their token "
                             f"ids; generate with a tokenizer, or pass delimiter_ids=[...]")
        for s in strings:
            enc = list(tokenizer.encode(s, add_special_tokens=False))
            if len(enc) != 1:
                raise ValueError(f"sampler {self.name!r}: delimiter {s!r} is {len(enc)} tokens {enc} for this "
                                 f"tokenizer; each delimiter must be a single token (or pass delimiter_ids)")
            ids.append(enc[0])
        return sorted(set(ids))

    def setup(self, state):
        tau_d = self.tau_d
        if tau_d is None:
            if state.family not in TAU_D_DEFAULTS:
                raise ValueError(f"sampler {self.name!r}: no default tau_d for model family {state.family!r} "
                                 f"(known: {', '.join(TAU_D_DEFAULTS)}); pass tau_d")
            tau_d = TAU_D_DEFAULTS[state.family]
        dev = state.x.device
        ids = self.resolve_delimiter_ids(state.tokenizer)
        outside = [i for i in ids if state.vocab_size is not None and i >= state.vocab_size]
        if outside:
            raise ValueError(f"sampler {self.name!r}: delimiter_ids {outside} are outside the model's vocabulary "
                             f"[0, {state.vocab_size}); such a delimiter could never be decoded")
        if state.ids.mask in ids:
            raise ValueError(f"sampler {self.name!r}: delimiter_ids hold the mask token id {state.ids.mask}, which is "
                             f"never decoded")
        state.extra["adablock"] = dict(
            ids=torch.tensor(ids, dtype=torch.long, device=dev),
            tau_d=float(tau_d),
            window=self.window if self.window is not None else int(0.25 * state.answer_length),
            base_block=self.base_block or state.block_length,
            pending=torch.ones(state.batch_size, dtype=torch.bool, device=dev),   # block length not chosen yet
        )

    def begin_block(self, state, rows):
        state.extra["adablock"]["pending"][rows] = True

    def begin_blocks(self, state, rows, opening):
        pending = state.extra["adablock"]["pending"]
        pending[rows] = pending[rows] | opening

    def score_mask(self, state, rows):
        ex = state.extra["adablock"]
        start = state.block_start[rows]                                            # (B',)
        reach = (start + max(ex["window"], ex["base_block"])).clamp(max=state.gen_end)
        cols = state.columns()[None, :]
        scan = state.is_mask[rows] & (cols >= start[:, None]) & (cols < reach[:, None])   # (B', L)
        return torch.where(ex["pending"][rows, None], scan, state.masked_in_block(rows))

    def choose_block_end(self, state, rows, positions, valid, scores, conf) -> torch.Tensor:
        """(B',) the end column of the block opening at each row's block start."""
        ex = state.extra["adablock"]
        start = state.block_start[rows]
        remaining = state.gen_end - start
        win_end = start + remaining.clamp(max=ex["window"])
        is_delim = valid & torch.isin(scores.token, ex["ids"]) & (positions < win_end[:, None])   # (B', Q)
        pick = top1(conf, is_delim)                                                # p*, one per row at most
        c_star = conf.masked_fill(~pick, float("-inf")).max(1).values
        p_star = (positions * pick).sum(1)
        fallback = start + remaining.clamp(max=ex["base_block"])
        tau_d = rounded_to(ex["tau_d"], scores.prob.dtype)
        return torch.where(pick.any(1) & (c_star >= tau_d), p_star + 1, fallback)

    def step(self, state, rows, positions, valid, scores):
        ex = state.extra["adablock"]
        conf = masked_confidence(scores, valid)                                   # (B', Q)
        pending = ex["pending"][rows]
        end = state.block_end[rows]
        if pending.any():
            end = torch.where(pending, self.choose_block_end(state, rows, positions, valid, scores, conf), end)
            ex["pending"][rows] = False
        active = valid & (positions >= state.block_start[rows, None]) & (positions < end[:, None])
        return Decision(commit=threshold_commit(conf, active, self.tau, scores.prob.dtype), block_end=end)
