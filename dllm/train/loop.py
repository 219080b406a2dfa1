"""The training run: the learning-rate schedule, one phase's loop (batches, masks, optimizer steps,
checkpoints, export) and a recipe's phases in turn."""
from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from ..distributed import refuse_several_processes
from ..models.llada import LLaDAModel
from .config import MAX_SEQ_LEN, TrainConfig, complete_recipe, phase_configs, recipe_fields, step_precision
from .cover import cover_pool, with_cover_names
from .data import (PAIR_BIND_ROWS, Encoded, answer_text, build_tokenizer, copy_example, copy_vocab, encode_records,
                   example_columns, global_pairing, make_batch, pair_example, response_sides, tokenizer_texts,
                   training_records)
from .model_init import generation_defaults, init_weights, model_config, save_pretrained, start_config, start_model
from .objective import bind_rows, diffusion_loss, hole_rows, span_rows


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (from 0): linear warm-up over `warmup` steps to the
    peak (`pair_lr` in the pair warm-up, `lr` otherwise), constant `pair_lr` through the pair
    warm-up, then a cosine from `lr` to `min_lr` over the steps after it (steps of a copy warm-up
    before it run at `lr`). Without a pair warm-up the cosine starts after the linear warm-up, over
    any copy warm-up steps too."""
    pair_end = cfg.copy_warmup_steps + cfg.pair_warmup_steps
    in_pairs = cfg.copy_warmup_steps <= step < pair_end
    if step < cfg.warmup:
        return (cfg.pair_lr if in_pairs else cfg.lr) * (step + 1) / cfg.warmup
    if in_pairs:
        return cfg.pair_lr
    start = max(cfg.warmup, pair_end) if cfg.pair_warmup_steps else cfg.warmup
    p = (step - start) / max(1, cfg.steps - start)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(max(p, 0.0), 1.0)))


def train(cfg: TrainConfig, progress: bool = True, stop_after: int | None = None) -> Path | None:
    """Train (or resume from the checkpoints under `out`) and export the model to `<out>/model`;
    returns that folder, or None when `stop_after` optimizer steps (all phases counted) stopped
    the run first, checkpointed as an interruption would leave it. Training runs in one process:
    a multi-process launch (WORLD_SIZE > 1) is refused. `threads` holds for the run only: the
    caller's torch thread count is restored afterwards."""
    refuse_several_processes("training")
    threads = torch.get_num_threads()
    try:
        if cfg.then_steps:
            return _train_phases(cfg, progress, stop_after)
        return _train_phase(cfg, progress, stop_after)
    finally:
        torch.set_num_threads(threads)


