"""The bench runner: rows, resume after a torn write or SIGKILL, 2 processes equal 1, the CLI."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dllm
from dllm.eval import data, runner
from tests.fixtures.scorers import PARAPHRASE_RECORDS, use_fixed_bertscore

# Fields that legitimately differ between two runs of the same configuration.
VOLATILE = {"timestamp", "seconds", "batch_seconds", "batch_size", "hardware"}
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:.*records where the benchmark has")


def _names(i, n):
    first = ["Ann", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal"]
    last = ["Lee", "Park", "Dunn", "Fox", "Gray", "Hill", "Ives", "Jay"]
    return [f"{first[(i + j) % 8]} {last[(3 * i + j) % 8]}" for j in range(n)]


def _render(names):
    return json.dumps(names, separators=(", ", ": "))


def _records(n):
    out = []
    for i in range(n):
        names = _names(i, 3 + i % 2)
        ex = _names(i + 5, 3)
        out.append({"input": {"context": _render(names),
                              "icl_examples": [{"input": {"context": _render(ex)}, "answer": _render(ex)}]},
                    "answer": _render(names), "metadata": {"length": len(names)}})
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny random LLaDA with room for one-shot benchmark prompts (~450 tokens with its byte tokenizer)."""
    from tests.fixtures.checkpoints import write_llada_checkpoint
    return write_llada_checkpoint(tmp_path_factory.mktemp("llada_long"), seed=0, max_sequence_length=1024)


@pytest.fixture(scope="module")
def llada(model_dir):
    import dllm
    return dllm.load(model_dir, dtype="float32")


@pytest.fixture(scope="module")
def bench_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pb")
    recs = _records(12)
    rev = [dict(r, answer=_render(list(reversed(json.loads(r["answer"]))))) for r in recs]
    return data.write_official_layout(folder, {"waiting_line/copy": recs, "waiting_line/reverse": rev})


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _file_rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_rows_scores_and_resume(llada, bench_data, tmp_path):
    model, tok = llada
    out = tmp_path / "r.jsonl"
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), limit=5, out=str(out), batch_size=2,
                                       tokens_per_step=4))
    rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert [(r["task"], r["index"]) for r in rows] == [(t, i) for t in ("waiting_line/copy", "waiting_line/reverse")
                                                       for i in range(5)]
    r = rows[0]
    assert r["steps_used"] == 8 and r["gen_length_used"] == 32 and r["block_length_used"] == 32
    assert r["nfe"] == 8 and r["tokens_per_forward"] == 4.0 and r["schedule"] == "fixed"
    assert r["score"] in (0.0, 1.0) and r["score"] == r["metrics"]["headline"]
    assert r["sampler"] == "low_confidence" and r["data_mode"] == "official" and r["model"]
    assert {"torch", "dllm"} <= set(r["versions"]) and r["hardware"]["world_size"] == 1
    assert r["runtime"] == {"attention": "sdpa", "cuda_graphs": False, "compile": False}
    assert len(r["prompt_id"]) == 12 and r["answer"] == json.loads(out.read_text().splitlines()[0])["answer"]
    assert _file_rows(out) == rows
    # A rerun of the same configuration finds everything stored and generates nothing.
    again = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert again == rows and len(_file_rows(out)) == 10
    # A larger limit only adds the missing samples.
    more = runner.run_bench(cfg.replace(limit=6), model=model, tokenizer=tok,
                            progress=False)
    assert len(more) == 12 and len(_file_rows(out)) == 12
    # Another sampler setting is another run in the same file.
    other = runner.run_bench(cfg.replace(limit=6, tokens_per_step=8), model=model,
                             tokenizer=tok, progress=False)
    assert len(other) == 12 and len({r["run_id"] for r in _file_rows(out)}) == 2


