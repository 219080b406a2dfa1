"""Tables and the leaderboard score from result rows.

A *run* (rows sharing `run_id`) gives one point: its headline score averaged within each task and
then across tasks, against tokens per forward averaged the same way over the same tasks. Tasks
whose headline is unavailable (Text Writing without a grammar checker) are left out of both
averages, and the average is then labelled with the number of tasks it covers.

PB@X (the ParallelBench leaderboard score) is computed per method, i.e. per (model, sampler,
cache with its arguments, data, set of scored tasks), over the points of its runs (the sampler's
arguments are what moves along a method's curve):
  * stepwise methods (`STEPWISE_METHODS`: tokens per forward set in advance by a count or a step
    number): the largest tokens/forward whose average is >= X;
  * every other method (`interpolated`; measured tokens/forward): points sorted by tokens/forward (the higher score
    kept where two share one); if the last point reaches X its tokens/forward is the answer;
    otherwise the first adjacent pair from the right with avg_lo >= X > avg_hi is interpolated
    linearly; with no such pair there is no score (None).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


_METHOD_IDS = {"low_confidence": "confidence-topk", "threshold": "confidence-threshold",
               "factor": "confidence-factor", "left_to_right": "l2r", "margin_topk": "topk-margin",
               "entropy_topk": "entropy-topk", "topk_margin": "dream-topk-margin"}
# Methods whose tokens per forward the request sets in advance (top-k counts, fixed step numbers):
# PB@X takes their best qualifying point. Every other method is interpolated, DUS included, as the
# leaderboard computes it.
STEPWISE_METHODS = frozenset({"confidence-topk", "topk-margin", "entropy-topk", "l2r", "random", "entropy",
                              "origin", "maskgit-plus", "dream-topk-margin", "rcr", "remdm"})


def method_id(sampler: str, cache: str = "none") -> str:
    """The leaderboard's id of a sampler (one id per sampler), with the cache appended when there is one."""
    name = _METHOD_IDS.get(sampler, sampler.replace("_", "-"))
    return name if cache == "none" else f"{name}+{cache}"


def interpolated(method: str) -> bool:
    """Whether PB@X interpolates the curve of `method` (a `method_id`; a cache suffix changes nothing)."""
    return method.split("+", 1)[0] not in STEPWISE_METHODS


@dataclass
class TaskSummary:
    task: str
    n: int
    score: float | None          # mean headline x 100 (None: unavailable)
    strict: float | None
    tokens_per_forward: float
    nfe: float
    seconds: float


@dataclass
class RunSummary:
    run_id: str
    model: str
    sampler: str
    sampler_args: dict
    cache: str
    data_mode: str
    schedule: str
    tasks: list[TaskSummary] = field(default_factory=list)
    cache_args: dict = field(default_factory=dict)

    @property
    def cache_label(self) -> str:
        """The cache with the arguments the run gave it: `dual(guard=0.9)`; a plain `dual` without."""
        args = ", ".join(f"{k}={v}" for k, v in sorted(self.cache_args.items()))
        return f"{self.cache}({args})" if args else self.cache

    @property
    def scored(self) -> list[TaskSummary]:
        return [t for t in self.tasks if t.score is not None]

    @property
    def average(self) -> float | None:
        s = self.scored
        return sum(t.score for t in s) / len(s) if s else None

    @property
    def tokens_per_forward(self) -> float:
        """Averaged over the tasks `average` covers (every task when none is scored), so that a
        point's two coordinates cover the same tasks."""
        tasks = self.scored or self.tasks
        return sum(t.tokens_per_forward for t in tasks) / len(tasks) if tasks else 0.0

    @property
    def method(self) -> tuple:
        """What a PB@X curve groups: model, sampler, cache, data and the tasks its average covers (a
        run with an unscored task is not averaged with one that scored it)."""
        return (self.model, self.sampler, self.cache_label, self.data_mode, tuple(sorted(t.task for t in self.scored)))


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def check_row(row: dict, i: int) -> None:
    """A ValueError naming the row (its run, task and index; else its place `i` among the rows)
    when it lacks a field the summaries read or holds one of the wrong type."""
    where = (f"result row of run {row['run_id']}, task {row['task']}, index {row.get('index')}"
             if "run_id" in row and "task" in row else f"result row {i + 1}")
    lacking = [k for k in ("run_id", "task", "tokens_per_forward", "nfe") if k not in row]
    if lacking:
        raise ValueError(f"{where} lacks {', '.join(lacking)}; rows come from dllm bench")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    wrong = [k for k in ("tokens_per_forward", "nfe") if not number(row[k])]
    wrong += [k for k in ("score", "seconds") if row.get(k) is not None and not number(row[k])]
    if wrong:
        raise ValueError(f"{where}: {', '.join(f'{k} {row[k]!r}' for k in wrong)} must be a number "
                         f"(score: or null); rows come from dllm bench")


def summarize(rows: Iterable[dict]) -> list[RunSummary]:
    """One summary per run, in the order runs first appear; a sample stored twice (decoded again
    after its data changed) counts once, with its last row."""
    runs: dict[str, RunSummary] = {}
    by_task: dict[tuple[str, str], list[dict]] = {}
    rows = list(rows)
    for i, r in enumerate(rows):
        check_row(r, i)
    last = {(r["run_id"], r["task"], r.get("index", i)): r for i, r in enumerate(rows)}
    for r in last.values():
        rid = r["run_id"]
        if rid not in runs:
            runs[rid] = RunSummary(rid, r.get("model", "?"), r.get("sampler", "?"), r.get("sampler_args", {}),
                                   r.get("cache", "none"), r.get("data_mode", "?"), r.get("schedule", "adaptive"),
                                   cache_args=r.get("cache_args") or {})
        by_task.setdefault((rid, r["task"]), []).append(r)
    for (rid, task), rs in by_task.items():
        scores = [r.get("score") for r in rs]
        score = None if any(s is None for s in scores) else 100.0 * sum(scores) / len(scores)
        strict = _mean([(r.get("metrics") or {}).get("score_strict") for r in rs])
        runs[rid].tasks.append(TaskSummary(
            task, len(rs), score, None if strict is None else 100.0 * strict,
            sum(r["tokens_per_forward"] for r in rs) / len(rs), sum(r["nfe"] for r in rs) / len(rs),
            sum(r.get("seconds") or 0.0 for r in rs)))
    return list(runs.values())


