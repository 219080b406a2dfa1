"""The leaderboard's CSV layout: dllm runs written as leaderboard files, files read back, and
`--compare` putting both side by side in `dllm bench --report` and the sweep's report and plot."""
from __future__ import annotations

import csv
import json

import pytest
from matplotlib.figure import Figure

from dllm import samplers
from dllm.cli import main
from dllm.eval import leaderboard, report
from dllm.sweep import plots as sweep_plots
from dllm.sweep.report import markdown_report

# The 17 task ids of the leaderboard's files (parallelbench.github.io, data/figures).
LEADERBOARD_TASKS = {
    "waitingline-copy", "waitingline-insert_index", "waitingline-insert_random", "waitingline-remove_index",
    "waitingline-remove_random", "waitingline-replace_index", "waitingline-replace_random", "waitingline-reverse",
    "waitingline-shuffle", "waitingline-sort", "textwriting-paraphrasing", "textwriting-summarization",
    "textwriting-w2s_easy", "textwriting-w2s_medium", "textwriting-w2s_hard", "puzzles-sudoku", "puzzles-latin_square",
}
OUR_TASKS = ["waiting_line/copy", "waiting_line/reverse", "waiting_line/sort", "waiting_line/shuffle",
             "waiting_line/insert_index", "waiting_line/insert_random", "waiting_line/remove_index",
             "waiting_line/remove_random", "waiting_line/replace_index", "waiting_line/replace_random",
             "puzzle/latin_square_n4", "puzzle/sudoku_n4_12", "paraphrase_summarize/samsum",
             "paraphrase_summarize/chatgpt-paraphrases", "words_to_sentence/easy", "words_to_sentence/medium",
             "words_to_sentence/hard"]


def _rows(run, sampler, cache, scores, tpf, schedule):
    """Result rows of one run: two samples per task, `scores[task]` each, `tpf` tokens per forward."""
    return [{"run_id": run, "model": "runs/GSAI-ML/LLaDA-1.5", "sampler": sampler, "sampler_args": {}, "cache": cache,
             "data_mode": "generated", "schedule": schedule, "task": task, "index": i, "score": s, "metrics": {},
             "tokens_per_forward": tpf, "nfe": 64 / tpf, "seconds": 0.1}
            for task, s in scores.items() for i in range(2)]


@pytest.fixture
def results(tmp_path):
    rows = (_rows("a", "low_confidence", "none", {"waiting_line/copy": 1.0, "puzzle/sudoku_n4_12": 0.5}, 1.0, "fixed")
            + _rows("b", "low_confidence", "none", {"waiting_line/copy": 0.5, "puzzle/sudoku_n4_12": 0.0}, 2.0, "fixed")
            + _rows("c", "threshold", "dual", {"waiting_line/copy": 1.0, "puzzle/sudoku_n4_12": 1.0}, 3.0, "adaptive"))
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_task_and_the_published_ids():
    assert {leaderboard.task_id(t) for t in OUR_TASKS} == LEADERBOARD_TASKS
    assert leaderboard.model_id("GSAI-ML/LLaDA-1.5") == "llada15"
    assert leaderboard.model_id("/ckpt/Dream-v0-Instruct-7B/") == "dream"
    assert leaderboard.model_id("runs/My-Model") == "my-model"
    assert report.method_id("low_confidence") == "confidence-topk"
    assert report.method_id("left_to_right") == "l2r"
    assert report.method_id("threshold", "dual") == "confidence-threshold+dual"
    with pytest.raises(ValueError, match="task 'waiting_line_n15/copy' has no leaderboard id"):
        leaderboard.task_id("waiting_line_n15/copy")


def test_bench_report_writes_leaderboard_files(results, tmp_path, capsys):
    out = tmp_path / "board"
    assert main(["bench", "--report", "--out", str(results), "--format", "leaderboard", "--out-dir", str(out)]) == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.csv"))
    assert files == ["llada15/confidence-threshold+dual.csv", "llada15/confidence-topk.csv"]
    with open(out / "llada15" / "confidence-topk.csv", newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0] == ["task", "tps", "accuracy"]
    assert [(t, float(x), float(a)) for t, x, a in lines[1:]] == [
        ("puzzles-sudoku", 1.0, 50.0), ("puzzles-sudoku", 2.0, 0.0),
        ("waitingline-copy", 1.0, 100.0), ("waitingline-copy", 2.0, 50.0),
        ("avg", 1.0, 75.0), ("avg", 2.0, 25.0)]
    assert {t for t, _, _ in lines[1:]} <= LEADERBOARD_TASKS | {"avg"}
    assert "wrote" in capsys.readouterr().out