def test_settings_a_sampler_ignores_leave_its_run_id_alone(llada, bench_data, tmp_path):
    """threshold sets its own schedule: steps or tokens_per_step given to it decode the run
    without them, stored once."""
    import warnings

    model, tok = llada
    out = tmp_path / "r.jsonl"
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), limit=2, out=str(out), batch_size=2,
                                       sampler="threshold"))
    rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # "steps 8 is ignored", as generate warns
        for change in (dict(steps=8), dict(tokens_per_step=4)):
            assert runner.run_bench(cfg.replace(**change), model=model, tokenizer=tok, progress=False) == rows
    assert len(_file_rows(out)) == len(rows) == 4
    assert all(r["steps_used"] is None and r["steps"] is None for r in rows)
    # entropy decodes the whole generation at once: a block length given to it is not part of its run
    whole = runner.run_bench(cfg.replace(sampler="entropy"), model=model, tokenizer=tok, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # "block_length 4 is ignored"
        blocks = runner.run_bench(cfg.replace(sampler="entropy", block_length=4), model=model, tokenizer=tok,
                                  progress=False)
        apart = runner.run_bench(cfg.replace(sampler="entropy", block_length=4, out=str(tmp_path / "apart.jsonl")),
                                 model=model, tokenizer=tok, progress=False)
    assert blocks == whole and len(_file_rows(out)) == 8
    assert [r["run_id"] for r in apart] == [r["run_id"] for r in whole]
    assert all(r["block_length_used"] == r["gen_length_used"] > 4 for r in whole + apart)


def test_a_results_file_that_cannot_be_written_fails_before_decoding(llada, bench_data, tmp_path):
    """The results file is opened before the first batch (`ResultsFile.check_writable`), not when
    the first rows are stored."""
    model, tok = llada
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), tasks="waiting_line/copy", limit=2,
                                       out=str(blocker / "r.jsonl")))
    with pytest.raises(OSError, match=r"cannot write the results file .*a-file/r\.jsonl"):
        runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    fine = runner.ResultsFile(tmp_path / "new" / "r.jsonl")
    fine.check_writable()
    assert fine.path.read_text() == "" and fine.rows() == []


def test_torn_last_line_is_redone(llada, bench_data, tmp_path):
    model, tok = llada
    full = tmp_path / "full.jsonl"
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), tasks="waiting_line/copy", limit=6,
                                       out=str(full), batch_size=3, tokens_per_step=2))
    ref = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    cut = tmp_path / "cut.jsonl"
    lines = full.read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    rows = runner.run_bench(cfg.replace(out=str(cut)), model=model, tokenizer=tok,
                            progress=False)
    assert _strip(rows) == _strip(ref)
    assert [(r["task"], r["index"]) for r in _file_rows(cut)] == [("waiting_line/copy", i) for i in range(6)]


def test_config_errors():
    assert runner.BenchConfig(model="m").generated  # no data_dir: the generated test split
    assert runner.BenchConfig().model is None  # the shipped default model
    with pytest.raises(ValueError, match="exclusive"):
        runner.BenchConfig(model="m", data_dir="x", generated=True)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        runner.BenchConfig(model="m", generated=True, limit=0)
    with pytest.raises(ValueError, match="tokens_per_step 5 does not divide gen_length 32"):
        runner.config_from_dict(dict(model="m", generated=True, tokens_per_step=5,
                                     sampler="low_confidence")).lengths(32)
    with pytest.raises(ValueError, match="sort_key"):
        runner.BenchConfig(model="m", generated=True, sort_key="first")
    with pytest.raises(ValueError, match="unknown bench option"):
        runner.config_from_dict({"model": "m", "generated": True, "smapler": "x"})
    with pytest.raises(ValueError, match="unknown name source 'faker'; sources: lists, open"):
        runner.BenchConfig(model="m", names="faker")
    # Cache settings that decode alike are one run identity (the arguments a run gave that are not defaults).
    assert runner.cache_identity("dual", {}) == runner.cache_identity("dual", {"twins": False, "guard": None}) \
        == ("dual", {})
    assert runner.cache_identity("dual", {"guard": 0.9}) == ("dual", {"guard": 0.9})
    one, one_point_zero = (json.dumps(runner.cache_identity("dual", {"guard": g})) for g in (1, 1.0))
    assert one == one_point_zero
    assert runner.cache_identity(dllm.cache.get_policy("dkv-greedy", window=4), {}) == ("dkv-greedy", {})
    official = runner.BenchConfig(model="m").replace(data_dir="data")     # the data source follows data_dir
    assert official.data_dir == "data" and not official.generated
    assert official.replace(data_dir=None).generated
    for field, value in (("model", 123), ("out", 123), ("data_dir", ""), ("model", " ")):
        with pytest.raises(ValueError, match=rf"{field} must be a path or name \(a non-empty str\) or None, got "):
            runner.BenchConfig(**{field: value})
    with pytest.raises(ValueError, match=r"generated must be True or False, got 'no'"):
        runner.BenchConfig(generated="no")
    with pytest.raises(ValueError, match=r"index_base must be 0 or 1, got 1.0"):
        runner.BenchConfig(index_base=1.0)
    import numpy as np
    numpy_numbers = runner.BenchConfig(limit=np.int64(3), batch_size=np.int32(2), index_base=np.int64(1))
    assert (numpy_numbers.limit, numpy_numbers.batch_size, numpy_numbers.index_base) == (3, 2, 1)
    assert {type(numpy_numbers.limit), type(numpy_numbers.index_base)} == {int}
    model = object()
    with pytest.raises(ValueError, match=r"run_bench got a model without a tokenizer: give both"):
        runner.run_bench(runner.BenchConfig(limit=1), model=model)
    with pytest.raises(ValueError, match=r"run_bench got a tokenizer without a model: give both"):
        runner.run_bench(runner.BenchConfig(limit=1), tokenizer=model)


