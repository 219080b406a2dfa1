"""The sweep grid: the settings every configuration shares, the configurations (points), the
parsing of grid files and command-line specs into them, and the points' readable labels."""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from dllm import samplers
from dllm.attention import get_backend
from dllm.cache import available_policies, policy_class
from dllm.config import GenerationConfig
from dllm.dpad import SuffixDropout
from dllm.eval.runner import BenchConfig, cache_identity, model_identity
from dllm.models.loading import parse_device, resolve_dtype

AXES = ("models", "samplers", "caches", "block_lengths", "gen_lengths", "suffix_dropouts")
SAMPLER_KEYS = ("name", "args", "tokens_per_step", "steps", "block_lengths", "gen_lengths")
CACHE_KEYS = ("name", "args")


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
    cuda_graphs: bool = False
    compile: bool = False
    seed: int | None = 0
    temperature: float = 0.0
    max_forwards: int | None = None
    eos_early_stop: bool = False
    grammar_url: str | None = None
    bertscore_model: str | None = None
    levels: tuple = (80.0, 70.0, 60.0)

    def __post_init__(self):
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
            self.attention = next(f.default for f in dataclasses.fields(BenchConfig) if f.name == "attention")
        get_backend(self.attention)
        for name in ("cuda_graphs", "compile", "eos_early_stop"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {getattr(self, name)!r} is not allowed; give true or false")
        if not isinstance(self.device, str) or not _names_a_device(self.device):
            raise ValueError(f"device {self.device!r} is not allowed; give 'auto', 'cpu', 'cuda', 'cuda:N' or "
                             f"another torch device")
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


def _names_a_device(name: str) -> bool:
    """Whether `name` is "auto" or a torch device name (on this machine or the one the sweep runs on)."""
    try:
        return name == "auto" or parse_device(name) is not None
    except ValueError:
        return False


@dataclass
class SweepPoint:
    """One configuration of the grid (one bench run): a model and a decoding request whose
    sampler, cache, lengths and schedule come from the grid (its temperature, seed and forward
    cap from the sweep's settings; gen_length None: the checkpoint's generation length when it names
    one, else each task's max_tokens)."""

    model: str | None
    generation: GenerationConfig
    label: str = ""

    def key(self) -> str:
        """The configuration's identity (every field but the label, and `suffix_dropout` when off): equal
        keys are one configuration."""
        fields = dataclasses.asdict(self.generation)
        if fields["suffix_dropout"] is None:
            del fields["suffix_dropout"]
        return json.dumps({"model": self.model, **fields}, sort_keys=True, default=str)

    def bench_config(self, settings: SweepSettings, out: str | None = None) -> BenchConfig:
        """The bench runner's config of this configuration under `settings`; `out`: its rows file."""
        generation = self.generation.replace(temperature=float(settings.temperature), seed=settings.seed,
                                             max_forwards=settings.max_forwards,
                                             eos_early_stop=settings.eos_early_stop)
        return BenchConfig(
            model=self.model, tasks=settings.tasks, data_dir=settings.data_dir, limit=settings.limit, out=out,
            generation=generation, batch_size=settings.batch_size, dtype=settings.dtype, device=settings.device,
            attention=settings.attention, cuda_graphs=settings.cuda_graphs, compile=settings.compile,
            grammar_url=settings.grammar_url, bertscore_model=settings.bertscore_model)


@dataclass
class Grid:
    """A parsed grid: the shared settings and the configurations, in grid order, each once."""

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


def _is_default(v) -> bool:
    """Whether an axis value asks for the default: null, or 'default' / 'none' / 'null' (TOML has no null)."""
    return v is None or (isinstance(v, str) and v.strip().lower() in ("default", "none", "null"))


def _length(v, where: str) -> int | None:
    """A length axis value: a positive integer, or null / 'default' / 'none' for the default."""
    if _is_default(v):
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
        if not isinstance(k, str):
            raise ValueError(f"{where}.args: argument name {k!r} must be a string")
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
    out = []
    for at, e in _named_entries(entries, where, SAMPLER_KEYS, "sampler names", samplers.available(),
                                samplers.sampler_class):
        name = e["name"]
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
        combos = []
        for c in _arg_combos(e.get("args"), at):
            try:
                sampler = samplers.get(name, **c)
            except (ValueError, FileNotFoundError) as err:
                raise ValueError(f"{at} with {_fmt_args(c) or 'defaults'}: {err}") from None
            _check_schedule_keys(sampler, e, f"{at} with {_fmt_args(c) or 'defaults'}")
            combos.append(SamplerCombo(c, sampler.arguments(), sampler.uses_blocks))
        out.append({"name": name, "combos": combos, "schedule": schedule, **own})
    return out


@dataclass(frozen=True)
class SamplerCombo:
    """One argument combination of a sampler entry: the arguments as given, as the sampler
    resolves them (defaults filled in; what decides its tokens), and whether it decodes in blocks."""

    given: dict
    resolved: dict
    uses_blocks: bool


def _check_schedule_keys(sampler, entry: dict, where: str) -> None:
    """A sampler that ignores the request's schedule or blocks refuses an entry that sets them:
    every value would decode the same run."""
    if not sampler.uses_steps and any(entry.get(k) is not None for k in ("steps", "tokens_per_step")):
        raise ValueError(f"{where}: sampler {sampler.name!r} sets its own schedule and ignores steps / "
                         f"tokens_per_step; leave them out")
    if not sampler.uses_blocks and any(v is not None for v in _alternatives(entry.get("block_lengths"))):
        raise ValueError(f"{where}: sampler {sampler.name!r} decodes the whole generation at once and ignores "
                         f"block_lengths; leave them out")


def _cache_entries(entries, where: str) -> list[tuple[str, dict, tuple]]:
    """(name, arguments as given, the run identity's (name, arguments)) of each cache setting."""
    out = []
    for at, e in _named_entries(entries, where, CACHE_KEYS, "cache policies", available_policies(), policy_class):
        for c in _arg_combos(e.get("args"), at):
            try:
                identity = cache_identity(e["name"], c)
            except ValueError as err:
                raise ValueError(f"{at} with {_fmt_args(c) or 'defaults'}: {err}") from None
            out.append((e["name"], c, identity))
    return out


def _dropout_entries(entries, where: str) -> list[dict | None]:
    """Each suffix dropout setting of the axis, its settings filled in: null, 'none' or 'default'
    (off; TOML has no null) or a mapping of `dllm.dpad.SuffixDropout`'s fields."""
    out = []
    for i, e in enumerate(_alternatives(entries)):
        try:
            dropout = None if _is_default(e) else SuffixDropout.from_value(e)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}[{i}]: {err}") from None
        out.append(None if dropout is None else dropout.arguments())
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
    seen: list[tuple] = []
    for i, sub in enumerate(subs):
        where = source if data.get("grids") is None else f"{source}.grids[{i}]"
        _check_keys(sub, AXES, where)
        axes = {"models": [None], "caches": ["none"], "block_lengths": [None], "gen_lengths": [None],
                "suffix_dropouts": [None], **top, **sub}
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
        dropouts = _dropout_entries(axes["suffix_dropouts"], f"{where}.suffix_dropouts")
        for model in models:
            for s in _sampler_entries(axes["samplers"], f"{where}.samplers"):
                for combo, (kind, count), (cache, cache_args, cache_same), dropout in itertools.product(
                        s["combos"], s["schedule"], caches, dropouts):
                    for block in s.get("block_lengths", blocks if combo.uses_blocks else [None]):
                        for gen in s.get("gen_lengths", gens):
                            request = GenerationConfig(
                                sampler=s["name"], sampler_kwargs=combo.given, cache=cache, cache_kwargs=cache_args,
                                gen_length=gen, block_length=block, suffix_dropout=dropout, **{kind: count})
                            # Equal as decoded: one model folder however spelled, arguments with their
                            # defaults filled in and compared as numbers (1 == 1.0).
                            same = (model_identity(model), s["name"], combo.resolved, cache_same, gen, block,
                                    kind if count is not None else None, count, json.dumps(dropout, sort_keys=True))
                            if same not in seen:
                                seen.append(same)
                                points.append(SweepPoint(model=model, generation=request))
    names = model_names([p.model for p in points])
    for p in points:
        p.label = point_label(p, model_name=names[p.model] if len(names) > 1 else None)
    # Validates the combination of lengths and settings the bench runner checks on its own.
    for p in points:
        try:
            p.bench_config(settings)
            if p.generation.gen_length is not None:
                p.generation.for_length()
        except ValueError as err:
            raise ValueError(f"{source}: configuration {p.label}: {err}") from None
    return Grid(settings, points)


