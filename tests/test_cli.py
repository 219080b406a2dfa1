import json
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
    # --format jsonl: one object per prompt, answers with newlines kept apart.
    assert main(["generate", "--model", str(llada_dir), "hello", "a longer prompt", "--gen-length", "8",
                 "--block-length", "4", "--steps", "4", "--dtype", "float32", "--format", "jsonl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [
        {"prompt": p, "text": t, "nfe": n, "answer_length": a, "hit_cap": h} for p, t, n, a, h in
        zip(["hello", "a longer prompt"], want.texts, want.nfe, want.answer_lengths, want.hit_cap)]


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
    with pytest.raises(SystemExit, match=r"--sampler-arg 'tau' is given twice \('tau=0.1'\); give each key once"):
        parse_kv(["tau=0.9", "tau=0.1"], "--sampler-arg")


@pytest.mark.parametrize("module", ["dllm.cli", "dllm"])
def test_console_script_lists_samplers(module):
    out = subprocess.run([sys.executable, "-m", module, "samplers"], capture_output=True, text=True, check=True)
    for name in ("low_confidence", "random", "origin", "maskgit_plus", "topk_margin", "entropy"):
        assert name in out.stdout
    # each description is its docstring's whole first sentence (llada21's runs over two lines)
    assert "where the model prefers another one above `editing_threshold`; a full block stays open" in out.stdout


def test_a_reader_that_stops_early_ends_the_command_without_a_traceback():
    import os
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "dllm", "samplers", "--json"], stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)                         # the reader is gone before the first write (`| head -c 0`)
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and proc.returncode == 1


def _defaults(argv):
    from dllm.cli import build_parser
    return vars(build_parser().parse_args(argv))


def test_shared_options_have_one_default():
    """The options generate, bench and sweep share parse to the same defaults."""
    generate, bench = _defaults(["generate", "hi"]), _defaults(["bench"])
    sweep = _defaults(["sweep", "--out-dir", "d"])
    everywhere = ("temperature", "seed", "max_forwards", "dtype", "device", "attention", "cuda_graphs", "compile")
    assert {k: generate[k] for k in everywhere} == {k: bench[k] for k in everywhere} == \
        {k: sweep[k] for k in everywhere} == {"temperature": 0.0, "seed": 0, "max_forwards": None, "dtype": "auto",
                                              "device": "auto", "attention": "auto", "cuda_graphs": False,
                                              "compile": False}
    request = ("sampler", "sampler_arg", "cache", "cache_arg", "gen_length", "block_length", "steps",
               "tokens_per_step", "cfg_scale", "score_dtype", "model")
    assert {k: generate[k] for k in request} == {k: bench[k] for k in request}
    benchmark = ("tasks", "data_dir", "limit", "batch_size", "grammar_url", "bertscore_model")
    assert {k: bench[k] for k in benchmark} == {k: sweep[k] for k in benchmark}


def test_shared_options_record_what_was_given():
    from dllm.cli.options import given
    args = _defaults(["sweep", "--out-dir", "d", "--seed", "0", "--cuda-graphs", "--limit", "3"])
    assert args["seed"] == 0 and args["cuda_graphs"] is True
    from argparse import Namespace
    assert given(Namespace(**args)) == {"seed", "cuda_graphs", "limit"}
    assert given(Namespace(**_defaults(["bench"]))) == set()


def test_generate_options_build_the_request():
    from dllm.cli import build_parser
    from dllm.cli.options import generation_config
    args = build_parser().parse_args(["generate", "hi", "--sampler", "threshold", "--sampler-arg", "tau=0.8",
                                      "--cache", "dkv-decode", "--cache-arg", "refresh=4", "--tokens-per-step", "2"])
    cfg = generation_config(args)
    assert (cfg.sampler, cfg.sampler_kwargs, cfg.cache, cfg.cache_kwargs) == ("threshold", {"tau": 0.8},
                                                                              "dkv-decode", {"refresh": 4})
    assert cfg.tokens_per_step == 2 and cfg.seed == 0 and cfg.gen_length is None and cfg.resolved_steps == 64
    assert cfg.suffix_dropout is None and cfg.eos_early_stop is False
    assert generation_config(build_parser().parse_args(["generate", "hi", "--eos-early-stop"])).eos_early_stop is True
    args = build_parser().parse_args(["generate", "hi", "--suffix-dropout", "window=64", "--suffix-dropout", "sigma=3"])
    assert generation_config(args).suffix_dropout == dict(window=64, distribution="gaussian", seed=0, sigma=3,
                                                          scale=2.0)


