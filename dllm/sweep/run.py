"""Running a sweep: plan which configurations to run from what rows.jsonl and summaries.jsonl
already hold, load each model once, try each configuration on one sample before its run, run it
through the bench runner with one progress bar over the whole grid, and write its summary."""
from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import dllm
from dllm.distributed import Distributed
from dllm.eval import leaderboard, runner
from dllm.models.loading import resolve_device
from dllm.eval.tasks import encode_messages

from .grid import Grid, SweepPoint, SweepSettings
from .report import write_report
from .summaries import (ROWS_FILE, SUMMARIES_FILE, expected_run_id, failed_summary, read_summaries, summarize_point,
                        summary_id, write_summary)

# Errors a configuration can raise that mean "this configuration cannot run", not "the sweep is broken".
CONFIG_ERRORS = (ValueError, FileNotFoundError, FloatingPointError, RuntimeError, OSError, ImportError)


def error_text(err: BaseException) -> str:
    """The message a failed configuration or command reports for `err`: the message of a
    ValueError, `Type: message` for other errors."""
    text = str(err) or type(err).__name__
    return text if isinstance(err, ValueError) else f"{type(err).__name__}: {text}"


class _Progress:
    """One bar over every sample of the grid. Bench rows are appended to the results file by the
    runner (main process only); while a configuration runs, a thread counts the lines appended so
    the bar moves with every finished batch."""

    def __init__(self, path: Path, total: int, initial: int, enabled: bool):
        self.path = path
        self.bar = None
        if enabled:
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
    """While a configuration runs (a context manager): a thread moves the bar by the whole lines
    appended to the results file."""

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
    cfg = cfg.for_checkpoint(model)
    firsts = {}
    for t in dataset.tasks:
        if dataset.samples[t]:
            s = dataset.samples[t][0]
            firsts.setdefault(cfg.lengths(s.task.max_tokens), s)
    for s in firsts.values():
        prompt = encode_messages(tokenizer, s.messages())
        dllm.generate(model, tokenizer, [prompt], cfg.request_for(s.task.max_tokens).replace(max_forwards=1))


@dataclass
class SweepResult:
    """What `run_sweep` returns."""

    summaries: list[dict]          # this grid's summary rows (ok and failed), in grid order
    report: str                    # the Markdown report ("" on non-main processes)
    out_dir: Path


@dataclass
class _Plan:
    """What a sweep decides before it decodes anything, the same on every process."""

    settings: SweepSettings
    points: list[SweepPoint]
    dataset: Any
    expected: set                  # (task, index, sample key) of every sample each configuration decodes
    run_ids: list[str]             # per point: the bench run id
    sids: list[str]                # per point: the summary id
    rows_path: Path
    summaries_path: Path
    done_pairs: dict[str, set]     # run id -> (task, index, prompt id) already in rows.jsonl
    stored: dict[str, dict]        # summary id -> the stored summary row
    todo: list[int]                # the first point of each distinct run id, in grid order

    @property
    def per_config(self) -> int:
        """Samples per configuration."""
        return len(self.expected)

    def done_samples(self, i: int) -> int:
        """How many of point i's samples rows.jsonl already holds."""
        return len(self.expected & self.done_pairs.get(self.run_ids[i], set()))

    def is_done(self, i: int) -> bool:
        """Point i has an ok summary and all its rows: it is skipped."""
        s = self.stored.get(self.sids[i])
        return s is not None and s["status"] == "ok" and self.expected <= self.done_pairs.get(self.run_ids[i], set())

    def order(self) -> list[int]:
        """The points to run, grouped by model in the order the models first appear (one load per model)."""
        models = [p.model for p in self.points]
        return sorted(self.todo, key=lambda i: models.index(self.points[i].model))


