"""Run summaries and the PB@X leaderboard score."""
import pytest

from dllm.eval import report
from tests.fixtures.scripts import load_benchmark

# LLaDA 1.5, confidence threshold, 17-task averages from the benchmark's project page.
THRESHOLD = [(1.33, 86.4), (3.42, 83.8), (4.53, 77.5), (5.62, 68.3), (6.55, 57.9), (8.27, 47.2)]
TOPK = [(1, 86.4), (2, 74.4), (4, 58.9), (8, 41.1), (16, 29.9), (32, 14.4)]


def test_pb_interpolates_adaptive_curves_like_the_leaderboard():
    assert report.pb_score(THRESHOLD, 80) == pytest.approx(3.42 + 3.8 / 6.3 * 1.11)
    # The site's 4.087 / 4.824 / 5.418 come from unrounded averages; these points are rounded.
    assert report.pb_score(THRESHOLD, 80) == pytest.approx(4.087, abs=0.005)
    assert report.pb_score(THRESHOLD, 75) == pytest.approx(4.824, abs=0.01)
    assert report.pb_score(THRESHOLD, 70) == pytest.approx(5.418, abs=0.01)
    assert report.pb_score(THRESHOLD, 90) is None


def test_pb_top_k_takes_the_largest_qualifying_point():
    assert report.pb_score(TOPK, 80, adaptive=False) == 1
    assert report.pb_score(TOPK, 75, adaptive=False) == 1
    assert report.pb_score(TOPK, 70, adaptive=False) == 2
    assert report.pb_score(TOPK, 90, adaptive=False) is None


def test_pb_edge_cases():
    assert report.pb_score([(2.0, 90.0), (3.0, 85.0)], 80) == 3.0          # last point qualifies: no extrapolation
    assert report.pb_score([(2.0, 70.0), (2.0, 90.0), (4.0, 60.0)], 80) == pytest.approx(2 + 10 / 30 * 2)
    assert report.pb_score([], 80) is None
    # Scanning from the right: a dip then a recovery above X takes the rightmost crossing.
    assert report.pb_score([(1, 85), (2, 75), (3, 82), (4, 70)], 80) == pytest.approx(3 + 2 / 12)


def _rows(run, sampler, task_scores, tpf, schedule="adaptive"):
    out = []
    for task, scores in task_scores.items():
        for i, s in enumerate(scores):
            out.append({"run_id": run, "model": "m", "sampler": sampler, "sampler_args": {}, "cache": "none",
                        "data_mode": "generated", "schedule": schedule, "task": task, "index": i, "score": s,
                        "metrics": {"score_strict": s if s is None else 0.0}, "tokens_per_forward": tpf, "nfe": 32 / tpf,
                        "seconds": 0.5})
    return out


def test_summaries_average_within_then_across_tasks_and_skip_unavailable():
    rows = _rows("r1", "threshold", {"a/x": [1, 1, 0, 0], "a/y": [1.0], "t/z": [None, None]}, 2.0)
    (s,) = report.summarize(rows)
    assert [t.task for t in s.tasks] == ["a/x", "a/y", "t/z"]
    assert s.tasks[0].score == 50.0 and s.tasks[1].score == 100.0 and s.tasks[2].score is None
    assert s.average == 75.0 and s.tokens_per_forward == 2.0
    assert "average (2 of 3 tasks scored)" in report.format_run(s)
    assert "n/a" in report.format_run(s)


def test_rows_lacking_a_field_the_summary_reads_are_named():
    rows = _rows("r1", "threshold", {"a/x": [1, 0]}, 2.0)
    del rows[1]["nfe"], rows[1]["tokens_per_forward"]
    with pytest.raises(ValueError, match=r"result row of run r1, task a/x, index 1 lacks tokens_per_forward, nfe; "
                                         r"rows come from dllm bench"):
        report.summarize(rows)
    with pytest.raises(ValueError, match=r"result row 1 lacks run_id"):
        report.summarize([{"task": "a/x", "tokens_per_forward": 1.0, "nfe": 2}])


def test_rows_without_seconds_count_none():
    rows = _rows("r1", "threshold", {"a/x": [1, 0]}, 2.0)
    rows[0]["seconds"] = None
    (s,) = report.summarize(rows)
    assert s.tasks[0].seconds == 0.5