def test_open_names_draw_the_held_out_people_and_say_so_in_the_source():
    from dllm.eval.names import open_pool

    cfg = runner.BenchConfig(model="m", tasks="waiting_line/copy", limit=4, names="open")
    ds = runner.load_dataset(cfg)
    assert "names=open" in ds.source
    people = {p for s in ds.samples["waiting_line/copy"] for p in json.loads(s.record["input"]["context"])}
    assert {w for p in people for w in p.split()} <= open_pool("test").words()
    assert "names" not in runner.load_dataset(cfg.replace(names="lists")).source


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    env.pop("WORLD_SIZE", None)
    return env


def _bench_cmd(model_dir, data_dir, out, *extra):
    return ["-m", "dllm.cli", "bench", "--model", str(model_dir), "--data-dir", str(data_dir), "--out", str(out),
            "--dtype", "float32", "--batch-size", "2", "--tokens-per-step", "2", "--no-progress", *extra]


def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(model_dir, bench_data, tmp_path):
    ref_out, out = tmp_path / "ref.jsonl", tmp_path / "killed.jsonl"
    subprocess.run([sys.executable, *_bench_cmd(model_dir, bench_data, ref_out)], env=_env(), check=True,
                   capture_output=True, cwd=tmp_path, timeout=300)
    ref = _file_rows(ref_out)
    assert len(ref) == 24
    proc = subprocess.Popen([sys.executable, *_bench_cmd(model_dir, bench_data, out, "--batch-size", "1")],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = out.read_text().count("\n")
    assert 3 <= partial < 24
    subprocess.run([sys.executable, *_bench_cmd(model_dir, bench_data, out, "--batch-size", "1")], env=_env(),
                   check=True, capture_output=True, cwd=tmp_path, timeout=300)
    rows = _file_rows(out)
    assert [(r["task"], r["index"]) for r in rows] == [(r["task"], r["index"]) for r in ref]
    assert _strip(rows) == _strip(ref)


def test_two_processes_store_exactly_the_rows_of_one(model_dir, bench_data, tmp_path):
    pytest.importorskip("accelerate")
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    subprocess.run([sys.executable, *_bench_cmd(model_dir, bench_data, one, "--limit", "5")], env=_env(),
                   check=True, capture_output=True, cwd=tmp_path, timeout=300)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *_bench_cmd(model_dir, bench_data, two, "--limit", "5")], env=_env(), capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = _file_rows(one), _file_rows(two)
    assert {r["hardware"]["world_size"] for r in b} == {2}
    assert _strip(a) == _strip(b) and len(a) == 10
    assert res.stdout.count("PB@X") == 1        # only the main process prints