def _snapshot(out_dir: Path, dist) -> tuple[dict[str, set], dict[str, dict]]:
    """Repair rows.jsonl (main process), then read which samples each run id has and the stored
    summaries. Every process decides from the same snapshot, taken before anything new is written."""
    results = runner.ResultsFile(out_dir / ROWS_FILE)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out-dir {str(out_dir)!r} is a file; give a folder for the sweep's rows, report and plots")
    if dist.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        results.repair()
    dist.barrier()
    done_pairs: dict[str, set] = {}
    for r in results.rows():
        done_pairs.setdefault(r["run_id"], set()).add((r["task"], r["index"], runner.row_key(r)))
    stored = {s["summary_id"]: s for s in read_summaries(out_dir / SUMMARIES_FILE)}
    dist.barrier()
    return done_pairs, stored


def _distinct_runs(run_ids: list[str]) -> list[int]:
    """The first index of each run id: configurations that decode the same run are run once."""
    first_of_run: dict[str, int] = {}
    todo = []
    for i, rid in enumerate(run_ids):
        if rid in first_of_run:
            continue
        first_of_run[rid] = i
        todo.append(i)
    return todo


def _grid_dataset(grid: Grid):
    """The tasks' samples every configuration of the grid decodes."""
    dataset = runner.load_dataset(grid.points[0].bench_config(grid.settings))
    if not any(dataset.samples[t] for t in dataset.tasks):
        raise ValueError("the task selection has no samples")
    return dataset


def same_run_as(grid: Grid) -> list[int]:
    """Per configuration, the index of the first configuration that decodes the same bench run
    (its own index when it is the first): a sweep runs each distinct run once. Loads the tasks'
    samples, not the models."""
    dataset = _grid_dataset(grid)
    run_ids = [expected_run_id(p, grid.settings, dataset) for p in grid.points]
    return [run_ids.index(rid) for rid in run_ids]


def _plan(grid: Grid, out_dir: Path, dist) -> _Plan:
    """Load the tasks' samples, compute every point's run id and summary id, and take the snapshot."""
    settings, points = grid.settings, grid.points
    template = points[0].bench_config(settings)
    dataset = _grid_dataset(grid)
    # a row counts for the sample decoded from the same prompt, answer and metric (as run_bench reuses rows)
    expected = {(t, s.index, runner.sample_key(s)) for t in dataset.tasks for s in dataset.samples[t]}
    scorers = runner.scorer_identity(runner.text_backends(template, dataset))
    run_ids = [expected_run_id(p, settings, dataset, scorers) for p in points]
    sids = [summary_id(r, dataset.tasks, settings.limit) for r in run_ids]
    done_pairs, stored = _snapshot(out_dir, dist)
    return _Plan(settings, points, dataset, expected, run_ids, sids, out_dir / ROWS_FILE, out_dir / SUMMARIES_FILE,
                 done_pairs, stored, _distinct_runs(run_ids))


class _LoadError(Exception):
    """A model that cannot be loaded; the message is the failed configurations' error."""


class _Models:
    """The model of the configurations being run. Loaded when the model changes, the previous one
    freed first; a model that fails to load is not tried again."""

    def __init__(self, settings: SweepSettings, dist):
        self.settings = settings
        self.dist = dist
        self.loaded: tuple[Any, Any, Any] = (object(), None, None)      # (model spec, model, tokenizer)
        self.errors: dict[Any, str] = {}

    def get(self, spec) -> tuple[Any, Any]:
        """(model, tokenizer) for the model spec; raises _LoadError when it cannot be loaded."""
        if spec in self.errors:
            raise _LoadError(self.errors[spec])
        if self.loaded[0] != spec:
            self.loaded = (object(), None, None)        # free the previous model before the next load
            s = self.settings
            try:
                model, tok = dllm.load(spec, dtype=s.dtype, device=resolve_device(s.device, auto=self.dist.device),
                                       attention=s.attention, cuda_graphs=s.cuda_graphs, compile=s.compile)
            except CONFIG_ERRORS as err:
                self.errors[spec] = f"cannot load model {spec or 'default'!r}: {error_text(err)}"
                raise _LoadError(self.errors[spec]) from None
            self.loaded = (spec, model, tok)
        return self.loaded[1], self.loaded[2]