def test_write_data_of_a_train_shard_is_a_validation_set(tmp_path, capsys):
    """--write-data with --train-shard writes that shard's train-split records (none of them a test
    input) in the official layout, --limit of them per task; without --write-data it is refused."""
    from dllm.eval import data, generators
    tasks = "puzzle/latin_square_n4,waiting_line/copy"
    assert main(["bench", "--write-data", str(tmp_path / "val"), "--train-shard", "7", "--limit", "30",
                 "--tasks", tasks]) == 0
    with pytest.warns(UserWarning, match="30 records where the benchmark has"):
        ds = data.load_official(tmp_path / "val")
    # read back, they are generated data (rows say data_mode generated), with how they were made
    assert ds.mode == "generated" and all(s.source == "generated" for ss in ds.samples.values() for s in ss)
    options = {"names": "open", "num_samples": 30, "shard": 7, "split": "train"}
    made = json.dumps({t: options for t in ds.tasks}, sort_keys=True)
    assert ds.source == f"{tmp_path / 'val'} (dllm.eval.generators {made})"
    # another write into the folder records its own tasks' options; a selection mixing them with
    # official files is refused
    assert main(["bench", "--write-data", str(tmp_path / "val"), "--tasks", "waiting_line/reverse", "--limit", "2",
                 "--names", "lists"]) == 0
    with pytest.warns(UserWarning):
        assert data.load_official(tmp_path / "val", ["waiting_line/reverse"]).source.endswith(
            '{"waiting_line/reverse": {}})')                # the generators' defaults (names lists)
    data.write_official_layout(tmp_path / "val", {"waiting_line/sort": generators.make_records("waiting_line/sort")})
    with pytest.raises(ValueError, match="waiting_line/copy were written by dllm's generators and waiting_line/sort"):
        data.load_official(tmp_path / "val", ["waiting_line/copy", "waiting_line/sort"])
    for task in tasks.split(","):
        written = [s.record for s in ds.samples[task]]
        assert written == generators.make_records(task, split="train", shard=7, num_samples=30, names="open")
        test_inputs = {repr(r["input"]) for r in generators.make_records(task, split="test", names="open")}
        assert not test_inputs & {repr(r["input"]) for r in written}
    assert main(["bench", "--train-shard", "7", "--generated"]) == 2
    assert "--train-shard 7" in capsys.readouterr().err
    assert main(["bench", "--write-data", str(tmp_path / "bad"), "--train-shard", "1000", "--tasks", tasks]) == 2
    assert "1000" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert main(["bench", "--write-data", str(tmp_path / "a-file"), "--tasks", tasks]) == 2
    assert f"--write-data {str(tmp_path / 'a-file')!r} is a file; give a folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--write-data", "w", "--data-dir", "d"], "--write-data writes the generated records and exits; --data-dir do(es) "
                                               "not apply"),
    (["--write-data", "w", "--out", "r.jsonl", "--format", "leaderboard"], "--out, --format leaderboard do(es) not"),
    (["--report", "--out", "r.jsonl", "--tasks", "waiting_line/copy", "--limit", "2"],
     "--report prints every run stored in --out; --limit, --tasks describe(s) a run to decode"),
    (["--report", "--out", "r.jsonl", "--model", "m", "--sampler", "threshold", "--sampler-arg", "tau=0.8",
      "--device", "cpu", "--names", "pseudo"], "--device, --model, --sampler, --sampler-arg, --names describe(s)"),
    (["--write-data", "w", "--tasks", "puzzle/latin_square_n4", "--model", "m", "--sampler", "threshold",
      "--grammar-server", "http://x"], "--grammar-server, --model, --sampler do(es) not apply"),
    (["--data-dir", "d", "--sort-key", "last_name", "--index-base", "1"],
     "--sort-key, --index-base shape(s) the generated records; the official files under --data-dir 'd' fix their own"),
    # given at its default value is given all the same
    (["--data-dir", "d", "--names", "open"], "--names shape(s) the generated records"),
])
def test_bench_options_its_mode_would_ignore_are_errors(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_an_argument_called_name_and_a_bad_key_value_are_usage_errors(capsys):
    assert main(["generate", "hi", "--sampler", "threshold", "--sampler-arg", "name=x"]) == 2
    assert "sampler 'threshold' has no argument(s) 'name'" in capsys.readouterr().err
    assert main(["generate", "hi", "--cache", "dual", "--cache-arg", "name=x"]) == 2
    assert "cache policy 'dual' has no argument(s) 'name'" in capsys.readouterr().err
    assert main(["generate", "hi", "--sampler-arg", "tau"]) == 2
    assert "--sampler-arg 'tau' must look like key=value" in capsys.readouterr().err
    assert main(["generate", "hi", "--suffix-dropout", "sigma=3"]) == 2
    assert "suffix_dropout needs a window" in capsys.readouterr().err


def test_train_filter_out_must_be_a_safetensors_file(tmp_path, capsys):
    for out, message in ((tmp_path / "f.json", "must be a .safetensors file"),
                         (tmp_path / "d.safetensors", "is a folder; give a .safetensors file")):
        if out.suffix == ".safetensors":
            out.mkdir()
        assert main(["train-filter", "--out", str(out), "--tasks", "waiting_line/copy"]) == 2
        assert message in capsys.readouterr().err


def test_no_progress_is_taken_by_every_mode(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    out.write_text("")
    assert main(["bench", "--report", "--out", str(out), "--no-progress"]) == 2     # taken; the file is empty
    assert "holds no result rows" in capsys.readouterr().err
    assert main(["bench", "--write-data", str(tmp_path / "w"), "--tasks", "waiting_line/copy", "--limit", "1",
                 "--no-progress", "--names", "lists"]) == 0


def test_generate_without_a_length_decodes_the_checkpoints(capsys):
    """The shipped model's generation_config.json names 64 tokens; the command decodes as many,
    and a block length that fits them is not checked against the 128 of other models."""
    rc = main(["generate", "hi", "--block-length", "32", "--dtype", "float32", "--no-chat"])
    err = capsys.readouterr().err
    assert rc == 0 and err.strip().splitlines()[-1].startswith("[64 forwards,"), err


def test_a_prompt_that_is_not_utf8_and_a_device_torch_lacks_are_clean_errors(capsys, monkeypatch):
    """A command-line argument that was not UTF-8 arrives with lone surrogates: refused by number
    before the model loads, as the Python API refuses it; a device type this torch build cannot
    make is refused before any weight is read."""
    import dllm
    from dllm.decode import encode_prompts
    from dllm.models.loading import resolve_device

    real_load = dllm.load
    monkeypatch.setattr(dllm, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["generate", "fine", "\udcff\udcfe bad", "--gen-length", "8"]) == 2
    assert "error: prompt 2 is not valid UTF-8 text" in capsys.readouterr().err
    monkeypatch.setattr(dllm, "load", real_load)
    model, tok = dllm.load()
    with pytest.raises(ValueError, match="prompt 1 is not valid UTF-8 text"):
        encode_prompts(tok, ["\udcff x"], chat=False)
    with pytest.raises(ValueError, match="prompt 1 is not valid UTF-8 text"):
        dllm.generate(model, tok, "\udcff x", gen_length=8)
    for device in ("xpu", "hpu"):
        with pytest.raises(ValueError, match=f"device '{device}' is not available on this machine"):
            resolve_device(device)


def test_warnings_show_as_one_line_without_the_source(tmp_path):
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dllm", "generate", "Hi", "--steps", "4", "--sampler", "threshold",
                           "--gen-length", "8"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: sampler 'threshold' decides its own number of steps; steps 4 is ignored\n" in proc.stderr
    assert "UserWarning" not in proc.stderr and "dllm.generate(" not in proc.stderr
