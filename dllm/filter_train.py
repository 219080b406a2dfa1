"""Learn2PD filter training: labels from the model's own decoding, then the tiny MLP.

    dllm train-filter --model runs/pb-tiny --out runs/pb-tiny/learn2pd_filter.safetensors

1. `collect_labels`: for each prompt, the model's own reference decode (LLaDA `low_confidence`,
   steps = gen_length, temperature 0: self-distillation, not ground truth), then the oracle
   re-decode "Extremely Greedy Parallel" (EGP). Each EGP step records, for the active block, the
   K confidences (the un-tempered top-1 probability at every block position, committed ones
   included) and the K booleans `candidate == reference`; it then commits every masked position
   whose candidate is correct, and when the block's candidates equal the previous step's (stuck),
   it copies the reference into the block. The EGP decode therefore ends on the reference tokens.
2. `train_filter`: records shuffled with the seed and split 80/10/10; full batch,
   BCEWithLogitsLoss, AdamW (lr 0.003); accuracy, false-positive and false-negative rates of
   sigmoid > 0.9 on the validation and test splits, as the published notebook reports them.
3. `train_filter_for_model`: prompts from our ParallelBench generators' train split (Waiting Line
   and Puzzle tasks by default) rendered with the task template and the chat template, exactly as
   the benchmark renders them, gen_length = the checkpoint's (`max_new_tokens` of its
   generation_config.json) or else the task's max_tokens; the filter is saved with
   `dllm.samplers.learn2pd.save_filter` (safetensors + JSON metadata).

Published recipe (Learn2PD, arXiv:2509.25188): 40 prompts per task, block 32, steps = gen_length,
40,000 epochs full batch, AdamW lr 0.003, validation at sigmoid > 0.9.
"""
from __future__ import annotations

import datetime
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import __version__
from .config import check_seed
from .decode import checkpoint_gen_length, generate
from .eval import generators
from .eval.names import DEFAULT_SOURCE
from .eval.tasks import encode_messages, get_task, messages
from .samplers.base import Sampler
from .samplers.learn2pd import DEFAULT_ACCEPT_THRES, Learn2PDFilter, save_filter
from .state import Decision

DEFAULT_TASKS = (
    "waiting_line/copy", "waiting_line/reverse", "waiting_line/sort", "waiting_line/shuffle",
    "waiting_line/insert_index", "waiting_line/insert_random", "waiting_line/remove_index",
    "waiting_line/remove_random", "waiting_line/replace_index", "waiting_line/replace_random",
    "puzzle/latin_square_n4", "puzzle/sudoku_n4_12",
)
# The train-split shard of the prompts: the shipped recipe trains on the shards of its phases' seeds
# (seed % 1000: 0 to 2 and 4 to 6), so shard 3 holds prompts the model never trained on.
DEFAULT_SHARD = 3
VALIDATION_THRESHOLD = 0.9


@dataclass
class LabelRecords:
    """EGP records: one row per oracle step and prompt.

    confidence: (N, K) float32 top-1 probabilities of the block positions.
    is_correct: (N, K) bool, candidate == the model's own reference token.
    prompts, blocks: how many prompts and blocks produced them; reference_forwards and
    oracle_forwards: batched model forwards of the two passes; skipped: prompts too long for the model.
    """

    confidence: torch.Tensor
    is_correct: torch.Tensor
    prompts: int = 0
    blocks: int = 0
    reference_forwards: int = 0
    oracle_forwards: int = 0
    skipped: int = 0
    per_gen_length: dict = field(default_factory=dict)

    @property
    def block_length(self) -> int:
        return self.confidence.shape[1]

    def __len__(self) -> int:
        return self.confidence.shape[0]

    def counts(self) -> dict:
        n = len(self)
        return {"prompts": self.prompts, "skipped_prompts": self.skipped, "blocks": self.blocks, "records": n,
                "positions": n * self.block_length,
                "positive_rate": float(self.is_correct.float().mean()) if n else None,
                "oracle_steps_per_block": n / self.blocks if self.blocks else None,
                "reference_forwards": self.reference_forwards, "oracle_forwards": self.oracle_forwards,
                "gen_lengths": dict(self.per_gen_length)}


