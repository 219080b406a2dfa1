"""The speed/quality sweep: a grid of decoding configurations run on ParallelBench, with one
summary per configuration, Pareto plots, PB@X and a Markdown report.

    dllm sweep --grid benchmarks/grids/default.yaml --out-dir runs/sweep
    dllm sweep --out-dir runs/s --tasks waiting_line --limit 5 \\
        --sampler 'low_confidence tokens_per_step=1,2,4,8' --sampler 'threshold tau=0.7,0.8,0.9' \\
        --cache none --cache 'dkv-decode refresh=4,8'
    torchrun --nproc_per_node 2 -m dllm.cli sweep --grid grid.yaml --out-dir runs/sweep

A *configuration* is one model, one sampler with its arguments, one cache policy with its
arguments, a block length, a generation length (None: each task's `max_tokens`) and a step count
or tokens per step; the grid is the cartesian product of the axes, and each sampler's argument
lists multiply out. Every configuration is run over the same tasks and samples (generated test
split by default, the official files with `data_dir`), through `dllm.eval.runner.run_bench`, so its
rows are the bench rows and its run id the bench run id.

Grid file (YAML or TOML; the command line builds the same structure)::

    tasks: pure                  # task ids, patterns or groups; default: the 12 Waiting Line + Puzzle tasks
    limit: 8                     # samples per task
    models: [null]               # null (TOML: "default") = the shipped default model
    block_lengths: [null]        # null = one block over the generation
    gen_lengths: [null]          # null = each task's max_tokens
    caches: [none, {name: dkv-decode, args: {refresh: [4, 8]}}]
    samplers:
      - {name: low_confidence, tokens_per_step: [1, 2, 4, 8]}
      - {name: threshold, args: {tau: [0.7, 0.8, 0.9]}}
      - {name: learn2pd, block_lengths: [32], args: {filter: [null, none]}}
    grids:                       # optional: the union of several products; each entry overrides axes
      - {samplers: [threshold], caches: [prefix, dual]}

A list is a list of alternatives; an argument whose value is itself a list is written as a list of
lists (`thresholds: [[7.5, 5.0, 2.5]]`). Unknown keys, names, arguments and out-of-range values are
errors naming the value and what is allowed, raised before any model is loaded.

Outputs in `out_dir`:
  rows.jsonl        one bench row per (configuration, sample), appended as each finishes;
  summaries.jsonl   one row per configuration (kind "summary"), rewritten atomically and replaced
                    by id, so a configuration never has two; failed configurations get a row with
                    status "failed" and the error, and are retried by the next run;
  report.md         per-configuration table, PB@X, the best configuration per accuracy level,
                    failed configurations;
  accuracy_vs_tokens_per_forward.png, accuracy_vs_tokens_per_second.png, accuracy_per_task.png.

Killed and restarted, the sweep skips finished configurations, resumes the interrupted one where
its rows end and redoes nothing. A configuration that fails (a Learn2PD filter that does not exist,
a block length the sampler refuses, ...) is tried once on one sample with a single forward before
its run, reported, and skipped. Under `torchrun` / `accelerate launch --multi_gpu` the runner
splits each configuration's batches over the processes; only the main process writes.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import itertools
import json
import math
import os
import shlex
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

SUMMARY_VERSION = 1
ROWS_FILE = "rows.jsonl"
SUMMARIES_FILE = "summaries.jsonl"
REPORT_FILE = "report.md"
PLOT_TPF = "accuracy_vs_tokens_per_forward.png"
PLOT_TPS = "accuracy_vs_tokens_per_second.png"
PLOT_TASKS = "accuracy_per_task.png"

AXES = ("models", "samplers", "caches", "block_lengths", "gen_lengths")
SAMPLER_KEYS = ("name", "args", "tokens_per_step", "steps", "block_lengths", "gen_lengths")
CACHE_KEYS = ("name", "args")
# Errors a configuration can raise that mean "this configuration cannot run", not "the sweep is broken".
CONFIG_ERRORS = (ValueError, FileNotFoundError, FloatingPointError, RuntimeError, OSError)


# -- the grid -------------------------------------------------------------------------------------
@dataclass
class SweepSettings:
    """What every configuration of a sweep shares (the scalar keys of a grid file).

    tasks: task ids, patterns or groups (`waiting_line,puzzle/*`, `pure`); None: the 12 Waiting
        Line and Puzzle tasks of the generated split, or every benchmark task in `data_dir`.
    data_dir: folder with the official ParallelBench files; None: our generators' test split.
    limit: the first `limit` samples of each task (None: all).
    levels: accuracy levels of PB@X and of the best-configuration list.
    The rest are the bench runner's options (`dllm.eval.runner.BenchConfig`).
    """

    tasks: Any = None
    data_dir: str | None = None
    limit: int | None = None
    batch_size: int = 8
    dtype: str = "auto"
    device: str = "auto"
    attention: str | None = None       # None: the bench runner's default
    seed: int | None = 0
    temperature: float = 0.0
    max_forwards: int | None = None
    grammar_url: str | None = None
    bertscore_model: str | None = None
    levels: tuple = (80.0, 70.0, 60.0)

    def __post_init__(self):
        from dllm.attention import get_backend
        from dllm.models.loading import resolve_dtype

        t = self.tasks
        if not (t is None or isinstance(t, str) or (isinstance(t, list) and t and all(isinstance(x, str) for x in t))):
            raise ValueError(f"tasks {t!r} is not allowed; give a selection string such as 'waiting_line,puzzle/*', "
                             f"a list of task ids, or null for the default tasks")
        for name in ("data_dir", "grammar_url", "bertscore_model"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{name} {v!r} is not allowed; give a string or null")
        for name in ("limit", "max_forwards"):
            _check_positive(name, getattr(self, name), allow_none=True)
        _check_positive("batch_size", self.batch_size)
        resolve_dtype(self.dtype)
        if self.attention is None:
            from dllm.eval.runner import BenchConfig
            self.attention = next(f.default for f in dataclasses.fields(BenchConfig) if f.name == "attention")
        get_backend(self.attention)
        if not isinstance(self.device, str):
            raise ValueError(f"device {self.device!r} is not allowed; give 'auto', 'cpu', 'cuda' or 'cuda:N'")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed {self.seed!r} is not allowed; give an integer or null")
        temp = self.temperature
        if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not 0 <= temp < math.inf:
            raise ValueError(f"temperature {temp!r} is not allowed; give a finite number >= 0")
        levels = self.levels if isinstance(self.levels, (list, tuple)) else [self.levels]
        if not levels or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= 100
                             for x in levels):
            raise ValueError(f"levels {self.levels!r} is not allowed; give accuracy levels between 0 and 100, "
                             f"e.g. [80, 70, 60]")
        self.levels = tuple(float(x) for x in levels)


@dataclass
class SweepPoint:
    """One configuration of the grid (one bench run)."""

    model: str | None
    sampler: str
    sampler_args: dict = field(default_factory=dict)
    cache: str = "none"
    cache_args: dict = field(default_factory=dict)
    gen_length: int | None = None
    block_length: int | None = None
    steps: int | None = None
    tokens_per_step: int | None = None
    label: str = ""

    def key(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("label")
        return json.dumps(d, sort_keys=True, default=str)

    def bench_config(self, settings: SweepSettings, out: str | None = None):
        from dllm.eval.runner import BenchConfig

        return BenchConfig(
            model=self.model, tasks=settings.tasks, data_dir=settings.data_dir, limit=settings.limit, out=out,
            sampler=self.sampler, sampler_args=dict(self.sampler_args), cache=self.cache,
            cache_args=dict(self.cache_args), gen_length=self.gen_length, block_length=self.block_length,
            steps=self.steps, tokens_per_step=self.tokens_per_step, temperature=float(settings.temperature),
            seed=settings.seed, max_forwards=settings.max_forwards, batch_size=settings.batch_size,
            dtype=settings.dtype, device=settings.device, attention=settings.attention,
            grammar_url=settings.grammar_url, bertscore_model=settings.bertscore_model)


@dataclass
class Grid:
    settings: SweepSettings
    points: list[SweepPoint]


def _check_positive(name: str, v, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        extra = " or null" if allow_none else ""
        raise ValueError(f"{name} {v!r} is not allowed; give a positive integer{extra}")


def _alternatives(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _length(v, where: str) -> int | None:
    """A length axis value: a positive integer, or null / 'default' / 'none' for the default."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("default", "none", "null")):
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: {v!r} is not allowed; give a positive integer, or null / 'default' for the "
                         f"default")
    return v


