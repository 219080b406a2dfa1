import subprocess
import sys

import pytest

from dllm.cli import main, parse_kv


def test_generate_prints_text_and_stats(llada_dir, capsys):
    rc = main(["generate", "--model", str(llada_dir), "hello", "a longer prompt", "--gen-length", "8",
               "--block-length", "4", "--steps", "4", "--dtype", "float32"])
    out, err = capsys.readouterr()
    assert rc == 0
    import dllm
    model, tok = dllm.load(llada_dir, dtype="float32")
    want = dllm.generate(model, tok, ["hello", "a longer prompt"], gen_length=8, block_length=4, steps=4)
    assert out == "".join(t + "\n" for t in want.texts)
    assert "4 forwards" in err and "2.00 tokens/forward" in err and "tokens/s" in err


def test_show_redraws_the_canvas(dream_dir, capsys):
    rc = main(["generate", "--model", str(dream_dir), "hi", "--gen-length", "6", "--steps", "3", "--show",
               "--sampler", "maskgit_plus", "--sampler-arg", "eps=0.01"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert out.count("\x1b[2J") == 3 and "[step 1  masks left" in out and "\u2591" in out


def test_bad_sampler_is_a_clean_error(llada_dir, capsys):
    rc = main(["generate", "--model", str(llada_dir), "hi", "--sampler", "nope", "--gen-length", "4"])
    _, err = capsys.readouterr()
    assert rc == 2 and "unknown sampler 'nope'; valid options:" in err


def test_bad_sampler_argument_is_a_clean_error(llada_dir, capsys):
    rc = main(["generate", "--model", str(llada_dir), "hi", "--sampler", "entropy", "--sampler-arg", "eps=2",
               "--gen-length", "4"])
    _, err = capsys.readouterr()
    assert rc == 2 and "eps must be <= 1, got 2" in err


def test_parse_kv():
    assert parse_kv(["tau=0.9", "n=3", "flag=true", "name=abc", "ids=[1, 2]", "x-y=None"], "--sampler-arg") == \
        {"tau": 0.9, "n": 3, "flag": True, "name": "abc", "ids": [1, 2], "x_y": None}
    # null is None; lower-case none is the string some arguments take (learn2pd filter=none)
    assert parse_kv(["a=null", "b=NULL", "filter=none"], "--sampler-arg") == {"a": None, "b": None, "filter": "none"}
    with pytest.raises(SystemExit, match="must look like key=value"):
        parse_kv(["tau"], "--sampler-arg")


def test_console_script_lists_samplers():
    out = subprocess.run([sys.executable, "-m", "dllm.cli", "samplers"], capture_output=True, text=True, check=True)
    for name in ("low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"):
        assert name in out.stdout