def _train_phases(cfg: TrainConfig, progress: bool, stop_after: int | None) -> Path | None:
    """Each phase of `phase_configs` in turn, each resuming from its own checkpoint. `out/train_info.json`
    then holds the whole recipe, the totals and every phase's record. `stop_after` counts the
    steps of all phases together."""
    runs = phase_configs(cfg)
    for run in runs:     # a phase's checkpoint made with other settings is refused before any phase trains
        ckpt_path = Path(run.out) / "checkpoint.pt"
        _check_recorded_recipe(run, ckpt_path, _recorded(ckpt_path))
    done = 0
    for run in runs:
        left = None if stop_after is None else stop_after - done
        if left is not None and left <= 0:
            return None
        folder = _train_phase(run, progress, left)
        if folder is None:
            return None
        done += run.steps
    phases = [json.loads((Path(c.out) / "train_info.json").read_text()) for c in runs]
    info = phases_record(cfg, phases)
    (Path(cfg.out) / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return folder


def phases_record(cfg: TrainConfig, phases: list[dict]) -> dict:
    """The train_info.json of the recipe `cfg` from its phases' own records, in order: the whole
    recipe, the totals (steps, training seconds, batches per task) and every phase's record."""
    return {"name": cfg.name, "recipe": recipe_fields(cfg), "steps": sum(p["steps"] for p in phases),
            "train_seconds": round(sum(p["train_seconds"] for p in phases), 1),
            "parameters": phases[-1]["parameters"],
            "batches_per_task": {t: sum(p["batches_per_task"].get(t, 0) for p in phases)
                                 for t in phases[-1]["batches_per_task"]},
            "init_from_sha256": phases[0]["init_from_sha256"],
            "torch": torch.__version__, "threads": phases[-1]["threads"], "phases": phases}


# -- one phase ------------------------------------------------------------------------------------
@dataclass
class _Optimizers:
    """AdamW over every trained parameter (weight decay on the 2-D ones but the embedding), and with
    embed_update="lazy" a SparseAdam over the embedding that updates only the rows of the batch's
    tokens and the mask token. embed_update="frozen" leaves the embedding out."""

    opt: torch.optim.AdamW
    emb_opt: torch.optim.SparseAdam | None
    emb: torch.nn.Parameter

    @classmethod
    def build(cls, cfg: TrainConfig, model) -> _Optimizers:
        emb = model.embed.weight
        if cfg.embed_update == "frozen":
            emb.requires_grad_(False)
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not (
            cfg.embed_update == "lazy" and p is emb)]
        decay = [p for n, p in params if p.dim() == 2 and "embed" not in n]
        no_decay = [p for n, p in params if not (p.dim() == 2 and "embed" not in n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
        emb_opt = torch.optim.SparseAdam([emb], lr=cfg.lr, betas=(0.9, 0.95)) if cfg.embed_update == "lazy" else None
        return cls(opt, emb_opt, emb)

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups + (self.emb_opt.param_groups if self.emb_opt is not None else []):
            g["lr"] = lr

    def step(self, model, loss: torch.Tensor, x: torch.Tensor, mask_id: int, grad_clip: float) -> None:
        """Backward `loss`, clip the gradient norm of `model` at `grad_clip`, step both optimizers."""
        emb, emb_opt = self.emb, self.emb_opt
        self.opt.zero_grad(set_to_none=True)
        emb.grad = None
        loss.backward()
        if emb_opt is not None:       # rows of tokens absent from the batch get no gradient at all
            present = torch.unique(torch.cat([x.flatten(), x.new_tensor([mask_id])]))
            keep = torch.zeros(emb.shape[0], 1, dtype=emb.grad.dtype)
            keep[present] = 1
            emb.grad.mul_(keep)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        self.opt.step()
        if emb_opt is not None:
            emb.grad = torch.sparse_coo_tensor(present[None], emb.grad[present], emb.shape, check_invariants=False)
            emb_opt.step()


@dataclass
class _Progress:
    """What a checkpoint holds besides the weights and the optimizer states. `seconds` is the time of
    steps before this session (restored from the checkpoint), not updated while training."""

    gen: torch.Generator                  # the masks' draws
    rng: random.Random                    # the batches' draws
    drawn: dict[str, int]                 # batches drawn per task
    step: int = 0
    seconds: float = 0.0
    log: list = field(default_factory=list)
    pair_batches: int = 0
    loss_avg: float | None = None         # the smoothed loss the log records

    @classmethod
    def fresh(cls, cfg: TrainConfig, tasks: list[str]) -> _Progress:
        return cls(torch.Generator().manual_seed(cfg.seed), random.Random(cfg.seed), dict.fromkeys(tasks, 0))


@dataclass
class _BatchSource:
    """The examples of one phase grouped by task, and how a batch is drawn from them."""

    cfg: TrainConfig
    tokenizer: object
    by_task: dict[str, list[Encoded]]
    tasks: list[str]
    weights: list[float] | None
    vocab: tuple                          # copy_vocab(tokenizer)
    pairing: dict[int, int]               # the global pairing of the pair curriculum

    @classmethod
    def build(cls, cfg: TrainConfig, tokenizer, data: list[Encoded]) -> _BatchSource:
        by_task: dict[str, list[Encoded]] = {}
        for e in data:
            by_task.setdefault(e.task, []).append(e)
        tasks = sorted(by_task)
        weights = cfg.sampling_weights()
        if weights is not None:
            weights = [weights[t] for t in tasks]
        vocab = copy_vocab(tokenizer)
        return cls(cfg, tokenizer, by_task, tasks, weights, vocab, global_pairing(vocab[0], cfg.seed))

    def draw(self, state: _Progress) -> tuple[list[Encoded], bool]:
        """The batch of step `state.step` and whether it is a pair batch: synthetic copy examples
        through the copy warm-up, synthetic pairs through the pair warm-up and in a share `pair_share`
        of the later steps, else `batch_size` records of one task drawn with the task weights."""
        cfg, rng = self.cfg, state.rng
        if state.step < cfg.copy_warmup_steps:
            return [copy_example(self.tokenizer, rng) for _ in range(cfg.batch_size)], False
        if (state.step < cfg.copy_warmup_steps + cfg.pair_warmup_steps
                or (cfg.pair_share and rng.random() < cfg.pair_share)):
            state.pair_batches += 1
            return [pair_example(rng, self.vocab, cfg.pair_max, "shuffled",
                                 self.pairing if rng.random() < cfg.pair_global else None)
                    for _ in range(cfg.batch_size)], True
        tasks = self.tasks
        task = tasks[rng.randrange(len(tasks))] if self.weights is None else rng.choices(tasks, self.weights)[0]
        pool = self.by_task[task]
        state.drawn[task] += 1
        return [pool[rng.randrange(len(pool))] for _ in range(cfg.batch_size)], False


def _row_masks(cfg: TrainConfig, items: list[Encoded], L: int, pair_batch: bool, gen: torch.Generator):
    """The optional inputs of `diffusion_loss` for one batch of canvas length L: (extra_cols,
    extra_ok) marking the in-context answers of a share `mask_example` of the rows, and (fixed,
    fixed_rows), the name-binding masks (`bind_rows`, on a share `PAIR_BIND_ROWS` of a pair batch's
    rows) overlaid with the whole-name holes (`hole_rows`, not in pair batches) and the contiguous
    spans (`span_rows`, not in pair batches). None where unused."""
    extra_cols = extra_ok = None
    if cfg.mask_example > 0:
        extra_cols, extra_ok = example_columns(items, L)
        extra_ok &= torch.rand(len(items), 1, generator=gen) < cfg.mask_example
    fixed = fixed_rows = None
    holes = cfg.hole_mask > 0 and not pair_batch
    if cfg.bind_mask > 0 or pair_batch or holes:
        sides = response_sides(items)
        fixed, fixed_rows = bind_rows(sides, PAIR_BIND_ROWS if pair_batch else cfg.bind_mask, gen)
    if holes:                     # hole_mask > 0 implies bind_mask < 1
        hole, hole_in = hole_rows(sides, fixed_rows, cfg.hole_mask / (1 - cfg.bind_mask), gen)
        fixed = torch.where(hole_in, hole, fixed)
        fixed_rows = fixed_rows | hole_in
    if cfg.span_mask > 0 and not pair_batch:      # span_mask > 0 implies bind_mask + hole_mask < 1
        taken = fixed_rows if fixed_rows is not None else torch.zeros(len(items), 1, dtype=torch.bool)
        share = cfg.span_mask / (1 - cfg.bind_mask - cfg.hole_mask)
        span, span_in = span_rows(len(items), len(items[0].response), taken, share, gen)
        fixed = span if fixed is None else torch.where(span_in, span, fixed)
        fixed_rows = taken | span_in
    return extra_cols, extra_ok, fixed, fixed_rows


@dataclass
class _Phase:
    """One phase's run: its recipe, its checkpoint file, the model and the forward it trains (compiled
    or not), the optimizers, the batch source and the progress a checkpoint holds."""

    cfg: TrainConfig
    recipe: dict
    ckpt_path: Path
    model: LLaDAModel
    forward: Callable
    optim: _Optimizers
    batches: _BatchSource
    state: _Progress
    precision: str          # the step's precision, "bf16" or "fp32" ("auto" resolved)
    start_sha256: str | None = None     # the sha256 of the start model's weights (`init_from`)


def _phase_tokenizer(cfg: TrainConfig, tok_dir: Path, records: dict[str, list[dict]], start, resuming: bool):
    """The phase's tokenizer: when `resuming` a checkpoint, the one saved in `tok_dir` by the session
    that made it; else the start model's, or one built on the rendered training text, saved in
    `tok_dir` (replacing one left by a session stopped before its first checkpoint, which may have
    had other settings)."""
    if resuming and (tok_dir / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    if start is not None:
        tokenizer = start[1]
    else:
        tokenizer = build_tokenizer(tokenizer_texts(records, cfg.names), cfg.vocab_size, cfg.whole_names)
    tokenizer.save_pretrained(str(tok_dir))
    return tokenizer


def _check_sequence_lengths(data: list[Encoded]) -> None:
    """A ValueError naming the longest example when its prompt and canvas together exceed the model's
    maximum sequence length (the exported model could not decode its own canvas after that prompt)."""
    longest = max(data, key=lambda e: len(e.prompt) + len(e.response), default=None)
    if longest is not None and len(longest.prompt) + len(longest.response) > MAX_SEQ_LEN:
        total = len(longest.prompt) + len(longest.response)
        raise ValueError(f"a {longest.task!r} prompt of {len(longest.prompt)} tokens and its canvas of "
                         f"{len(longest.response)} take {total} tokens, more than the model's maximum sequence "
                         f"length {MAX_SEQ_LEN}; give a smaller canvas")


def _build_model(cfg: TrainConfig, tokenizer, start, precision: str) -> LLaDAModel:
    """The recipe's model, initialised by `init_weights` (from the global torch RNG), then given the
    start model's weights when there is one (of the same shape). `precision` is the step's."""
    mcfg = model_config(cfg, tokenizer) if start is None else start_config(cfg.init_from, start[0].config,
                                                                          model_config(cfg, tokenizer))
    # eager attention: plain matmuls and softmax, which torch.compile fuses and bf16 autocast runs
    # on the CPU's bf16 matrix units (docs/training.md, "Speed").
    model = LLaDAModel(mcfg, attention="eager" if precision == "bf16" or cfg.compile else "sdpa")
    init_weights(model, cfg)
    if start is not None:
        model.load_state_dict(start[0].state_dict())
    return model


def _recorded(ckpt_path: Path) -> dict | None:
    """The checkpoint at `ckpt_path` (memory-mapped: its fields are read, its tensors are not), or None."""
    return torch.load(ckpt_path, weights_only=False, mmap=True) if ckpt_path.is_file() else None


def _check_recorded_recipe(cfg: TrainConfig, ckpt_path: Path, recorded: dict | None) -> None:
    """Before any costly setup: a ValueError when the checkpoint `recorded` (at `ckpt_path`), if there
    is one, was made with other settings than `cfg` (its start weights are compared when it resumes)."""
    if recorded is not None:
        _refuse_other_settings(ckpt_path, recipe_fields(cfg), recorded["recipe"], same_start=True,
                               same_start_weights=True)


def _refuse_other_settings(ckpt_path: Path, recipe: dict, recorded: dict, same_start: bool,
                           same_start_weights: bool = False) -> None:
    """A ValueError naming the recipe fields in which `recorded` (a checkpoint's, completed with
    defaults) differs from `recipe`. `init_from` counts as the same when `same_start_weights` (the
    start weights' sha256 is the one recorded, under another path); with `same_start` False the
    start weights changed under the same path."""
    recorded = complete_recipe(recorded)
    diff = sorted(k for k in recipe if recipe[k] != recorded.get(k))
    if diff == ["init_from"] and same_start_weights:
        diff = []           # the same start weights under another path (--out spelled otherwise, a moved run)
    elif not diff and not same_start:
        diff = ["init_from (its weights changed)"]
    if diff:
        raise ValueError(f"{ckpt_path} was made with other settings ({', '.join(diff)}); use another --out "
                         f"or the same settings")


def _resume(run: _Phase) -> None:
    """Restore the weights, optimizer states, random streams and progress of `run.ckpt_path`; a
    ValueError names the recipe fields when it was made with other settings (a field its recipe
    lacks counts as that field's default). An `init_from` path counts as the same when the start
    weights' sha256 is the one the checkpoint recorded."""
    ck = torch.load(run.ckpt_path, weights_only=False)
    same_start = run.start_sha256 is None or ck.get("init_from_sha256") in (None, run.start_sha256)
    _refuse_other_settings(run.ckpt_path, run.recipe, ck["recipe"], same_start,
                           run.start_sha256 is not None and ck.get("init_from_sha256") == run.start_sha256)
    run.model.load_state_dict(ck["model"])
    run.optim.opt.load_state_dict(ck["optimizer"])
    if run.optim.emb_opt is not None:
        run.optim.emb_opt.load_state_dict(ck["embed_optimizer"])
    state = run.state
    state.gen.set_state(ck["generator"])
    state.rng.setstate(ck["rng"])
    state.step, state.seconds, state.log = ck["step"], ck["seconds"], ck["log"]
    state.drawn = ck.get("drawn", state.drawn)
    state.pair_batches = ck.get("pair_batches", 0)
    state.loss_avg = ck.get("loss_avg")


def _step_precision(cfg: TrainConfig, recorded: dict | None) -> str:
    """The precision of this session's steps: `cfg.precision`, "auto" resolved for this machine,
    except that a run resumed with "auto" keeps the precision its checkpoint `recorded` ran in."""
    ran = recorded.get("precision") if recorded is not None else None
    if cfg.precision == "auto" and ran is not None:
        return ran
    return step_precision(cfg.precision)


def _save_checkpoint(run: _Phase, seconds: float) -> None:
    """Write `run.ckpt_path` (through a temporary file, so an interruption leaves the last one whole)."""
    state, optim = run.state, run.optim
    tmp = run.ckpt_path.with_suffix(".tmp")
    torch.save({"recipe": run.recipe, "model": run.model.state_dict(), "optimizer": optim.opt.state_dict(),
                "embed_optimizer": optim.emb_opt.state_dict() if optim.emb_opt is not None else None,
                "generator": state.gen.get_state(), "rng": state.rng.getstate(), "step": state.step,
                "seconds": seconds, "log": state.log, "drawn": state.drawn,
                "pair_batches": state.pair_batches, "init_from_sha256": run.start_sha256,
                "loss_avg": state.loss_avg, "precision": run.precision,
                "model_config": asdict(run.model.config)}, tmp)
    tmp.replace(run.ckpt_path)


def _run_steps(run: _Phase, progress: bool, stop_after: int | None) -> float:
    """Optimizer steps from `run.state.step` until `cfg.steps`, or until `stop_after` steps in all;
    logs the smoothed loss and checkpoints every `save_every` steps, at the end and when stopping.
    Returns the seconds of steps in all (earlier sessions' included)."""
    cfg, model, state = run.cfg, run.model, run.state
    mcfg = model.config
    bar = tqdm(total=cfg.steps, initial=state.step, desc="train", unit="step", file=sys.stderr) if progress else None
    tokens_seen, t0 = 0, time.perf_counter()
    while state.step < cfg.steps and (stop_after is None or state.step < stop_after):
        items, pair_batch = run.batches.draw(state)
        x, valid, pos, cols = make_batch(items, mcfg.pad_token_id)
        extra_cols, extra_ok, fixed, fixed_rows = _row_masks(cfg, items, x.shape[1], pair_batch, state.gen)
        run.optim.set_lr(lr_at(cfg, state.step))
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=run.precision == "bf16"):
            loss = diffusion_loss(run.forward, x, valid, pos, cols, mcfg.mask_token_id, cfg.eps, state.gen, cfg.loss,
                                  cfg.t_power, extra_cols, extra_ok, fixed, fixed_rows, head=model.head_logits,
                                  end_id=mcfg.eot_token_id, end_weight=cfg.end_weight,
                                  distance_smoothing=cfg.distance_smoothing)
        run.optim.step(model, loss, x, mcfg.mask_token_id, cfg.grad_clip)
        state.step += 1
        tokens_seen += int(valid.sum())
        value = loss.item()
        loss_avg = state.loss_avg = value if state.loss_avg is None else 0.98 * state.loss_avg + 0.02 * value
        elapsed = time.perf_counter() - t0
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_avg:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}")
        stopping = stop_after is not None and state.step >= stop_after
        if state.step % cfg.save_every == 0 or state.step == cfg.steps or stopping:
            state.log.append({"step": state.step, "loss": loss_avg, "seconds": state.seconds + elapsed})
            _save_checkpoint(run, state.seconds + elapsed)
        if stopping:
            break
    if bar is not None:
        bar.close()
    return state.seconds + (time.perf_counter() - t0)


def _export(run: _Phase, out: Path, total: float, start, dropped: dict[str, int]) -> Path:
    """Save the trained model to `<out>/model` and its record to `<out>/train_info.json`."""
    run.model.eval()
    folder = save_pretrained(run.model, run.batches.tokenizer, out / "model", generation_defaults(run.cfg))
    state = run.state
    info = {"name": run.cfg.name, "recipe": run.recipe, "steps": state.step, "train_seconds": round(total, 1),
            "parameters": run.model.config.n_params,
            "records_per_task": {t: len(v) for t, v in run.batches.by_task.items()},
            "batches_per_task": state.drawn, "pair_batches": state.pair_batches,
            "init_from_sha256": start[2] if start is not None else None,
            "dropped_too_long": dropped,
            "loss_log": state.log, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "precision": run.precision}
    (out / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return folder


def _train_phase(cfg: TrainConfig, progress: bool = True, stop_after: int | None = None) -> Path | None:
    """Train (or resume from `<out>/checkpoint.pt`) and export the model to `<out>/model`;
    returns that folder. `stop_after` stops (checkpointed, not exported) after that many
    optimizer steps in total, as an interruption would."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ckpt_path = out / "checkpoint.pt"
    recorded = _recorded(ckpt_path)
    _check_recorded_recipe(cfg, ckpt_path, recorded)
    start = start_model(cfg) if cfg.init_from else None
    records = training_records(cfg)
    tokenizer = _phase_tokenizer(cfg, out / "tokenizer", records, start, resuming=ckpt_path.is_file())
    if cfg.cover_share:
        records = with_cover_names(records, cover_pool(tokenizer, seed=cfg.seed), cfg.cover_share, cfg.seed)
    data, dropped = encode_records(tokenizer, records, cfg.canvas)
    _check_sequence_lengths(data)
    batches = _BatchSource.build(cfg, tokenizer, data)
    torch.manual_seed(cfg.seed)
    precision = _step_precision(cfg, recorded)
    model = _build_model(cfg, tokenizer, start, precision)
    forward = torch.compile(model.hidden_at, dynamic=True) if cfg.compile else model.hidden_at
    run = _Phase(cfg, recipe_fields(cfg), ckpt_path, model, forward, _Optimizers.build(cfg, model),
                 batches, _Progress.fresh(cfg, batches.tasks), precision,
                 start[2] if start is not None else None)
    if run.ckpt_path.is_file():
        _resume(run)
    model.train()
    total = _run_steps(run, progress, stop_after)
    if run.state.step < cfg.steps:
        return None
    return _export(run, out, total, start, dropped)