def test_cli_prints_the_table_and_report(model_dir, bench_data, tmp_path, capsys):
    from dllm.cli import main

    out = tmp_path / "r.jsonl"
    assert main(["bench", "--model", str(model_dir), "--data-dir", str(bench_data), "--limit", "2", "--out", str(out),
                 "--dtype", "float32", "--tokens-per-step", "4", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "waiting_line/copy" in text and "waiting_line/reverse" in text and "average" in text and "PB@80" in text
    assert main(["bench", "--report", "--out", str(out)]) == 0
    assert "waiting_line/copy" in capsys.readouterr().out
    # A second run of the same settings over one task shows that task's table alone.
    assert main(["bench", "--model", str(model_dir), "--data-dir", str(bench_data), "--limit", "1", "--out", str(out),
                 "--dtype", "float32", "--tokens-per-step", "4", "--no-progress", "--tasks", "waiting_line/copy"]) == 0
    run_table = capsys.readouterr().out.split("PB@X")[0]
    assert "waiting_line/copy" in run_table and "waiting_line/reverse" not in run_table
    assert main(["bench", "--report", "--out", str(tmp_path / "nowhere.jsonl")]) == 2
    assert "no results file" in capsys.readouterr().err
    assert main(["bench", "--model", str(model_dir), "--data-dir", str(bench_data), "--tasks", "puzzle/*"]) == 2
    assert "matches none" in capsys.readouterr().err
    assert main(["bench", "--model", str(model_dir), "--data-dir", str(bench_data), "--sampler", "nope"]) == 2
    assert "unknown sampler" in capsys.readouterr().err.lower()
    assert main(["bench", "--report"]) == 2


def test_generated_limit_5_over_every_waiting_line_and_puzzle_task(model_dir, tmp_path, capsys):
    from dllm.cli import main
    from dllm.eval.tasks import GROUPS

    out = tmp_path / "g.jsonl"
    assert main(["bench", "--model", str(model_dir), "--generated", "--limit", "5", "--out", str(out),
                 "--dtype", "float32", "--tokens-per-step", "4", "--no-progress"]) == 0
    text = capsys.readouterr().out
    rows = _file_rows(out)
    assert [r["task"] for r in rows[::5]] == list(GROUPS["pure"])
    assert len(rows) == 60 and {r["data_mode"] for r in rows} == {"generated"}
    for task in GROUPS["pure"]:
        assert task in text
    assert "average" in text and "PB@60" in text


def test_text_tasks_without_grammar_checker_are_unavailable_not_zero(llada, tmp_path, monkeypatch):
    monkeypatch.delenv("DLLM_LANGUAGETOOL_URL", raising=False)
    model, tok = llada
    recs = {"words_to_sentence/easy": [{"input": {"words": "dog, park, ball, and throw"},
                                        "answer": {"words": ["dog", "park", "ball", "throw"]}, "metadata": {}}],
            "waiting_line/copy": _records(1)}
    folder = data.write_official_layout(tmp_path / "d", recs)
    rows = runner.run_bench(runner.config_from_dict(dict(model="tiny", data_dir=str(folder), tokens_per_step=8)),
                            model=model, tokenizer=tok, progress=False)
    text = {r["task"]: r for r in rows}["words_to_sentence/easy"]
    assert text["prediction"].strip()          # a non-empty answer: grammar unknown, not 0
    assert text["score"] is None and text["metrics"]["grammar"] is None and text["metrics"]["score_v1"] is None
    assert text["grammar_backend"]["grammar"] == "unavailable"
    assert "inclusion" in text["metrics"]
    from dllm.eval import report
    (s,) = report.summarize(rows)
    assert [t.task for t in s.tasks] == ["waiting_line/copy", "words_to_sentence/easy"]
    assert s.average == s.tasks[0].score and s.tasks[1].score is None
    assert "(1 of 2 tasks scored)" in report.format_run(s)


def test_a_run_resolves_its_sampler_and_policy_once(llada, bench_data, monkeypatch):
    """Every batch of a run decodes with the sampler and policy built once for the run."""
    from dllm.cache import CachePolicy
    from dllm.samplers import Sampler

    model, tok = llada
    used = []
    real = dllm.generate

    def recording(model, tok, prompts, config):
        used.append((config.sampler, config.cache))
        return real(model, tok, prompts, config)
    monkeypatch.setattr(dllm, "generate", recording)
    cfg = runner.config_from_dict(dict(data_dir=str(bench_data), limit=3, batch_size=2, sampler="threshold",
                                       cache="dual", block_length=8))
    rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert len(rows) == 6 and all(r["cache"] == "dual" and r["cache_args"] == {} for r in rows)
    assert len(used) == 4                                   # two tasks, batches of 2 and 1
    sampler, policy = used[0]
    assert isinstance(sampler, Sampler) and isinstance(policy, CachePolicy)
    assert all(s is sampler and p is policy for s, p in used)


def test_the_package_exports_what_its_docstring_shows():
    import dllm.eval
    for line in dllm.eval.__doc__.splitlines():
        if line.strip().startswith("from dllm.eval import"):
            exec(line.strip(), {})


def test_a_checkpoints_generation_length_is_the_default(model_dir, bench_data, tmp_path):
    """A checkpoint whose generation_config.json names `max_new_tokens` decodes every request that
    gives no gen_length with it: bench rows (over the task's max_tokens) and `dllm.generate`."""
    import shutil

    import dllm
    from dllm.decode import checkpoint_gen_length, resolve_request
    folder = Path(shutil.copytree(model_dir, tmp_path / "m"))
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "max_new_tokens": 16}))
    model, tok = dllm.load(folder, dtype="float32")
    assert checkpoint_gen_length(model) == 16
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), limit=1, tasks="waiting_line/copy"))
    (row,) = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert (row["max_tokens"], row["gen_length_used"], row["steps_used"], row["nfe"]) == (32, 16, 16, 16)
    (row,) = runner.run_bench(cfg.replace(gen_length=8), model=model, tokenizer=tok, progress=False)
    assert row["gen_length_used"] == 8
    assert dllm.generate(model, tok, ["hi"], dllm.GenerationConfig()).nfe == [16]
    # Without the entry (or with one that is not a positive integer): the task's max_tokens, and 128.
    for bad in (None, 0, True, "16"):
        model.generation_defaults = {**gen, "max_new_tokens": bad}
        assert checkpoint_gen_length(model) is None
    (row,) = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert row["gen_length_used"] == 32
    assert resolve_request(model, dllm.GenerationConfig()).config.gen_length == 128


