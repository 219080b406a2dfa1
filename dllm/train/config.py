"""The training recipe: `TrainConfig` (every field a `dllm train` flag, the defaults make the shipped
model), its later phases, the record of a recipe, and the command-line flags built from it.
docs/training.md explains each field."""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import torch

from ..config import check_fields
from ..eval import generators
from ..eval.names import DEFAULT_SOURCE, NAME_SOURCES

DEFAULT_TASKS = (
    "waiting_line/copy", "waiting_line/reverse", "waiting_line/sort", "waiting_line/shuffle",
    "waiting_line/insert_index", "waiting_line/insert_random", "waiting_line/remove_index",
    "waiting_line/remove_random", "waiting_line/replace_index", "waiting_line/replace_random",
    "puzzle/latin_square_n4", "puzzle/sudoku_n4_12",
)


# Batches per task relative to the others in the shipped recipe's first phase: the grids and the
# operations on the list weigh more than sort, which the model learns last if at all.
DEFAULT_TASK_WEIGHTS = ("waiting_line/copy=1.5,waiting_line/reverse=1.5,waiting_line/*_index=1.5,"
                        "waiting_line/*_random=1.5,waiting_line/shuffle=1.5,waiting_line/sort=0.5,"
                        "puzzle/latin_square_n4=2.5,puzzle/sudoku_n4_12=2")

LOSSES = ("masked-mean", "llada")
SEEDS = (-2 ** 63, 2 ** 64 - 1)     # torch.manual_seed's range, less one for the derived seed + 1
# Generated tasks training cannot render: Text Writing records have no single answer.
UNTRAINABLE_CATEGORIES = ("words_to_sentence/",)
INITS = ("mimetic", "normal")
PRECISIONS = ("auto", "bf16", "fp32")
EMBED_UPDATES = ("dense", "lazy", "frozen")
PREV_HEAD_INPUTS = ("embedding", "bias")
# The smallest vocabulary: the byte-level BPE's 256-byte alphabet and LLaDA's six special tokens
# (`data.SPECIAL_TOKENS`).
MIN_VOCAB = 256 + 6
# Rotary frequency pairs the built positional heads (previous-, next-token and window heads) use.
PREV_HEAD_PAIRS = 3
MAX_SEQ_LEN = 1024      # the exported model's maximum sequence length: prompt and canvas together
MAX_CANVAS = MAX_SEQ_LEN

# The task weights of the shipped recipe's later phases. Second: the Latin squares, the list tasks
# held at a low weight. Third: the list operations again, the Latin squares still weighing most.
# Fourth (and fifth, with cover names): the operations it still gets wrong most, at a lower
# learning rate. Sixth (with cover names): the same with the Latin squares weighing most.
THEN_TASK_WEIGHTS = "waiting_line/*=0.3,puzzle/latin_square_n4=6,puzzle/sudoku_n4_12=1"
LAST_TASK_WEIGHTS = ("waiting_line/copy=0.75,waiting_line/reverse=0.75,waiting_line/insert_index=1.5,"
                     "waiting_line/replace_index=1.5,waiting_line/remove_index=1,waiting_line/*_random=1.5,"
                     "waiting_line/shuffle=1,waiting_line/sort=1,puzzle/latin_square_n4=4,puzzle/sudoku_n4_12=1")
FINAL_TASK_WEIGHTS = ("waiting_line/copy=0.5,waiting_line/reverse=0.75,waiting_line/insert_index=2,"
                      "waiting_line/replace_index=2,waiting_line/remove_index=1.5,waiting_line/insert_random=2,"
                      "waiting_line/replace_random=1.5,waiting_line/remove_random=0.5,waiting_line/shuffle=1.5,"
                      "waiting_line/sort=0.25,puzzle/latin_square_n4=4,puzzle/sudoku_n4_12=2")


def reweighted(task_weights: str, changes: dict[str, str]) -> str:
    """`task_weights` ("pattern=weight,...") with the weights of the patterns in `changes`
    replaced, in place (the order, hence the recorded recipe string, is kept)."""
    entries = [entry.split("=", 1) for entry in task_weights.split(",")]
    unknown = set(changes) - {pattern for pattern, _ in entries}
    if unknown:
        raise ValueError(f"patterns {sorted(unknown)} are not in the task weights {task_weights!r}")
    return ",".join(f"{pattern}={changes.get(pattern, weight)}" for pattern, weight in entries)


