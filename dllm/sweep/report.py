"""The sweep's Markdown report (report.md): the table of configurations, PB@X per method, the best
configuration per accuracy level and the failed configurations, written with the plots."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from dllm.eval import leaderboard
from dllm.eval import report as bench_report

from .pareto import best_per_level, pareto_front
from .plots import write_plots
from .summaries import task_names

REPORT_FILE = "report.md"


def _num(v, spec=".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def _average_cell(summary: dict) -> str:
    """The average over the scored tasks, saying how many of the tasks it covers when some went
    unscored (Text Writing without a grammar checker)."""
    total = len(summary["tasks"])
    return _num(summary["average"]) + bench_report.coverage_note(summary.get("tasks_scored", total), total)


def _samples_per_task(summary: dict) -> str:
    """'N sample(s) per task', or the range of the per-task counts when tasks hold different
    numbers; with the limit that capped them, if any."""
    counts = [t["n"] for t in summary.get("per_task", [])] or [summary["samples"]]
    low, high = min(counts), max(counts)
    text = f"{low} sample(s) per task" if low == high else f"{low}-{high} samples per task"
    return text + (f" (limit {summary['limit']})" if summary.get("limit") is not None else "")


def markdown_report(summaries: list[dict], levels: Sequence[float], plots: Sequence[str] = (),
                    compare: Sequence[leaderboard.Curve] = ()) -> str:
    """The sweep report: one row per configuration, PB@X per method, the best configuration per
    accuracy level, PB@X beside the leaderboard's curves (`compare`), and the configurations that
    failed."""
    ok = [s for s in summaries if s["status"] == "ok"]
    failed = [s for s in summaries if s["status"] != "ok"]
    tasks: list[str] = []
    for s in ok:
        tasks += [t for t in s["tasks"] if t not in tasks]
    names = task_names(tasks)
    scored = [s for s in ok if s["average"] is not None]
    front = {id(scored[i]) for i in pareto_front([(s["tokens_per_forward"], s["average"]) for s in scored])}
    lines = ["# Sweep report", ""]
    if ok:
        first = ok[0]
        lines.append(f"{len(summaries)} configuration(s): {len(ok)} finished, {len(failed)} failed. "
                     f"{len(tasks)} task(s), {_samples_per_task(first)}, data: {first['data_mode']}. "
                     f"Accuracy in %, averaged over tasks; "
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
        cells = [f"{s['label']}{mark}", _average_cell(s), f"{s['tokens_per_forward']:.2f}",
                 _num(s["tokens_per_second"]), f"{s['nfe']:.1f}",
                 *[_num(s["accuracy"].get(t)) if t in s["accuracy"] else "" for t in tasks]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## PB@X", "",
              "The largest tokens/forward at which a method's average accuracy is still >= X (stepwise methods, "
              "`dllm.eval.report.STEPWISE_METHODS`: the best qualifying point; every other method: interpolated "
              "between the points around X); n/a: never reached.",
              ""]
    board = bench_report.leaderboard([_run_summary(s) for s in scored], levels)
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
    if compare:
        lines += _comparison(scored, compare, levels)
    if failed:
        lines += ["", "## Failed configurations", ""]
        for s in failed:
            lines.append(f"- {s['label']}: {s['error']}")
    return "\n".join(lines) + "\n"


def _comparison(scored: list[dict], compare, levels) -> list[str]:
    """The report's section of PB@X beside the leaderboard's curves."""
    ours = leaderboard.curves_from_runs([_run_summary(s) for s in scored])
    head = leaderboard.comparison_head(levels)
    lines = ["", "## Beside the leaderboard", "",
             "PB@X of the methods above (tps: tokens per forward) and of the leaderboard files given with "
             "`--compare`, from their `avg` rows; their curves are drawn on the tokens/forward plot.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r) + " |" for r in leaderboard.comparison_rows(ours, list(compare), levels)]


def _run_summary(row: dict):
    """A `dllm.eval.report.RunSummary` rebuilt from a summary row (for the leaderboard)."""
    return bench_report.RunSummary(row["run_id"], row["model"], row["sampler"], row["sampler_args"], row["cache"],
                                   row["data_mode"], row["schedule"],
                                   [bench_report.TaskSummary(**t) for t in row["per_task"]],
                                   cache_args=row.get("cache_args") or {})


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(summaries: list[dict], out_dir: str | os.PathLike, levels: Sequence[float],
                 plots: bool = True, compare: Sequence[leaderboard.Curve] = ()) -> str:
    """Write the plots (optional) and report.md into `out_dir`, with the leaderboard's curves
    `compare` beside the sweep's; returns the report text."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = write_plots(summaries, out_dir, compare) if plots else []
    text = markdown_report(summaries, levels, [f.name for f in files], compare)
    _atomic_write_text(out_dir / REPORT_FILE, text)
    return text
