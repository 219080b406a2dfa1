"""`benchmarks/decode_threads.py` runs its four rounds and finds the same texts in each."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_threads.py"


def script_main():
    """The script's `main`, imported here: its refusals come before any round, so no subprocess."""
    spec = importlib.util.spec_from_file_location("decode_threads", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_every_round_decodes_the_same_texts():
    done = subprocess.run([sys.executable, str(SCRIPT), "--prompts", "2", "--gen-length", "8", "--block-length", "8",
                           "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert len(rounds) == 4 and rounds[0].split()[:2] == ["main", "thread"] and rounds[0].endswith("1.00x")
    assert "same texts in every round: yes" in done.stdout


@pytest.mark.parametrize("flags, message", [
    (["--cache", "bogus"], "argument --cache: invalid choice: 'bogus'"),
    (["--gen-length", "16", "--block-length", "32"], "block_length 32 exceeds gen_length 16"),
    (["--task", "nope"], "no generator for task 'nope'; generated tasks:"),
    (["--threads", "0"], "argument --threads"),
])
def test_bad_settings_are_refused_by_name_before_any_round(capsys, flags, message):
    with pytest.raises(SystemExit) as stop:
        script_main()(["--prompts", "1", "--gen-length", "16", *flags])
    assert stop.value.code == 2 and message in capsys.readouterr().err, flags


def test_the_block_length_follows_a_short_generation():
    done = subprocess.run([sys.executable, str(SCRIPT), "--prompts", "1", "--gen-length", "8", "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]                   # block length min(32, 8)