LATIN_FINAL_TASK_WEIGHTS = reweighted(FINAL_TASK_WEIGHTS, {"waiting_line/replace_random": "2",
                                                           "waiting_line/remove_random": "1",
                                                           "puzzle/latin_square_n4": "10"})

# The then_ fields: one value per later phase; on the command line numbers are comma-separated and
# task weights (which hold commas) semicolon-separated.
THEN_FIELDS = {"then_steps": int, "then_lr": float, "then_min_lr": float, "then_seed": int, "then_task_weights": str,
               "then_cover_share": float}
NO_LATER_PHASES = {name: () for name in THEN_FIELDS}   # the then_ fields of a single-phase run

# TrainConfig fields that do not change the trained model: left out of the recorded recipe.
_NOT_RECIPE = ("out", "threads", "save_every", "name")


def check_seed(name: str, seed) -> None:
    """A seed torch.manual_seed takes, with room for the derived `seed + 1`."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEEDS[0] <= seed < SEEDS[1]:
        raise ValueError(f"{name} must be an integer in [-2**63, 2**64 - 1), got {seed!r}")


def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX512-BF16)."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def step_precision(precision: str) -> str:
    """The precision a training step runs in: "auto" is bf16 on a CPU with bf16 matrix units and
    fp32 elsewhere; "bf16" and "fp32" as given."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    return "bf16" if cpu_has_bf16_units() else "fp32"


def _finite(value) -> bool:
    """Whether `value` is a real, finite number (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


# The real-valued fields of TrainConfig whose range checks compare without checking the type (the
# others, grad_clip, weight_decay, rope_theta, pseudo_share and cover_share, check it themselves).
NUMBER_FIELDS = ("pair_lr", "pair_global", "pair_share", "lr", "min_lr", "eps", "embed_std", "qk_std", "vo_std",
                 "t_power", "end_weight", "distance_smoothing", "mask_example", "bind_mask", "hole_mask", "span_mask")


def then_values(name: str, value, kind: type) -> tuple:
    """A then_ field as a tuple of `kind`, one value per later phase, from a tuple or list, one value,
    or command-line text (numbers comma-separated, task weights semicolon-separated). then_steps 0
    (or nothing) means no later phase."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = value.split(";") if kind is str else value.split(",") if value.strip() else []
        if kind is not str and any(not v.strip() for v in parts):
            raise ValueError(f"{name} has an empty entry in {value!r}; give {kind.__name__} values, comma-separated, "
                             f"one per later phase")
        try:
            values = tuple(v.strip() if kind is str else kind(v.strip()) for v in parts)
        except ValueError:
            raise ValueError(f"{name} must be {kind.__name__} values, comma-separated, one per later phase; "
                             f"got {value!r}") from None
    elif isinstance(value, (list, tuple)):
        values = tuple(value)
    else:
        values = (value,)
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}[kind]
    bad = [v for v in values if not ok(v)]
    if bad:
        raise ValueError(f"{name} must be {kind.__name__} values, one per later phase; got {bad[0]!r} in {value!r}")
    values = tuple(float(v) for v in values) if kind is float else values
    return () if name == "then_steps" and values == (0,) else values