def model_names(models: Sequence[str | None]) -> dict[str | None, str]:
    """A short distinct name per model for labels: the fewest trailing path parts that tell the
    models apart ('default' for the shipped default model)."""
    distinct = list(dict.fromkeys(models))
    given = [m for m in distinct if m is not None]
    depth = max((len(Path(m).parts) for m in given), default=1)
    tails = list(given)
    for k in range(1, depth + 1):
        parts = [str(Path(*Path(m).parts[-k:])) for m in given]
        if len(set(parts)) == len(parts) and "default" not in parts:
            tails = parts
            break
    names = dict(zip(given, tails))            # as given where no tail tells them apart ('a', './a')
    if None in distinct:
        names[None] = "default"
    return names


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
            import tomllib          # in the standard library from Python 3.11 only
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        else:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except Exception as err:  # yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError
        raise ValueError(f"cannot parse grid file {str(path)!r}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"grid file {str(path)!r} must hold a mapping at the top level, got {type(data).__name__}")
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml's safe loader that refuses a mapping holding a key twice (yaml itself keeps the last)
    and reads numbers in exponent notation without a dot (`1e-2`) as floats, as YAML 1.2 and
    Python do (YAML 1.1 reads them as text)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_spec(text: str, what: str, entry_keys: Sequence[str] = ()) -> dict:
    """A command-line sampler or cache spec, `NAME key=v1,v2 key2=v`, as a grid entry mapping.
    Values are YAML (`0.9`, `none` is the string, `null` is None, `[7.5,5,2.5]` one list value);
    commas separate alternatives. Keys in `entry_keys` (tokens_per_step, steps, ...) belong to the
    entry, the others are arguments."""
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
            alts = yaml.load(f"[{value}]", Loader=UniqueKeyLoader)
        except yaml.YAMLError as err:
            raise ValueError(f"{what} {text!r}: cannot read the value of {key!r}: {err}") from None
        target = entry if key in entry_keys else args
        if key in target:
            raise ValueError(f"{what} {text!r}: {key!r} is given twice; list its values once, e.g. {key}=a,b")
        target[key] = alts      # always a list of alternatives
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
    replaces that axis everywhere in the file, sub-grids and the file's per-sampler lengths
    included (a --sampler's own lengths stay). A
    setting (--seed, --limit, ...) replaces the file's when it is named in `args.given`, the
    options given on the command line."""
    data = load_grid_file(args.grid) if args.grid else {}
    source = str(args.grid) if args.grid else "command line"
    for name in ("tasks", "data_dir", "limit", "batch_size", "dtype", "device", "attention", "cuda_graphs", "compile",
                 "seed", "temperature", "max_forwards", "eos_early_stop", "grammar_url", "bertscore_model"):
        if name in getattr(args, "given", ()):
            data[name] = getattr(args, name)
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
    # A length axis on the command line replaces the file's per-sampler lengths; a --sampler's own
    # lengths (`--sampler 'dus block_lengths=8'`) stay, as they do under the file's axes.
    for k in ("block_lengths", "gen_lengths"):
        if k in axes:
            for holder in [data, *(s for s in data.get("grids") or [] if isinstance(s, dict))]:
                for e in _alternatives(holder.get("samplers") or []):
                    if isinstance(e, dict):
                        e.pop(k, None)
    for k, v in axes.items():
        data[k] = v
        for sub in data.get("grids") or []:
            if isinstance(sub, dict):
                sub.pop(k, None)
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


def point_label(p: SweepPoint, model_name: str | None = None) -> str:
    """A short readable name: `threshold(tau=0.9) k=2 +dual(refresh=2) blk=32 gen=64`, after
    `model_name: ` when one is given."""
    g = p.generation
    s = g.sampler + (f"({_fmt_args(g.sampler_kwargs)})" if g.sampler_kwargs else "")
    if g.tokens_per_step is not None:
        s += f" k={g.tokens_per_step}"
    if g.steps is not None:
        s += f" steps={g.steps}"
    if g.cache != "none" or g.cache_kwargs:
        s += f" +{g.cache}" + (f"({_fmt_args(g.cache_kwargs)})" if g.cache_kwargs else "")
    if g.block_length is not None:
        s += f" blk={g.block_length}"
    if g.gen_length is not None:
        s += f" gen={g.gen_length}"
    if g.suffix_dropout is not None:
        s += f" +dpad({_fmt_args(g.suffix_dropout)})"
    if model_name is not None:
        s = f"{model_name}: {s}"
    return s