class EGPOracle(Sampler):
    """The EGP oracle: commits exactly the masked block positions whose candidate equals the
    reference, copies the reference into a stuck block, and records every step (see the module
    docstring). `reference` (B, G) long: the reference generation of each row."""

    name = "egp-oracle"
    uses_blocks = True
    fixed_schedule = True       # it may commit nothing in a step (then the next step is stuck)
    score_fields = frozenset({"prob"})

    def __init__(self, reference: torch.Tensor):
        self.reference = reference
        self.confidence: list[torch.Tensor] = []
        self.is_correct: list[torch.Tensor] = []

    def setup(self, state):
        G, K = state.gen_length, state.block_length
        if G % K:
            raise ValueError(f"EGP labels need gen_length {G} to be a multiple of block_length {K}")
        if tuple(self.reference.shape) != (state.batch_size, G):
            raise ValueError(f"reference of shape {tuple(self.reference.shape)} for {state.batch_size} rows of "
                             f"gen_length {G}")
        self.reference = self.reference.to(state.x.device)
        state.extra["egp_prev"] = torch.full((state.batch_size, K), -1, dtype=torch.long, device=state.x.device)
        state.extra["egp_has_prev"] = torch.zeros(state.batch_size, dtype=torch.bool, device=state.x.device)

    def begin_block(self, state, rows):
        state.extra["egp_has_prev"][rows] = False

    def score_mask(self, state, rows):
        return state.in_block(rows)          # every block position, committed ones included

    def step(self, state, rows, positions, valid, scores):
        if not bool(valid.all()) or positions.shape[1] != state.block_length:
            raise RuntimeError("EGP oracle: every row must score exactly its block's K columns")
        ref = self.reference[rows].gather(1, positions - state.gen_start)             # (B', K)
        correct = scores.token == ref
        self.confidence.append(scores.prob.float().cpu())
        self.is_correct.append(correct.cpu())
        masked = state.x[rows].gather(1, positions) == state.ids.mask
        prev, has_prev = state.extra["egp_prev"], state.extra["egp_has_prev"]
        stuck = has_prev[rows] & (scores.token == prev[rows]).all(1)                  # (B',)
        prev[rows] = scores.token
        has_prev[rows] = True
        commit = torch.where(stuck[:, None], masked, masked & correct)
        return Decision(commit=commit, tokens=ref)


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def collect_labels(model, tokenizer, prompts: list[list[int]], gen_length: int | list[int], block_length: int = 32,
                   *, batch_size: int = 16, progress: bool = True) -> LabelRecords:
    """EGP records of `prompts` (token-id lists) decoded by `model` (module docstring, step 1).

    gen_length: one length for every prompt, or one per prompt (prompts are batched by length).
    Prompts longer than the model allows with their gen_length are skipped and counted.
    Returns LabelRecords with (N, block_length) confidence / is_correct.
    """
    lengths = [gen_length] * len(prompts) if isinstance(gen_length, int) else list(gen_length)
    if len(lengths) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(lengths)} gen_lengths")
    if isinstance(block_length, bool) or not isinstance(block_length, int) or block_length < 1:
        raise ValueError(f"block_length must be an integer >= 1, got {block_length!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    for g in set(lengths):
        if isinstance(g, bool) or not isinstance(g, int) or g < 1 or g % block_length:
            raise ValueError(f"gen_length {g!r} must be a positive multiple of block_length {block_length}")
    limit = model.config.max_seq_len
    groups: dict[int, list[list[int]]] = {}
    skipped = 0
    for p, g in zip(prompts, lengths):
        if len(p) + g > limit:
            skipped += 1
            continue
        groups.setdefault(g, []).append(list(p))
    if not groups:
        raise ValueError(f"every one of the {len(prompts)} prompts is too long for the model's maximum sequence "
                         f"length {limit} with its gen_length")
    conf, correct = [], []
    out = LabelRecords(torch.empty(0, block_length), torch.empty(0, block_length, dtype=torch.bool), skipped=skipped)
    total = sum(len(v) for v in groups.values())
    bar = None
    if progress:
        bar = tqdm(total=total, desc="labels", unit="prompt", file=sys.stderr)
    for g, rows in groups.items():
        out.per_gen_length[g] = out.per_gen_length.get(g, 0) + len(rows)
        for chunk in _batches(rows, batch_size):
            common = dict(gen_length=g, block_length=block_length, steps=g, temperature=0.0)
            ref = generate(model, None, chunk, sampler="low_confidence", **common)
            oracle = EGPOracle(ref.generated.clone())
            egp = generate(model, None, chunk, sampler=oracle, max_forwards=g + g // block_length + 1, **common)
            if any(egp.hit_cap) or not torch.equal(egp.generated, ref.generated):
                raise RuntimeError("the EGP oracle did not reproduce the reference decode; this is a bug")
            conf += oracle.confidence
            correct += oracle.is_correct
            out.prompts += len(chunk)
            out.blocks += len(chunk) * (g // block_length)
            out.reference_forwards += ref.forwards
            out.oracle_forwards += egp.forwards
            if bar is not None:
                bar.update(len(chunk))
    if bar is not None:
        bar.close()
    out.confidence = torch.cat(conf)
    out.is_correct = torch.cat(correct)
    return out


def _figures(filt, X, y, threshold: float) -> dict | None:
    if X.shape[0] == 0:
        return None
    with torch.no_grad():
        logits = filt(X)
        loss = F.binary_cross_entropy_with_logits(logits, y).item()
        pred = torch.sigmoid(logits) > threshold
    truth = y.bool()
    accepted, rejected = int(pred.sum()), int((~pred).sum())
    return {"records": int(X.shape[0]), "loss": loss, "threshold": threshold,
            "accuracy": float((pred == truth).float().mean()),
            "false_positive_rate": float((pred & ~truth).sum()) / accepted if accepted else None,
            "false_negative_rate": float((~pred & truth).sum()) / rejected if rejected else None,
            "accepted_rate": accepted / pred.numel()}


def check_fit_settings(epochs, lr, seed) -> None:
    """The fit's settings: epochs an integer >= 1, lr a number in (0, 1), seed an integer torch's
    generators take, in [-2**63, 2**64)."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 < lr < 1:
        raise ValueError(f"lr must be a number in (0, 1), got {lr!r}")
    check_seed(seed, allow_none=False)


def train_filter(records: LabelRecords, epochs: int = 40000, lr: float = 0.003, seed: int = 0, *,
                 progress: bool = True) -> tuple[Learn2PDFilter, dict]:
    """Fit a Learn2PDFilter to `records` (module docstring, step 2).

    Returns (filter, report) where report holds the split sizes and the validation and test
    figures at sigmoid > 0.9 (accuracy, false-positive / false-negative rates, loss).
    Deterministic in `seed` (shuffle and initialisation use their own generator).
    """
    check_fit_settings(epochs, lr, seed)
    n = len(records)
    if n == 0:
        raise ValueError("no label records to train on")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    X = records.confidence.float()[order]                                          # (N, K)
    y = records.is_correct.float()[order]
    n_train, n_val = int(n * 0.8), int(n * 0.1)
    n_train = max(n_train, 1)
    splits = {"train": slice(0, n_train), "validation": slice(n_train, n_train + n_val),
              "test": slice(n_train + n_val, n)}
    K = records.block_length
    filt = Learn2PDFilter(K)
    bound = 1.0 / math.sqrt(K)           # torch's default Linear init, drawn from our generator
    with torch.no_grad():
        for p in filt.parameters():
            p.uniform_(-bound, bound, generator=gen)
    opt = torch.optim.AdamW(filt.parameters(), lr=lr)
    Xt, yt = X[splits["train"]], y[splits["train"]]
    bar = None
    if progress:
        bar = tqdm(total=epochs, desc="filter", unit="epoch", file=sys.stderr)
    every = max(1, epochs // 100)
    loss = None
    filt.train()
    for epoch in range(epochs):
        opt.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(filt(Xt), yt)
        loss.backward()
        opt.step()
        if bar is not None and (epoch + 1) % every == 0:
            bar.update(every)
            bar.set_postfix(loss=f"{loss.item():.4f}")
    if bar is not None:
        bar.update(epochs - bar.n)
        bar.close()
    filt.eval()
    report = {"epochs": epochs, "lr": lr, "seed": seed, "optimizer": "AdamW", "loss_fn": "BCEWithLogitsLoss",
              "full_batch": True, "split": {k: s.stop - s.start for k, s in splits.items()},
              "train_loss": float(loss.item()),
              "validation": _figures(filt, X[splits["validation"]], y[splits["validation"]], VALIDATION_THRESHOLD),
              "test": _figures(filt, X[splits["test"]], y[splits["test"]], VALIDATION_THRESHOLD)}
    return filt, report


def task_prompts(tokenizer, tasks, samples_per_task: int, shard: int = DEFAULT_SHARD,
                 names: str = DEFAULT_SOURCE, gen_length: int | None = None) -> tuple[list[list[int]], list[int]]:
    """Token ids and gen_lengths of `samples_per_task` train-split records of each generated task,
    people from `names`, rendered as the benchmark renders them (task template, in-context example,
    chat template). The gen_length is `gen_length`, or each task's max_tokens when None."""

    bad = [t for t in tasks if t not in generators.generator_tasks()]
    if bad or not tasks:
        raise ValueError(f"no generator for task(s) {', '.join(bad) or '(none)'}; generated tasks: "
                         f"{', '.join(generators.generator_tasks())}")
    ids, lengths = [], []
    for task in tasks:
        spec = get_task(task)
        for record in generators.make_records(task, split=generators.TRAIN_SPLIT, num_samples=samples_per_task,
                                              shard=shard, names=names):
            ids.append(encode_messages(tokenizer, messages(spec, record)))
            lengths.append(gen_length or spec.max_tokens)
    return ids, lengths


def check_filter_path(out) -> None:
    """`out` names a filter file: a .safetensors path that is not a folder (`save_filter` writes the
    metadata beside it as .json, so a .json path would lose the weights)."""
    path = Path(out)
    if path.suffix != ".safetensors":
        raise ValueError(f"out {str(out)!r} must be a .safetensors file (the metadata is written beside it as .json)")
    if path.is_dir():
        raise ValueError(f"out {str(out)!r} is a folder; give a .safetensors file")
    try:       # written at the end of a long run: a folder that cannot hold it is refused now
        path.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path.parent).close()
    except OSError as err:
        raise OSError(f"cannot write out {str(out)!r}: {err}") from None


def train_filter_for_model(model, tokenizer, out, *, tasks=DEFAULT_TASKS, samples_per_task: int = 40,
                           shard: int = DEFAULT_SHARD, names: str = DEFAULT_SOURCE, block_length: int = 32,
                           epochs: int = 40000, lr: float = 0.003, seed: int = 0, batch_size: int = 16,
                           accept_thres: float = DEFAULT_ACCEPT_THRES,
                           progress: bool = True) -> tuple[Path, dict]:
    """Prompts -> labels -> filter -> `out` (safetensors + `<out>.json`). Returns (path, metadata).

    The gen_length of a task is the checkpoint's (`checkpoint_gen_length`), else its max_tokens,
    rounded up to a multiple of block_length.
    shard: the generators' train-split shard (a recipe trains on shard `seed % 1000` of each phase's
    seed: the shipped one on shards 0 to 2 and 4 to 6; `DEFAULT_SHARD` holds prompts it never trained on);
    names: their people (`dllm.eval.names.NAME_SOURCES`).
    """
    if isinstance(samples_per_task, bool) or not isinstance(samples_per_task, int) or samples_per_task < 1:
        raise ValueError(f"samples_per_task must be an integer >= 1, got {samples_per_task!r}")
    if not isinstance(accept_thres, (int, float)) or isinstance(accept_thres, bool) or not 0 <= accept_thres <= 1:
        raise ValueError(f"accept_thres must be a number in [0, 1], got {accept_thres!r}")
    if isinstance(block_length, bool) or not isinstance(block_length, int) or block_length < 1:
        raise ValueError(f"block_length must be an integer >= 1, got {block_length!r}")
    check_fit_settings(epochs, lr, seed)        # before the labels, the long part
    check_filter_path(out)
    tasks = tuple(tasks)
    prompts, lengths = task_prompts(tokenizer, tasks, samples_per_task, shard, names,
                                    checkpoint_gen_length(model))
    lengths = [-(-g // block_length) * block_length for g in lengths]
    records = collect_labels(model, tokenizer, prompts, lengths, block_length, batch_size=batch_size,
                             progress=progress)
    filt, report = train_filter(records, epochs=epochs, lr=lr, seed=seed, progress=progress)

    meta = {"block_length": block_length, "accept_thres": float(accept_thres),
            "model": getattr(model, "name_or_path", None), "model_family": model.config.family,
            "labels": {"reference": "low_confidence, steps = gen_length, temperature 0 (the model's own output)",
                       "oracle": "EGP: commit every correct position; copy the reference into a stuck block"},
            "prompts": {"source": "dllm.eval.generators", "split": "train", "shard": shard, "names": names,
                        "tasks": list(tasks),
                        "samples_per_task": samples_per_task, "rendering": "task template + chat template"},
            "counts": records.counts(),
            "training": {k: v for k, v in report.items() if k not in ("validation", "test")},
            "validation": report["validation"], "test": report["test"],
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "dllm_version": __version__, "torch_version": torch.__version__}
    path = save_filter(filt, out, meta)
    return path, meta


__all__ = ["DEFAULT_SHARD", "DEFAULT_TASKS", "EGPOracle", "LabelRecords", "collect_labels", "task_prompts", "train_filter",
           "train_filter_for_model"]
