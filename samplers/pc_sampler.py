"""PC-Sampler: position-aware calibration of decoding bias (arXiv:2508.13021, "PC-Sampler:
Position-Aware Calibration of Decoding Bias in Masked Diffusion Models"; NEUIR/PC-Sampler
`src/generate.py`, `generate_with_pc_sampler`).

LLaDA's schedule (`low_confidence`, docs/samplers.md §2): semi-autoregressive blocks, the steps split
evenly over them, and step j of a block with n masks commits n // s positions plus one for the first
n % s steps. What changes is the score that picks them among the block's masks. With p the
un-tempered probability of a position's candidate token x, f(x) the token's frequency in a reference
corpus and d the position's offset from the block's first column:

    score = exp(-lambd * d) * min(alpha, -p * log(f(x) + 1e-9))

The first factor steers the order towards the left of the block (lambd = 0: none); the second, the
calibrated confidence, holds back tokens that are frequent everywhere (punctuation, filler words)
and is clipped at `alpha`; a token the corpus never holds (EOS, when it was counted without special
tokens) scores as the rarest. Frequencies come from a table of token counts (`dllm.token_frequencies`,
written by `dllm token-frequencies`, or one of PC-Sampler's corpus files), as float32 with 1 / N for a
token the corpus never holds; the log term is float32, p is in the request's `score_dtype` (the
reference: the logits' dtype, `score_dtype="logits"`).

The table is `frequencies=PATH`; without one, the `token_frequencies.json` shipped in the model's
checkpoint folder is used; with neither, setup fails and names `dllm token-frequencies`.
`frequencies="none"` drops the calibration: score = exp(-lambd * d) * p. A `TokenFrequencies`
instance may be passed directly (its arguments name it by its file, else by a digest of its counts). The table a
request reads lives in its decode state, so one instance serves requests of several models; outputs
record the file a request found in its checkpoint folder. Ties (frequent with lambd = 0, where many
scores reach alpha) go to the lower position.

`weighting="linear"` is the paper's linear-position baseline (`generate_with_linear_position`): the
calibrated confidence C of every block position (a written one with its own token and its argmax's
probability) is min-max normalised over the block, and score = (1 - lambd) * C_norm + lambd * (K - d) / K
for a block of K columns (lambd in [0, 1]).

Published settings: lambd 0.25, alpha 10, block_length = steps = gen_length (one block, one token per
step); lambd 0 for Sudoku and 1 for Countdown; temperature 0.
"""
from __future__ import annotations

import os

import torch

from .base import check_number, loaded_once, missing_from_checkpoint, top_k_mask
from .llada import LowConfidence
from dllm.state import Decision
from dllm import token_frequencies
from dllm.token_frequencies import TokenFrequencies

LOG_FLOOR = 1e-9   # added to the frequency inside the log, as in the reference
NORM_FLOOR = 1e-9  # the linear weighting's least max - min of a block's scores, as in the reference
WEIGHTINGS = ("exponential", "linear")


class PCSampler(LowConfidence):
    """PC-Sampler: LLaDA's schedule, positions by a position-weighted, frequency-calibrated confidence."""

    name = "pc_sampler"
    row_state = ("counts",)
    file_arguments = ("frequencies",)

    def __init__(self, *, lambd: float = 0.25, alpha: float = 10.0, frequencies=None, weighting: str = "exponential"):
        super().__init__()
        if weighting not in WEIGHTINGS:
            raise ValueError(f"sampler {self.name!r}: weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}")
        self.weighting = weighting
        check_number("lambd", lambd, low=0, high=1 if weighting == "linear" else None, sampler=self.name)
        check_number("alpha", alpha, low=0, low_open=True, sampler=self.name)
        self.lambd, self.alpha = float(lambd), float(alpha)
        self.table: TokenFrequencies | None = None
        self.calibrated, self.from_model = True, frequencies is None
        if isinstance(frequencies, TokenFrequencies):
            self.table, shown = frequencies, frequencies.path or frequencies.digest()
        elif isinstance(frequencies, str) and frequencies.lower() == "none":
            self.calibrated, shown = False, "none"
        elif isinstance(frequencies, (str, os.PathLike)):
            self.table, shown = token_frequencies.load(frequencies), str(frequencies)   # errors before any model work
        elif frequencies is None:
            shown = None                                                              # resolved at each setup
        else:
            raise ValueError(f"sampler {self.name!r}: frequencies must be a file path, 'none' or a TokenFrequencies, "
                             f"got {type(frequencies).__name__}")
        self._args = dict(lambd=lambd, alpha=alpha, frequencies=shown, weighting=weighting)
        self._shipped: dict[str, TokenFrequencies] = {}     # tables shipped with models, by file

    def table_for(self, state) -> TokenFrequencies:
        """The table of a request: the given one, else the one shipped with the request's model."""
        if not self.from_model:
            return self.table
        found = token_frequencies.shipped(state.source)
        if found is None:
            raise missing_from_checkpoint(
                self.name, state.source, "token frequencies", token_frequencies.FILE_NAME,
                "count a corpus with `dllm token-frequencies --model MODEL --data CORPUS --out freq.json` and pass "
                "frequencies='freq.json', or frequencies='none' for the position weighting alone")
        state.extra["resolved_arguments"] = dict(frequencies=str(found))
        return loaded_once(self._shipped, found, token_frequencies.load)

    def setup(self, state):
        if self.calibrated:      # (V,) float32, the same for every row (not row state: joins keep it)
            state.extra["log_frequency"] = self.table_for(state).log_probabilities(state.vocab_size, LOG_FLOOR,
                                                                                    state.x.device)
        super().setup(state)   # LLaDA's requirements and per-block counts

    def calibrated_confidence(self, state, prob: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """min(alpha, -p log(f(token) + 1e-9)), or p itself without a table."""
        if not self.calibrated:
            return prob
        return (-prob * state.extra["log_frequency"][tokens]).clamp(max=self.alpha)

    def planned_widths(self, state):
        """LLaDA's widths (the masks left) for the exponential weighting; the linear one scores the whole block."""
        return None if self.weighting == "linear" else super().planned_widths(state)

    def score_mask(self, state, rows):
        # The linear weighting normalises over every block position, written ones too.
        return state.in_block(rows) if self.weighting == "linear" else super().score_mask(state, rows)

    def scores_for(self, state, rows, positions, valid, scores):
        offset = (positions - state.block_start[rows, None]).to(torch.float32)
        if self.weighting == "exponential":
            return torch.exp(-self.lambd * offset) * self.calibrated_confidence(state, scores.prob, scores.token)
        written = state.x[rows].gather(1, positions)
        tokens = torch.where(written == state.ids.mask, scores.token, written)
        conf = self.calibrated_confidence(state, scores.prob, tokens)
        if conf.dtype == torch.float16:      # its 1e-9 spread floor would round to 0 (0 / 0 on a flat block)
            conf = conf.float()
        low = conf.masked_fill(~valid, float("inf")).amin(1, keepdim=True)
        high = conf.masked_fill(~valid, float("-inf")).amax(1, keepdim=True)
        norm = (conf - low) / (high - low).clamp(min=NORM_FLOOR)
        K = state.block_length
        return (1 - self.lambd) * norm + self.lambd * (K - offset) / K

    def step(self, state, rows, positions, valid, scores):
        masked = valid & (state.x[rows].gather(1, positions) == state.ids.mask)
        score = self.scores_for(state, rows, positions, valid, scores).double().masked_fill(~masked, float("-inf"))
        return Decision(commit=top_k_mask(score, self.step_counts(state, rows)) & masked)