def pb_score(points: Iterable[tuple[float, float]], x: float, adaptive: bool = True) -> float | None:
    """The largest tokens/forward at which the average score is still >= x (see module doc)."""
    pts = [(float(t), float(a)) for t, a in points if a is not None]
    if not pts:
        return None
    if not adaptive:
        ok = [t for t, a in pts if a >= x]
        return max(ok) if ok else None
    best: dict[float, float] = {}
    for t, a in pts:
        best[t] = max(a, best.get(t, float("-inf")))
    curve = sorted(best.items())
    if curve[-1][1] >= x:
        return curve[-1][0]
    for i in range(len(curve) - 1, 0, -1):
        (t_lo, a_lo), (t_hi, a_hi) = curve[i - 1], curve[i]
        if a_lo >= x > a_hi:
            return t_lo + (a_lo - x) / (a_lo - a_hi) * (t_hi - t_lo)
    return None


def leaderboard(summaries: list[RunSummary], levels=(80, 70, 60)) -> list[dict]:
    """PB@X per method over the runs given."""
    methods: dict[tuple, list[RunSummary]] = {}
    for s in summaries:
        if s.average is not None:
            methods.setdefault(s.method, []).append(s)
    out = []
    for key, runs in methods.items():
        adaptive = interpolated(method_id(key[1]))
        points = [(r.tokens_per_forward, r.average) for r in runs]
        out.append({"model": key[0], "sampler": key[1], "cache": key[2], "data_mode": key[3],
                    "tasks": len(key[4]), "runs": len(runs), "points": sorted(points),
                    **{f"PB{x:g}": pb_score(points, x, adaptive) for x in levels}})
    return out


def coverage_note(scored: int, total: int) -> str:
    """The note ` (k of n tasks scored)` when an average covers fewer tasks than the run's, else ""."""
    return "" if scored == total else f" ({scored} of {total} tasks scored)"


def format_number(v, spec=".1f") -> str:
    """`v` formatted with `spec`, or "n/a" for None."""
    return "n/a" if v is None else format(v, spec)


def format_run(s: RunSummary) -> str:
    """A per-task table of one run with its average."""
    args = ", ".join(f"{k}={v}" for k, v in s.sampler_args.items())
    lines = [f"model {s.model}  sampler {s.sampler}({args})  cache {s.cache_label}  data {s.data_mode}  run {s.run_id}",
             f"{'task':<40} {'n':>4} {'score':>7} {'strict':>7} {'tok/fwd':>8} {'NFE':>7} {'sec':>8}"]
    for t in s.tasks:
        lines.append(f"{t.task:<40} {t.n:>4} {format_number(t.score):>7} {format_number(t.strict):>7} "
                     f"{t.tokens_per_forward:>8.2f} "
                     f"{t.nfe:>7.1f} {t.seconds:>8.2f}")
    k, total = len(s.scored), len(s.tasks)
    label = "average" + coverage_note(k, total)
    lines.append(f"{label:<40} {sum(t.n for t in s.tasks):>4} {format_number(s.average):>7} {'':>7} "
                 f"{s.tokens_per_forward:>8.2f}")
    return "\n".join(lines)


def format_leaderboard(board: list[dict], levels=(80, 70, 60)) -> str:
    if not board:
        return "no scored runs"
    head = f"{'model':<28} {'sampler':<16} {'cache':<10} {'data':<9} {'tasks':>5} {'runs':>4} " + \
        " ".join(f"{'PB@' + format(x, 'g'):>7}" for x in levels)
    lines = [head]
    for b in board:   # methods that differ only in the tasks their averages cover differ in `tasks`
        model = b["model"] if len(b["model"]) <= 28 else "…" + b["model"][-27:]
        lines.append(f"{model:<28} {b['sampler']:<16} {b['cache']:<10} {b['data_mode']:<9} {b['tasks']:>5} "
                     f"{b['runs']:>4} " + " ".join(f"{format_number(b[f'PB{x:g}'], '.2f'):>7}" for x in levels))
    return "\n".join(lines)


def markdown_table(summaries: list[RunSummary], label=lambda s: s.sampler) -> str:
    """Tasks as rows, runs as columns (headline score; tokens/forward in the last rows)."""
    tasks: list[str] = []
    for s in summaries:
        tasks += [t.task for t in s.tasks if t.task not in tasks]
    head = "| task | " + " | ".join(label(s) for s in summaries) + " |"
    lines = [head, "|---|" + "---|" * len(summaries)]
    for task in tasks:
        cells = []
        for s in summaries:
            t = next((t for t in s.tasks if t.task == task), None)
            cells.append("" if t is None else format_number(t.score))
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines.append("| **average** | " + " | ".join(f"**{format_number(s.average)}**" for s in summaries) + " |")
    lines.append("| tokens/forward | " + " | ".join(f"{s.tokens_per_forward:.2f}" for s in summaries) + " |")
    return "\n".join(lines)