def _model(v, where: str) -> str | None:
    if v is None or (isinstance(v, str) and v.strip().lower() == "default"):
        return None
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{where}: model {v!r} is not allowed; give a checkpoint folder, shipped model name or hub "
                         f"id, or null / 'default' for the shipped default model")
    return v


def _check_keys(d, allowed: Sequence[str], where: str) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(allowed)}; got {d!r}")
    unknown = [k for k in d if k not in allowed]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}")


def _arg_combos(args, where: str) -> list[dict]:
    """The cartesian product of an `args` mapping whose values are lists of alternatives."""
    if args is None:
        return [{}]
    if not isinstance(args, dict):
        raise ValueError(f"{where}.args must be a mapping of argument -> value or list of values; got {args!r}")
    names = list(args)
    lists = []
    for k in names:
        alts = _alternatives(args[k])
        if not alts:
            raise ValueError(f"{where}.args.{k}: an empty list of values is not allowed; give at least one value")
        lists.append(alts)
    return [dict(zip(names, combo)) for combo in itertools.product(*lists)]


def _named_entries(entries, where: str, keys, what: str, available, lookup):
    """(location, entry) for each entry of a sampler or cache list: a bare name becomes
    {"name": ...}; its keys are checked and its name looked up with `lookup` (ValueError if unknown).
    The location names the entry and its name, for the caller's further errors."""
    for j, e in enumerate(_alternatives(entries)):
        at = f"{where}[{j}]"
        if isinstance(e, str):
            e = {"name": e}
        _check_keys(e, keys, at)
        if "name" not in e:
            raise ValueError(f"{at}: missing 'name'; valid {what}: {', '.join(available)}")
        try:
            lookup(e["name"])
        except ValueError as err:
            raise ValueError(f"{at}: {err}") from None
        yield f"{at} ({e['name']})", e


def _sampler_entries(entries, where: str) -> list[dict]:
    from dllm import samplers

    out = []
    for at, e in _named_entries(entries, where, SAMPLER_KEYS, "sampler names", samplers.available(),
                                samplers.sampler_class):
        name = e["name"]
        combos = _arg_combos(e.get("args"), at)
        for c in combos:
            try:
                samplers.get(name, **c)
            except (ValueError, FileNotFoundError) as err:
                raise ValueError(f"{at} with {_fmt_args(c) or 'defaults'}: {err}") from None
        if "tokens_per_step" in e and "steps" in e:
            raise ValueError(f"{at}: give tokens_per_step or steps, not both")
        kind = "tokens_per_step" if "tokens_per_step" in e else "steps"
        values = _alternatives(e.get(kind))
        if not values:
            raise ValueError(f"{at}.{kind}: an empty list is not allowed")
        schedule = [(kind, _length(v, f"{at}.{kind}")) for v in values]
        own = {}
        for k in ("block_lengths", "gen_lengths"):
            if k in e:
                if not _alternatives(e[k]):
                    raise ValueError(f"{at}.{k}: an empty list is not allowed")
                own[k] = [_length(v, f"{at}.{k}") for v in _alternatives(e[k])]
        out.append({"name": name, "combos": combos, "schedule": schedule, **own})
    return out