def test_compare_puts_the_leaderboard_beside_the_runs(results, tmp_path, capsys):
    theirs = tmp_path / "figures" / "llada15"
    theirs.mkdir(parents=True)
    (theirs / "confidence-topk.csv").write_text(
        "task,tps,accuracy\nwaitingline-copy,1.0,90.0\nwaitingline-copy,2.0,70.0\n"
        "puzzles-sudoku,1.0,80.0\npuzzles-sudoku,2.0,60.0\navg,1.0,85.0\navg,2.0,65.0\n")
    assert main(["bench", "--report", "--out", str(results), "--compare", str(tmp_path / "figures"), "--pb", "80,60"]) == 0
    table = capsys.readouterr().out.split("Beside the leaderboard files")[1].splitlines()
    mine = next(line.split() for line in table if line.startswith("dllm") and "confidence-topk" in line)
    board = next(line.split() for line in table if line.startswith("leaderboard"))
    # dllm top-k: averages 75 at 1 and 25 at 2 tokens per step; the leaderboard's 85 and 65.
    assert mine[1:] == ["llada15", "confidence-topk", "2", "n/a", "1.00", "75.0"]
    assert board[1:] == ["llada15", "confidence-topk", "2", "1.00", "2.00", "85.0"]
    # The sweep's report and plot carry the same curves.
    curves = leaderboard.read_curves(tmp_path / "figures")
    summaries = [{"status": "ok", "label": s.run_id, "run_id": s.run_id, "model": s.model, "sampler": s.sampler,
                  "sampler_args": {}, "cache": s.cache, "data_mode": s.data_mode, "schedule": s.schedule,
                  "tasks": [t.task for t in s.tasks], "samples": 4, "limit": 2, "accuracy": {t.task: t.score for t in s.tasks},
                  "average": s.average, "tokens_per_forward": s.tokens_per_forward, "tokens_per_second": 1.0, "nfe": 1.0,
                  "per_task": [vars(t) for t in s.tasks]}
                 for s in report.summarize(json.loads(line) for line in results.read_text().splitlines())]
    text = markdown_report(summaries, (80, 60), compare=curves)
    assert "## Beside the leaderboard" in text and "| leaderboard | llada15 | confidence-topk | 2 | 1.00 | 2.00 | 85.0 |" in text
    ax = Figure().add_subplot()
    sweep_plots._curves(ax, curves)
    assert [line.get_label() for line in ax.get_lines()] == ["leaderboard llada15/confidence-topk"]
    assert list(ax.get_lines()[0].get_xdata()) == [1.0, 2.0]
    assert sweep_plots.write_plots(summaries, tmp_path / "plots", curves)


@pytest.mark.parametrize("text,message", [
    ("task,acc\nx,1\n", "the header must be task,tps,accuracy, got task,acc"),
    ("task,tps,accuracy\nwaitingline-copy,one,2\n", "line 2: expected task,tps,accuracy with two finite numbers"),
    ("task,tps,accuracy\navg,1,2\navg,1,nan\n", "line 3: expected task,tps,accuracy with two finite numbers"),
    ("task,tps,accuracy\navg,inf,50\n", "line 2: expected .* got avg,inf,50"),
    ("task,tps,accuracy\nwaitingline-copy,1,2\n", "no 'avg' rows"),
])
def test_bad_leaderboard_files_are_clear_errors(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        leaderboard.read_curves(tmp_path)


@pytest.mark.parametrize("extra,message", [
    (["--format", "leaderboard"], "give their folder with --out-dir DIR"),
    (["--out-dir", "x"], "is the folder of --format leaderboard"),
    (["--compare", "no/such/dir"], "no such folder of leaderboard CSV files"),
])
def test_bad_report_options_are_clear_errors(results, capsys, extra, message):
    assert main(["bench", "--report", "--out", str(results), *extra]) == 2
    assert message in capsys.readouterr().err


def test_compare_with_a_task_the_leaderboard_lacks_fails_before_decoding(tmp_path, capsys):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "confidence-topk.csv").write_text("task,tps,accuracy\navg,1.0,90.0\n")
    out = tmp_path / "rows.jsonl"
    assert main(["bench", "--tasks", "waiting_line_n15/copy", "--limit", "1", "--out", str(out),
                 "--compare", str(tmp_path / "figures")]) == 2
    assert "task 'waiting_line_n15/copy' has no leaderboard id" in capsys.readouterr().err
    assert not out.exists() or not out.read_text()


@pytest.mark.parametrize("sampler, stepwise", [("low_confidence", True), ("dus", False), ("rcr", True),
                                               ("entropy", True), ("threshold", False), ("margin_topk", True)])