@pytest.mark.parametrize("field, value", [("score", "1"), ("tokens_per_forward", None), ("nfe", True),
                                          ("seconds", "0.5")])
def test_rows_with_a_field_of_the_wrong_type_are_named(field, value):
    rows = _rows("r1", "threshold", {"a/x": [1, 0]}, 2.0)
    rows[0][field] = value
    with pytest.raises(ValueError, match=rf"result row of run r1, task a/x, index 0: {field} {value!r} must be a "
                                         rf"number"):
        report.summarize(rows)


def test_report_refuses_a_file_without_result_rows_and_reads_compare_files_before_decoding(tmp_path, capsys,
                                                                                           monkeypatch):
    from dllm.cli import main
    from dllm.eval import runner

    empty, summaries = tmp_path / "empty.jsonl", tmp_path / "summaries.jsonl"
    empty.write_text("")
    summaries.write_text('{"label": "threshold", "status": "ok"}\n')
    assert main(["bench", "--report", "--out", str(empty)]) == 2
    assert f"'{empty}' holds no result rows of dllm bench\n" in capsys.readouterr().err
    assert main(["bench", "--report", "--out", str(summaries)]) == 2
    assert "a sweep's summaries? its rows are in rows.jsonl" in capsys.readouterr().err
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "bom.csv").write_bytes("\ufefftask,tps,accuracy\navg,1.0,90.0\n".encode())
    (figures / "latin1.csv").write_bytes(b"task,tps,accuracy\navg,1.0,90.0\n\xff\n")
    monkeypatch.setattr(runner, "run_bench", lambda *a, **k: pytest.fail("decoded before reading --compare"))
    assert main(["bench", "--tasks", "waiting_line/copy", "--limit", "1", "--out", str(tmp_path / "r.jsonl"),
                 "--compare", str(figures)]) == 2
    assert f"{figures / 'latin1.csv'}: not UTF-8 text" in capsys.readouterr().err


def test_a_points_tokens_per_forward_covers_the_tasks_its_average_does():
    """An unscored task (Text Writing without a grammar checker) leaves both averages, so the
    table's PB@X equals the leaderboard files' (whose avg rows average the scored tasks)."""
    from dllm.eval import leaderboard

    rows = (_rows("a", "threshold", {"waiting_line/copy": [1, 1], "words_to_sentence/easy": [None]}, 2.0)
            + _rows("b", "threshold", {"waiting_line/copy": [1, 0], "words_to_sentence/easy": [None]}, 3.0))
    for r in rows:
        if r["task"] == "words_to_sentence/easy":    # an unscored task decoded at another rate
            r["tokens_per_forward"] = 6.0
    summaries = report.summarize(rows)
    assert [(s.tokens_per_forward, s.average) for s in summaries] == [(2.0, 100.0), (3.0, 50.0)]
    (row,) = report.leaderboard(summaries, (80,))
    (curve,) = leaderboard.curves_from_runs(summaries)
    assert row["PB80"] == curve.pb(80) == pytest.approx(2.4)


def test_leaderboard_groups_runs_into_methods():
    rows = (_rows("a", "threshold", {"t": [1] * 9 + [0]}, 2.0) + _rows("b", "threshold", {"t": [1] * 7 + [0] * 3}, 4.0)
            + _rows("c", "low_confidence", {"t": [1] * 9 + [0]}, 1.0, "fixed")
            + _rows("d", "low_confidence", {"t": [1] * 8 + [0] * 2}, 2.0, "fixed"))
    board = {b["sampler"]: b for b in report.leaderboard(report.summarize(rows), (80, 70))}
    assert board["threshold"]["PB80"] == pytest.approx(2 + 10 / 20 * 2)
    assert board["threshold"]["PB70"] == 4.0
    assert board["low_confidence"]["PB80"] == 2.0 and board["low_confidence"]["runs"] == 2
    text = report.format_leaderboard(list(board.values()), (80, 70))
    assert "PB@80" in text and "3.00" in text
    # a method whose average covers other tasks is another row, told apart by its task count
    more = rows + _rows("e", "threshold", {"t": [1] * 9 + [0], "u": [1] * 10}, 2.0)
    lines = report.format_leaderboard(report.leaderboard(report.summarize(more), (80,)), (80,)).splitlines()
    assert lines[0].split()[4] == "tasks"
    assert sorted(line.split()[4] for line in lines[1:] if " threshold " in line) == ["1", "2"]


