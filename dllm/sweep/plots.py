"""The sweep's plots (PNG, matplotlib's Agg canvas, no pyplot): accuracy against tokens per forward
and against tokens per second, each with the Pareto front, and one accuracy panel per task."""
from __future__ import annotations

import math
import os
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .pareto import pareto_front
from .summaries import task_names

PLOT_TPF = "accuracy_vs_tokens_per_forward.png"
PLOT_TPS = "accuracy_vs_tokens_per_second.png"
PLOT_TASKS = "accuracy_per_task.png"

_MARKERS = "osD^v<>phX*8"


def _series(summaries: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in summaries:
        out.setdefault(s["sampler"], []).append(s)
    return out


def sampler_styles(names: list[str]) -> dict[str, tuple]:
    """(colour, marker) per name: tab10's colours up to 10 names, else tab20's and then tab20b's (40
    distinct colours), the markers cycling beside them."""
    colours = colormaps["tab10"].colors if len(names) <= 10 else colormaps["tab20"].colors + colormaps["tab20b"].colors
    return {n: (colours[i % len(colours)], _MARKERS[i % len(_MARKERS)]) for i, n in enumerate(names)}


def _figure(figsize):
    fig = Figure(figsize=figsize, dpi=110, layout="constrained")
    FigureCanvasAgg(fig)           # Agg without pyplot: no global backend switch
    return fig


def _log2_if_positive(ax, xs) -> None:
    if xs and min(xs) > 0:
        ax.set_xscale("log", base=2)


def _scatter_panel(ax, summaries, styles, xkey, ykey, front: bool, legend: bool) -> None:
    """`xkey`: a summary field, or a function of a summary (as `ykey`)."""
    xval = xkey if callable(xkey) else (lambda s: s.get(xkey))
    pts = [(s, xval(s), ykey(s)) for s in summaries if xval(s) is not None and ykey(s) is not None]
    for name, group in _series([s for s, _, _ in pts]).items():
        colour, marker = styles[name]
        ax.scatter([xval(s) for s in group], [ykey(s) for s in group], color=colour, marker=marker, s=36,
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


def task_tokens_per_forward(summary: dict, task: str) -> float | None:
    """The tokens per forward of one task of a configuration (its `per_task` entry), not the
    configuration's average."""
    for entry in summary.get("per_task") or []:
        if entry.get("task") == task:
            return entry.get("tokens_per_forward")
    return None


def _curves(ax, compare) -> None:
    """The leaderboard's curves (`avg` points by tps) as grey lines, one line style per curve."""
    styles = ["-", "--", "-.", ":"]
    for i, c in enumerate(compare):
        pts = sorted(c.points)
        ax.plot([t for t, _ in pts], [a for _, a in pts], color="grey", linestyle=styles[i % len(styles)],
                marker=".", linewidth=1.0, label=f"leaderboard {c.model}/{c.method}".replace(" /", " "))


def write_plots(summaries: list[dict], out_dir: str | os.PathLike, compare=()) -> list[Path]:
    """Accuracy vs tokens/forward (with the Pareto front and the leaderboard's curves `compare`),
    accuracy vs tokens/s, and one panel per task, as PNGs; one colour and marker per sampler.
    Returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [s for s in summaries if s["status"] == "ok" and s["average"] is not None]
    if not ok:
        return []
    styles = sampler_styles(list(_series(ok)))
    avg = lambda s: s["average"]  # noqa: E731
    written = []

    for xkey, xlabel, title, name in (("tokens_per_forward", "tokens per forward", "parallelism", PLOT_TPF),
                                      ("tokens_per_second", "tokens per second", "speed", PLOT_TPS)):
        fig = _figure((7.5, 5.0))
        ax = fig.add_subplot()
        if xkey == "tokens_per_forward":
            _curves(ax, compare)
        _scatter_panel(ax, ok, styles, xkey, avg, front=True, legend=True)
        ax.set_xlabel(xlabel + (" (log2)" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel("average accuracy (%)")
        drawn = sum(s.get(xkey) is not None for s in ok)    # a failed timing leaves a configuration out
        ax.set_title(f"Accuracy vs {title}, {drawn} configurations")
        written.append(out_dir / name)
        fig.savefig(written[-1])

    tasks: list[str] = []
    for s in ok:
        tasks += [t for t in s["accuracy"] if t not in tasks]
    names = task_names(tasks)
    cols = min(4, len(tasks))
    rows_n = math.ceil(len(tasks) / cols)
    fig = _figure((3.2 * cols, 2.6 * rows_n + 0.6))
    axes = fig.subplots(rows_n, cols, squeeze=False, sharex=True, sharey=True)
    for k, task in enumerate(tasks):
        ax = axes[k // cols][k % cols]
        _scatter_panel(ax, ok, styles, lambda s, t=task: task_tokens_per_forward(s, t),
                       lambda s, t=task: s["accuracy"].get(t), front=True, legend=False)
        ax.set_title(names[task], fontsize=9)
        ax.tick_params(labelbottom=True)     # shared x: keep the ticks above empty panels
    for k in range(len(tasks), rows_n * cols):
        axes[k // cols][k % cols].set_visible(False)
    legend = {}                              # every panel's entries: the first panel may have no points
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    fig.legend(handles, labels, loc="outside upper center", ncols=min(8, len(labels)), fontsize=8)
    logged = any(ax.get_xscale() == "log" for ax in axes.flat if ax.get_visible())
    fig.supxlabel("tokens per forward" + (" (log2)" if logged else ""), fontsize=9)
    fig.supylabel("accuracy (%)", fontsize=9)
    written.append(out_dir / PLOT_TASKS)
    fig.savefig(written[-1], bbox_inches="tight")      # the legend may be wider than a few task panels
    return written