def test_pb_of_a_method_follows_its_name_for_runs_and_files_alike(tmp_path, sampler, stepwise):
    """One rule per method, whatever the runs' `schedule` says and wherever the points come from:
    dllm's runs, the PB@X table and the same curve written and read back agree (DUS interpolated,
    as the leaderboard computes it)."""
    rows = [r for run, tpf, score in (("a", 1.0, 0.8), ("b", 2.0, 0.5))
            for r in _rows(run, sampler, "dual", {"waiting_line/copy": score}, tpf, "fixed")]
    summaries = report.summarize(rows)
    (curve,) = leaderboard.curves_from_runs(summaries)
    (row,) = report.leaderboard(summaries, (70,))
    leaderboard.write_curves([curve], tmp_path)
    (back,) = leaderboard.read_curves(tmp_path)
    assert curve.pb(70) == row["PB70"] == back.pb(70) == (1.0 if stepwise else pytest.approx(4 / 3))
    assert report.interpolated(curve.method) is not stepwise


@pytest.mark.parametrize("method", sorted(report.STEPWISE_METHODS))
def test_each_stepwise_method_takes_its_best_point_with_or_without_a_cache(method):
    assert not report.interpolated(method) and not report.interpolated(method + "+dual")
    assert report.interpolated("dus") and report.interpolated("confidence-threshold+prefix")
    assert sorted(report.STEPWISE_METHODS) == ["confidence-topk", "dream-topk-margin", "entropy", "entropy-topk",
                                               "l2r", "maskgit-plus", "origin", "random", "rcr", "remdm",
                                               "topk-margin"]


def test_every_sampler_has_its_own_method_id():
    ids = [report.method_id(name) for name in samplers.available()]
    assert len(set(ids)) == len(ids)
    assert report.method_id("topk_margin") == "dream-topk-margin" and report.method_id("margin_topk") == "topk-margin"


def test_a_curve_keeps_the_runs_over_the_most_tasks_and_names_the_rest(results, capsys):
    """An interrupted run (fewer tasks) beside complete ones: its average is over other tasks, so
    the curve leaves it out, with a warning naming it."""
    rows = (_rows("d", "threshold", "none", {"waiting_line/copy": 1.0}, 2.0, "adaptive")
            + _rows("e", "threshold", "none", {"waiting_line/copy": 1.0, "puzzle/sudoku_n4_12": 0.0}, 3.0, "adaptive"))
    with pytest.warns(UserWarning, match=r"curve llada15/confidence-threshold holds the runs of .*tasks "
                                         r"puzzle/sudoku_n4_12, waiting_line/copy; run\(s\) d over other tasks"):
        (curve,) = leaderboard.curves_from_runs(report.summarize(rows))
    assert curve.points == [(3.0, 50.0)]
    with open(results, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    out = results.parent / "curves"
    with pytest.warns(UserWarning, match="run\\(s\\) d over other tasks"):
        assert main(["bench", "--report", "--out", str(results), "--format", "leaderboard", "--out-dir", str(out)]) == 0
    assert (out / "llada15" / "confidence-threshold.csv").is_file()


def test_a_fixed_method_with_a_cache_stays_fixed_when_read_back(tmp_path):
    points = [(leaderboard.AVG, 1.0, 90.0), (leaderboard.AVG, 2.0, 75.0), (leaderboard.AVG, 4.0, 50.0)]
    written = leaderboard.Curve("m", "confidence-topk+dual", points, adaptive=False)
    leaderboard.write_curves([written], tmp_path)
    (curve,) = leaderboard.read_curves(tmp_path)                 # no `adaptive`: known from the file's name
    assert curve.adaptive is None and curve.method == "confidence-topk+dual"
    assert curve.pb(80) == 1.0 and curve.pb(70) == 2.0          # the best point, no interpolation
    adaptive = leaderboard.Curve("m", "threshold+dual", curve.rows)
    assert adaptive.pb(70) != 2.0                                # an adaptive method's curve is interpolated


def test_model_ids_of_relative_folders_stay_inside_the_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert leaderboard.model_id("..") == tmp_path.parent.name.lower() and leaderboard.model_id(".") == \
        tmp_path.name.lower()


def test_runs_whose_scored_tasks_differ_are_separate_methods():
    def run(run_id, tps, scores):
        s = report.RunSummary(run_id, "m", "threshold", {}, "none", "generated", "adaptive")
        for task, score in scores.items():
            s.tasks.append(report.TaskSummary(task, 10, score, None, tps, 1.0, 1.0))
        return s

    both = run("a", 2.0, {"waiting_line/copy": 100.0, "text_writing/w2s_easy": 20.0})
    one = run("b", 3.0, {"waiting_line/copy": 100.0, "text_writing/w2s_easy": None})
    assert both.method != one.method and len(report.leaderboard([both, one], (80,))) == 2
