"""The public ParallelBench leaderboard's result files, written from dllm runs and read back to compare.

The leaderboard (parallelbench.github.io, `data/figures/<model>/<method>.csv`) keeps one CSV per model
and method with the header `task,tps,accuracy`: one row per task and operating point (a setting of
the method: k, a threshold, ...), where tps is tokens per denoising step (the generation length
over the forwards, averaged over a task's samples) and accuracy the task's score in %, sorted by
task id and then tps; then one `avg` row per operating point, its tps and accuracy averaged over
the tasks. Task ids are the leaderboard's (`waitingline-copy`, `puzzles-sudoku`, ...).

Here a dllm run is an operating point, and runs of the same model, sampler and cache make one
method (`report.method_id`: the leaderboard's name where it has one, `confidence-topk` for
`low_confidence`; a cache other than none is appended, `confidence-threshold+dual`). PB@X of a curve
is `report.pb_score` over its `avg` rows, stepwise for `report.STEPWISE_METHODS`, whether the curve
comes from dllm's runs or from a file.
"""
from __future__ import annotations

import csv
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .report import RunSummary, interpolated, method_id, pb_score

HEADER = ["task", "tps", "accuracy"]
AVG = "avg"

_TASK_IDS = {
    "puzzle/sudoku_n4_12": "puzzles-sudoku",
    "puzzle/latin_square_n4": "puzzles-latin_square",
    "paraphrase_summarize/samsum": "textwriting-summarization",
    "paraphrase_summarize/chatgpt-paraphrases": "textwriting-paraphrasing",
    **{f"words_to_sentence/{lv}": f"textwriting-w2s_{lv}" for lv in ("easy", "medium", "hard")},
}
_MODEL_IDS = {"LLaDA-1.5": "llada15", "LLaDA-8B-Instruct": "llada10", "Dream-v0-Instruct-7B": "dream",
              "DiffuCoder-7B-Instruct": "diffucoder"}


def task_id(task: str) -> str:
    """The leaderboard's id of a ParallelBench task name (`waiting_line/copy` -> `waitingline-copy`)."""
    if task.startswith("waiting_line/"):
        return "waitingline-" + task.split("/", 1)[1]
    if task in _TASK_IDS:
        return _TASK_IDS[task]
    raise ValueError(f"task {task!r} has no leaderboard id; the leaderboard has the Waiting Line tasks, "
                     f"{', '.join(sorted(_TASK_IDS))}")


def model_id(model: str) -> str:
    """The leaderboard's id of a model (`GSAI-ML/LLaDA-1.5` -> `llada15`), else the folder's name."""
    name = Path(str(model).rstrip("/")).name
    if name in ("", ".", ".."):     # a folder named by a relative path: its own name, never a way out
        name = Path(str(model)).resolve().name or "model"
    return _MODEL_IDS.get(name, name.lower())


@dataclass
class Curve:
    """One model and method: its rows (task id, tps, accuracy), `avg` rows included."""

    model: str
    method: str
    rows: list[tuple[str, float, float]] = field(default_factory=list)
    source: str = "dllm"
    adaptive: bool | None = None      # None: known from the method's name (`report.interpolated`)

    @property
    def points(self) -> list[tuple[float, float]]:
        """(tps, accuracy) of each operating point (the `avg` rows)."""
        return [(tps, acc) for task, tps, acc in self.rows if task == AVG]

    def pb(self, x: float) -> float | None:
        adaptive = interpolated(self.method) if self.adaptive is None else self.adaptive
        return pb_score(self.points, x, adaptive=adaptive)

    def sorted_rows(self) -> list[tuple[str, float, float]]:
        """The tasks' rows by task id and tps, then the `avg` rows by tps (the leaderboard's order)."""
        tasks = sorted((r for r in self.rows if r[0] != AVG), key=lambda r: (r[0], r[1]))
        return tasks + sorted((r for r in self.rows if r[0] == AVG), key=lambda r: r[1])