def _cache_entries(entries, where: str) -> list[tuple[str, dict]]:
    from dllm.cache import available_policies, get_policy, policy_class

    out = []
    for at, e in _named_entries(entries, where, CACHE_KEYS, "cache policies", available_policies(), policy_class):
        for c in _arg_combos(e.get("args"), at):
            try:
                get_policy(e["name"], **c)
            except ValueError as err:
                raise ValueError(f"{at} with {_fmt_args(c) or 'defaults'}: {err}") from None
            out.append((e["name"], c))
    return out


def parse_grid(data: dict, source: str = "grid") -> Grid:
    """A Grid from the mapping of a grid file (see the module doc). Raises ValueError naming any
    unknown key, name or argument and any value out of range, with what is allowed."""
    settings_keys = [f.name for f in dataclasses.fields(SweepSettings)]
    allowed = [*settings_keys, *AXES, "grids"]
    _check_keys(data, allowed, source)
    settings = SweepSettings(**{k: data[k] for k in settings_keys if k in data})
    top = {k: data[k] for k in AXES if k in data}
    subs = data.get("grids")
    if subs is None:
        subs = [{}]
    elif not isinstance(subs, list) or not subs:
        raise ValueError(f"{source}.grids must be a non-empty list of mappings with keys {', '.join(AXES)}; "
                         f"got {subs!r}")
    points: list[SweepPoint] = []
    seen: set[str] = set()
    for i, sub in enumerate(subs):
        where = source if len(subs) == 1 and not sub else f"{source}.grids[{i}]"
        _check_keys(sub, AXES, where)
        axes = {"models": [None], "caches": ["none"], "block_lengths": [None], "gen_lengths": [None], **top, **sub}
        if "samplers" not in axes:
            raise ValueError(f"{where}: no samplers; give `samplers` (names or mappings with name/args), or "
                             f"--sampler on the command line")
        for k in AXES:
            if not _alternatives(axes[k]):
                raise ValueError(f"{where}.{k}: an empty list is not allowed")
        models = [_model(m, f"{where}.models") for m in _alternatives(axes["models"])]
        blocks = [_length(v, f"{where}.block_lengths") for v in _alternatives(axes["block_lengths"])]
        gens = [_length(v, f"{where}.gen_lengths") for v in _alternatives(axes["gen_lengths"])]
        caches = _cache_entries(axes["caches"], f"{where}.caches")
        for model in models:
            for s in _sampler_entries(axes["samplers"], f"{where}.samplers"):
                for args in s["combos"]:
                    for kind, count in s["schedule"]:
                        for cache, cache_args in caches:
                            for block in s.get("block_lengths", blocks):
                                for gen in s.get("gen_lengths", gens):
                                    p = SweepPoint(model=model, sampler=s["name"], sampler_args=args, cache=cache,
                                                   cache_args=cache_args, gen_length=gen, block_length=block,
                                                   **{kind: count})
                                    if p.key() not in seen:
                                        seen.add(p.key())
                                        points.append(p)
    many_models = len({p.model for p in points}) > 1
    for p in points:
        p.label = point_label(p, with_model=many_models)
    # Validates the combination of lengths and settings the bench runner checks on its own.
    for p in points:
        try:
            p.bench_config(settings)
        except ValueError as err:
            raise ValueError(f"{source}: configuration {p.label}: {err}") from None
    return Grid(settings, points)


