"""benchmarks/list_errors.py sorts wrong list answers into run-on, misspelt and unparsable."""
import json

import pytest

from tests.fixtures.scripts import load_benchmark


@pytest.fixture(scope="module")
def errors():
    return load_benchmark("list_errors")


def test_error_kinds(errors):
    answer = '["Ann Lee", "Bo Kim", "Cy Orr"]'
    assert errors.error_kind(answer, answer) == "right"
    assert errors.error_kind('["Ann Lee", "Bo Kim", "Cy Orr", "Cy Orr"]', answer) == "run-on"
    assert errors.error_kind('["Ann Lee", "Bo Kim"]', answer) == "run-on"
    assert errors.error_kind('["Ann Lee", "Bo Kimm", "Cy Orr"]', answer) == "misspelt"
    assert errors.error_kind('["Bo Kim", "Ann Lee", "Cy Orr"]', answer) == "misspelt"
    assert errors.error_kind('["Ann Lee", "Bo', answer) == "unparsable"
    assert errors.error_kind('{"a": 1}', answer) == "unparsable"


def test_counts_per_run_and_task_and_the_table(errors, tmp_path, capsys):
    answer = '["Ann Lee", "Bo Kim"]'
    rows = [dict(run_id="r1", task="waiting_line/copy", prediction=p, answer=answer, score=s)
            for p, s in ((answer, 1.0), ('["Ann Lee", "Bo Kim"]"]', 1.0), ('["Ann Lee"]', 0.0),
                         ('["Ann Lee", "Bo Kin"]', 0.5), ('["Ann', 0.0))]
    rows.append(dict(run_id="r1", task="puzzle/sudoku_n4_12", prediction="1234", answer="1234", score=1.0))
    counts = errors.count_errors(rows, {"waiting_line/copy"})
    assert counts == {("r1", "waiting_line/copy"): {"right": 2, "run-on": 1, "misspelt": 1, "unparsable": 1}}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert errors.main([str(path), "--tasks", "waiting_line/copy"]) == 0
    assert "| r1 | waiting_line/copy | 5 | 2 | 1 | 1 | 1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no rows of waiting_line/reverse"):
        errors.main([str(path), "--tasks", "waiting_line/reverse"])


def test_counts_by_answer_length(errors, tmp_path, capsys):
    short, long = '["Ann Lee", "Bo Kim"]', '["Ann Lee", "Bo Kim", "Cy Orr"]'
    rows = [dict(run_id="r1", task="waiting_line/copy", prediction=p, answer=a, score=s)
            for p, a, s in ((short, short, 1.0), ('["Ann Lee"]', short, 0.0), (long, long, 1.0),
                            ('["Ann Lee", "Bo Kim", "Cy Or"]', long, 0.0), (long, long, 1.0))]
    counts = errors.count_errors(rows, {"waiting_line/copy"}, by_length=True)
    assert counts == {("r1", "waiting_line/copy", 2): {"right": 1, "run-on": 1},
                      ("r1", "waiting_line/copy", 3): {"right": 2, "misspelt": 1}}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert errors.main([str(path), "--tasks", "waiting_line/copy", "--by-length"]) == 0
    out = capsys.readouterr().out
    assert "| run | task | answer length | samples |" in out
    assert "| r1 | waiting_line/copy | 3 | 3 | 2 | 0 | 1 | 0 |" in out