def test_markdown_table_has_a_column_per_run():
    rows = _rows("a", "threshold", {"x/a": [1, 0], "x/b": [1, 1]}, 2.0) + _rows("b", "eb", {"x/a": [1, 1]}, 3.0)
    text = report.markdown_table(report.summarize(rows))
    lines = text.splitlines()
    assert lines[0] == "| task | threshold | eb |"
    assert "| x/a | 50.0 | 100.0 |" in lines and "| x/b | 100.0 |  |" in lines
    assert lines[-2] == "| **average** | **75.0** | **100.0** |" and lines[-1] == "| tokens/forward | 2.00 | 3.00 |"


def test_runs_whose_cache_arguments_differ_are_separate_methods():
    plain = _rows("a", "threshold", {"t": [1] * 3 + [0] * 7}, 2.0)
    guarded = [{**r, "cache": "dual", "cache_args": {"guard": 0.9}} for r in _rows("b", "threshold", {"t": [1] * 9 + [0]},
                                                                                   1.5)]
    plain = [{**r, "cache": "dual", "cache_args": {}} for r in plain]
    board = report.leaderboard(report.summarize(plain + guarded), (80,))
    assert sorted((b["cache"], b["runs"], b["PB80"]) for b in board) == [("dual", 1, None), ("dual(guard=0.9)", 1, 1.5)]


def _summary(run_id, cache, scores, seconds, n=100, tpf=1.0):
    s = report.RunSummary(run_id, "m", "threshold", {}, cache, "generated", "adaptive")
    for task, score in scores.items():
        s.tasks.append(report.TaskSummary(task, n if "sudoku" not in task else 108, score, None, tpf, 1.0, seconds))
    return s


def test_model_tables_cells_zero_dep_and_speedup_against_the_same_sampler():
    mt = load_benchmark("model_tables")
    scores = {f"waiting_line/{t}": 10.0 * i for i, t in enumerate(mt.TASK_ORDER[:10])}
    scores["puzzle/latin_square_n4"], scores["puzzle/sudoku_n4_12"] = 48.0, 100.0
    base = _summary("a", "none", scores, 10.0)
    fast = _summary("b", "dual", scores, 2.5, tpf=19.5)
    table = mt.sampler_table([("threshold", base)]).splitlines()
    assert len(table) == 3 and table[0].count("|") == len(mt.TASK_ORDER) + 5
    cells = [c.strip() for c in table[2].split("|")[1:-1]]
    assert cells[1:4] == ["0", "10", "20"] and cells[12] == "100.0"              # n=108 keeps a decimal
    assert cells[14] == "20.0"                                                     # zero-dep: mean of 0..40
    assert float(cells[13]) == pytest.approx(sum(scores.values()) / 12, abs=0.05)
    rows = mt.cache_table([("threshold", "none", base), ("threshold", "dual", fast),
                           ("low_confidence", "dual", fast)]).splitlines()
    assert rows[2].endswith("| 120.0 | 1.00 |") and rows[3].endswith("| 19.50 | 30.0 | 4.00 |")
    assert rows[4].endswith("| n/a |")                                             # no baseline of its own sampler


def test_model_tables_rejects_an_unknown_table(capsys):
    mt = load_benchmark("model_tables")
    assert mt.main(["--out", "unused.jsonl", "--only", "samplers,kv"]) == 2
    assert "'samplers,kv'" in capsys.readouterr().err


def test_model_tables_rows_are_well_formed_and_each_table_has_its_baselines():
    """Every cache row is (sampler label, sampler, settings, cache label, cache, cache args), the
    names are registered and the arguments accepted, and each sampler label of a table has a `none`
    row before its cached ones (the speedup column's baseline)."""
    from dllm import samplers
    from dllm.cache import get_policy
    mt = load_benchmark("model_tables")
    for table in (mt.CACHES, mt.TWINS, mt.GUARDED):
        seen_none = set()
        for label, sampler, settings, cache_label, cache, cache_args in table:
            assert isinstance(label, str) and isinstance(cache_label, str)
            assert isinstance(settings, dict) and isinstance(cache_args, dict)
            samplers.get(sampler)
            get_policy(cache, **cache_args)
            if cache == "none":
                seen_none.add(label)
            assert label in seen_none, (label, cache_label)
