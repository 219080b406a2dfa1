"""The ParallelBench runner: batched generation, one JSONL row per sample, resume, data parallel.

    rows = run_bench(BenchConfig(model="GSAI-ML/LLaDA-8B-Instruct", tasks="waiting_line/*",
                                 data_dir="~/ParallelBench", sampler="threshold", out="results.jsonl"))

Every finished sample is appended to `out` at once (flushed and synced). A row belongs to a *run*,
identified by a hash of everything that decides its tokens (model, sampler and arguments, cache,
lengths, steps, temperature, seed, data source); a rerun of the same run skips the (task, index)
pairs already stored, so an interrupted run resumes with nothing lost or repeated, and one results
file can hold many runs (the points of the PB@X curves). A line cut short by a kill is dropped on
the next start and its sample redone.

Under `torchrun` or `accelerate launch --multi_gpu` the batches are dealt to the processes round
by round; each row carries its (task, index), the rows of a round are gathered, de-duplicated and
sorted, and only the main process writes, so N processes store exactly the rows one would.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data import Dataset, Sample, discover, load_generated, load_official
from .tasks import GROUPS, TASKS, encode_messages, prompt_id, select_tasks

ROW_VERSION = 1


@dataclass
class BenchConfig:
    """One benchmark run.

    tasks:        selection (`waiting_line/copy,puzzle/*`, a group such as `all`, or a list);
                  default: every task found in `data_dir`, or every generated task.
    model:        checkpoint folder, shipped model name or hub id; None = the shipped default model.
    data_dir:     folder with the official files; without it the generated test split is used.
    limit:        the first `limit` samples of each task.
    gen_length:   default: each task's `max_tokens` (32 / 64 / 128).
    block_length: default: one block over the whole generation (the benchmark's curves).
    steps / tokens_per_step: default one token per step; `tokens_per_step=k` sets steps = gen/k.
    """

    model: str | None = None
    tasks: Any = None
    data_dir: str | None = None
    generated: bool = False
    limit: int | None = None
    out: str | None = None
    sampler: str | None = None
    sampler_args: dict = field(default_factory=dict)
    cache: str = "none"
    cache_args: dict = field(default_factory=dict)
    gen_length: int | None = None
    block_length: int | None = None
    steps: int | None = None
    tokens_per_step: int | None = None
    temperature: float = 0.0
    seed: int | None = 0
    max_forwards: int | None = None
    batch_size: int = 8
    dtype: str = "auto"
    device: str = "auto"
    attention: str = "auto"
    cuda_graphs: bool = False
    grammar_url: str | None = None
    bertscore_model: str | None = None
    sort_key: str = "full_name"
    index_base: int = 0

    def __post_init__(self):
        if self.data_dir is None:  # nothing to download: our generators' held-out test split
            self.generated = True
        elif self.generated:
            raise ValueError("data_dir and generated=True are exclusive; choose one data source")
        for name in ("limit", "gen_length", "block_length", "steps", "tokens_per_step", "max_forwards"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
        if self.steps is not None and self.tokens_per_step is not None:
            raise ValueError("give steps or tokens_per_step, not both")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.sort_key not in ("full_name", "last_name"):
            raise ValueError(f"sort_key must be 'full_name' or 'last_name', got {self.sort_key!r}")
        if self.index_base not in (0, 1):
            raise ValueError(f"index_base must be 0 or 1, got {self.index_base!r}")

    def lengths(self, max_tokens: int) -> tuple[int, int, int]:
        """(gen_length, block_length, steps) for a task decoded with `max_tokens`."""
        gen = self.gen_length or max_tokens
        block = self.block_length or gen
        if self.tokens_per_step is not None:
            if gen % self.tokens_per_step:
                raise ValueError(f"tokens_per_step {self.tokens_per_step} does not divide gen_length {gen}")
            steps = gen // self.tokens_per_step
        else:
            steps = self.steps or gen
        return gen, block, steps


# -- the results file ---------------------------------------------------------------------------
class ResultsFile:
    """An append-only JSONL file of result rows that survives being killed mid-write."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def repair(self) -> int:
        """Drop a trailing line cut short by a kill (no newline, or not JSON); returns bytes dropped."""
        if not self.path.is_file():
            return 0
        data = self.path.read_bytes()
        keep = len(data)
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
        else:
            last_start = data.rfind(b"\n", 0, max(len(data) - 1, 0)) + 1
            tail = data[last_start:].strip()
            if tail:
                try:
                    json.loads(tail)
                except json.JSONDecodeError:
                    keep = last_start
        if keep < len(data):
            with self.path.open("r+b") as fh:
                fh.truncate(keep)
        return len(data) - keep

    def rows(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        with self.path.open(encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue        # a torn last line (repaired by the main process)
                if isinstance(row, dict) and "run_id" in row:
                    out.append(row)
        return out

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                fh.flush()
            os.fsync(fh.fileno())


# -- environment --------------------------------------------------------------------------------
def _versions() -> dict:
    import torch

    import dllm

    out = {"dllm": getattr(dllm, "__version__", None), "torch": torch.__version__, "python": platform.python_version()}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - a runtime dependency
        pass
    return out


def _hardware(world_size: int) -> dict:
    import torch

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    else:
        device = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        device = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
    return {"device": device, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "world_size": world_size}


class _Dist:
    """Single process, or accelerate's PartialState when launched with several processes."""

    def __init__(self):
        self.state = None
        self.rank, self.world = 0, 1
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            try:
                from accelerate import PartialState
            except ImportError:
                raise RuntimeError("a multi-process launch needs accelerate: pip install 'dllm[eval]'") from None
            import torch
            self.state = PartialState(cpu=not torch.cuda.is_available())
            self.rank, self.world = self.state.process_index, self.state.num_processes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self):
        return None if self.state is None else self.state.device

    def barrier(self):
        if self.state is not None:
            self.state.wait_for_everyone()

    def gather(self, rows: list) -> list:
        if self.state is None:
            return rows
        from accelerate.utils import gather_object
        return gather_object(rows)


def is_main_process() -> bool:
    """True in a single-process run and on the main process of a multi-process launch."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return True
    return int(os.environ.get("RANK", os.environ.get("PROCESS_INDEX", "0"))) == 0


# -- running ------------------------------------------------------------------------------------
def run_identity(cfg: BenchConfig, model_name: str, sampler_name: str, sampler_args: dict, dataset: Dataset) -> dict:
    """Everything that decides a run's tokens; its hash is the run id."""
    return {"model": model_name, "sampler": sampler_name, "sampler_args": sampler_args, "cache": cfg.cache,
            "cache_args": cfg.cache_args, "gen_length": cfg.gen_length, "block_length": cfg.block_length,
            "steps": cfg.steps, "tokens_per_step": cfg.tokens_per_step, "temperature": cfg.temperature,
            "seed": cfg.seed, "max_forwards": cfg.max_forwards, "dtype": cfg.dtype, "data_mode": dataset.mode,
            "data_source": dataset.source}


def _run_id(identity: dict) -> str:
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def load_dataset(cfg: BenchConfig) -> Dataset:
    if cfg.data_dir is not None:
        found = discover(cfg.data_dir)
        default = [t for t in found if t in GROUPS["all"]] or found
        tasks = default if cfg.tasks is None else select_tasks(cfg.tasks, found)
        return load_official(cfg.data_dir, tasks, cfg.limit)
    from . import generators

    can = [t for t in TASKS if t in set(generators.generator_tasks())]
    default = [t for t in can if t in GROUPS["pure"]]
    tasks = default if cfg.tasks is None else select_tasks(cfg.tasks, can)
    options = {}
    if cfg.sort_key != "full_name":
        options["sort_key"] = cfg.sort_key
    if cfg.index_base != 0:
        options["index_base"] = cfg.index_base
    return load_generated(tasks, cfg.limit, **options)


def _backends(cfg: BenchConfig, dataset: Dataset):
    """Grammar / BERTScore backends, looked up only when a Text Writing task is in the run."""
    from . import text_metrics

    if not any(s.task.headline == "grammar" for ss in dataset.samples.values() for s in ss[:1]):
        reason = "no Text Writing task in this run"
        return text_metrics.Backends(grammar_reason=reason, bertscore_reason=reason)
    return text_metrics.Backends.resolve(cfg.grammar_url, bertscore_model=cfg.bertscore_model)


def _batches(pending: list[Sample], size: int) -> list[list[Sample]]:
    out, cur = [], []
    for s in pending:
        if cur and (cur[0].task.id != s.task.id or len(cur) == size):
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def _generate_batch(model, tokenizer, batch: list[Sample], cfg: BenchConfig, sampler_name, sampler_kwargs):
    import dllm
    from dllm.cache import get_policy

    gen, block, steps = cfg.lengths(batch[0].task.max_tokens)
    prompts = [encode_messages(tokenizer, s.messages()) for s in batch]
    policy = get_policy(cfg.cache, **cfg.cache_args)
    return dllm.generate(model, tokenizer, prompts, gen_length=gen, block_length=block, steps=steps,
                         sampler=sampler_name, sampler_kwargs=sampler_kwargs, temperature=cfg.temperature,
                         seed=cfg.seed, max_forwards=cfg.max_forwards, cache=policy), (gen, block, steps)


def run_bench(cfg: BenchConfig, *, model=None, tokenizer=None, progress: bool = True) -> list[dict]:
    """Run (or resume) a benchmark run; returns every row of this run, stored ones included,
    sorted by task and index. Only the main process writes `cfg.out`."""
    import torch

    import dllm
    from dllm import samplers
    from dllm.cache import get_policy

    from . import metrics

    dist = _Dist()
    # Fail on bad names before any model load.
    if cfg.sampler is not None:
        samplers.get(cfg.sampler, **cfg.sampler_args)
    get_policy(cfg.cache, **cfg.cache_args)
    dataset = load_dataset(cfg)
    if model is None:
        device = cfg.device
        if device == "auto":
            device = str(dist.device) if dist.device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = dllm.load(cfg.model, dtype=cfg.dtype, device=device, attention=cfg.attention,
                                     cuda_graphs=cfg.cuda_graphs)
    model_name = getattr(model, "name_or_path", None) or cfg.model
    from dllm.config import GenerationConfig
    from dllm.decode import resolve_sampler

    probe = resolve_sampler(model, GenerationConfig(sampler=cfg.sampler, sampler_kwargs=dict(cfg.sampler_args)))
    sampler_name, sampler_args = probe.name, probe.arguments()
    schedule = "fixed" if probe.fixed_schedule else "adaptive"
    identity = run_identity(cfg, str(model_name), sampler_name, sampler_args, dataset)
    backends = _backends(cfg, dataset)
    if backends.grammar is not None:    # scores with and without a grammar checker are not one run
        identity["grammar"] = backends.describe()["grammar"]
    run_id = _run_id(identity)

    results = ResultsFile(cfg.out) if cfg.out else None
    if results is not None and dist.is_main:
        results.repair()
    dist.barrier()
    stored = [r for r in results.rows() if r.get("run_id") == run_id] if results is not None else []
    done = {(r["task"], r["index"]) for r in stored}
    order = {t: i for i, t in enumerate(dataset.tasks)}
    pending = [s for t in dataset.tasks for s in dataset.samples[t] if (t, s.index) not in done]
    batches = _batches(pending, cfg.batch_size)
    common = {"version": ROW_VERSION, "run_id": run_id, **identity, "schedule": schedule,
              "grammar_backend": backends.describe(), "versions": _versions(), "hardware": _hardware(dist.world)}

    bar = None
    if progress and dist.is_main and pending:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(pending), desc=f"bench {sampler_name}", unit="sample", file=sys.stderr)
    new_rows: list[dict] = []
    rounds = (len(batches) + dist.world - 1) // dist.world
    for rnd in range(rounds):
        slot = rnd * dist.world + dist.rank
        mine = batches[slot] if slot < len(batches) else []
        rows = []
        if mine:
            out, (gen, block, steps) = _generate_batch(model, tokenizer, mine, cfg, sampler_name, sampler_args)
            for i, s in enumerate(mine):
                result = metrics.compute(s.task.metric, out.texts[i], s.answer, backends=backends)
                nfe = out.nfe[i]
                rows.append({
                    **common, "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "task": s.task.id, "index": s.index, "prompt_id": prompt_id(s.messages()),
                    "max_tokens": s.task.max_tokens, "gen_length_used": gen, "block_length_used": block,
                    "steps_used": steps, "prediction": out.texts[i], "answer": s.answer,
                    "score": result.get("headline"), "metrics": result, "nfe": nfe,
                    "tokens_per_forward": out.tokens_per_forward[i],
                    "tokens_per_forward_effective": out.answer_lengths[i] / max(nfe, 1),
                    "answer_tokens": out.answer_lengths[i], "hit_cap": out.hit_cap[i],
                    "seconds": out.seconds / len(mine), "batch_seconds": out.seconds, "batch_size": len(mine)})
        gathered = dist.gather(rows)
        if dist.is_main:
            uniq = {(r["task"], r["index"]): r for r in gathered}
            ordered = [uniq[k] for k in sorted(uniq, key=lambda k: (order[k[0]], k[1]))]
            if results is not None:
                results.append(ordered)
            new_rows.extend(ordered)
            if bar is not None:
                bar.update(len(ordered))
    if bar is not None:
        bar.close()
    dist.barrier()
    everything = {(r["task"], r["index"]): r for r in stored}
    if dist.is_main:
        everything.update({(r["task"], r["index"]): r for r in new_rows})
    elif results is not None:
        everything = {(r["task"], r["index"]): r for r in results.rows() if r.get("run_id") == run_id}
    return [everything[k] for k in sorted(everything, key=lambda k: (order.get(k[0], len(order)), k[1]))]


def config_from_dict(d: dict) -> BenchConfig:
    """A BenchConfig from a mapping; unknown keys are an error naming them."""
    from dllm.config import check_fields

    check_fields(BenchConfig, d, "bench")
    return BenchConfig(**d)