def curves_from_runs(summaries: list[RunSummary]) -> list[Curve]:
    """The curves of dllm runs: one per (model, method), a run's scored tasks and its `avg` row each.
    The runs of one curve share their model, data and tasks (the PB@X table's methods), so that its
    `avg` rows average the same thing: where a model and method's runs differ (an interrupted run
    over fewer tasks, another task selection, two model folders of one name), the curve takes the
    group over the most tasks (then the most runs) and a warning names the runs left out."""
    groups: dict[tuple[str, str], dict[tuple, list[RunSummary]]] = {}
    for s in summaries:
        if s.scored:
            key = (model_id(s.model), method_id(s.sampler, s.cache_label))
            groups.setdefault(key, {}).setdefault(s.method, []).append(s)
    curves = []
    for key, by_method in groups.items():
        kept = max(by_method, key=lambda m: (len(m[4]), len(by_method[m])))
        left = [s.run_id for m, runs in by_method.items() if m != kept for s in runs]
        if left:
            warnings.warn(f"leaderboard curve {key[0]}/{key[1]} holds the runs of {_describe(kept)}; run(s) "
                          f"{', '.join(left)} over other tasks, data or model are left out", stacklevel=2)
        curves.append(_curve(key, by_method[kept]))
    return curves


def _curve(key: tuple[str, str], runs: list[RunSummary]) -> Curve:
    curve = Curve(*key)
    for s in runs:
        rows = [(task_id(t.task), t.tokens_per_forward, t.score) for t in s.scored]
        curve.rows += rows + [(AVG, sum(r[1] for r in rows) / len(rows), sum(r[2] for r in rows) / len(rows))]
    return curve


def _describe(method: tuple) -> str:
    model, _, _, data_mode, tasks = method
    return f"model {model}, {data_mode} data, tasks {', '.join(tasks)}"


def write_curves(curves: list[Curve], out_dir: str | os.PathLike) -> list[Path]:
    """`out_dir/<model>/<method>.csv` for each curve, in the leaderboard's layout; returns the files."""
    written = []
    for c in curves:
        path = Path(out_dir) / c.model / f"{c.method}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            out = csv.writer(f, lineterminator="\n")
            out.writerow(HEADER)
            out.writerows((task, repr(float(tps)), repr(float(acc))) for task, tps, acc in c.sorted_rows())
        written.append(path)
    return written


def read_curves(folder: str | os.PathLike) -> list[Curve]:
    """The curves of every `<model>/<method>.csv` (or `<method>.csv`, model "") under `folder`."""
    root = Path(folder)
    if not root.is_dir():
        why = "is a file, not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(f"leaderboard folder {str(folder)!r} {why}")
    files = sorted(root.rglob("*.csv"))
    if not files:
        raise FileNotFoundError(f"no leaderboard CSV files (<model>/<method>.csv) under {str(folder)!r}")
    return [_read_csv(path, root) for path in files]


def _read_csv(path: Path, root: Path) -> Curve:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:      # a spreadsheet's byte-order mark is read past
            lines = list(csv.reader(f))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not lines or [h.strip() for h in lines[0]] != HEADER:
        got = ",".join(lines[0]) if lines else "(empty)"
        raise ValueError(f"{path}: the header must be {','.join(HEADER)}, got {got}")
    parent = path.parent.relative_to(root)
    curve = Curve("" if str(parent) == "." else str(parent), path.stem, source=str(path))
    for n, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        try:
            task, tps, acc = line
            tps, acc = float(tps), float(acc)
            if not (math.isfinite(tps) and math.isfinite(acc)):
                raise ValueError
            curve.rows.append((task.strip(), tps, acc))
        except ValueError:
            raise ValueError(f"{path}, line {n}: expected task,tps,accuracy with two finite numbers, "
                             f"got {','.join(line)}") from None
    if not curve.points:
        raise ValueError(f"{path}: no '{AVG}' rows (one per operating point)")
    return curve


def comparison_head(levels) -> list[str]:
    return ["source", "model", "method", "points", *[f"PB@{x:g}" for x in levels], "best average"]


def comparison_rows(ours: list[Curve], theirs: list[Curve], levels) -> list[list[str]]:
    """A row per curve, dllm's first: PB@X at each level and the best average accuracy."""
    rows = []
    for label, curves in (("dllm", ours), ("leaderboard", theirs)):
        for c in curves:
            pbs = ["n/a" if c.pb(x) is None else format(c.pb(x), ".2f") for x in levels]
            rows.append([label, c.model or "-", c.method, str(len(c.points)), *pbs,
                         format(max(acc for _, acc in c.points), ".1f")])
    return rows


def format_comparison(ours: list[Curve], theirs: list[Curve], levels) -> str:
    """`comparison_rows` as an aligned text table."""
    table = [comparison_head(levels)] + comparison_rows(ours, theirs, levels)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in table]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])
