"""benchmarks/probe_grids.py scores single-forward grid predictions of a trained model."""
import itertools
import random

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from tests.fixtures.scripts import load_benchmark

probe = load_benchmark("probe_grids")
SHIPPED = "dllm/assets/llada-pb-tiny"


def test_latin_validity_against_a_direct_check_of_rows_and_columns():
    """A symbol is valid at a cell when the grid written so far (row-major, up to that cell) has no
    symbol twice in a row or a column once it is placed, and it is one of the prompt's symbols."""
    rng = random.Random(0)
    symbols = ["A", "7", "K", "B"]
    for _ in range(300):
        grid = [[rng.choice(symbols + ["Z"]) for _ in range(4)] for _ in range(4)]
        cell = rng.randrange(16)
        symbol = rng.choice(symbols + ["Z"])
        r, c = divmod(cell, 4)
        placed = [row[:] for row in grid]
        placed[r][c] = symbol
        written = {(i, j) for i in range(4) for j in range(4) if 4 * i + j < cell} | {(r, c)}
        clash = any((a[0] == b[0] or a[1] == b[1]) and placed[a[0]][a[1]] == placed[b[0]][b[1]]
                    for a, b in itertools.combinations(sorted(written), 2) if (r, c) in (a, b))
        assert probe.latin_valid(symbol, symbols, grid, cell) == (symbol in symbols and not clash)


def test_cell_columns_skip_the_separators():
    tokenizer = PreTrainedTokenizerFast.from_pretrained(SHIPPED)
    latin = "A,7,K,B\n7,K,B,A\nK,B,A,7\nB,A,7,K"
    assert probe.cell_columns(tokenizer, latin) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]
    assert probe.cell_columns(tokenizer, "1234\n3412\n2143\n4321") == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13,
                                                                      15, 16, 17, 18]
    with pytest.raises(ValueError, match="3 cells, not 16"):
        probe.cell_columns(tokenizer, "1,2\n3")


def test_the_shipped_model_rules_out_what_its_row_holds(capsys):
    """With the rest of a held-out grid shown, the shipped model fills a single masked cell right
    nearly always (its row and column fix it)."""
    threads = torch.get_num_threads()
    assert probe.main(["--model", SHIPPED, "--limit", "4", "--threads", "1"]) == 0
    assert torch.get_num_threads() == threads                           # the script leaves the thread count
    lines = capsys.readouterr().out.strip().splitlines()
    scores = {line.split(":")[0]: dict(kv.rsplit(" ", 1) for kv in line.split(": ", 1)[1].split("; "))
              for line in lines}
    assert set(scores) == {probe.LATIN, probe.SUDOKU}
    assert float(scores[probe.LATIN]["one cell"]) >= 0.9
    assert float(scores[probe.SUDOKU]["one cell blanks"]) >= 0.9
    assert torch.is_grad_enabled()
    with pytest.raises(SystemExit):
        probe.main(["--model", SHIPPED, "--limit", "0"])


def test_a_thread_count_below_one_is_refused_before_anything_loads(tmp_path, capsys):
    before = torch.get_num_threads()
    with pytest.raises(SystemExit) as stop:
        probe.main(["--model", str(tmp_path / "none"), "--threads", "0"])
    assert stop.value.code == 2 and "--threads must be >= 1" in capsys.readouterr().err
    assert torch.get_num_threads() == before


def test_a_missing_model_folder_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        probe.main(["--model", str(tmp_path / "none")])
    assert stop.value.code == 2 and "no checkpoint folder at" in capsys.readouterr().err