def load_grid_file(path: str | os.PathLike) -> dict:
    """The mapping of a YAML (.yaml/.yml) or TOML (.toml) grid file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no grid file at {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ValueError(f"grid file {str(path)!r} has suffix {suffix!r}; allowed: .yaml, .yml, .toml")
    try:
        if suffix == ".toml":
            import tomllib
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        else:
            import yaml
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as err:  # yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError
        raise ValueError(f"cannot parse grid file {str(path)!r}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"grid file {str(path)!r} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def parse_spec(text: str, what: str, entry_keys: Sequence[str] = ()) -> dict:
    """A command-line sampler or cache spec, `NAME key=v1,v2 key2=v`, as a grid entry mapping.
    Values are YAML (`0.9`, `none` is the string, `null` is None, `[7.5,5,2.5]` one list value);
    commas separate alternatives. Keys in `entry_keys` (tokens_per_step, steps, ...) belong to the
    entry, the others are arguments."""
    import yaml

    try:
        parts = shlex.split(text)
    except ValueError as err:
        raise ValueError(f"{what} {text!r}: {err}") from None
    if not parts or "=" in parts[0]:
        raise ValueError(f"{what} {text!r} must start with a name, e.g. 'threshold tau=0.8,0.9'")
    entry: dict = {"name": parts[0]}
    args: dict = {}
    for tok in parts[1:]:
        key, sep, value = tok.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{what} {text!r}: {tok!r} must look like key=value or key=v1,v2")
        try:
            alts = yaml.safe_load(f"[{value}]")
        except yaml.YAMLError as err:
            raise ValueError(f"{what} {text!r}: cannot read the value of {key!r}: {err}") from None
        (entry if key in entry_keys else args)[key] = alts      # always a list of alternatives
    if args:
        entry["args"] = args
    return entry


def _csv_lengths(text: str, what: str) -> list:
    items = [s.strip() for s in text.split(",") if s.strip()]
    out = []
    for s in items:
        try:
            out.append(int(s))
        except ValueError:
            out.append(s)
    if not out:
        raise ValueError(f"{what} {text!r}: give comma-separated positive integers or 'default'")
    return [_length(v, what) for v in out]


def grid_from_args(args) -> Grid:
    """The grid of `dllm sweep`: the grid file (if any) with the command line's values on top. An
    axis given on the command line (--model, --sampler, --cache, --block-length, --gen-length)
    replaces that axis everywhere in the file, sub-grids and per-sampler lengths included."""
    data = load_grid_file(args.grid) if args.grid else {}
    source = str(args.grid) if args.grid else "command line"
    for name in ("tasks", "data_dir", "limit", "batch_size", "dtype", "device", "attention", "seed", "temperature",
                 "max_forwards", "grammar_url", "bertscore_model"):
        v = getattr(args, name, None)
        if v is not None:
            data[name] = v
    if args.pb is not None:
        try:
            data["levels"] = [float(x) for x in args.pb.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--pb {args.pb!r} must be comma-separated numbers such as 80,70,60") from None
    axes: dict[str, list] = {}
    if args.model:
        axes["models"] = [_model(m, "--model") for m in args.model]
    if args.sampler:
        axes["samplers"] = [parse_spec(s, "--sampler", ("tokens_per_step", "steps", "block_lengths", "gen_lengths"))
                            for s in args.sampler]
    if args.cache:
        axes["caches"] = [parse_spec(c, "--cache") for c in args.cache]
    if args.block_length:
        axes["block_lengths"] = _csv_lengths(args.block_length, "--block-length")
    if args.gen_length:
        axes["gen_lengths"] = _csv_lengths(args.gen_length, "--gen-length")
    for k, v in axes.items():
        data[k] = v
        for sub in data.get("grids") or []:
            if isinstance(sub, dict):
                sub.pop(k, None)
    for k in ("block_lengths", "gen_lengths"):
        if k in axes:
            for holder in [data, *(s for s in data.get("grids") or [] if isinstance(s, dict))]:
                for e in _alternatives(holder.get("samplers") or []):
                    if isinstance(e, dict):
                        e.pop(k, None)
    return parse_grid(data, source)


# -- labels ---------------------------------------------------------------------------------------
def _fmt_value(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_fmt_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _fmt_args(args: dict) -> str:
    return ", ".join(f"{k}={_fmt_value(v)}" for k, v in args.items())


def point_label(p: SweepPoint, with_model: bool = False) -> str:
    """A short readable name: `threshold(tau=0.9) k=2 +dual(refresh=2) blk=32 gen=64`."""
    s = p.sampler + (f"({_fmt_args(p.sampler_args)})" if p.sampler_args else "")
    if p.tokens_per_step is not None:
        s += f" k={p.tokens_per_step}"
    if p.steps is not None:
        s += f" steps={p.steps}"
    if p.cache != "none" or p.cache_args:
        s += f" +{p.cache}" + (f"({_fmt_args(p.cache_args)})" if p.cache_args else "")
    if p.block_length is not None:
        s += f" blk={p.block_length}"
    if p.gen_length is not None:
        s += f" gen={p.gen_length}"
    if with_model:
        s = f"{Path(p.model).name if p.model else 'default'}: {s}"
    return s


# -- Pareto front and levels ----------------------------------------------------------------------
def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points that no other point dominates, both coordinates maximised: j dominates
    i when x_j >= x_i and y_j >= y_i with at least one strict. Equal points are all kept. Returned
    in increasing x (then increasing index). Coordinates must be finite numbers."""
    for i, (x, y) in enumerate(points):
        if not (math.isfinite(x) and math.isfinite(y)):
            raise ValueError(f"pareto_front: point {i} = ({x!r}, {y!r}) is not finite")
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], i))
    front: list[int] = []
    best_right = -math.inf          # the best y among points with a strictly larger x
    k = 0
    while k < len(order):
        x = points[order[k]][0]
        group = []
        while k < len(order) and points[order[k]][0] == x:
            group.append(order[k])
            k += 1
        top = max(points[i][1] for i in group)
        if top > best_right:
            front += [i for i in group if points[i][1] == top]
        best_right = max(best_right, top)
    return sorted(front, key=lambda i: (points[i][0], i))


def best_per_level(summaries: list[dict], levels: Iterable[float]) -> list[tuple[float, dict | None]]:
    """For each level X: the configuration with the most tokens/forward whose average accuracy is
    >= X (ties: higher average, then more tokens/s), or None."""
    out = []
    for x in levels:
        ok = [s for s in summaries if s.get("average") is not None and s["average"] >= x]
        best = max(ok, key=lambda s: (s["tokens_per_forward"], s["average"], s.get("tokens_per_second") or 0.0),
                   default=None)
        out.append((x, best))
    return out


