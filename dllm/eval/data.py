"""Benchmark samples: the official ParallelBench files from a user's folder, or our generators.

Official layout (the benchmark's test set, never shipped with dllm):

    <root>/<category>/task_config.yaml      mapping task id -> {prompt, metric, ...}
    <root>/<category>/<task>.jsonl          one record per line

`<root>` may be given as a ParallelBench checkout (its `dataset/parallel_bench/data/output/test`
is used), as any folder containing that path or `output/test`, or as the folder itself. The task
id is `<category>/<file stem>`; folders starting with `_` are skipped. A task's prompt template
and metric are the entry keyed by the task id in its folder's `task_config.yaml`.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import generators
from .metrics import METRICS, compute
from .tasks import TASKS, Task, get_task, messages

GENERATED_MARKER = "dllm_generated.json"     # beside records our generators wrote in the official layout
_NESTED = ("dataset/parallel_bench/data/output/test", "data/output/test", "output/test", "test")


@dataclass
class Sample:
    """One benchmark question: its task, 0-based index within the task, and the raw record."""

    task: Task
    index: int
    record: dict
    source: str = "generated"      # "official" | "generated"

    @property
    def answer(self):
        return self.record.get("answer")

    def messages(self) -> list[dict]:
        return messages(self.task, self.record)


@dataclass
class Dataset:
    """Samples grouped by task, with where they came from (recorded in every result row)."""

    mode: str                        # "official" | "generated"
    source: str                      # folder, or the generator settings
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    @property
    def tasks(self) -> list[str]:
        return list(self.samples)


def find_official_root(path: str | Path) -> Path:
    """The folder holding `<category>/task_config.yaml` under `path` (folders named `_...` are not
    categories, as in `discover`); errors say what was expected."""
    base = Path(path).expanduser()
    if not base.is_dir():
        raise FileNotFoundError(f"ParallelBench data folder {str(base)!r} does not exist or is not a folder")
    for cand in (base, *(base / n for n in _NESTED)):
        if cand.is_dir() and any(not p.parent.name.startswith("_") for p in cand.glob("*/task_config.yaml")):
            return cand
    raise FileNotFoundError(
        f"no ParallelBench test files under {str(base)!r}: expected <category>/task_config.yaml and "
        f"<category>/<task>.jsonl there or under {', '.join(_NESTED)} (e.g. a ParallelBench checkout)")


def discover(root: str | Path) -> list[str]:
    """Task ids of the official files under `root`, registry order first, then the rest sorted."""
    root = find_official_root(root)
    found = sorted(f"{p.parent.name}/{p.stem}" for p in root.glob("*/*.jsonl") if not p.parent.name.startswith("_"))
    known = [t for t in TASKS if t in found]
    return known + [t for t in found if t not in TASKS]


def _task_config(root: Path, task_id: str) -> dict:
    path = root / task_id.split("/", 1)[0] / "task_config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; every category folder needs its task_config.yaml")
    try:
        configs = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(configs, dict) or task_id not in configs:
        keys = ", ".join(map(str, configs)) if isinstance(configs, dict) else type(configs).__name__
        raise ValueError(f"{path} has no entry for task {task_id!r} (entries: {keys})")
    entry = configs[task_id] or {}
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: the entry for {task_id!r} must be a mapping with 'prompt' and 'metric', got "
                         f"{type(entry).__name__} {str(entry)[:60]!r}")
    missing = [k for k in ("prompt", "metric") if k not in entry]
    if missing:
        raise ValueError(f"{path}: the entry for {task_id!r} lacks {', '.join(missing)}")
    for key in ("prompt", "metric"):
        if not isinstance(entry[key], str):
            raise ValueError(f"{path}: the {key} of {task_id!r} must be a string, got {type(entry[key]).__name__} "
                             f"{str(entry[key])[:60]!r}")
    return entry


def official_task(root: str | Path, task_id: str) -> Task:
    """The task as the official files define it (their prompt template and metric)."""
    root = find_official_root(root)
    entry = _task_config(root, task_id)
    if entry["metric"] not in METRICS:
        raise ValueError(f"task {task_id!r} names metric {entry['metric']!r}; known metrics: {', '.join(METRICS)}")
    known = TASKS.get(task_id)
    if known is not None:
        return Task(task_id, entry["prompt"], entry["metric"], known.max_tokens, known.num_samples, known.headline,
                    known.one_shot)
    headline = "grammar" if entry["metric"] in ("summary_score", "paraphrase_score", "sentence_to_words_score") \
        else "accuracy"
    max_tokens = 128 if task_id.split("/", 1)[0].endswith("_n15") else (32 if task_id.startswith("waiting_line") else 64)
    return Task(task_id, entry["prompt"], entry["metric"], max_tokens, int(entry.get("num_samples") or 100), headline,
                headline == "accuracy")


def read_records(path: str | Path) -> list[dict]:
    """JSON records of a JSONL file (compact or spaced); a bad line is an error naming it."""
    return [rec for _, rec in _numbered_records(Path(path))]


def _numbered_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, record) of each record of a JSONL file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    out = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n} is not valid JSON: {err.msg}") from None
            if not isinstance(rec, dict) or "input" not in rec or "answer" not in rec:
                raise ValueError(f"{path}:{n} is not a benchmark record (needs 'input' and 'answer')")
            out.append((n, rec))
    return out


def _check_record(task: Task, record: dict, where: str) -> None:
    """A record whose prompt cannot be rendered or whose answer its metric cannot read is an error
    naming `where` (file:line), found when the data loads rather than after decoding."""
    try:
        messages(task, record)
        compute(task.metric, "", record["answer"])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
        detail = f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
        raise ValueError(f"{where}: {detail}") from None


def _check_selection(tasks, limit) -> None:
    """`tasks` a list of task ids, `limit` None or a positive integer; else a ValueError naming them."""
    if isinstance(tasks, str) or not all(isinstance(t, str) for t in tasks):
        raise ValueError(f"tasks must be a list of task ids such as ['waiting_line/copy'], got {tasks!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")


def load_official(root: str | Path, tasks: list[str] | None = None, limit: int | None = None) -> Dataset:
    """Samples of the official files under `root` for `tasks` (default: every task found)."""
    _check_selection(tasks or [], limit)
    root = find_official_root(root)
    found = discover(root)
    if not found:
        raise FileNotFoundError(f"no ParallelBench task file (<category>/<task>.jsonl) under {root}")
    chosen = found if tasks is None else tasks
    absent = [t for t in chosen if t not in found]
    if absent:
        raise FileNotFoundError(f"no file for task(s) {', '.join(absent)} under {root}; found: {', '.join(found)}")
    made = generated_options(root, chosen)
    if made:                   # records our generators wrote (`dllm bench --write-data`): not official data
        ds = Dataset("generated", f"{root} (dllm.eval.generators {json.dumps(made, sort_keys=True)})")
    else:
        ds = Dataset("official", str(root))
    for task_id in chosen:
        task = official_task(root, task_id)
        path = root / f"{task_id}.jsonl"
        numbered = _numbered_records(path)
        if not numbered:
            raise ValueError(f"{path} holds no records")
        if len(numbered) != task.num_samples:
            warnings.warn(f"{task_id}: {len(numbered)} records where the benchmark has {task.num_samples}",
                          stacklevel=2)
        numbered = numbered if limit is None else numbered[:limit]
        for n, record in numbered:
            _check_record(task, record, f"{path}:{n}")
        ds.samples[task_id] = [Sample(task, i, r, ds.mode) for i, (_, r) in enumerate(numbered)]
    return ds


def load_generated(tasks: list[str], limit: int | None = None, **options) -> Dataset:
    """Samples of our seeded generators' held-out test split (`dllm.eval.generators`)."""
    _check_selection(tasks, limit)
    ds = Dataset("generated", "dllm.eval.generators test split"
                 + "".join(f" {k}={v}" for k, v in sorted(options.items())))
    for task_id in tasks:
        task = get_task(task_id)
        records = generators.make_records(task_id, split="test", **options)
        records = records if limit is None else records[:limit]
        ds.samples[task_id] = [Sample(task, i, r, "generated") for i, r in enumerate(records)]
    return ds