def test_repair_refuses_a_file_that_is_not_results_and_keeps_a_whole_last_line(tmp_path):
    notes = tmp_path / "notes.csv"
    notes.write_text("task,tps,accuracy\nwaitingline-copy,1.0,100\navg,1.0,100")
    with pytest.raises(ValueError, match=r"notes.csv' is not a JSONL results file \(line 1 is not a JSON object\)"):
        runner.ResultsFile(notes).repair()
    assert notes.read_text().endswith("avg,1.0,100")
    whole = tmp_path / "whole.jsonl"
    whole.write_text('{"run_id": "a", "task": "t", "index": 0}\n{"run_id": "a", "task": "t", "index": 1}')
    assert runner.ResultsFile(whole).repair() == 0
    assert whole.read_text().endswith('"index": 1}\n') and len(runner.ResultsFile(whole).rows()) == 2
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"run_id": "a", "task": "t", "index": 0}\n{"run_id": "a", "ta')
    assert len(runner.ResultsFile(torn).rows()) == 1                # read as it is: the torn line skipped
    cut = tmp_path / "cut.jsonl"                                    # torn inside a two-byte character
    cut.write_bytes('{"run_id": "a", "task": "t", "index": 0}\n{"run_id": "é'.encode()[:-1])
    assert len(runner.ResultsFile(cut).rows()) == 1
    assert runner.ResultsFile(cut).repair() == len('{"run_id": "é'.encode()) - 1      # the torn bytes dropped
    assert len(runner.ResultsFile(cut).rows()) == 1 and cut.read_bytes().endswith(b'"index": 0}\n')
    assert runner.ResultsFile(torn).repair() == len('{"run_id": "a", "ta')
    assert len(runner.ResultsFile(torn).rows()) == 1
    # Reading (bench --report) refuses what repairing refuses, rather than dropping the line.
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"run_id": "a", "task": "t", "index": 0}\ngarbage\n{"run_id": "a", "task": "t", "index": 1}\n')
    for read in (runner.ResultsFile(damaged).rows, runner.ResultsFile(notes).records):
        with pytest.raises(ValueError, match=r"is not a JSONL results file \(line [12] is not a JSON object\)"):
            read()


def test_a_sweeps_summaries_are_not_result_rows(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"kind": "summary", "summary_id": "s", "run_id": "a"}\n{"run_id": "a", "task": "t", "index": 0}\n')
    assert runner.ResultsFile(path).rows() == [{"run_id": "a", "task": "t", "index": 0}]


def _run_on_a_copy(bench_data, tmp_path, limit):
    """A copy of the official-layout data, a results file and the copy task's run on them: (the
    copy task's records file, the results file, the run's config)."""
    folder = tmp_path / "pb"
    shutil.copytree(bench_data, folder)
    out = tmp_path / "r.jsonl"
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(folder), tasks="waiting_line/copy", limit=limit,
                                       out=str(out), tokens_per_step=8))
    return folder / "waiting_line" / "copy.jsonl", out, cfg