# -- files ----------------------------------------------------------------------------------------
def read_summaries(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("kind") == "summary" and "summary_id" in row:
            out.append(row)
    return out


def write_summary(path: str | os.PathLike, row: dict) -> None:
    """Insert or replace (by summary_id) one summary row; the file is rewritten through a temporary
    file and an atomic rename, so a kill leaves the old or the new version, never a mix."""
    path = Path(path)
    rows = read_summaries(path)
    for i, r in enumerate(rows):
        if r["summary_id"] == row["summary_id"]:
            rows[i] = row
            break
    else:
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# -- identities -----------------------------------------------------------------------------------
def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def expected_run_id(p: SweepPoint, settings: SweepSettings, dataset, grammar: str | None = None) -> str:
    """The bench run id `run_bench` will give this configuration (computed without loading the model)."""
    from dllm import samplers
    from dllm.eval import runner
    from dllm.models.loading import DEFAULT_MODEL

    probe = samplers.get(p.sampler, **p.sampler_args)
    cfg = p.bench_config(settings)
    model_name = str(p.model) if p.model is not None else DEFAULT_MODEL
    identity = runner.run_identity(cfg, model_name, probe.name, probe.arguments(), dataset)
    if grammar is not None:
        identity["grammar"] = grammar
    return runner._run_id(identity)


def summary_id(run_id: str, tasks: list[str], limit: int | None) -> str:
    return _sha({"run_id": run_id, "tasks": list(tasks), "limit": limit})


# -- summaries ------------------------------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def summarize_point(p: SweepPoint, rows: list[dict], *, sid: str, tasks: list[str], limit, world: int) -> dict:
    """The summary row of one finished configuration from its bench rows."""
    from dllm.eval import report, runner

    (s,) = report.summarize(rows)
    committed = sum(r["tokens_per_forward"] * r["nfe"] for r in rows)
    seconds = sum(r.get("seconds", 0.0) for r in rows)
    first = rows[0]
    return {
        "kind": "summary", "version": SUMMARY_VERSION, "summary_id": sid, "status": "ok", "error": None,
        "label": p.label, "run_id": s.run_id, "model": s.model, "sampler": s.sampler, "sampler_args": s.sampler_args,
        "cache": s.cache, "cache_args": first.get("cache_args", {}), "gen_length": p.gen_length,
        "block_length": p.block_length, "steps": p.steps, "tokens_per_step": p.tokens_per_step,
        "schedule": s.schedule, "data_mode": s.data_mode, "data_source": first.get("data_source"),
        "tasks": list(tasks), "limit": limit, "samples": len(rows),
        "accuracy": {t.task: t.score for t in s.tasks}, "average": s.average, "tasks_scored": len(s.scored),
        "tokens_per_forward": s.tokens_per_forward,
        "nfe": sum(r["nfe"] for r in rows) / len(rows), "forwards": sum(r["nfe"] for r in rows),
        "tokens_per_second": committed / seconds if seconds > 0 else None, "seconds": seconds,
        "per_task": [dataclasses.asdict(t) for t in s.tasks],
        "hardware": runner._hardware(world), "versions": runner._versions(), "timestamp": _now(),
    }


def failed_summary(p: SweepPoint, *, sid: str, run_id: str, tasks: list[str], limit, error: str) -> dict:
    return {"kind": "summary", "version": SUMMARY_VERSION, "summary_id": sid, "status": "failed", "error": error,
            "label": p.label, "run_id": run_id, "model": p.model, "sampler": p.sampler,
            "sampler_args": p.sampler_args, "cache": p.cache, "cache_args": p.cache_args,
            "gen_length": p.gen_length, "block_length": p.block_length, "steps": p.steps,
            "tokens_per_step": p.tokens_per_step, "tasks": list(tasks), "limit": limit, "timestamp": _now()}


def _run_summary(row: dict):
    """A report.RunSummary rebuilt from a summary row (for the leaderboard)."""
    from dllm.eval import report

    return report.RunSummary(row["run_id"], row["model"], row["sampler"], row["sampler_args"], row["cache"],
                             row["data_mode"], row["schedule"],
                             [report.TaskSummary(**t) for t in row["per_task"]])


# -- running --------------------------------------------------------------------------------------
class _Progress:
    """One bar over every sample of the grid. Bench rows are appended to the results file by the
    runner (main process only); while a configuration runs, a thread counts the lines appended so
    the bar moves with every finished batch."""

    def __init__(self, path: Path, total: int, initial: int, enabled: bool):
        self.path = path
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, initial=initial, desc="sweep", unit="sample", file=sys.stderr,
                            dynamic_ncols=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def drop(self, n: int) -> None:
        """A configuration was skipped: its remaining samples leave the total."""
        if self.bar is not None and n:
            self.bar.total = max(self.bar.n, self.bar.total - n)
            self.bar.refresh()

    def follow(self):
        return _Follow(self)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _Follow:
    def __init__(self, progress: _Progress):
        self.p = progress
        self.stop = threading.Event()
        self.offset = progress.path.stat().st_size if progress.path.exists() else 0
        self.thread = None

    def _poll(self) -> None:
        try:
            size = self.p.path.stat().st_size
        except FileNotFoundError:
            return
        if size <= self.offset:
            return
        with self.p.path.open("rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read(size - self.offset)
        done = chunk.rfind(b"\n") + 1          # count whole lines only
        self.offset += done
        if done:
            self.p.bar.update(chunk[:done].count(b"\n"))

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            self._poll()

    def __enter__(self):
        if self.p.bar is not None:
            self.thread = threading.Thread(target=self._loop, name="sweep-progress", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self._poll()
        return False


def _preflight(p: SweepPoint, cfg, model, tokenizer, dataset) -> None:
    """Decode the first sample of each distinct generation length with a single forward, so a
    configuration the sampler, cache or model refuses fails here, the same way on every process."""
    import dllm
    from dllm.cache import get_policy
    from dllm.eval.tasks import encode_messages

    firsts = {}
    for t in dataset.tasks:
        if dataset.samples[t]:
            s = dataset.samples[t][0]
            firsts.setdefault(cfg.lengths(s.task.max_tokens), s)
    for (gen, block, steps), s in firsts.items():
        prompt = encode_messages(tokenizer, s.messages())
        dllm.generate(model, tokenizer, [prompt], gen_length=gen, block_length=block, steps=steps,
                      sampler=cfg.sampler, sampler_kwargs=dict(cfg.sampler_args), temperature=cfg.temperature,
                      seed=cfg.seed, max_forwards=1, cache=get_policy(cfg.cache, **cfg.cache_args))


def _error_text(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text if isinstance(err, ValueError) else f"{type(err).__name__}: {text}"


@dataclass
class SweepResult:
    summaries: list[dict]          # this grid's summary rows (ok and failed), in grid order
    report: str                    # the Markdown report ("" on non-main processes)
    out_dir: Path


def run_sweep(grid: Grid, out_dir: str | os.PathLike, *, progress: bool = True, plots: bool = True,
              report_only: bool = False) -> SweepResult:
    """Run (or resume) every configuration of `grid`, then write the summaries, report and plots
    into `out_dir` (main process only). Returns this grid's summaries and the report."""
    import torch

    import dllm
    from dllm.eval import runner

    out_dir = Path(out_dir)
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise RuntimeError("the sweep's plots need matplotlib: pip install 'matplotlib>=3.7' (or pass "
                               "--no-plots)") from None
    settings, points = grid.settings, grid.points
    rows_path, summaries_path = out_dir / ROWS_FILE, out_dir / SUMMARIES_FILE
    dist = runner._Dist()
    template = points[0].bench_config(settings)
    dataset = runner.load_dataset(template)
    expected = {(t, s.index) for t in dataset.tasks for s in dataset.samples[t]}
    per_config = len(expected)
    if per_config == 0:
        raise ValueError("the task selection has no samples")
    backends = runner._backends(template, dataset)
    grammar = backends.describe()["grammar"] if backends.grammar is not None else None
    run_ids = [expected_run_id(p, settings, dataset, grammar) for p in points]
    sids = [summary_id(r, dataset.tasks, settings.limit) for r in run_ids]

    results = runner.ResultsFile(rows_path)
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        results.repair()
    dist.barrier()
    # Every process decides from the same snapshot, taken before anything new is written.
    done_pairs: dict[str, set] = {}
    for r in results.rows():
        done_pairs.setdefault(r["run_id"], set()).add((r["task"], r["index"]))
    stored = {s["summary_id"]: s for s in read_summaries(summaries_path)}
    dist.barrier()

    def is_done(i: int) -> bool:
        s = stored.get(sids[i])
        return s is not None and s["status"] == "ok" and expected <= done_pairs.get(run_ids[i], set())

    # Configurations that decode the same run are run once.
    first_of_run: dict[str, int] = {}
    todo = []
    for i, rid in enumerate(run_ids):
        if rid in first_of_run:
            continue
        first_of_run[rid] = i
        todo.append(i)
    initial = sum(len(expected & done_pairs.get(run_ids[i], set())) for i in todo)
    bar = _Progress(rows_path, per_config * len(todo), initial,
                    enabled=progress and dist.is_main and not report_only)
    order = sorted(todo, key=lambda i: [p.model for p in points].index(points[i].model))   # one load per model
    loaded: tuple[Any, Any, Any] = (object(), None, None)          # (model spec, model, tokenizer)
    load_error: dict[Any, str] = {}
    try:
        for i in order:
            if report_only or is_done(i):
                continue
            p, rid = points[i], run_ids[i]
            remaining = per_config - len(expected & done_pairs.get(rid, set()))
            cfg = p.bench_config(settings, out=str(rows_path))

            def fail(message: str) -> None:
                bar.drop(remaining)
                if dist.is_main:
                    bar.write(f"skipped {p.label}: {message}")
                    write_summary(summaries_path, failed_summary(p, sid=sids[i], run_id=rid, tasks=dataset.tasks,
                                                                 limit=settings.limit, error=message))
            if p.model in load_error:
                fail(load_error[p.model])
                continue
            if loaded[0] != p.model:
                loaded = (object(), None, None)        # free the previous model before the next load
                model = tok = None
                device = settings.device
                if device == "auto":
                    device = str(dist.device) if dist.device is not None else (
                        "cuda" if torch.cuda.is_available() else "cpu")
                try:
                    model, tok = dllm.load(p.model, dtype=settings.dtype, device=device, attention=settings.attention)
                except CONFIG_ERRORS as err:
                    load_error[p.model] = f"cannot load model {p.model or 'default'!r}: {_error_text(err)}"
                    fail(load_error[p.model])
                    continue
                loaded = (p.model, model, tok)
            _, model, tok = loaded
            try:
                _preflight(p, cfg, model, tok, dataset)
            except CONFIG_ERRORS as err:
                fail(_error_text(err))
                continue
            try:
                with bar.follow():
                    rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
            except CONFIG_ERRORS as err:
                fail(_error_text(err))
                continue
            rows = [r for r in rows if (r["task"], r["index"]) in expected]
            if not rows:
                fail("the runner returned no rows")
                continue
            if dist.is_main:
                if rows[0]["run_id"] != rid:    # resumes still work (the runner's own); only skipping does not
                    warnings.warn(f"configuration {p.label}: the runner gave run id {rows[0]['run_id']}, the sweep "
                                  f"expected {rid}; finished configurations will be re-checked on every run")
                write_summary(summaries_path, summarize_point(p, rows, sid=sids[i], tasks=dataset.tasks,
                                                              limit=settings.limit, world=dist.world))
    finally:
        bar.close()
    dist.barrier()
    if not dist.is_main:
        return SweepResult([], "", out_dir)
    by_id = {s["summary_id"]: s for s in read_summaries(summaries_path)}
    mine = [by_id[sids[i]] for i in todo if sids[i] in by_id]
    text = write_report(mine, out_dir, settings.levels, plots=plots)
    return SweepResult(mine, text, out_dir)


# -- report ---------------------------------------------------------------------------------------
def _task_names(tasks: list[str]) -> dict[str, str]:
    short = {t: t.split("/", 1)[-1] for t in tasks}
    return short if len(set(short.values())) == len(short) else {t: t for t in tasks}


def _num(v, spec=".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def markdown_report(summaries: list[dict], levels: Sequence[float], plots: Sequence[str] = ()) -> str:
    """The sweep report: one row per configuration, PB@X per method, the best configuration per
    accuracy level, and the configurations that failed."""
    from dllm.eval import report

    ok = [s for s in summaries if s["status"] == "ok"]
    failed = [s for s in summaries if s["status"] != "ok"]
    tasks: list[str] = []
    for s in ok:
        tasks += [t for t in s["tasks"] if t not in tasks]
    names = _task_names(tasks)
    scored = [s for s in ok if s["average"] is not None]
    front = {id(scored[i]) for i in pareto_front([(s["tokens_per_forward"], s["average"]) for s in scored])}
    lines = ["# Sweep report", ""]
    if ok:
        first = ok[0]
        lines.append(f"{len(summaries)} configuration(s): {len(ok)} finished, {len(failed)} failed. "
                     f"{len(tasks)} task(s), {first['samples'] // max(len(first['tasks']), 1)} sample(s) per task "
                     f"(limit {first['limit']}), data: {first['data_mode']}. Accuracy in %, averaged over tasks; "
                     f"tokens/forward = generated tokens / model forwards; * = on the Pareto front of accuracy "
                     f"vs tokens/forward.")
    else:
        lines.append(f"{len(summaries)} configuration(s), none finished.")
    lines.append("")
    for p in plots:
        lines.append(f"![{Path(p).stem.replace('_', ' ')}]({Path(p).name})")
    if plots:
        lines.append("")
    lines += ["## Configurations", ""]
    head = ["configuration", "average", "tokens/forward", "tokens/s", "NFE", *[names[t] for t in tasks]]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for s in ok:
        mark = " *" if id(s) in front else ""
        cells = [f"{s['label']}{mark}", _num(s["average"]), f"{s['tokens_per_forward']:.2f}",
                 _num(s["tokens_per_second"]), f"{s['nfe']:.1f}",
                 *[_num(s["accuracy"].get(t)) if t in s["accuracy"] else "" for t in tasks]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## PB@X", "",
              "The largest tokens/forward at which a method's average accuracy is still >= X (fixed schedules: the "
              "best qualifying point; adaptive ones: interpolated between the points around X); n/a: never reached.",
              ""]
    board = report.leaderboard([_run_summary(s) for s in scored], levels)
    head = ["model", "sampler", "cache", "configurations", *[f"PB@{x:g}" for x in levels]]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for b in board:
        lines.append("| " + " | ".join([b["model"], b["sampler"], b["cache"], str(b["runs"]),
                                        *[_num(b[f"PB{x:g}"], ".2f") for x in levels]]) + " |")
    lines += ["", "## Best configuration per accuracy level", "",
              "The most tokens/forward among the configurations whose average accuracy reaches the level.", ""]
    for x, s in best_per_level(scored, levels):
        if s is None:
            lines.append(f"- average >= {x:g}: none reaches it")
        else:
            lines.append(f"- average >= {x:g}: **{s['label']}**: {s['tokens_per_forward']:.2f} tokens/forward, "
                         f"average {s['average']:.1f}, {_num(s['tokens_per_second'])} tokens/s")
    if failed:
        lines += ["", "## Failed configurations", ""]
        for s in failed:
            lines.append(f"- {s['label']}: {s['error']}")
    return "\n".join(lines) + "\n"


_MARKERS = "osD^v<>phX*8"


def _series(summaries: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in summaries:
        out.setdefault(s["sampler"], []).append(s)
    return out


def _style(names: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: (cmap(i % cmap.N), _MARKERS[i % len(_MARKERS)]) for i, n in enumerate(names)}


def _figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)           # Agg without pyplot: no global backend switch
    return fig


def _log2_if_positive(ax, xs) -> None:
    if xs and min(xs) > 0:
        ax.set_xscale("log", base=2)


def _scatter_panel(ax, summaries, styles, xkey: str, ykey, front: bool, legend: bool) -> None:
    pts = [(s, s[xkey], ykey(s)) for s in summaries if s.get(xkey) is not None and ykey(s) is not None]
    for name, group in _series([s for s, _, _ in pts]).items():
        colour, marker = styles[name]
        ax.scatter([s[xkey] for s in group], [ykey(s) for s in group], color=colour, marker=marker, s=36,
                   label=name, alpha=0.85, edgecolors="none")
    if front and pts:
        idx = pareto_front([(x, y) for _, x, y in pts])
        # A dashed line through the front, each front point ringed (so a one-point front shows too).
        ax.plot([pts[i][1] for i in idx], [pts[i][2] for i in idx], color="black", linestyle="--", linewidth=1.0,
                marker="o", markersize=10, markerfacecolor="none", markeredgewidth=0.9, label="Pareto front",
                zorder=0)
    _log2_if_positive(ax, [x for _, x, _ in pts])
    ax.set_ylim(-3, 103)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc="best")


def write_plots(summaries: list[dict], out_dir: str | os.PathLike) -> list[Path]:
    """Accuracy vs tokens/forward (with the Pareto front), accuracy vs tokens/s, and one panel per
    task, as PNGs; one colour and marker per sampler. Returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [s for s in summaries if s["status"] == "ok" and s["average"] is not None]
    if not ok:
        return []
    styles = _style(list(_series(ok)))
    avg = lambda s: s["average"]  # noqa: E731
    written = []

    fig = _figure((7.5, 5.0))
    ax = fig.add_subplot()
    _scatter_panel(ax, ok, styles, "tokens_per_forward", avg, front=True, legend=True)
    ax.set_xlabel("tokens per forward (log2)")
    ax.set_ylabel("average accuracy (%)")
    ax.set_title(f"Accuracy vs parallelism, {len(ok)} configurations")
    written.append(out_dir / PLOT_TPF)
    fig.savefig(written[-1])

    fig = _figure((7.5, 5.0))
    ax = fig.add_subplot()
    _scatter_panel(ax, ok, styles, "tokens_per_second", avg, front=True, legend=True)
    ax.set_xlabel("tokens per second (log2)")
    ax.set_ylabel("average accuracy (%)")
    ax.set_title(f"Accuracy vs speed, {len(ok)} configurations")
    written.append(out_dir / PLOT_TPS)
    fig.savefig(written[-1])

    tasks: list[str] = []
    for s in ok:
        tasks += [t for t in s["accuracy"] if t not in tasks]
    names = _task_names(tasks)
    cols = min(4, len(tasks))
    rows_n = math.ceil(len(tasks) / cols)
    fig = _figure((3.2 * cols, 2.6 * rows_n + 0.6))
    axes = fig.subplots(rows_n, cols, squeeze=False, sharex=True, sharey=True)
    for k, task in enumerate(tasks):
        ax = axes[k // cols][k % cols]
        _scatter_panel(ax, ok, styles, "tokens_per_forward", lambda s, t=task: s["accuracy"].get(t), front=True,
                       legend=False)
        ax.set_title(names[task], fontsize=9)
        ax.tick_params(labelbottom=True)     # shared x: keep the ticks above empty panels
    for k in range(len(tasks), rows_n * cols):
        axes[k // cols][k % cols].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(8, len(labels)), fontsize=8)
    fig.supxlabel("tokens per forward (log2)", fontsize=9)
    fig.supylabel("accuracy (%)", fontsize=9)
    written.append(out_dir / PLOT_TASKS)
    fig.savefig(written[-1])
    return written


def write_report(summaries: list[dict], out_dir: str | os.PathLike, levels: Sequence[float],
                 plots: bool = True) -> str:
    """Write the plots (optional) and report.md into `out_dir`; returns the report text."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_plots(summaries, out_dir) if plots else []
    text = markdown_report(summaries, levels, [f.name for f in files])
    _atomic_write_text(out_dir / REPORT_FILE, text)
    return text


# -- command line ---------------------------------------------------------------------------------
def add_arguments(p) -> None:
    """The `dllm sweep` options (also used by benchmarks/sweep.py)."""
    p.add_argument("--grid", default=None, help="grid file (.yaml/.yml/.toml); see benchmarks/grids/default.yaml")
    p.add_argument("--out-dir", required=True, help="folder for rows.jsonl, summaries.jsonl, report.md and the plots; "
                                                     "a rerun resumes")
    p.add_argument("--model", action="append", default=None,
                   help="model axis (repeatable): checkpoint folder, shipped model name or hub id; 'default' = the "
                        "shipped default model")
    p.add_argument("--sampler", action="append", default=None, metavar="'NAME key=v1,v2 ...'",
                   help="sampler axis (repeatable): a name and argument lists, e.g. 'threshold tau=0.8,0.9' or "
                        "'low_confidence tokens_per_step=1,2,4'; keys tokens_per_step, steps, block_lengths, "
                        "gen_lengths set that sampler's schedule and lengths")
    p.add_argument("--cache", action="append", default=None, metavar="'NAME key=v1,v2 ...'",
                   help="cache axis (repeatable), e.g. none, dual or 'dkv-decode refresh=4,8'")
    p.add_argument("--block-length", default=None, help="block length axis, comma-separated ('default' = one block)")
    p.add_argument("--gen-length", default=None, help="generation length axis, comma-separated ('default' = the "
                                                      "task's max_tokens)")
    p.add_argument("--tasks", default=None, help="task ids, patterns or groups (default: the 12 Waiting Line and "
                                                 "Puzzle tasks, or every benchmark task in --data-dir)")
    p.add_argument("--data-dir", default=None, help="folder with the official ParallelBench files (default: our "
                                                    "generators' test split)")
    p.add_argument("--limit", type=int, default=None, help="the first N samples of each task")
    p.add_argument("--batch-size", type=int, default=None, help="samples decoded together (default 8)")
    p.add_argument("--dtype", default=None, help="auto | float32 | float16 | bfloat16")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N")
    p.add_argument("--attention", default=None, help="attention backend (default: the bench runner's)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-forwards", type=int, default=None)
    p.add_argument("--grammar-server", dest="grammar_url", default=None,
                   help="LanguageTool server URL for Text Writing tasks")
    p.add_argument("--bertscore-model", default=None, help="local roberta-large folder for BERTScore")
    p.add_argument("--pb", default=None, help="accuracy levels for PB@X and the best-configuration list "
                                              "(default 80,70,60)")
    p.add_argument("--dry-run", action="store_true", help="list the configurations and exit")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rewrite report.md and the plots from the stored summaries")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true")


def main_from_args(args) -> int:
    """`dllm sweep`; returns the exit status."""
    from dllm.eval import runner

    try:
        grid = grid_from_args(args)
        if args.dry_run:
            for p in grid.points:
                print(p.label)
            print(f"{len(grid.points)} configuration(s)")
            return 0
        result = run_sweep(grid, args.out_dir, progress=not args.no_progress, plots=not args.no_plots,
                           report_only=args.report_only)
    except CONFIG_ERRORS as err:
        print(f"error: {_error_text(err)}", file=sys.stderr)
        return 2
    if not runner.is_main_process():
        return 0
    print(result.report)
    print(f"written to {result.out_dir}", file=sys.stderr)
    return 0