def _generated_marker(folder: Path) -> dict[str, dict]:
    """{task: the generators' options} recorded in `folder`'s GENERATED_MARKER, empty without one."""
    marker = folder / GENERATED_MARKER
    return json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else {}


def generated_options(root: Path, tasks: list[str]) -> dict[str, dict]:
    """{task: the generators' options} of the `tasks` our generators wrote under `root` (its
    `GENERATED_MARKER`); empty for official files. A selection mixing both is a ValueError."""
    made = _generated_marker(root)
    ours = {t: made[t] for t in tasks if t in made}
    if ours and len(ours) != len(tasks):
        others = [t for t in tasks if t not in made]
        raise ValueError(f"under {root}, task(s) {', '.join(ours)} were written by dllm's generators and "
                         f"{', '.join(others)} were not; read them in separate runs")
    return ours


def write_official_layout(folder: str | Path, records: dict[str, list[dict]], generated: dict | None = None) -> Path:
    """Write `{task_id: records}` in the official layout (JSONL + per-category task_config.yaml),
    so generated data can be read back by `load_official` or by other tools. `generated`: how our
    generators made the records (their options), recorded per task in `GENERATED_MARKER` beside
    them, so that the data read back is labelled generated, not official."""
    folder = Path(folder)
    if generated is not None:
        folder.mkdir(parents=True, exist_ok=True)
        made = {**_generated_marker(folder), **{task: generated for task in records}}
        (folder / GENERATED_MARKER).write_text(json.dumps(made, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    by_category: dict[str, dict] = {}
    for task_id, recs in records.items():
        task = get_task(task_id)
        cat_dir = folder / task.category
        cat_dir.mkdir(parents=True, exist_ok=True)
        with (cat_dir / f"{task.name}.jsonl").open("w", encoding="utf-8") as fh:
            for r in recs:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        by_category.setdefault(task.category, {})[task_id] = {
            "name": task_id, "prompt": task.template, "metric": task.metric, "num_samples": len(recs)}
    for cat, entries in by_category.items():
        path = folder / cat / "task_config.yaml"
        existing = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
        path.write_text(yaml.safe_dump({**(existing or {}), **entries}, sort_keys=False, allow_unicode=True),
                        encoding="utf-8")
    return folder
