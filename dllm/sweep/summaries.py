"""Summary rows: the ids a configuration's bench run and summary get, the summary of a finished or
failed configuration, and summaries.jsonl (read, and written one row at a time, atomically)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from dllm import provenance, samplers
from dllm.eval import report as bench_report
from dllm.eval import runner
from dllm.models.loading import DEFAULT_MODEL

from .grid import SweepPoint, SweepSettings

SUMMARY_VERSION = 1
ROWS_FILE = "rows.jsonl"
SUMMARIES_FILE = "summaries.jsonl"


def expected_run_id(p: SweepPoint, settings: SweepSettings, dataset, scorers: dict | None = None) -> str:
    """The bench run id `run_bench` will give this configuration (computed without loading the
    model); `scorers`: the text scorers' share of it (`runner.scorer_identity`)."""
    probe = samplers.get(p.generation.sampler, **p.generation.sampler_kwargs)
    cfg = p.bench_config(settings)
    model_name = str(p.model) if p.model is not None else DEFAULT_MODEL
    identity = runner.run_identity(cfg, model_name, probe, dataset)
    identity.update(scorers or {})
    return provenance.run_id(identity)


def summary_id(run_id: str, tasks: list[str], limit: int | None) -> str:
    """The id of a configuration's summary row: its run id with the tasks and the sample limit."""
    return provenance.run_id({"run_id": run_id, "tasks": list(tasks), "limit": limit})


def summarize_point(p: SweepPoint, rows: list[dict], *, sid: str, tasks: list[str], limit, world: int) -> dict:
    """The summary row of one finished configuration from its bench rows."""
    (s,) = bench_report.summarize(rows)
    committed = sum(r["tokens_per_forward"] * r["nfe"] for r in rows)
    seconds = sum(r.get("seconds", 0.0) for r in rows)
    first = rows[0]
    return {
        "kind": "summary", "version": SUMMARY_VERSION, "summary_id": sid, "status": "ok", "error": None,
        "label": p.label, "run_id": s.run_id, "model": s.model, "sampler": s.sampler, "sampler_args": s.sampler_args,
        "cache": s.cache, "cache_args": first.get("cache_args", {}), **_lengths(p),
        "schedule": s.schedule, "data_mode": s.data_mode, "data_source": first.get("data_source"),
        "tasks": list(tasks), "limit": limit, "samples": len(rows),
        "accuracy": {t.task: t.score for t in s.tasks}, "average": s.average, "tasks_scored": len(s.scored),
        "tokens_per_forward": s.tokens_per_forward,
        "nfe": sum(r["nfe"] for r in rows) / len(rows), "forwards": sum(r["nfe"] for r in rows),
        "tokens_per_second": committed / seconds if seconds > 0 else None, "seconds": seconds,
        "per_task": [dataclasses.asdict(t) for t in s.tasks],
        "hardware": first.get("hardware") or provenance.hardware(world), "versions": provenance.versions(),
        "timestamp": provenance.timestamp(),
    }


def failed_summary(p: SweepPoint, *, sid: str, run_id: str, tasks: list[str], limit, error: str) -> dict:
    """The summary row of a configuration that could not run, with the error."""
    return {"kind": "summary", "version": SUMMARY_VERSION, "summary_id": sid, "status": "failed", "error": error,
            "label": p.label, "run_id": run_id, "model": p.model, "sampler": p.generation.sampler,
            "sampler_args": p.generation.sampler_kwargs, "cache": p.generation.cache,
            "cache_args": p.generation.cache_kwargs, **_lengths(p), "tasks": list(tasks), "limit": limit,
            "timestamp": provenance.timestamp()}


def _lengths(p: SweepPoint) -> dict:
    g = p.generation
    return {"gen_length": g.gen_length, "block_length": g.block_length, "steps": g.steps,
            "tokens_per_step": g.tokens_per_step}


def read_summaries(path: str | os.PathLike) -> list[dict]:
    """The summary rows of a summaries file, in file order ([] when there is none); lines that are
    not summary rows are skipped."""
    return [r for r in runner.ResultsFile(path).records() if r.get("kind") == "summary" and "summary_id" in r]


def write_summary(path: str | os.PathLike, row: dict) -> None:
    """Insert or replace (by summary_id) one summary row; the file is rewritten through a temporary
    file and an atomic rename, so a kill leaves the old or the new version, never a mix."""
    path = Path(path)
    rows = read_summaries(path)
    at = next((i for i, r in enumerate(rows) if r["summary_id"] == row["summary_id"]), len(rows))
    rows = rows[:at] + [row] + [r for r in rows[at:] if r["summary_id"] != row["summary_id"]]   # every copy replaced
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def task_names(tasks: list[str]) -> dict[str, str]:
    """Display names for task ids, as the report's columns and the plots' panels show them: the
    part after the group (`waiting_line/...` -> `...`) when those are unique, else the full ids."""
    short = {t: t.split("/", 1)[-1] for t in tasks}
    return short if len(set(short.values())) == len(short) else {t: t for t in tasks}
