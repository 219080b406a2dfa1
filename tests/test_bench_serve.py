"""`benchmarks/bench_serve.py` end to end with the shipped model: the offline batches alone, bad
batch sizes, and a small load whose every answer is checked against offline `dllm.generate`."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytest.importorskip("uvicorn")

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCHMARKS)      # the client process imports the module by name, as here
    import bench_serve

    yield bench_serve
    sys.path.remove(BENCHMARKS)


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and line[2].isdigit()]


def test_offline_batches_alone_count_their_forwards(bench, capsys):
    assert bench.main(["--requests", "2", "--concurrency", "", "--offline-batches", "1,2", "--gen-length", "8"]) == 0
    rows = table_rows(capsys.readouterr().out)
    # one token per step over 8 positions: 8 forwards per batch, two batches of 1 or one of 2
    assert [(r[0], r[1], r[3]) for r in rows] == [("1", "2", "16"), ("2", "2", "8")]
    assert rows[0][5] == "1.00x"


@pytest.mark.parametrize("argv,message", [
    (["--requests", "2", "--offline-batches", "1,4"],
     "--offline-batches must be a comma list of integers between 1 and --requests (2), got '1,4'"),
    (["--offline-batches", "0"], "--offline-batches must be a comma list of integers between 1 and --requests"),
    (["--concurrency", "1,x"], "--concurrency must be a comma list of integers at least 1, got '1,x'"),
    (["--concurrency", "-8"], "--concurrency must be a comma list of integers at least 1, got '-8'"),
    (["--requests", "0"], "--requests must be at least 1, got 0"),
])
def test_bad_counts_are_named(bench, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert message in capsys.readouterr().err


def test_a_small_load_is_answered_and_equal_to_offline(bench, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert bench.main(["--requests", "3", "--concurrency", "1,2", "--gen-length", "8", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["timestamp"] and r["hardware"]["device"] and r["versions"]["dllm"] for r in rows)
    assert all(r["answered"] == r["equal_offline"] == 3 for r in rows)
    assert [r[0] for r in table_rows(capsys.readouterr().out)] == ["1", "2"]


def test_the_breakdown_splits_the_engines_time(bench, tmp_path, capsys):
    """`--breakdown` with `dual`: every request takes a full forward (its first, at its block start) and
    partial ones after it; the parts add up to the level's time per request."""
    out = tmp_path / "rows.jsonl"
    assert bench.main(["--requests", "2", "--concurrency", "2", "--gen-length", "8", "--block-length", "4",
                       "--cache", "dual", "--breakdown", "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["answered"] == row["equal_offline"] == 2
    assert row["full_forwards"] >= 2 and row["partial_forwards"] >= 1 and row["rows_per_partial_forward"] >= 1
    parts = [row[k] for k in ("full_forward_ms", "partial_forward_ms", "rest_of_steps_ms", "outside_steps_ms")]
    assert min(parts[:3]) > 0
    assert sum(parts) == pytest.approx(row["seconds"] / 2 * 1e3, abs=0.6)   # seconds are rounded to 1 ms
    assert "| full forwards ms/request |" in capsys.readouterr().out
