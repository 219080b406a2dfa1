"""The ParallelBench runner: batched generation, one JSONL row per sample, resume, data parallel.

    from dllm import GenerationConfig
    from dllm.eval.runner import BenchConfig, run_bench
    rows = run_bench(BenchConfig(model="GSAI-ML/LLaDA-8B-Instruct", tasks="waiting_line/*",
                                 data_dir="~/ParallelBench",
                                 generation=GenerationConfig(sampler="threshold", cache="dual", seed=0),
                                 out="results.jsonl"))

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

import inspect
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import dllm
from dllm import provenance, samplers
from dllm.attention import default_backend
from dllm.cache import CachePolicy, get_policy
from dllm.config import GenerationConfig
from dllm.decode import checkpoint_gen_length, resolve_sampler, with_instances
from dllm.distributed import Distributed, run_together
from dllm.models.loading import resolve_device
from dllm.samplers import Sampler
from dllm.state import plain_number

from . import generators, metrics, text_metrics
from .data import Dataset, Sample, discover, load_generated, load_official
from .names import DEFAULT_SOURCE, check_source
from .tasks import GROUPS, TASKS, encode_messages, prompt_id, select_tasks

ROW_VERSION = 2
# What a row's prediction is: the whole generation region decoded with the special tokens left out
# (as the benchmark's own model code scores it), text after an end token included. Rows of version 1
# scored the answer cut at its first end token; the identity names this, so they are not resumed.
PREDICTION = "region"
# Request fields that joined the run identity later: named in it only when not at their default,
# so the run ids of earlier results files stay valid.
_LATER_IDENTITY_FIELDS = ("cfg_scale", "chat", "score_dtype", "suffix_dropout", "eos_early_stop")
# Sampler arguments added later, with the value that decodes as before: left out of the identity at
# that value, so the run ids of earlier results files stay valid.
LATER_SAMPLER_ARGUMENTS = {"threshold": {"commit_block_start": False}, "pc_sampler": {"weighting": "exponential"}}


def _bench_generation() -> GenerationConfig:
    return GenerationConfig(seed=0)


@dataclass
class BenchConfig:
    """One benchmark run.

    generation:   the decoding request (sampler, cache, lengths, schedule, temperature, seed, ...).
                  Its gen_length None (the default) means the checkpoint's generation length when
                  its generation_config.json names one (`max_new_tokens`, `for_checkpoint`), else
                  each task's `max_tokens` (32 / 64 / 128);
                  block_length None one block over the whole generation; steps and
                  tokens_per_step None one token per step. Default: GenerationConfig(seed=0).
    tasks:        selection (`waiting_line/copy,puzzle/*`, a group such as `all`, or a list);
                  default: every task found in `data_dir`, or every generated task.
    model:        checkpoint folder, shipped model name or hub id; None = the shipped default model.
    data_dir:     folder with the official files; without it the generated test split is used.
    limit:        the first `limit` samples of each task.
    names:        the generated split's Waiting Line people (`dllm.eval.names.NAME_SOURCES`); "open"
                  holds its names out of every training record.
    """

    model: str | None = None
    tasks: Any = None
    data_dir: str | None = None
    generated: bool = False
    limit: int | None = None
    out: str | None = None
    generation: GenerationConfig = field(default_factory=_bench_generation)
    batch_size: int = 8
    dtype: str = "auto"
    device: str = "auto"
    attention: str = "auto"
    cuda_graphs: bool = False
    compile: bool = False
    grammar_url: str | None = None
    bertscore_model: str | None = None
    sort_key: str = "full_name"
    index_base: int = 0
    names: str = DEFAULT_SOURCE

    def __post_init__(self):
        for name in ("model", "data_dir", "out"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (str, os.PathLike)) or str(value).strip() == ""):
                raise ValueError(f"{name} must be a path or name (a non-empty str) or None, got {value!r:.80}")
        if not isinstance(self.generated, bool):
            raise ValueError(f"generated must be True or False, got {self.generated!r}")
        self.limit, self.batch_size, self.index_base = map(plain_number, (self.limit, self.batch_size,
                                                                    self.index_base))
        if self.data_dir is None:  # nothing to download: our generators' held-out test split
            self.generated = True
        elif self.generated:
            raise ValueError("data_dir and generated=True are exclusive; choose one data source")
        if not isinstance(self.generation, GenerationConfig):
            raise ValueError(f"generation must be a dllm.GenerationConfig, got {type(self.generation).__name__}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 1):
            raise ValueError(f"limit must be a positive integer or None, got {self.limit!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.sort_key not in ("full_name", "last_name"):
            raise ValueError(f"sort_key must be 'full_name' or 'last_name', got {self.sort_key!r}")
        if type(self.index_base) is not int or self.index_base not in (0, 1):
            raise ValueError(f"index_base must be 0 or 1, got {self.index_base!r}")
        check_source(self.names)
        shaped = [k for k, default in (("sort_key", "full_name"), ("index_base", 0), ("names", DEFAULT_SOURCE))
                  if getattr(self, k) != default]
        if self.data_dir is not None and shaped:
            raise ValueError(f"{', '.join(shaped)} shape(s) the generated records; the official files under "
                             f"data_dir {self.data_dir!r} fix their own")

    def request_for(self, max_tokens: int) -> GenerationConfig:
        """The generation request of a task decoded with `max_tokens` (its gen_length when the
        run leaves it open)."""
        return self.generation.for_length(max_tokens)

    def for_checkpoint(self, model) -> "BenchConfig":
        """This run as it decodes on `model`: a gen_length left open takes the checkpoint's
        (`dllm.decode.checkpoint_gen_length`) when it names one."""
        length = checkpoint_gen_length(model)
        if self.generation.gen_length is not None or length is None:
            return self
        return self.replace(gen_length=length)

    def lengths(self, max_tokens: int) -> tuple[int, int, int]:
        """(gen_length, block_length, steps) for a task decoded with `max_tokens`."""
        g = self.request_for(max_tokens)
        return g.gen_length, g.resolved_block_length, g.resolved_steps

    def replace(self, **changes: Any) -> "BenchConfig":
        """A copy with `changes`; generation fields (gen_length, sampler, ...) apply to `generation`."""
        generation = {k: changes.pop(k) for k in list(changes) if k not in _BENCH_FIELDS}
        if "data_dir" in changes and "generated" not in changes:
            changes["generated"] = False        # the data source follows data_dir (set again when it is None)
        if generation:
            changes["generation"] = changes.get("generation", self.generation).replace(**generation)
        return config_from_dict({**{k: getattr(self, k) for k in _BENCH_FIELDS}, **changes})


# -- the results file ---------------------------------------------------------------------------
def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


class ResultsFile:
    """An append-only JSONL file of result rows that survives being killed mid-write."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def repair(self) -> int:
        """Drop a last line cut short by a kill (a JSON object begun and not ended), or end a whole
        last line that lacks its newline; returns the bytes dropped. A file with any other line
        that is not a JSON object is not a results file: ValueError naming it, nothing changed."""
        if not self.path.is_file():
            return 0
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        filled = [i for i, line in enumerate(lines) if line.strip()]
        if not filled:
            return 0
        last = filled[-1]
        bad = [i for i in filled if not _is_json_object(lines[i])]
        if bad and (bad != [last] or not lines[last].lstrip().startswith(b"{")):
            raise self._not_results(bad[0] + 1)
        if bad:                               # the torn last line
            keep = sum(len(line) + 1 for line in lines[:last])
            with self.path.open("r+b") as fh:
                fh.truncate(keep)
            return len(data) - keep
        if not data.endswith(b"\n"):
            with self.path.open("ab") as fh:
                fh.write(b"\n")
        return 0

    def _not_results(self, line_number: int) -> ValueError:
        return ValueError(f"{str(self.path)!r} is not a JSONL results file (line {line_number} is not a JSON "
                          f"object); give another file")

    def records(self) -> list[dict]:
        """Every JSON object of the file, in order; blank lines and a torn last line (a JSON object
        begun and not ended, repaired by the main process) are skipped. Any other line that is not
        a JSON object: the ValueError `repair` raises."""
        if not self.path.is_file():
            return []
        lines = [(number, line.strip()) for number, line in enumerate(self.path.read_bytes().split(b"\n"), 1)
                 if line.strip()]
        out = []
        for i, (number, line) in enumerate(lines):
            try:
                record = json.loads(line)          # bytes: a line cut inside a character fails here too
            except (json.JSONDecodeError, UnicodeDecodeError):
                if i == len(lines) - 1 and line.startswith(b"{"):
                    continue
                raise self._not_results(number) from None
            if not isinstance(record, dict):
                raise self._not_results(number)
            out.append(record)
        return out

    def rows(self) -> list[dict]:
        """The result rows of the file: records of one sample of a run (a run id, a task and an
        index; a sweep's summaries are not rows)."""
        return [r for r in self.records() if "run_id" in r and "task" in r and "index" in r]

    def check_writable(self) -> None:
        """Create the file's folder and open the file for appending (creating it empty), so that a
        path that cannot be written fails before any sample is decoded. Raises OSError naming it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8"):
                pass
        except OSError as err:
            raise OSError(f"cannot write the results file {str(self.path)!r}: {err.strerror or err}") from err

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
                fh.flush()
            os.fsync(fh.fileno())


# -- running ------------------------------------------------------------------------------------
def cache_identity(cache, cache_kwargs: dict) -> tuple[str, dict]:
    """(name, arguments) of a run's cache policy as its identity holds them: the arguments that
    differ from the policy's defaults, integral floats as integers, so that settings that decode
    alike (`dual` and `dual twins=false`, `guard=1` and `guard=1.0`) are one run."""
    policy = cache if isinstance(cache, CachePolicy) else get_policy(cache, **cache_kwargs)
    defaults = get_policy(policy.name).arguments()
    canonical = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in policy.arguments().items()}
    return policy.name, {k: v for k, v in canonical.items() if v != defaults.get(k)}


def sampler_identity(sampler: Sampler) -> dict:
    """A run's sampler arguments as its identity holds them: resolved, and an integer given for an
    argument annotated as a float as that float (also in prophet's `base_kwargs`), so that `tau=1`
    and `tau=1.0` are one run; `LATER_SAMPLER_ARGUMENTS` at their old behaviour left out."""
    return _canonical_arguments(sampler.name, sampler.arguments())


def _canonical_arguments(name: str, arguments: dict) -> dict:
    try:
        params = inspect.signature(samplers.sampler_class(name).__init__).parameters
    except ValueError:      # an unregistered sampler instance: its arguments as they are
        return dict(arguments)
    out, later = {}, LATER_SAMPLER_ARGUMENTS.get(name, {})
    for key, value in arguments.items():
        if key in later and type(value) is type(later[key]) and value == later[key]:
            continue
        annotation = str(params[key].annotation) if key in params else ""
        if type(value) is int and "float" in annotation:
            value = float(value)
        elif key == "base_kwargs" and isinstance(value, dict) and isinstance(arguments.get("base"), str):
            value = _canonical_arguments(arguments["base"], value)
        out[key] = value
    return out


def model_identity(model: str | None) -> str | None:
    """A model as run ids name it: a local folder by its real path (a relative path typed in another
    directory is another model), anything else (a hub id, the shipped model's name) as given."""
    return os.path.realpath(model) if model is not None and os.path.isdir(model) else model


def run_identity(cfg: BenchConfig, model_name: str, sampler: Sampler, dataset: Dataset) -> dict:
    """Everything that decides a run's tokens; its hash is the run id. Settings the sampler
    ignores (steps and tokens_per_step of one that sets its own schedule, block_length of one
    that decodes the whole generation at once) are left out, so such runs are the run without them;
    the batch size is in it when the run draws random numbers (temperature > 0, `Sampler.draws`)."""
    g = cfg.generation
    cache, cache_args = cache_identity(g.cache, g.cache_kwargs)
    steps = (g.steps, g.tokens_per_step) if sampler.uses_steps else (None, None)
    identity = {"model": model_identity(model_name), "sampler": sampler.name,
                "sampler_args": sampler_identity(sampler), "cache": cache, "cache_args": cache_args,
                "gen_length": g.gen_length,
                "block_length": g.block_length if sampler.uses_blocks else None,
                "steps": steps[0], "tokens_per_step": steps[1], "temperature": float(g.temperature),
                "seed": g.seed, "max_forwards": g.max_forwards, "dtype": cfg.dtype, "data_mode": dataset.mode,
                "data_source": dataset.source, "prediction": PREDICTION}
    default = GenerationConfig()
    for name in _LATER_IDENTITY_FIELDS:
        if getattr(g, name) != getattr(default, name):
            identity[name] = getattr(g, name)
    if g.temperature != 0 or sampler.draws:   # a batch shares one random stream: its rows' draws depend on it
        identity["run_batch_size"] = cfg.batch_size   # a row's `batch_size` is its own batch's
    return identity


def load_dataset(cfg: BenchConfig) -> Dataset:
    if cfg.data_dir is not None:
        found = discover(cfg.data_dir)
        default = [t for t in found if t in GROUPS["all"]] or found
        tasks = default if cfg.tasks is None else select_tasks(cfg.tasks, found)
        return load_official(cfg.data_dir, tasks, cfg.limit)
    return load_generated(generated_tasks(cfg), cfg.limit, **generator_options(cfg))


def generated_tasks(cfg: BenchConfig) -> list[str]:
    """The generated tasks `cfg.tasks` selects (default: the Waiting Line and Puzzle tasks)."""
    can = [t for t in TASKS if t in set(generators.generator_tasks())]
    return [t for t in can if t in GROUPS["pure"]] if cfg.tasks is None else select_tasks(cfg.tasks, can)


def generator_options(cfg: BenchConfig) -> dict:
    """The generators' options of `cfg` that differ from the official files' conventions."""
    options = {}
    if cfg.sort_key != "full_name":
        options["sort_key"] = cfg.sort_key
    if cfg.index_base != 0:
        options["index_base"] = cfg.index_base
    if cfg.names != "lists":
        options["names"] = cfg.names
    return options


def scorer_identity(backends: text_metrics.Backends) -> dict:
    """The run identity's share of the text scorers: the name of each one present (grammar,
    bertscore), since scores with and without a scorer are not one run."""
    described = backends.describe()
    return {field: described[field] for field in ("grammar", "bertscore") if getattr(backends, field) is not None}


def text_backends(cfg: BenchConfig, dataset: Dataset) -> text_metrics.Backends:
    """Grammar / BERTScore backends, looked up only when a Text Writing task is in the run."""
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


@dataclass
class _Run:
    """What every batch of one run shares."""

    cfg: BenchConfig
    model: Any
    tokenizer: Any
    generation: GenerationConfig      # sampler and cache policy resolved once, for the whole run
    common: dict                       # the fields every row of the run carries
    backends: text_metrics.Backends


def _rows_of_batch(run: _Run, batch: list[Sample]) -> list[dict]:
    """Decode one batch of samples of one task and score it: one row per sample."""
    request = run.generation.for_length(batch[0].task.max_tokens)
    prompts = [encode_messages(run.tokenizer, s.messages()) for s in batch]
    out = dllm.generate(run.model, run.tokenizer, prompts, request)
    predictions = run.tokenizer.batch_decode(out.generated.tolist(), skip_special_tokens=True)
    sampler = request.sampler        # what it ignores was not used: the whole generation, no step count
    gen = request.gen_length
    block = out.block_length if sampler.uses_blocks else gen
    steps = request.resolved_steps if sampler.uses_steps else None
    rows = []
    for i, s in enumerate(batch):
        result = metrics.compute(s.task.metric, predictions[i], s.answer, backends=run.backends)
        nfe = out.nfe[i]
        rows.append({
            **run.common, "timestamp": provenance.timestamp(),
            "task": s.task.id, "index": s.index, "prompt_id": prompt_id(s.messages()), "metric": s.task.metric,
            "max_tokens": s.task.max_tokens, "gen_length_used": gen, "block_length_used": block,
            "steps_used": steps, "prediction": predictions[i], "answer": s.answer,
            "score": result.get("headline"), "metrics": result, "nfe": nfe,
            "tokens_per_forward": out.tokens_per_forward[i],
            "tokens_per_forward_effective": out.answer_lengths[i] / max(nfe, 1),
            "answer_tokens": out.answer_lengths[i], "hit_cap": out.hit_cap[i],
            "seconds": out.seconds / len(batch), "batch_seconds": out.seconds, "batch_size": len(batch)})
    return rows


def _start_run(cfg: BenchConfig, dist: Distributed, model, tokenizer) -> tuple[_Run, Dataset, str]:
    """Check the request, load the data and (unless given) the model, and fix the run id."""
    generation = with_instances(cfg.generation)        # bad names fail before any model load
    dataset = load_dataset(cfg)
    if model is None:
        device = resolve_device(cfg.device, auto=dist.device)
        model, tokenizer = dllm.load(cfg.model, dtype=cfg.dtype, device=device, attention=cfg.attention,
                                     cuda_graphs=cfg.cuda_graphs, compile=cfg.compile)
    model_name = getattr(model, "name_or_path", None) or cfg.model
    sampler = resolve_sampler(model, generation)
    generation = generation.replace(sampler=sampler, gen_length=cfg.for_checkpoint(model).generation.gen_length)
    identity = run_identity(cfg, str(model_name), sampler, dataset)
    backends = text_backends(cfg, dataset)
    identity.update(scorer_identity(backends))
    run_id = provenance.run_id(identity)
    common = {"version": ROW_VERSION, "run_id": run_id, **identity,
              "schedule": "fixed" if sampler.fixed_schedule else "adaptive",
              "grammar_backend": backends.describe(), "versions": provenance.versions(),
              "hardware": provenance.hardware(dist.world, getattr(model, "device", None)),
              "runtime": runtime_of(model)}
    return _Run(cfg, model, tokenizer, generation, common, backends), dataset, run_id


def runtime_of(model) -> dict:
    """How the model runs, which changes tokens only by rounding and so is recorded, not part of the
    run id: its attention backend (`auto` resolved), CUDA graphs and torch.compile on or off."""
    attention = getattr(model, "attention", None)
    if attention == "auto":
        attention = default_backend(model.device)
    return {"attention": attention, "cuda_graphs": getattr(model, "cuda_graphs", None) is not None,
            "compile": bool(getattr(model, "compiled", False))}


def _stored_rows(cfg: BenchConfig, dist: Distributed, run_id: str) -> tuple[ResultsFile | None, list[dict]]:
    results = ResultsFile(cfg.out) if cfg.out else None

    def prepare():
        if results is not None and dist.is_main:
            results.check_writable()
            results.repair()
    run_together(dist, prepare, "preparing the results file")
    stored = [r for r in results.rows() if r.get("run_id") == run_id] if results is not None else []
    return results, stored


def _decode_pending(run: _Run, dist: Distributed, batches: list, results, order: dict, progress: bool) -> list[dict]:
    """Deal the batches to the processes round by round; the main process stores each round's rows."""
    bar = None
    if progress and dist.is_main and batches:
        bar = tqdm(total=sum(map(len, batches)), desc=f"bench {run.generation.sampler.name}", unit="sample",
                   file=sys.stderr)
    new_rows: list[dict] = []
    for rnd in range((len(batches) + dist.world - 1) // dist.world):
        slot = rnd * dist.world + dist.rank
        rows = run_together(dist, lambda: _rows_of_batch(run, batches[slot]) if slot < len(batches) else [],
                            "a batch")
        gathered = dist.gather(rows)

        def store():
            if not dist.is_main:
                return
            uniq = {(r["task"], r["index"]): r for r in gathered}
            ordered = [uniq[k] for k in sorted(uniq, key=lambda k: (order[k[0]], k[1]))]
            if results is not None:
                results.append(ordered)
            new_rows.extend(ordered)
            if bar is not None:
                bar.update(len(ordered))
        run_together(dist, store, "storing the rows")
    if bar is not None:
        bar.close()
    return new_rows


def run_bench(cfg: BenchConfig, *, model=None, tokenizer=None, progress: bool = True) -> list[dict]:
    """Run (or resume) a benchmark run; returns the rows of the selected samples (tasks and
    limit), stored ones included, sorted by task and index. A stored row is reused when it was
    decoded from the same sample (`sample_key`: its prompt, answer and metric); a sample whose data
    changed is decoded again and its new row appended, and a reused row that is no longer the
    sample's last is appended again (tables read each sample's last row). Only the main process
    writes `cfg.out`. A `model` object is given with its `tokenizer` and is used as it is: `cfg.model`
    then only names it when it has no `name_or_path`, and `cfg.dtype`, `device`, `attention`,
    `cuda_graphs` and `compile` load nothing."""
    if (model is None) != (tokenizer is None):
        given, missing = ("model", "tokenizer") if tokenizer is None else ("tokenizer", "model")
        raise ValueError(f"run_bench got a {given} without a {missing}: give both (from dllm.load), or neither to "
                         f"load cfg.model")
    dist = Distributed()
    run, dataset, run_id = _start_run(cfg, dist, model, tokenizer)
    results, stored = _stored_rows(cfg, dist, run_id)
    samples = {(t, s.index): sample_key(s) for t in dataset.tasks for s in dataset.samples[t]}
    current = lambda rows: {(r["task"], r["index"]): r for r in rows                     # noqa: E731
                            if samples.get((r["task"], r["index"])) == row_key(r)}
    order = {t: i for i, t in enumerate(dataset.tasks)}
    done = current(stored)
    last = {(r["task"], r["index"]): r for r in stored}
    superseded = [done[k] for k in sorted(done, key=lambda k: (order[k[0]], k[1])) if last[k] is not done[k]]
    if superseded and results is not None and dist.is_main:
        results.append(superseded)
    pending = [s for t in dataset.tasks for s in dataset.samples[t] if (t, s.index) not in done]
    new_rows = _decode_pending(run, dist, _batches(pending, cfg.batch_size), results, order, progress)
    dist.barrier()
    if dist.is_main:
        done.update(current(new_rows))
    elif results is not None:
        done = current(r for r in results.rows() if r.get("run_id") == run_id)
    return [done[k] for k in sorted(done, key=lambda k: (order[k[0]], k[1]))]


def sample_key(sample: Sample) -> tuple:
    """What a stored row must have been decoded and scored from to stand for `sample`: its
    prompt's id, its answer and its metric."""
    return prompt_id(sample.messages()), json.dumps(sample.answer, sort_keys=True), sample.task.metric


def row_key(row: dict) -> tuple:
    """`sample_key` of the sample a stored row was decoded from (rows without a metric: none)."""
    return row.get("prompt_id"), json.dumps(row.get("answer"), sort_keys=True), row.get("metric")


_BENCH_FIELDS = tuple(f for f in BenchConfig.__dataclass_fields__)


def config_from_dict(d: dict) -> BenchConfig:
    """A BenchConfig from a mapping whose keys are BenchConfig fields or GenerationConfig fields
    (these go into `generation`); unknown keys are an error naming them."""
    bench = {k: v for k, v in d.items() if k in _BENCH_FIELDS}
    request = {k: v for k, v in d.items() if k not in _BENCH_FIELDS}
    unknown = sorted(set(request) - set(GenerationConfig.__dataclass_fields__))
    if unknown:
        valid = sorted(set(_BENCH_FIELDS) | set(GenerationConfig.__dataclass_fields__))
        raise ValueError(f"unknown bench option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    if request:
        bench["generation"] = bench.get("generation", _bench_generation()).replace(**request)
    return BenchConfig(**bench)
