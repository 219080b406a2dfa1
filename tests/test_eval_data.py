"""The official-layout loader, on files the tests write in the benchmark's schema."""
import json
import warnings

import pytest
import yaml

from dllm.eval import data
from dllm.eval.tasks import TASKS

COPY_CFG = {"waiting_line/copy": {"name": "waiting_line/copy", "type": "copy", "seed": 31940, "num_samples": 100,
                                  "prompt": TASKS["waiting_line/copy"].template, "metric": "list_match_score"}}
# The benchmark stores the Sudoku template with literal backslash-n pairs and a different `name`.
SUDOKU_CFG = {"puzzle/sudoku_n4_12": {"name": "puzzle/sudoku_4x4_4", "prompt": TASKS["puzzle/sudoku_n4_12"].template,
                                      "metric": "sudoku_score"}}


def _copy_record(i):
    names = [f"Name{i} Last{j}" for j in range(3)]
    ctx = json.dumps(names, separators=(", ", ": "))
    return {"input": {"context": ctx, "icl_examples": [{"input": {"context": '["X Y"]'}, "answer": '["X Y"]',
                                                        "metadata": {"length": 1}}]},
            "answer": ctx, "output_format": json.dumps(["[MASK]"] * 3, separators=(", ", ": ")),
            "metadata": {"length": 3, "index": None, "word": None}}


def _write(folder, n_copy=4, spaced=False):
    wl = folder / "waiting_line"
    wl.mkdir(parents=True)
    (wl / "task_config.yaml").write_text(yaml.safe_dump(COPY_CFG))
    sep = (", ", ": ") if spaced else (",", ":")
    (wl / "copy.jsonl").write_text("".join(json.dumps(_copy_record(i), separators=sep) + "\n" for i in range(n_copy)))
    pz = folder / "puzzle"
    pz.mkdir()
    (pz / "task_config.yaml").write_text(yaml.safe_dump(SUDOKU_CFG))
    rec = {"input": {"sudoku": "0042\n2031\n4023\n3214",
                     "icl_examples": [{"input": {"sudoku": "1342\n4003\n2104\n3420"}, "answer": "1342\n4213\n2134\n3421"}]},
           "answer": "1342\n2431\n4123\n3214", "metadata": {"length": 12}}
    (pz / "sudoku_n4_12.jsonl").write_text(json.dumps(rec) + "\n\n")
    (folder / "_drafts").mkdir()
    (folder / "_drafts" / "x.jsonl").write_text("{}\n")
    return folder


@pytest.mark.parametrize("spaced", [False, True])
def test_loads_records_prompts_and_answers(tmp_path, spaced):
    root = _write(tmp_path / "test", spaced=spaced)
    assert data.discover(root) == ["waiting_line/copy", "puzzle/sudoku_n4_12"]
    with pytest.warns(UserWarning) as caught:
        ds = data.load_official(root)
    assert {str(w.message) for w in caught} == {"waiting_line/copy: 4 records where the benchmark has 100",
                                                "puzzle/sudoku_n4_12: 1 records where the benchmark has 108"}
    assert ds.mode == "official" and ds.tasks == ["waiting_line/copy", "puzzle/sudoku_n4_12"]
    s = ds.samples["waiting_line/copy"][2]
    assert s.index == 2 and s.answer == _copy_record(2)["answer"] and s.source == "official"
    turns = s.messages()
    assert turns[1] == {"role": "assistant", "content": '["X Y"]'}
    assert turns[2]["content"].endswith('["Name2 Last0", "Name2 Last1", "Name2 Last2"]\nPlease copy the list '
                                        "exactly and provide only the final list.\n")
    sud = ds.samples["puzzle/sudoku_n4_12"]
    assert len(sud) == 1 and sud[0].task.metric == "sudoku_score"
    assert sud[0].messages()[2]["content"].endswith("Input:\n0042\n2031\n4023\n3214\nOutput:\n")


def test_checkout_root_and_limit(tmp_path):
    _write(tmp_path / "ParallelBench" / "dataset" / "parallel_bench" / "data" / "output" / "test")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = data.load_official(tmp_path / "ParallelBench", ["waiting_line/copy"], limit=2)
    assert [s.index for s in ds.samples["waiting_line/copy"]] == [0, 1]


def test_the_data_folder_of_a_checkout_resolves_past_its_underscore_folders(tmp_path):
    """ParallelBench's dataset/parallel_bench/data holds `_old/task_config.yaml` beside output/test."""
    folder = tmp_path / "data"
    _write(folder / "output" / "test")
    (folder / "_old").mkdir()
    (folder / "_old" / "task_config.yaml").write_text(yaml.safe_dump(COPY_CFG))
    assert data.find_official_root(folder) == folder / "output" / "test"
    (folder / "cat").mkdir()                               # a category with a config but no task file
    (folder / "cat" / "task_config.yaml").write_text(yaml.safe_dump(COPY_CFG))
    with pytest.raises(FileNotFoundError, match=r"no ParallelBench task file \(<category>/<task>.jsonl\) under"):
        data.load_official(folder)


