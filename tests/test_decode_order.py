"""benchmarks/decode_order.py sorts committed tokens by which neighbours were written before them."""
import itertools

import torch

from tests.fixtures.scripts import load_benchmark

order = load_benchmark("decode_order")


def test_neighbour_kinds_on_every_order_of_five_positions():
    """Against a direct reading of each permutation: the prompt is written before column 0,
    nothing lies right of the last column, skipped columns are not counted."""
    for trace in itertools.permutations(range(5)):
        skip = [False, False, True, False, False]
        counts = order.neighbour_kinds(list(trace), skip)
        assert sum(counts.values()) == 4
        want = dict.fromkeys(order.KINDS, 0)
        for j in (0, 1, 3, 4):
            before = lambda i: i == -1 or (0 <= i < 5 and trace[i] < trace[j])
            key = {(True, False): "left", (False, True): "right", (True, True): "both", (False, False): "none"}
            want[key[before(j - 1), before(j + 1)]] += 1
        assert counts == want
    assert order.neighbour_kinds([0, 1, 2, 3], [False] * 4) == {"left": 4, "right": 0, "both": 0, "none": 0}
    assert order.neighbour_kinds([3, 2, 1, 0], [False] * 4) == {"left": 0, "right": 2, "both": 1, "none": 1}


def test_the_script_runs_on_the_shipped_model(capsys):
    assert order.main(["--model", "dllm/assets/llada-pb-tiny", "--names", "lists", "--limit", "2",
                       "--gen-length", "32"]) == 0
    out = capsys.readouterr().out
    assert "| dllm/assets/llada-pb-tiny | waiting_line/copy |" in out
    assert torch.is_grad_enabled()                                      # the script leaves autograd as it was


def test_a_task_that_matches_none_is_refused_by_name(capsys):
    import pytest
    with pytest.raises(SystemExit) as stop:
        order.main(["--model", "dllm/assets/llada-pb-tiny", "--task", "bogus", "--limit", "1"])
    assert stop.value.code == 2 and "task selection 'bogus' matches none" in capsys.readouterr().err
