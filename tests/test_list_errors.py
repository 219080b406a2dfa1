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
    path.write_text("".join(json.dumps({"index": i, **r}) + "\n" for i, r in enumerate(rows)))   # bench rows
    assert errors.main([str(path), "--tasks", "waiting_line/copy"]) == 0
    assert "| r1 | waiting_line/copy | 5 | 2 | 1 | 1 | 1 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no rows of waiting_line/reverse"):
        errors.main([str(path), "--tasks", "waiting_line/reverse"])
    with pytest.raises(SystemExit, match="task 'puzzle/sudoku_n4_12' has answers that are not lists"):
        errors.main([str(path), "--tasks", "puzzle/sudoku_n4_12"])
    with pytest.raises(SystemExit, match="no results file"):
        errors.main([str(tmp_path / "missing.jsonl")])


def test_counts_by_answer_length(errors, tmp_path, capsys):
    short, long = '["Ann Lee", "Bo Kim"]', '["Ann Lee", "Bo Kim", "Cy Orr"]'
    rows = [dict(run_id="r1", task="waiting_line/copy", prediction=p, answer=a, score=s)
            for p, a, s in ((short, short, 1.0), ('["Ann Lee"]', short, 0.0), (long, long, 1.0),
                            ('["Ann Lee", "Bo Kim", "Cy Or"]', long, 0.0), (long, long, 1.0))]
    counts = errors.count_errors(rows, {"waiting_line/copy"}, by_length=True)
    assert counts == {("r1", "waiting_line/copy", 2): {"right": 1, "run-on": 1},
                      ("r1", "waiting_line/copy", 3): {"right": 2, "misspelt": 1}}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps({"index": i, **r}) + "\n" for i, r in enumerate(rows)))   # bench rows
    assert errors.main([str(path), "--tasks", "waiting_line/copy", "--by-length"]) == 0
    out = capsys.readouterr().out
    assert "| run | task | answer length | samples |" in out
    assert "| r1 | waiting_line/copy | 3 | 3 | 2 | 0 | 1 | 0 |" in out


def test_counts_by_held_out_words_made_of_rare_pieces(errors, tmp_path, capsys):
    from transformers import PreTrainedTokenizerFast

    from dllm.eval.names import open_pool
    from dllm.train import cover

    tok = PreTrainedTokenizerFast.from_pretrained("dllm/assets/llada-pb-tiny")
    rare = errors.rare_words(tok, 3)
    test = open_pool("test")
    assert rare and rare <= test.words()
    # brute force: a word is rare when one of its pieces, in its place, is in fewer than 3 training words
    firsts, lasts = cover.training_words()
    only_first = [w for w in test.firsts if w not in test.lasts]
    only_last = [w for w in test.lasts if w not in test.firsts]
    checks = [("Pearse", "first")] + [(w, "first") for w in only_first[:3]] + [(w, "last") for w in only_last[:3]]
    for word, side in checks:
        pieces = cover.word_ids(tok, [word], side)[0]
        words = firsts if side == "first" else lasts
        held = [sum(p in ids for ids in cover.word_ids(tok, words, side)) for p in pieces]
        assert (word in rare) == (min(held) < 3), word
    assert "Pearse" in rare
    common = sorted(test.words() - rare)[0]
    rows = [dict(run_id="r1", task="waiting_line/shuffle", answer={"input": [f"Pearse {common}"]}, score=0.0),
            dict(run_id="r1", task="waiting_line/shuffle", answer={"input": [f"{common} {common}"]}, score=1.0),
            dict(run_id="r1", task="waiting_line/copy", answer=f'["Pearse {common}"]', score=1.0)]
    counts = errors.count_by_rare_words(rows, {"waiting_line/shuffle", "waiting_line/copy"}, rare)
    assert counts == {("r1", "waiting_line/shuffle", "yes"): {"samples": 1, "wrong": 1},
                      ("r1", "waiting_line/shuffle", "no"): {"samples": 1, "wrong": 0},
                      ("r1", "waiting_line/copy", "yes"): {"samples": 1, "wrong": 0}}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps({"index": i, **r}) + "\n" for i, r in enumerate(rows)))   # bench rows
    args = [str(path), "--tasks", "waiting_line/shuffle", "--rare-pieces", "dllm/assets/llada-pb-tiny"]
    assert errors.main(args) == 0
    assert "| r1 | waiting_line/shuffle | yes | 1 | 1 |" in capsys.readouterr().out