@pytest.mark.parametrize("call, message", [
    (lambda root: data.load_official(root, "waiting_line/copy"), "tasks must be a list of task ids"),
    (lambda root: data.load_generated("waiting_line/copy"), "tasks must be a list of task ids"),
    (lambda root: data.load_official(root, ["waiting_line/copy"], limit=-1), "limit must be a positive integer or "
                                                                             "None, got -1"),
    (lambda root: data.load_generated(["waiting_line/copy"], limit=2.5), "limit must be a positive integer"),
])
def test_a_selection_of_the_wrong_kind_is_refused(tmp_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(_write(tmp_path / "t"))


def test_config_prompt_from_file_wins(tmp_path):
    root = _write(tmp_path / "t")
    cfg = dict(COPY_CFG)
    cfg["waiting_line/copy"] = dict(cfg["waiting_line/copy"], prompt="Copy: {context}")
    (root / "waiting_line" / "task_config.yaml").write_text(yaml.safe_dump(cfg))
    assert data.official_task(root, "waiting_line/copy").template == "Copy: {context}"
    assert data.official_task(root, "waiting_line/copy").max_tokens == 32


def test_unregistered_task_found_in_the_folder(tmp_path):
    root = _write(tmp_path / "t")
    w = root / "words_to_sentence"
    w.mkdir()
    (w / "task_config.yaml").write_text(yaml.safe_dump({"words_to_sentence/easy_n1": {
        "prompt": "Construct a single, coherent sentence using the word {words}.", "metric": "sentence_to_words_score"}}))
    (w / "easy_n1.jsonl").write_text(json.dumps({"input": {"words": "dog"}, "answer": {"words": ["dog"]},
                                                 "metadata": {"length": 3}}) + "\n")
    assert "words_to_sentence/easy_n1" in data.discover(root)
    task = data.official_task(root, "words_to_sentence/easy_n1")
    assert task.headline == "grammar" and task.max_tokens == 64 and not task.one_shot


def test_errors_name_the_missing_file_or_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.find_official_root(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no ParallelBench test files"):
        data.find_official_root(tmp_path / "empty")
    root = _write(tmp_path / "t")
    with pytest.raises(FileNotFoundError, match="waiting_line/sort"):
        data.load_official(root, ["waiting_line/sort"])
    (root / "waiting_line" / "task_config.yaml").write_text(yaml.safe_dump({"waiting_line/copy": {"prompt": "x"}}))
    with pytest.raises(ValueError, match="lacks metric"):
        data.official_task(root, "waiting_line/copy")
    (root / "waiting_line" / "task_config.yaml").write_text(yaml.safe_dump({"other": {}}))
    with pytest.raises(ValueError, match="no entry for task 'waiting_line/copy'"):
        data.official_task(root, "waiting_line/copy")
    (root / "waiting_line" / "task_config.yaml").write_text(
        yaml.safe_dump({"waiting_line/copy": {"prompt": "{context}", "metric": "list_matchscore"}}))
    with pytest.raises(ValueError, match="list_matchscore"):
        data.official_task(root, "waiting_line/copy")
    (root / "puzzle" / "sudoku_n4_12.jsonl").write_text('{"input": {}, "answer": "x"}\n{"input": \n')
    with pytest.raises(ValueError, match="sudoku_n4_12.jsonl:2 is not valid JSON"):
        data.read_records(root / "puzzle" / "sudoku_n4_12.jsonl")


def test_write_official_layout_round_trips(tmp_path):
    recs = {"waiting_line/copy": [_copy_record(i) for i in range(3)]}
    data.write_official_layout(tmp_path / "out", recs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = data.load_official(tmp_path / "out")
    assert [s.record for s in ds.samples["waiting_line/copy"]] == recs["waiting_line/copy"]
    assert ds.samples["waiting_line/copy"][0].task.template == TASKS["waiting_line/copy"].template


@pytest.mark.parametrize("change,message", [
    (lambda r: r["input"]["icl_examples"][0].pop("input"),
     r"copy.jsonl:2: waiting_line/copy: an in-context example must be an object with an 'input' object"),
    (lambda r: r.update(answer={"input": 3}), r"copy.jsonl:2: "),
    (lambda r: r["input"].pop("context"), r"copy.jsonl:2: prompt template needs the input field 'context'"),
])
def test_a_bad_record_is_named_when_the_data_loads(tmp_path, change, message):
    root = _write(tmp_path / "t")
    path = root / "waiting_line" / "copy.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    change(records[1])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=message):
        data.load_official(root, ["waiting_line/copy"])


@pytest.mark.parametrize("config,message", [
    ({"waiting_line/copy": "prompt metric"}, r"the entry for 'waiting_line/copy' must be a mapping"),
    ({"waiting_line/copy": {"prompt": "{context}", "metric": ["list_match_score"]}},
     r"the metric of 'waiting_line/copy' must be a string, got list"),
    ({"waiting_line/copy": {"prompt": "Copy {0}: {context}", "metric": "list_match_score"}},
     r"copy.jsonl:1: prompt template 'Copy \{0\}: \{context\}' is not a template of named fields"),
])
def test_a_bad_task_config_is_named(tmp_path, config, message):
    root = _write(tmp_path / "t")
    (root / "waiting_line" / "task_config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=message):
        data.load_official(root, ["waiting_line/copy"])


def test_an_empty_task_file_is_refused(tmp_path):
    root = _write(tmp_path / "t")
    (root / "waiting_line" / "copy.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"copy.jsonl holds no records"):
        data.load_official(root, ["waiting_line/copy"])