def _run_point(i: int, plan: _Plan, models: _Models, bar: _Progress, dist) -> None:
    """Run point i and write its summary: "ok" from its rows, or "failed" with the error when its
    model does not load, the preflight or the run raises one of CONFIG_ERRORS, or no rows come back
    (a failed point's samples leave the bar's total)."""
    p, rid = plan.points[i], plan.run_ids[i]
    remaining = plan.per_config - plan.done_samples(i)
    cfg = p.bench_config(plan.settings, out=str(plan.rows_path))

    def fail(message: str) -> None:
        bar.drop(remaining)
        if dist.is_main:
            bar.write(f"skipped {p.label}: {message}")
            write_summary(plan.summaries_path, failed_summary(p, sid=plan.sids[i], run_id=rid, tasks=plan.dataset.tasks,
                                                              limit=plan.settings.limit, error=message))

    failure = None
    try:
        model, tok = models.get(p.model)
        _preflight(p, cfg, model, tok, plan.dataset)
    except _LoadError as err:
        failure = str(err)
    except CONFIG_ERRORS as err:
        failure = error_text(err)
    failure = dist.first_failure(failure)      # a failure on one process skips the point on every one
    if failure is not None:
        fail(failure)
        return
    try:
        with bar.follow():
            rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    except CONFIG_ERRORS as err:
        fail(error_text(err))
        return
    rows = [r for r in rows if (r["task"], r["index"], runner.row_key(r)) in plan.expected]
    if not rows:
        fail("the runner returned no rows")
        return
    if dist.is_main:
        if rows[0]["run_id"] != rid:    # resumes still work (the runner's own); only skipping does not
            warnings.warn(f"configuration {p.label}: the runner gave run id {rows[0]['run_id']}, the sweep "
                          f"expected {rid}; finished configurations will be re-checked on every run")
        write_summary(plan.summaries_path, summarize_point(p, rows, sid=plan.sids[i], tasks=plan.dataset.tasks,
                                                           limit=plan.settings.limit, world=dist.world))


def run_sweep(grid: Grid, out_dir: str | os.PathLike, *, progress: bool = True, plots: bool = True,
              report_only: bool = False, compare: str | None = None) -> SweepResult:
    """Run (or resume) every configuration of `grid`, then write the summaries, report and plots
    into `out_dir` (main process only), with the leaderboard CSV files under `compare` beside them.
    Returns this grid's summaries and the report."""
    curves = leaderboard.read_curves(compare) if compare else []
    out_dir = Path(out_dir)
    if report_only and not (out_dir / SUMMARIES_FILE).is_file():
        raise FileNotFoundError(f"--report-only: no {SUMMARIES_FILE} in {str(out_dir)!r}; give the --out-dir of a sweep")
    dist = Distributed()
    if not report_only:
        resolve_device(grid.settings.device, auto=dist.device)   # a missing device fails once, not per configuration
    plan = _plan(grid, out_dir, dist)
    if compare:   # the comparison needs each task's leaderboard id: known before anything is decoded
        for task in plan.dataset.tasks:
            try:
                leaderboard.task_id(task)
            except ValueError as err:
                raise ValueError(f"--compare {compare!r}: {err}") from None
    initial = sum(plan.done_samples(i) for i in plan.todo)
    bar = _Progress(plan.rows_path, plan.per_config * len(plan.todo), initial,
                    enabled=progress and dist.is_main and not report_only)
    models = _Models(plan.settings, dist)
    try:
        for i in plan.order():
            if report_only or plan.is_done(i):
                continue
            _run_point(i, plan, models, bar, dist)
    finally:
        bar.close()
    dist.barrier()
    if not dist.is_main:
        return SweepResult([], "", out_dir)
    by_id = {s["summary_id"]: s for s in read_summaries(plan.summaries_path)}
    # each with this grid's label (a summary keeps the label of the sweep that wrote it)
    mine = [{**by_id[plan.sids[i]], "label": plan.points[i].label} for i in plan.todo if plan.sids[i] in by_id]
    if report_only and not mine:
        raise ValueError(f"--report-only: none of this grid's {len(plan.todo)} configuration(s) is among the "
                         f"{len(by_id)} summarized in {str(out_dir)!r}; give the grid that sweep ran")
    text = write_report(mine, out_dir, plan.settings.levels, plots=plots, compare=curves)
    return SweepResult(mine, text, out_dir)