def test_resume_redoes_a_sample_whose_data_changed_and_returns_the_selection(llada, bench_data, tmp_path):
    model, tok = llada
    copy, out, cfg = _run_on_a_copy(bench_data, tmp_path, 3)
    first = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert len(runner.run_bench(cfg.replace(limit=2), model=model, tokenizer=tok, progress=False)) == 2
    records = [json.loads(line) for line in copy.read_text().splitlines()]
    records[0] = _records(13)[12]
    copy.write_text("".join(json.dumps(r) + "\n" for r in records))
    again = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert len(_file_rows(out)) == 4                     # sample 0 decoded again, the others reused
    assert again[0]["prompt_id"] != first[0]["prompt_id"] and again[1:] == first[1:]
    from dllm.eval import report
    (summary,) = report.summarize(runner.ResultsFile(out).rows())
    assert [t.n for t in summary.tasks] == [3]                # the redone sample counts once


def test_resume_redoes_a_sample_whose_answer_changed_and_a_row_reused_after_a_change_back_is_last(
        llada, bench_data, tmp_path):
    """The same prompt with another answer is another sample (its old score would be stale); when
    the data changes back, the first row is reused and written again, so the table read back from
    the file (each sample's last row) is the run's own."""
    from dllm.eval import report

    model, tok = llada
    copy, out, cfg = _run_on_a_copy(bench_data, tmp_path, 1)
    original = copy.read_text()
    first = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    records = [json.loads(line) for line in original.splitlines()]
    records[0]["answer"] = _render(["Nobody Here"])
    copy.write_text("".join(json.dumps(r) + "\n" for r in records))
    changed = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert len(_file_rows(out)) == 2 and changed[0]["answer"] != first[0]["answer"]
    assert changed[0]["prompt_id"] == first[0]["prompt_id"] and changed[0]["score"] == 0
    copy.write_text(original)
    back = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert back[0]["answer"] == first[0]["answer"] and len(_file_rows(out)) == 3     # reused, written again
    (summary,) = report.summarize(runner.ResultsFile(out).rows())
    assert [(t.n, t.score) for t in summary.tasks] == [(1, first[0]["score"] * 100)]


def test_a_relative_model_folder_is_named_by_its_real_path(llada_dir, tmp_path, monkeypatch):
    """`--model m` typed in two directories names two models: the run ids differ."""
    for place in ("a", "b"):
        shutil.copytree(llada_dir, tmp_path / place / "m")
    ids = []
    for place in ("a", "b"):
        monkeypatch.chdir(tmp_path / place)
        ids.append(runner.run_identity(runner.BenchConfig(model="m"), "m", dllm.samplers.get("threshold"),
                                       runner.load_dataset(runner.config_from_dict(dict(limit=1))))["model"])
    assert ids == [os.path.realpath(tmp_path / "a" / "m"), os.path.realpath(tmp_path / "b" / "m")]
    assert runner.model_identity("llada-pb-tiny") == "llada-pb-tiny"      # a name that is no folder stays
    (tmp_path / "link").symlink_to(tmp_path / "a" / "m")
    assert runner.model_identity(str(tmp_path / "link")) == ids[0]


def test_a_prediction_is_the_whole_generation_region_without_special_tokens(llada, bench_data, monkeypatch):
    """As the benchmark's own model code scores it: an end token committed inside the answer is
    left out and the text after it kept (the answer `texts` of dllm.generate stops there)."""
    import dataclasses

    import torch

    model, tok = llada
    real_generate = dllm.generate
    answers = {}

    def end_token_inside_the_answer(model_, tokenizer, prompts, request):
        out = real_generate(model_, tokenizer, prompts, request)
        rows = []
        for label in answers["labels"][:len(prompts)]:
            ids = tokenizer(label, add_special_tokens=False)["input_ids"]
            row = ids[:3] + [tokenizer.eos_token_id] + ids[3:]
            rows.append(row + [tokenizer.eos_token_id] * (out.generated.shape[1] - len(row)))
        answers["labels"] = answers["labels"][len(prompts):]
        return dataclasses.replace(out, generated=torch.tensor(rows))

    cfg = runner.config_from_dict(dict(data_dir=str(bench_data), limit=2, batch_size=2, tasks=["waiting_line/copy"],
                                       gen_length=64))
    samples = runner.load_dataset(cfg).samples["waiting_line/copy"]
    answers["labels"] = [s.answer for s in samples]
    monkeypatch.setattr(dllm, "generate", end_token_inside_the_answer)
    rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert [r["prediction"] for r in rows] == [s.answer for s in samples]
    assert [r["score"] for r in rows] == [1.0, 1.0]