@dataclass
class TrainConfig:
    """The recipe. Every field is a `dllm train` flag; the defaults make the shipped model.

    Construction checks every field (a ValueError names the first bad one), turns `tasks` given as
    comma-separated text into a tuple, and brings the then_ fields to one value per later phase."""

    out: str = "runs/pb-tiny"
    seed: int = 0
    tasks: tuple = DEFAULT_TASKS
    samples_per_task: int = 13000
    names: str = DEFAULT_SOURCE
    pseudo_share: float = 0.5
    cover_share: float = 0.0
    canvas: int = 64
    vocab_size: int = 2048
    whole_names: bool = False
    embed_update: str = "dense"
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    mlp_hidden: int = 384
    tie_embeddings: bool = True
    init_from: str = ""
    steps: int = 4500
    copy_warmup_steps: int = 0
    pair_warmup_steps: int = 0
    pair_lr: float = 1e-3
    pair_global: float = 0.0
    pair_share: float = 0.0
    pair_max: int = 8
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eps: float = 1e-3
    rope_theta: float = 10000.0
    init: str = "mimetic"
    prev_token_head: bool = True
    prev_head_input: str = "bias"
    next_token_head: bool = True
    window_heads: int = 0
    embed_std: float = 0.1
    qk_std: float = 0.06
    vo_std: float = 0.05
    loss: str = "masked-mean"
    t_power: float = 1.0
    end_weight: float = 5.0
    distance_smoothing: float = 0.1
    mask_example: float = 0.5
    bind_mask: float = 0.15
    hole_mask: float = 0.35
    span_mask: float = 0.25
    task_weights: str = DEFAULT_TASK_WEIGHTS
    then_steps: tuple = (3500, 5000, 3000, 3000, 3000)
    then_lr: tuple = (8e-4, 5e-4, 3e-4, 3e-4, 3e-4)
    then_min_lr: tuple = (8e-5, 5e-5, 3e-5, 3e-5, 3e-5)
    then_seed: tuple = (1, 2, 4, 5, 6)
    then_task_weights: tuple = (THEN_TASK_WEIGHTS, LAST_TASK_WEIGHTS, FINAL_TASK_WEIGHTS, FINAL_TASK_WEIGHTS,
                                LATIN_FINAL_TASK_WEIGHTS)
    then_cover_share: tuple = (0.0, 0.0, 0.0, 0.25, 0.25)
    precision: str = "bf16"
    compile: bool = True
    save_every: int = 250
    threads: int | None = None
    name: str = "pb-tiny"

    def __post_init__(self):
        for k in NUMBER_FIELDS:    # their ranges are checked below, with the fields they depend on
            if not _finite(getattr(self, k)):
                raise ValueError(f"train option {k} must be a finite number, got {getattr(self, k)!r}")
        self._check_counts()
        self._check_model_options()
        self._check_objective_options()
        self._set_tasks()
        self._set_later_phases()

    def _check_counts(self) -> None:
        """The sizes, step counts, the seed and the pair curriculum's settings."""
        check_seed("seed", self.seed)
        ints = ("samples_per_task", "vocab_size", "d_model", "n_layers", "n_heads", "mlp_hidden", "steps",
                "batch_size", "save_every")
        for k in ints:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"train option {k} must be a positive integer, got {v!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"train option warmup must be an integer >= 0 (steps of linear warm-up), "
                             f"got {self.warmup!r}")
        if not isinstance(self.out, str) or not self.out.strip():
            raise ValueError(f"train option out must name a folder, got {self.out!r}")
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise ValueError(f"train option threads must be an integer >= 0 (0 or unset: torch's default), got {t!r}")
        w = self.copy_warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < self.steps:
            raise ValueError(f"copy_warmup_steps must be an integer in [0, steps={self.steps}), got {w!r}")
        p = self.pair_warmup_steps
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self.steps - w:
            raise ValueError(f"pair_warmup_steps must be an integer in [0, steps - copy_warmup_steps = "
                             f"{self.steps - w}), got {p!r}")
        if not 0 < self.pair_lr < 1:
            raise ValueError(f"pair_lr must be in (0, 1), got {self.pair_lr}")
        if not 0 <= self.pair_global <= 1:
            raise ValueError(f"pair_global must be in [0, 1], got {self.pair_global}")
        if not 0 <= self.pair_share < 1:
            raise ValueError(f"pair_share must be in [0, 1), got {self.pair_share}")
        if isinstance(self.pair_max, bool) or not isinstance(self.pair_max, int) or not 3 <= self.pair_max <= 64:
            raise ValueError(f"pair_max must be an integer in [3, 64], got {self.pair_max!r}")

    def _check_model_options(self) -> None:
        """The tokenizer, embedding and model-shape switches."""
        if self.embed_update not in EMBED_UPDATES:
            raise ValueError(f"embed_update {self.embed_update!r} is not one of {', '.join(EMBED_UPDATES)}")
        if not isinstance(self.whole_names, bool):
            raise ValueError(f"whole_names must be true or false, got {self.whole_names!r}")
        if not isinstance(self.prev_token_head, bool):
            raise ValueError(f"prev_token_head must be true or false, got {self.prev_token_head!r}")
        if not isinstance(self.next_token_head, bool):
            raise ValueError(f"next_token_head must be true or false, got {self.next_token_head!r}")
        if self.next_token_head and self.n_heads < 2:
            raise ValueError(f"next_token_head builds head 1 of layer 0 and needs n_heads >= 2, got {self.n_heads}")
        w = self.window_heads
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"window_heads must be an integer >= 0, got {w!r}")
        if w and self.n_heads < 2 + 2 * w:
            raise ValueError(f"window_heads {w} builds heads 2..{1 + 2 * w} of layer 0 and needs n_heads >= "
                             f"{2 + 2 * w}, got {self.n_heads}")
        if self.prev_head_input not in PREV_HEAD_INPUTS:
            raise ValueError(f"prev_head_input {self.prev_head_input!r} is not one of {', '.join(PREV_HEAD_INPUTS)}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        if self.names not in NAME_SOURCES:
            raise ValueError(f"names {self.names!r} is not one of {', '.join(NAME_SOURCES)}")
        if isinstance(self.pseudo_share, bool) or not isinstance(self.pseudo_share, (int, float)) \
                or not 0 <= self.pseudo_share < 1:
            raise ValueError(f"pseudo_share must be a number in [0, 1), got {self.pseudo_share!r}")
        if isinstance(self.cover_share, bool) or not isinstance(self.cover_share, (int, float)) \
                or not 0 <= self.cover_share <= 1:
            raise ValueError(f"cover_share must be a number in [0, 1], got {self.cover_share!r}")
        if isinstance(self.canvas, bool) or not isinstance(self.canvas, int) or not 0 <= self.canvas <= MAX_CANVAS:
            raise ValueError(f"canvas must be an integer in [0, {MAX_CANVAS}] (0: each task's max_tokens), "
                             f"got {self.canvas!r}")
        if self.vocab_size < MIN_VOCAB:
            raise ValueError(f"vocab_size must be at least {MIN_VOCAB} (the 256-byte alphabet and 6 special tokens), "
                             f"got {self.vocab_size}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        head_dim = self.d_model // self.n_heads
        if head_dim % 2:
            raise ValueError(f"d_model / n_heads = {head_dim} must be even (rotary embeddings rotate pairs), got "
                             f"d_model {self.d_model}, n_heads {self.n_heads}")
        if (self.prev_token_head or self.next_token_head or w) and head_dim < 2 * PREV_HEAD_PAIRS:
            raise ValueError(f"the built positional heads (prev_token_head, next_token_head, window_heads) need "
                             f"d_model / n_heads >= {2 * PREV_HEAD_PAIRS}, got {head_dim}")

    def _check_objective_options(self) -> None:
        """The learning rates, the init, the loss and its masks, the precision and RoPE."""
        if not 0 < self.lr < 1 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need 0 < lr < 1 and 0 <= min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if isinstance(self.grad_clip, bool) or not isinstance(self.grad_clip, (int, float)) \
                or not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be a number > 0 (the largest gradient norm; inf: no clipping), "
                             f"got {self.grad_clip!r}")
        if not _finite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if self.init not in INITS:
            raise ValueError(f"init {self.init!r} is not one of {', '.join(INITS)}")
        for k in ("embed_std", "qk_std", "vo_std"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise ValueError(f"{k} must be in (0, 1], got {v}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not one of {', '.join(LOSSES)}")
        if not 0 < self.t_power <= 10:
            raise ValueError(f"t_power must be in (0, 10], got {self.t_power}")
        if not 1 <= self.end_weight <= 100:
            raise ValueError(f"end_weight must be in [1, 100], got {self.end_weight}")
        if isinstance(self.distance_smoothing, bool) or not 0 <= self.distance_smoothing < 1:
            raise ValueError(f"distance_smoothing must be in [0, 1), got {self.distance_smoothing!r}")
        if not 0 <= self.mask_example <= 1:
            raise ValueError(f"mask_example must be in [0, 1], got {self.mask_example}")
        if not 0 <= self.bind_mask <= 1:
            raise ValueError(f"bind_mask must be in [0, 1], got {self.bind_mask}")
        if not 0 <= self.hole_mask <= 1 - self.bind_mask:
            raise ValueError(f"hole_mask must be in [0, 1 - bind_mask = {1 - self.bind_mask:g}], got {self.hole_mask}")
        room = 1 - self.bind_mask - self.hole_mask
        if not 0 <= self.span_mask <= room + 1e-12 or (self.span_mask > 0 and room <= 1e-12):
            raise ValueError(f"span_mask must be in [0, 1 - bind_mask - hole_mask = {room:g}], got {self.span_mask}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be true or false, got {self.compile!r}")
        if not _finite(self.rope_theta) or not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be a finite number > 0, got {self.rope_theta!r}")

    def _set_tasks(self) -> None:
        """`tasks` as a tuple of generated task ids (comma-separated text is split); checks the task weights."""
        if isinstance(self.tasks, str):
            self.tasks = tuple(t.strip() for t in self.tasks.split(",") if t.strip())
        trainable = [t for t in generators.generator_tasks() if not t.startswith(UNTRAINABLE_CATEGORIES)]
        bad = [t for t in self.tasks if t not in trainable]
        if bad or not self.tasks:
            raise ValueError(f"cannot train on task(s) {', '.join(bad) or '(none)'}; training takes the generated "
                             f"tasks with one answer each: {', '.join(trainable)}")
        self.sampling_weights()

    def _set_later_phases(self) -> None:
        """Each then_ field as one value per later phase (a single value serves every phase), checked."""
        for name, kind in THEN_FIELDS.items():
            setattr(self, name, then_values(name, getattr(self, name), kind))
        if not self.then_steps:   # no later phase: the other then_ values would change nothing
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            given = [name for name, kind in THEN_FIELDS.items() if name != "then_steps"
                     and getattr(self, name) not in ((), then_values(name, defaults[name], kind))]
            if given:
                raise ValueError(f"{', '.join(given)} set(s) later phases, and then_steps gives none")
            for name in THEN_FIELDS:
                setattr(self, name, ())
            return
        n = len(self.then_steps)
        if any(t < 1 for t in self.then_steps):
            raise ValueError(f"then_steps must be integers >= 1, one per later phase (none: no later "
                             f"phase), got {list(self.then_steps)}")
        for name in THEN_FIELDS:
            have = getattr(self, name)
            if len(have) == 1 and n > 1:
                setattr(self, name, have * n)
            elif len(have) != n:
                raise ValueError(f"{name} has {len(have)} value(s) {list(have)} for {n} later phase(s) "
                                 f"(then_steps {list(self.then_steps)}); give one per phase or one for all")
        for i, seed in enumerate(self.then_seed):
            check_seed(f"then_seed[{i}]", seed)
        if any(not 0 <= c <= 1 for c in self.then_cover_share):
            raise ValueError(f"then_cover_share must be numbers in [0, 1], one per later phase, got "
                             f"{list(self.then_cover_share)}")
        for lr, min_lr in zip(self.then_lr, self.then_min_lr):
            if not 0 < lr < 1 or not 0 <= min_lr <= lr:
                raise ValueError(f"need 0 < then_lr < 1 and 0 <= then_min_lr <= then_lr in each later "
                                 f"phase, got then_lr={lr}, then_min_lr={min_lr}")
        for i in range(n):
            self.then_phase(i, "")

    def then_phase(self, i: int, start: str) -> "TrainConfig":
        """Later phase `i` (0: the second phase) of the recipe: a run going on from the model folder
        `start` of the phase before, with its own step count, learning rates, seed (so fresh training
        records), task weights (empty: the first phase's) and cover-name share, no copy or pair warm-up
        and no later phases of its own; everything else as in the first phase."""
        return dataclasses.replace(
            self, init_from=start, steps=self.then_steps[i], lr=self.then_lr[i], min_lr=self.then_min_lr[i],
            copy_warmup_steps=0, pair_warmup_steps=0, seed=self.then_seed[i],
            task_weights=self.then_task_weights[i] or self.task_weights, cover_share=self.then_cover_share[i],
            **NO_LATER_PHASES)

    def sampling_weights(self) -> dict[str, float] | None:
        """How often each task's batches are drawn, from `task_weights` ("PATTERN=W,...", glob
        patterns over task ids, the last match wins, unmatched tasks weigh 1; a pattern must name
        some generated task, and one naming only tasks outside `tasks` is ignored so the default
        weights work with any task subset); None when every task weighs the same (uniform draws)."""
        generated = generators.generator_tasks()
        weights = {t: 1.0 for t in self.tasks}
        for item in (i.strip() for i in self.task_weights.split(",")):
            if not item:
                continue
            pattern, sep, value = item.rpartition("=")
            try:
                w = float(value)
            except ValueError:
                w = float("nan")
            if not sep or not pattern or not (w >= 0 and math.isfinite(w)):
                raise ValueError(f"task_weights entry {item!r} is not PATTERN=WEIGHT with a weight >= 0")
            known = [t for t in generated if fnmatchcase(t, pattern.strip())]
            if not known:
                raise ValueError(f"task_weights pattern {pattern.strip()!r} matches none of the generated "
                                 f"tasks {', '.join(generated)}")
            hits = [t for t in self.tasks if t in known]  # patterns for tasks not trained on are ignored
            weights.update(dict.fromkeys(hits, w))
        if not any(weights.values()):
            raise ValueError(f"task_weights {self.task_weights!r} gives every task weight 0")
        return None if len(set(weights.values())) == 1 else weights


def recipe_fields(cfg: TrainConfig) -> dict:
    """The recipe fields of `cfg` as recorded in checkpoints and train_info.json: every field but
    those that do not change the model (out, threads, save_every, name), tuples as lists."""
    recipe = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_RECIPE}
    for k in ("tasks", *THEN_FIELDS):
        recipe[k] = list(recipe[k])
    return recipe


def complete_recipe(recorded: dict) -> dict:
    """A recipe recorded by an earlier version, with each field added since at its default (the
    value such a run trained with), and without the then_ values that versions kept in runs with no
    later phase."""
    recipe = {**recipe_fields(TrainConfig()), **recorded}
    return recipe if recipe["then_steps"] else {**recipe, **{k: [] for k in THEN_FIELDS}}


def phase_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """The runs a recipe makes, in order: the first phase (all of cfg but the then_ fields), then one
    per later phase (`TrainConfig.then_phase`), each going on from the model of the one before. All
    but the last run in `out/phase<k>` (k from 1); the last in `out`."""
    n = len(cfg.then_steps) + 1
    outs = [str(Path(cfg.out) / f"phase{k}") for k in range(1, n)] + [cfg.out]
    runs = [dataclasses.replace(cfg, out=outs[0], **NO_LATER_PHASES)]
    for i in range(n - 1):
        runs.append(dataclasses.replace(cfg.then_phase(i, str(Path(outs[i]) / "model")), out=outs[i + 1]))
    return runs


# -- the command line -----------------------------------------------------------------------------
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_train_arguments(parser) -> None:
    """One `--flag` per TrainConfig field, typed and defaulted from the dataclass."""
    defaults = TrainConfig.__dataclass_fields__
    for f in dataclasses.fields(TrainConfig):
        default = defaults[f.name].default
        flag = "--" + f.name.replace("_", "-")
        if f.name == "tasks":
            parser.add_argument(flag, default=None, help=f"comma-separated task ids (default: {','.join(default)})")
        elif f.name == "then_task_weights":
            parser.add_argument(flag, default=None, help="task weights of each later phase, semicolon-separated "
                                f"(default: {';'.join(default)})")
        elif f.name in THEN_FIELDS:
            none = "; 0: no later phase" if f.name == "then_steps" else ""
            parser.add_argument(flag, default=None, help="one value per later phase, comma-separated (default: "
                                f"{','.join(map(str, default))}{none})")
        elif isinstance(default, bool):
            parser.add_argument(flag, type=_parse_bool, default=None, help=f"true or false (default {default})")
        elif f.name == "threads":
            parser.add_argument(flag, type=int, default=None, help="torch threads (default: torch's choice)")
        else:
            parser.add_argument(flag, type=type(default), default=None, help=f"default {default}")


def config_from_args(args: dict) -> TrainConfig:
    """The TrainConfig of `args` (field name -> value); a ValueError names any unknown option."""
    check_fields(TrainConfig, args, "train")
    return TrainConfig(**args)
