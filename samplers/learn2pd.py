"""Learn2PD: a learned acceptance filter with End-of-Text Prediction (arXiv:2509.25188, "Learning
to Parallel: Accelerating Diffusion Large Language Models via Learnable Parallel Decoding"; the
authors' Learning-to-Parallel-Decoding `llada/generate.py`).

LLaDA's semi-autoregressive `low_confidence` schedule (`steps` split evenly over the blocks; with
steps = gen_length every step commits k_j = 1) plus a small learned filter that lets more masked
positions through. Each step, for the active block [s, e) of K = block_length columns:

1. c = the un-tempered probability of every block position's candidate token, committed positions
   included (the model's raw top-1 probability there), as a (K,) float32 vector; columns of the
   block thrown away by a truncation enter as 0.
2. The filter (Linear(K, K) -> ReLU -> Linear(K, K), 2,112 parameters for K = 32) maps it to K
   logits; a masked block position is accepted when sigmoid(logit) > accept_thres.
3. Commit the accepted positions and the baseline top-k_j masked block positions by c (LLaDA's
   count, so every step makes progress). The block is stepped until it holds no mask.

End-of-Text Prediction (`eotp`, "upon detection of an [EoT] token, we throw away all the tokens
after the [EoT] token"): before committing, note (a) the accepted positions whose candidate is
EOS and (b) the masked positions anywhere in the generation region whose candidate is EOS. After
committing, the canvas is cut after the first (a) position, else after the most confident (b)
position (lowest column on ties); in case (b) the last kept position may still be masked. The
loop throws the columns after the cut away (`Decision.truncate_at`): they become EOS, later
forwards stop at the cut, and blocks past it vanish. EoTP needs scores outside the active block,
so with it this sampler scores every masked position of the generation region each step. As in
the reference, the test is for EOS (`<|endoftext|>`), not the end-of-turn token.

The filter is tied to its block size and to the model whose decoding it learned (labels come from
that model's own greedy decode, `dllm.filter_train`). It is loaded from `filter=PATH`, a file
written by `dllm train-filter`; without one, the file `learn2pd_filter.safetensors` shipped in the
model's checkpoint folder is used; with neither, setup fails and names `dllm train-filter`.
`filter="none"` runs without a learned filter: LLaDA's schedule with EoTP only (the reference's
"EoT" method). A `Learn2PDFilter` instance may be passed directly.

File format: safetensors with `linear1.weight` (K, K), `linear1.bias` (K,), `linear2.weight`
(K, K), `linear2.bias` (K,) in float32, and the header metadata key `dllm_learn2pd` holding a JSON
object (format, block_length, accept_thres, model, prompt source, counts, validation figures);
`dllm train-filter` writes the same JSON beside it as `<name>.json` for reading.

Published defaults: accept_thres 0.96, gen_length 256, steps = gen_length, block_length 32,
temperature 0; EoTP on in the headline setting ("L2P+EoT"). The reference pads a block shorter
than K with zeros before the filter and softmaxes in the logits dtype (`score_dtype="logits"`).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import torch.nn as nn

from .base import check_number, loaded_once, missing_from_checkpoint, top_k_mask
from .llada import LowConfidence
from dllm.state import Decision

FILTER_FILE = "learn2pd_filter.safetensors"   # a filter shipped inside a checkpoint folder
FORMAT = "dllm-learn2pd-filter"
META_KEY = "dllm_learn2pd"
DEFAULT_ACCEPT_THRES = 0.96


class Learn2PDFilter(nn.Module):
    """The learned filter: (..., K) float32 confidences of a block -> (..., K) acceptance logits.

    Two Linear(K, K) layers with a ReLU between them (2 * (K*K + K) parameters: 2,112 for K = 32).
    `metadata` holds what the file recorded (empty for a fresh filter); `path` the file it came from.
    """

    def __init__(self, block_length: int = 32):
        super().__init__()
        if isinstance(block_length, bool) or not isinstance(block_length, int) or block_length < 1:
            raise ValueError(f"Learn2PDFilter: block_length must be an integer >= 1, got {block_length!r}")
        self.block_length = block_length
        self.linear1 = nn.Linear(block_length, block_length)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(block_length, block_length)
        self.metadata: dict = {}
        self.path: str | None = None

    def forward(self, conf: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.relu(self.linear1(conf)))

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return f"Learn2PDFilter(block_length={self.block_length}{where})"


def save_filter(filt: Learn2PDFilter, path: str | os.PathLike, metadata: dict | None = None) -> Path:
    """Write `filt` to `path` (safetensors, metadata in its header) and the metadata to
    `<path without suffix>.json`. Returns the safetensors path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "block_length": filt.block_length, "architecture": "linear-relu-linear",
            "accept_thres": DEFAULT_ACCEPT_THRES} | dict(metadata or {})
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in filt.state_dict().items()}
    try:
        save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta)})
    except Exception as err:  # safetensors raises its own error type when the file cannot be written
        raise OSError(f"cannot write the Learn2PD filter {str(path)!r}: {err}") from None
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def load_filter(path: str | os.PathLike) -> Learn2PDFilter:
    """A filter written by `save_filter` / `dllm train-filter`; missing or corrupt files are errors
    naming the file."""
    from safetensors import safe_open

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"Learn2PD filter {str(path)!r} is a folder; give the .safetensors file `dllm "
                         f"train-filter --out` wrote")
    if not path.is_file():
        raise FileNotFoundError(f"no Learn2PD filter file at {str(path)!r}; write one with `dllm train-filter "
                                f"--model MODEL --out {path}`")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as err:  # safetensors raises its own error types on a damaged file
        raise ValueError(f"corrupt Learn2PD filter file {str(path)!r}: {type(err).__name__}: {err}") from None
    try:
        meta = json.loads(header[META_KEY])
    except (KeyError, json.JSONDecodeError):
        meta = None
    if not isinstance(meta, dict):
        raise ValueError(f"{str(path)!r} is not a Learn2PD filter file (its header has no {META_KEY!r} "
                         f"metadata object); write one with `dllm train-filter`")
    K = meta.get("block_length")
    if meta.get("format") != FORMAT or isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"{str(path)!r} is not a Learn2PD filter file (format {meta.get('format')!r}, "
                         f"block_length {K!r})")
    filt = Learn2PDFilter(K)
    want = {k: tuple(v.shape) for k, v in filt.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if want != got:
        raise ValueError(f"Learn2PD filter file {str(path)!r} holds tensors {got}; a block_length {K} filter "
                         f"needs {want}")
    thres = meta.get("accept_thres")
    if thres is not None and (isinstance(thres, bool) or not isinstance(thres, (int, float)) or not 0 <= thres <= 1):
        raise ValueError(f"Learn2PD filter file {str(path)!r} records accept_thres {thres!r}; it must lie in [0, 1]")
    broken = [k for k, v in tensors.items() if not torch.isfinite(v).all()]
    if broken:
        raise ValueError(f"Learn2PD filter file {str(path)!r} holds NaN or infinite weights in {', '.join(broken)}")
    filt.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    filt.metadata, filt.path = meta, str(path)
    return filt.eval()


def shipped_filter(source: str | None) -> Path | None:
    """The filter shipped in a checkpoint folder (`learn2pd_filter.safetensors`), if any."""
    if not source:
        return None
    candidate = Path(source) / FILTER_FILE
    return candidate if candidate.is_file() else None


class Learn2PD(LowConfidence):
    """Learn2PD: a learned filter accepts block positions beyond LLaDA's count; end-of-text truncation."""

    name = "learn2pd"
    row_state = None
    file_arguments = ("filter",)
    uses_blocks = True
    fixed_schedule = False
    needs_logits = False
    score_fields = frozenset({"prob"})

    def __init__(self, *, filter=None, accept_thres: float | None = None, eotp: bool = True):
        # LLaDA's options stay off: the baseline count is plain low_confidence.
        self.logits_eos_inf = self.confidence_eos_eot_inf = False
        check_number("accept_thres", accept_thres, low=0, high=1, allow_none=True, sampler=self.name)
        if not isinstance(eotp, bool):
            raise ValueError(f"sampler {self.name!r}: eotp must be True or False, got {eotp!r}")
        self.eotp = eotp
        self._given_thres = accept_thres
        self.filter: Learn2PDFilter | None = None
        self.use_filter = True
        self.from_model = filter is None
        self._shipped_filters: dict[str, Learn2PDFilter] = {}   # filters shipped with models, by file
        if isinstance(filter, Learn2PDFilter):
            self.filter, shown = filter, filter.path or repr(filter)
        elif isinstance(filter, str) and filter.lower() == "none":
            self.use_filter, shown = False, "none"
        elif isinstance(filter, (str, os.PathLike)):
            self.filter, shown = load_filter(filter), str(filter)      # errors before any model work
        elif filter is None:
            shown = None                                              # resolved from the model at each setup
        else:
            raise ValueError(f"sampler {self.name!r}: filter must be a file path, 'none' or a Learn2PDFilter, "
                             f"got {type(filter).__name__}")
        self.accept_thres = self._resolve_thres()
        self._args = dict(filter=shown, accept_thres=self.accept_thres, eotp=eotp)

    def _resolve_thres(self, filt: Learn2PDFilter | None = None) -> float:
        """The given accept_thres, else the one `filt` (default: the given filter) records, else 0.96."""
        if self._given_thres is not None:
            return float(self._given_thres)
        filt = self.filter if filt is None else filt
        recorded = (filt.metadata if filt is not None else {}).get("accept_thres")
        return float(recorded) if isinstance(recorded, (int, float)) else DEFAULT_ACCEPT_THRES

    # -- lifecycle -------------------------------------------------------------------------
    def filter_for(self, source) -> Learn2PDFilter | None:
        """The filter a request on the model from `source` reads: the given one, else the one shipped
        with that model (loaded once per file), else None."""
        if not self.use_filter or not self.from_model:
            return self.filter
        found = shipped_filter(source)
        return None if found is None else loaded_once(self._shipped_filters, found, load_filter)

    def block_length_for(self, source):
        """The block length of the filter: the given one, else the one shipped with `source`."""
        filt = self.filter_for(source)
        return None if filt is None else filt.block_length

    def setup(self, state):
        filt = self.filter_for(state.source)
        if self.from_model:
            if filt is None:
                raise missing_from_checkpoint(
                    self.name, state.source, "a trained filter", FILTER_FILE,
                    "train one with `dllm train-filter --model MODEL --out filter.safetensors` and pass "
                    "filter='filter.safetensors', or filter='none' for LLaDA's schedule with end-of-text prediction only")
            state.extra["resolved_arguments"] = dict(filter=filt.path, accept_thres=self._resolve_thres(filt))
        if filt is not None:
            if filt.block_length != state.block_length:
                which = f"the filter {filt.path!r}" if filt.path else "the filter"
                raise ValueError(
                    f"sampler {self.name!r}: {which} was trained for block_length {filt.block_length}, and "
                    f"this request has block_length {state.block_length}; pass block_length="
                    f"{filt.block_length}, or train a filter for {state.block_length} with "
                    f"`dllm train-filter --block-length {state.block_length}`")
            filt.to(device=state.x.device, dtype=torch.float32).eval()
        # The request's filter and threshold (one instance may serve requests on several models).
        state.extra["learn2pd_filter"], state.extra["accept_thres"] = filt, self._resolve_thres(filt)
        super().setup(state)   # LLaDA's requirements and per-block counts

    def score_mask(self, state, rows):
        # The filter reads every block position (committed ones too); EoTP every masked one.
        mask = state.in_block(rows) if self.use_filter else state.masked_in_block(rows)
        if self.eotp:
            mask = mask | state.masked_in_generation(rows)
        return mask

    # -- the rule --------------------------------------------------------------------------
    def filter_accepts(self, state, rows, positions, valid, conf) -> torch.Tensor:
        """(B', Q) bool: scored block positions whose filter probability exceeds accept_thres
        (masked or not; the caller keeps the masked ones)."""
        start = state.block_start[rows, None]
        in_block = valid & (positions >= start) & (positions < state.block_end[rows, None])
        filt = state.extra["learn2pd_filter"]
        if filt is None:
            return torch.zeros_like(in_block)
        K = filt.block_length
        offset = (positions - start).clamp(0, K - 1)                                   # (B', Q)
        feats = torch.zeros(positions.shape[0], K, dtype=torch.float32, device=positions.device)   # (B', K)
        r, q = in_block.nonzero(as_tuple=True)
        feats[r, offset[r, q]] = conf[r, q].float()
        # sigmoid(z) > thres, compared as z > logit(thres): exact where float32 sigmoid would
        # round to 0 or 1 (thres 0 accepts every position, thres 1 none)
        z = filt(feats).double()
        t = float(state.extra["accept_thres"])
        accept = z > (math.log(t) - math.log1p(-t)) if 0 < t < 1 else torch.full_like(z, t == 0, dtype=torch.bool)
        return in_block & accept.gather(1, offset)

    def step(self, state, rows, positions, valid, scores):
        conf = scores.prob                                                              # (B', Q)
        masked = valid & (state.x[rows].gather(1, positions) == state.ids.mask)
        in_block = (positions >= state.block_start[rows, None]) & (positions < state.block_end[rows, None])
        due = masked & in_block
        accepted = self.filter_accepts(state, rows, positions, valid, conf) & due
        baseline = top_k_mask(conf.double().masked_fill(~due, float("-inf")), self.step_counts(state, rows)) & due
        dec = Decision(commit=accepted | baseline)
        if self.eotp:
            dec.truncate_at = eotp_cut(positions, conf, scores.token == state.ids.eos, accepted, masked)
        return dec


def eotp_cut(positions, conf, is_eos, accepted, masked) -> torch.Tensor:
    """(B',) long: the column to cut after (-1: none). positions (B', Q) in increasing column order;
    conf (B', Q) candidate probabilities; is_eos, accepted, masked (B', Q) bool.

    (a) the first accepted position whose candidate is EOS; else (b) the masked position with an
    EOS candidate and the highest confidence, the lowest column on ties."""
    a = accepted & is_eos
    b = masked & is_eos
    big = torch.iinfo(positions.dtype).max
    first_a = positions.masked_fill(~a, big).min(1).values
    best_b = conf.double().masked_fill(~b, float("-inf")).argmax(1)                    # first maximum
    cut_b = positions.gather(1, best_b[:, None]).squeeze(1)
    none = torch.full_like(first_a, -1)
    return torch.where(a.any(1), first_a, torch.where(b.any(1), cut_b, none))