def test_a_bertscore_backend_makes_another_run(llada, tmp_path, monkeypatch):
    """Rows scored without BERTScore are not reused once a BERTScore model is given."""
    use_fixed_bertscore(monkeypatch)
    model, tok = llada
    folder = data.write_official_layout(tmp_path / "d", PARAPHRASE_RECORDS)
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(folder), gen_length=8, out=str(tmp_path / "r.jsonl")))
    (without,) = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    (scored,) = runner.run_bench(cfg.replace(bertscore_model="roberta"), model=model, tokenizer=tok, progress=False)
    assert without["metrics"]["bertscore"] is None and scored["metrics"]["bertscore"] == 0.5
    assert scored["run_id"] != without["run_id"] and scored["bertscore"] == "bert_score"
    assert len(_file_rows(tmp_path / "r.jsonl")) == 2


def test_runs_that_draw_name_their_batch_size(llada, bench_data, tmp_path):
    """Rows of a batch share one random stream: a sampled run at another batch size is another run;
    a greedy run of a sampler that draws nothing is the same run at any batch size."""
    model, tok = llada
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), limit=3, out=str(tmp_path / "r.jsonl"),
                                       tokens_per_step=4))

    def run_id(**change):
        (row, *_) = runner.run_bench(cfg.replace(**change), model=model, tokenizer=tok, progress=False)
        return row["run_id"], row.get("run_batch_size")

    assert run_id(batch_size=1) == run_id(batch_size=3)[:1] + (None,)
    for change in (dict(temperature=1.0), dict(sampler="random"), dict(sampler="origin"),
                   dict(sampler="entropy", sampler_kwargs={"alg_temp": 0.5}),
                   dict(sampler="prophet", sampler_kwargs={"base": "random"})):
        (one, size_one), (three, size_three) = run_id(batch_size=1, **change), run_id(batch_size=3, **change)
        assert one != three and (size_one, size_three) == (1, 3), change


def test_arguments_equal_as_numbers_are_one_run(llada, bench_data, tmp_path):
    model, tok = llada
    cfg = runner.config_from_dict(dict(model="tiny", data_dir=str(bench_data), limit=1, sampler="threshold",
                                       out=str(tmp_path / "r.jsonl")))
    ids = {runner.run_bench(cfg.replace(sampler_kwargs=kwargs, temperature=temperature), model=model, tokenizer=tok,
                            progress=False)[0]["run_id"]
           for kwargs, temperature in (({"tau": 1}, 0), ({"tau": 1.0}, 0.0))}
    assert len(ids) == 1


@pytest.mark.parametrize("name, given, same", [
    ("entropy", {"alg_temp": 1}, {"alg_temp": 1.0}),                   # a float argument whose default is None
    ("adablock", {"tau_d": 1}, {"tau_d": 1.0}),
    ("prophet", {"base": "threshold", "base_kwargs": {"tau": 1}}, {"base": "threshold", "base_kwargs": {"tau": 1.0}}),
])
def test_sampler_identity_reads_integers_for_float_arguments_as_floats(name, given, same):
    from dllm import samplers

    def hashed(kwargs):     # as the run id hashes it (1 == 1.0 in Python, not in JSON)
        return json.dumps(runner.sampler_identity(samplers.get(name, **kwargs)), sort_keys=True)

    assert hashed(given) == hashed(same)
    assert runner.sampler_identity(samplers.get("adablock", window=3))["window"] == 3     # an int argument stays


def test_sampler_arguments_added_later_keep_earlier_run_ids():
    """threshold's commit_block_start, at False (how every earlier run decoded), is not in the
    identity, in prophet's base_kwargs neither; set, it is."""
    from dllm import samplers

    assert runner.sampler_identity(samplers.get("threshold", tau=0.9)) == {"tau": 0.9}
    assert samplers.get("threshold").arguments()["commit_block_start"] is False           # recorded in rows
    assert runner.sampler_identity(samplers.get("threshold", commit_block_start=True))["commit_block_start"]
    inner = runner.sampler_identity(samplers.get("prophet", base="threshold", base_kwargs={"tau": 0.8}))
    assert inner["base_kwargs"] == {"tau": 0.8}
    # pc_sampler's weighting, at "exponential" however the string was made (a command line's is
    # another object), is left out; "linear" is in.
    typed = "".join(["expo", "nential"])
    for given in ({}, {"weighting": typed}):
        assert "weighting" not in runner.sampler_identity(samplers.get("pc_sampler", frequencies="none", **given))
    assert runner.sampler_identity(samplers.get("pc_sampler", frequencies="none", weighting="linear"))["weighting"]


def test_rows_record_the_blocks_the_decode_used(bench_data, tmp_path):
    """A block-causal model decodes in its attention blocks whatever the request leaves open: rows
    say so (they recorded the whole generation length)."""
    from tests.fixtures.checkpoints import write_llada2_checkpoint
    model, tok = dllm.load(write_llada2_checkpoint(tmp_path / "m"), dtype="float32")
    cfg = runner.config_from_dict(dict(model="tiny2", data_dir=str(bench_data), limit=1, out=str(tmp_path / "r.jsonl"),
                                       tasks=["waiting_line/copy"], gen_length=64))
    (row,) = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert row["gen_length_used"] == 64 and row["block_length_used"] == 32


class _TwoProcesses:
    """Rank 0 of a two-process launch whose other process fails its first batch (`other`) or not."""

    rank, world, is_main = 0, 2, True

    def __init__(self, other=None):
        self.other, self.asked = other, []

    def first_failure(self, failure):
        self.asked.append(failure)
        return failure or self.other

    def gather(self, rows):
        return rows


def test_a_batch_failing_on_one_process_stops_every_process_at_the_same_round(monkeypatch):
    """A process whose batch raises tells the others before they gather its rows (they would wait
    for them for ever): it raises its own error, and the others a RuntimeError naming it."""
    monkeypatch.setattr(runner, "_rows_of_batch", lambda run, batch: (_ for _ in ()).throw(FloatingPointError("nan")))
    mine = _TwoProcesses()
    with pytest.raises(FloatingPointError, match="nan"):
        runner._decode_pending(None, mine, [["b0"], ["b1"]], None, {}, progress=False)
    assert mine.asked == ["process 0: FloatingPointError: nan"]
    monkeypatch.setattr(runner, "_rows_of_batch", lambda run, batch: [])
    theirs = _TwoProcesses(other="process 1: FloatingPointError: nan")
    with pytest.raises(RuntimeError, match=r"a batch failed on another process \(process 1: FloatingPointError"):
        runner._decode_pending(None, theirs, [["b0"], ["b1"]], None, {}, progress=False)
    assert theirs.asked == [None]


def test_first_failure_is_the_first_any_process_reports(monkeypatch):
    from dllm.distributed import Distributed
    dist = Distributed()
    assert dist.first_failure("mine") == "mine" and dist.first_failure(None) is None      # one process
    dist.state = object()                                                                  # as in a launch
    monkeypatch.setattr(dist, "gather", lambda items: [None, *items, "process 2: later"])
    assert dist.first_failure(None) == "process 2: later"
    assert dist.first_failure("process 1: X") == "process 1: X"
    monkeypatch.setattr(dist, "gather", lambda items: [None, *items])
    assert dist.first_failure(None) is None


def test_a_store_failing_on_the_main_process_stops_the_others_too(monkeypatch):
    """Only the main process writes the rows: a write that fails there (a full disk) is agreed on
    like a failed batch, so the other processes stop instead of waiting in the next round."""
    monkeypatch.setattr(runner, "_rows_of_batch", lambda run, batch: [{"task": "t", "index": batch[0]}])

    class Full:
        def append(self, rows):
            raise OSError("disk full")
    main = _TwoProcesses()
    with pytest.raises(OSError, match="disk full"):
        runner._decode_pending(None, main, [[0], [1]], Full(), {"t": 0}, progress=False)
    assert main.asked == [None, "process 0: OSError: disk full"]

    class Other(_TwoProcesses):
        rank, is_main = 1, False

        def first_failure(self, failure):
            self.asked.append(failure)
            return "process 0: OSError: disk full" if len(self.asked) == 2 else failure
    other = Other()
    with pytest.raises(RuntimeError, match=r"storing the rows failed on another process \(process 0: OSError"):
        runner._decode_pending(None, other, [[0], [1]], None, {"t": 0}, progress=False)
    assert other.asked == [None, None]
