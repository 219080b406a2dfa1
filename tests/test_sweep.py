"""The sweep: grid files (YAML/TOML) and their errors, the Pareto front, a small grid on the tiny
random LLaDA (rows, summaries, plots, report, failures skipped), resume after SIGKILL, and two
processes storing what one stores."""
import itertools
import json
import os
import random
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dllm import samplers, sweep
from tests.fixtures.scorers import PARAPHRASE_RECORDS, use_fixed_bertscore

ROOT = Path(__file__).resolve().parents[1]
# Fields that legitimately differ between two runs of the same configuration.
ROW_VOLATILE = {"timestamp", "seconds", "batch_seconds", "batch_size", "hardware"}
SUMMARY_VOLATILE = {"timestamp", "seconds", "tokens_per_second", "hardware"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.filterwarnings("ignore:.*records where the benchmark has")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model gains nothing from two threads, and they contend on a 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny random LLaDA with room for one-shot benchmark prompts (~600 tokens with its byte tokenizer)."""
    from tests.fixtures.checkpoints import write_llada_checkpoint
    return write_llada_checkpoint(tmp_path_factory.mktemp("llada_sweep"), seed=0, max_sequence_length=1024)


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _strip_rows(rows):
    return [{k: v for k, v in r.items() if k not in ROW_VOLATILE} for r in rows]


def _strip_summaries(rows):
    out = []
    for r in rows:
        r = {k: v for k, v in r.items() if k not in SUMMARY_VOLATILE}
        if "per_task" in r:
            r["per_task"] = [{k: v for k, v in t.items() if k != "seconds"} for t in r["per_task"]]
        out.append(r)
    return out


# -- grid files -----------------------------------------------------------------------------------
GRID_YAML = """\
tasks: [waiting_line/copy, puzzle/*]
limit: 4
levels: [90, 50]
models: [null, some/folder]
gen_lengths: [null, 32]
caches: [none, {name: dkv-decode, args: {refresh: [4, 8]}}]
samplers:
  - {name: low_confidence, tokens_per_step: [1, 2]}
  - {name: threshold, args: {tau: [0.8, 0.9]}}
  - {name: prophet, args: {thresholds: [[7.5, 5.0, 2.5]], base_kwargs: {logits_eos_inf: true}}}
  - {name: learn2pd, block_lengths: [32], args: {filter: none}}
grids:
  - {}
  - {models: [default], caches: [dual], samplers: [eb], gen_lengths: [64]}
"""

GRID_TOML = """\
tasks = ["waiting_line/copy", "puzzle/*"]
limit = 4
levels = [90, 50]
models = ["default", "some/folder"]
gen_lengths = ["default", 32]
caches = ["none", { name = "dkv-decode", args = { refresh = [4, 8] } }]

[[samplers]]
name = "low_confidence"
tokens_per_step = [1, 2]

[[samplers]]
name = "threshold"
args = { tau = [0.8, 0.9] }

[[samplers]]
name = "prophet"
args = { thresholds = [[7.5, 5.0, 2.5]], base_kwargs = { logits_eos_inf = true } }

[[samplers]]
name = "learn2pd"
block_lengths = [32]
args = { filter = "none" }

[[grids]]

[[grids]]
models = ["default"]
caches = ["dual"]
samplers = ["eb"]
gen_lengths = [64]
"""


def test_yaml_and_toml_grids_expand_to_the_same_product(tmp_path):
    (tmp_path / "g.yaml").write_text(GRID_YAML)
    (tmp_path / "g.toml").write_text(GRID_TOML)
    a = sweep.parse_grid(sweep.load_grid_file(tmp_path / "g.yaml"))
    b = sweep.parse_grid(sweep.load_grid_file(tmp_path / "g.toml"))
    assert [p.key() for p in a.points] == [p.key() for p in b.points]
    assert a.settings == b.settings and a.settings.levels == (90.0, 50.0) and a.settings.limit == 4
    # 2 models x (2 + 2 + 1 + 1 sampler settings) x 3 caches x 2 gen lengths, then eb x dual x gen 64
    assert len(a.points) == 2 * 6 * 3 * 2 + 1
    p0 = a.points[0]
    g0 = p0.generation
    assert (p0.model, g0.sampler, g0.tokens_per_step, g0.cache, g0.gen_length) == (None, "low_confidence", 1, "none",
                                                                                   None)
    assert {(p.model, p.generation.sampler, p.generation.cache, p.generation.gen_length)
            for p in a.points if p.generation.sampler == "eb"} == {(None, "eb", "dual", 64)}
    assert {p.generation.block_length for p in a.points if p.generation.sampler == "learn2pd"} == {32}
    assert {p.generation.block_length for p in a.points if p.generation.sampler != "learn2pd"} == {None}
    assert {p.generation.cache_kwargs.get("refresh")
            for p in a.points if p.generation.cache == "dkv-decode"} == {4, 8}
    prophet = [p for p in a.points if p.generation.sampler == "prophet"]
    assert prophet[0].generation.sampler_kwargs == {"thresholds": [7.5, 5.0, 2.5],
                                                    "base_kwargs": {"logits_eos_inf": True}}
    labels = [p.label for p in a.points]
    assert len(set(labels)) == len(labels)              # labels name configurations uniquely
    assert "default: threshold(tau=0.8) +dkv-decode(refresh=4) gen=32" in labels


def test_duplicate_configurations_are_run_once():
    g = sweep.parse_grid({"samplers": ["threshold", {"name": "threshold"}], "caches": ["none", "none"],
                          "grids": [{}, {"caches": [{"name": "none"}]}]})
    assert len(g.points) == 1 and g.points[0].label == "threshold"


def test_configurations_that_decode_alike_are_one(tmp_path):
    """Arguments equal as numbers or equal to their defaults, one folder spelled two ways, and block
    lengths for a sampler without blocks make one configuration each."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    g = sweep.parse_grid({
        "models": [str(folder), str(folder) + "/", str(tmp_path / "." / "ckpt")],
        "samplers": [{"name": "threshold", "args": {"tau": [1, 1.0]}}, "entropy"],
        "caches": ["dual", {"name": "dual", "args": {"twins": False}}],
        "block_lengths": [16, None]})
    assert [p.label for p in g.points] == ["threshold(tau=1) +dual blk=16", "threshold(tau=1) +dual",
                                           "entropy +dual"]
    assert {p.model for p in g.points} == {str(folder)}
    # no step count given either way is one configuration
    g = sweep.parse_grid({"samplers": ["low_confidence", {"name": "low_confidence", "tokens_per_step": [None]}],
                          "gen_lengths": [16]})
    assert [p.label for p in g.points] == ["low_confidence gen=16"]


def test_labels_name_models_by_the_path_parts_that_tell_them_apart(tmp_path):
    g = sweep.parse_grid({"models": [None, "/runs/a/final", "/runs/b/final", "llada-pb-tiny"],
                          "samplers": ["threshold"]})
    assert [p.label for p in g.points] == ["default: threshold", "a/final: threshold", "b/final: threshold",
                                           "llada-pb-tiny: threshold"]
    assert sweep.model_names(["/x/final"]) == {"/x/final": "final"}
    assert sweep.model_names(["org/m", "./org/m"]) == {"org/m": "org/m", "./org/m": "./org/m"}   # hub ids


@pytest.mark.parametrize("entry, message", [
    ({"name": "threshold", "tokens_per_step": [1, 4]}, r"sampler 'threshold' sets its own schedule and ignores steps"),
    ({"name": "eb", "steps": 8}, r"sampler 'eb' sets its own schedule"),
    ({"name": "entropy", "block_lengths": [8]}, r"sampler 'entropy' decodes the whole generation at once and "
                                                r"ignores block_lengths"),
])
def test_schedule_keys_a_sampler_ignores_are_refused(entry, message):
    with pytest.raises(ValueError, match=message):
        sweep.parse_grid({"samplers": [entry]})
    # prophet's progress is the step over the requested steps, whatever its base
    for args in ({}, {"base": "threshold"}):
        assert len(sweep.parse_grid({"samplers": [{"name": "prophet", "args": args, "steps": [8, 16]}]}).points) == 2


def test_a_command_line_samplers_own_lengths_stay_beside_the_length_axes():
    from dllm.cli import build_parser

    args = build_parser().parse_args(["sweep", "--out-dir", "x", "--sampler", "dus block_lengths=8",
                                      "--sampler", "low_confidence gen_lengths=32", "--block-length", "16",
                                      "--gen-length", "64"])
    assert [p.label for p in sweep.grid_from_args(args).points] == ["dus blk=8 gen=64", "low_confidence blk=16 gen=32"]


def test_the_per_task_legend_names_every_sampler_when_the_first_panel_is_empty(tmp_path, monkeypatch):
    from matplotlib.figure import Figure as MplFigure

    shown = []
    legend = MplFigure.legend
    monkeypatch.setattr(MplFigure, "legend", lambda fig, *a, **k: (shown.append(list(a[1])), legend(fig, *a, **k))[1])
    summaries = [{"status": "ok", "label": name, "sampler": name, "cache": "none", "tokens_per_forward": tpf,
                  "tokens_per_second": 1.0, "average": 50.0,
                  "accuracy": {"paraphrase_summarize/samsum": None, "waiting_line/copy": 50.0},
                  "per_task": [{"task": t, "tokens_per_forward": tpf} for t in ("paraphrase_summarize/samsum",
                                                                                "waiting_line/copy")]}
                 for name, tpf in (("low_confidence", 1.0), ("threshold", 2.0))]
    sweep.write_plots(summaries, tmp_path)
    assert {"low_confidence", "threshold"} <= set(shown[-1])


def test_each_task_panel_places_a_configuration_at_that_tasks_tokens_per_forward(tmp_path, monkeypatch):
    """An adaptive sampler runs faster on some tasks than others: a task's panel uses the task's own
    tokens per forward (its `per_task` entry), not the configuration's average."""
    from matplotlib.axes import Axes

    drawn = []
    scatter = Axes.scatter
    monkeypatch.setattr(Axes, "scatter", lambda ax, x, y, **k: (drawn.append(list(x)), scatter(ax, x, y, **k))[1])
    summary = {"status": "ok", "label": "threshold", "sampler": "threshold", "cache": "none",
               "tokens_per_forward": 2.0, "tokens_per_second": 1.0, "average": 50.0,
               "accuracy": {"waiting_line/copy": 60.0, "waiting_line/sort": 40.0},
               "per_task": [{"task": "waiting_line/copy", "tokens_per_forward": 1.5},
                            {"task": "waiting_line/sort", "tokens_per_forward": 2.5}]}
    sweep.write_plots([summary], tmp_path)
    assert [1.5] in drawn and [2.5] in drawn                # the panels; the overall figures draw 2.0


def test_the_per_task_figure_grows_to_hold_a_legend_wider_than_its_panels(tmp_path):
    from matplotlib.image import imread

    names = ["low_confidence", "threshold", "factor", "eb", "adablock", "localleap", "dus", "slowfast"]
    summaries = [{"status": "ok", "label": name, "sampler": name, "cache": "none", "tokens_per_forward": 1.0 + k,
                  "tokens_per_second": 1.0, "average": 50.0, "accuracy": {"waiting_line/copy": 50.0},
                  "per_task": [{"task": "waiting_line/copy", "tokens_per_forward": 1.0 + k}]}
                 for k, name in enumerate(names)]
    written = sweep.write_plots(summaries, tmp_path)
    per_task = imread(str(next(p for p in written if p.name == sweep.plots.PLOT_TASKS)))
    dpi = __import__("matplotlib").rcParams["savefig.dpi"]
    dpi = __import__("matplotlib").rcParams["figure.dpi"] if dpi == "figure" else dpi
    assert per_task.shape[1] > 3.2 * dpi * 1.5          # one 3.2-inch panel; the legend's 8 columns are wider


def test_the_report_states_each_tasks_sample_count():
    def per_task(counts):
        return [{"task": t, "n": n, "score": 50.0, "strict": 50.0, "tokens_per_forward": 1.0, "nfe": 4.0,
                 "seconds": 1.0} for t, n in zip(("t/one", "t/two"), counts)]
    base = {"status": "ok", "label": "a", "run_id": "r", "model": "m", "sampler": "threshold", "sampler_args": {},
            "cache": "none", "schedule": "threshold", "tokens_per_forward": 1.0, "tokens_per_second": 1.0,
            "average": 50.0, "nfe": 4.0, "data_mode": "generated", "accuracy": {"t/one": 50.0, "t/two": 50.0},
            "tasks": ["t/one", "t/two"], "samples": 208, "limit": None, "per_task": per_task((100, 108))}
    head = sweep.markdown_report([base], levels=()).splitlines()[2]
    assert "2 task(s), 100-108 samples per task, data: generated." in head
    even = {**base, "samples": 8, "limit": 4, "per_task": per_task((4, 4))}
    assert "4 sample(s) per task (limit 4)" in sweep.markdown_report([even], levels=()).splitlines()[2]


def test_a_summary_written_over_duplicate_copies_leaves_one(tmp_path):
    """Two copies of one id (two sweeps writing a folder at once, files joined): the new row
    replaces both, so what is read back is what was written."""
    path = tmp_path / "summaries.jsonl"
    rows = [{"kind": "summary", "summary_id": "a", "status": "ok"}, {"kind": "summary", "summary_id": "b"},
            {"kind": "summary", "summary_id": "a", "status": "failed"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sweep.write_summary(path, {"kind": "summary", "summary_id": "a", "status": "ok", "new": True})
    assert [(r["summary_id"], r.get("new")) for r in sweep.read_summaries(path)] == [("a", True), ("b", None)]


def test_numbers_in_exponent_notation_are_numbers():
    spec = sweep.grid.parse_spec("klass kl_threshold=1e-2,2.5E-1", "--sampler")
    assert spec["args"]["kl_threshold"] == [0.01, 0.25]
    import yaml
    assert yaml.load("tau: [1e-2, 5, 0.5, 1e, x1e2]", Loader=sweep.grid.UniqueKeyLoader) == \
        {"tau": [0.01, 5, 0.5, "1e", "x1e2"]}


def test_the_package_docstrings_grid_file_runs_the_top_level_product_and_its_extra_entry():
    text = sweep.__doc__.split("Grid file (YAML or TOML; the command line builds the same structure)::")[1]
    block = "\n".join(line[4:] for line in text.split("\n\n")[1].splitlines())
    import yaml
    grid = sweep.parse_grid(yaml.safe_load(block))
    # (4 low_confidence + 3 threshold + 2 learn2pd) x 3 caches x 2 dropouts, then threshold x prefix, dual x 2
    assert len(grid.points) == 9 * 3 * 2 + 2 * 2
    dropped = [p for p in grid.points if p.generation.suffix_dropout is not None]
    assert len(dropped) == len(grid.points) // 2
    assert all(p.label.endswith("+dpad(window=32, distribution=gaussian, seed=0, sigma=4, scale=2)") for p in dropped)
    assert len({p.key() for p in grid.points}) == len(grid.points)


def test_eos_early_stop_is_a_setting_every_configuration_shares():
    grid = sweep.parse_grid({"samplers": ["threshold", "low_confidence"], "eos_early_stop": True})
    assert all(p.bench_config(grid.settings).generation.eos_early_stop for p in grid.points)
    with pytest.raises(ValueError, match="eos_early_stop 'yes' is not allowed; give true or false"):
        sweep.parse_grid({"samplers": ["threshold"], "eos_early_stop": "yes"})
    from dllm.cli import build_parser
    args = build_parser().parse_args(["sweep", "--out-dir", "d", "--sampler", "threshold", "--eos-early-stop"])
    assert sweep.grid_from_args(args).settings.eos_early_stop is True


def test_a_dropout_axis_of_equal_settings_runs_once():
    grid = sweep.parse_grid({"samplers": ["threshold"], "suffix_dropouts": [{"window": 8}, {"window": 8, "sigma": 4},
                                                                           None, "null"]})
    assert [p.generation.suffix_dropout for p in grid.points][:2] == [
        dict(window=8, distribution="gaussian", seed=0, sigma=4.0, scale=2.0), None]


BAD_GRIDS = [
    ({"samplers": ["threshold"], "smaplers": []}, r"unknown key\(s\) 'smaplers'; allowed: .*samplers"),
    ({"samplers": ["thresh"]}, r"samplers\[0\]: unknown sampler 'thresh'; valid options: .*threshold"),
    ({"samplers": [{"name": "threshold", "args": {"tau": [0.9, 1.5]}}]}, r"tau=1.5.*tau must be <= 1, got 1.5"),
    ({"samplers": [{"name": "threshold", "args": {"gamma": 1}}]}, r"has no argument\(s\) 'gamma'; its arguments: tau"),
    ({"samplers": [{"name": "threshold", "argz": {}}]}, r"unknown key\(s\) 'argz'; allowed: name, args"),
    ({"samplers": [{"args": {"tau": 0.9}}]}, r"missing 'name'; valid sampler names: .*threshold"),
    ({"samplers": [{"name": "low_confidence", "tokens_per_step": 2, "steps": 16}]}, "tokens_per_step or steps"),
    ({"samplers": [{"name": "low_confidence", "tokens_per_step": [0]}]}, r"tokens_per_step: 0 is not allowed"),
    ({"samplers": ["threshold"], "caches": ["dual", "lru"]}, r"caches\[1\]: unknown cache policy 'lru'; valid"),
    ({"samplers": ["threshold"], "caches": [{"name": "dkv-greedy", "args": {"window": -1}}]}, r"window"),
    ({"samplers": ["threshold"], "block_lengths": [32, "long"]}, r"block_lengths: 'long' is not allowed; give a "
                                                                 r"positive integer"),
    ({"samplers": ["threshold"], "gen_lengths": [2.5]}, r"gen_lengths: 2.5 is not allowed"),
    ({"samplers": ["threshold"], "models": [3]}, r"model 3 is not allowed"),
    ({"samplers": ["threshold"], "limit": 0}, r"limit 0 is not allowed; give a positive integer"),
    ({"samplers": ["threshold"], "batch_size": "8"}, r"batch_size '8' is not allowed"),
    ({"samplers": ["threshold"], "dtype": "fp8"}, r"unsupported dtype 'fp8'; choose one of"),
    ({"samplers": ["threshold"], "levels": [80, 120]}, r"levels \[80, 120\] is not allowed; give accuracy levels "
                                                       r"between 0 and 100"),
    ({"samplers": ["threshold"], "temperature": -1}, r"temperature -1 is not allowed"),
    ({"samplers": ["threshold"], "grids": [{"limit": 3}]}, r"grids\[0\]: unknown key\(s\) 'limit'; allowed: models"),
    ({"samplers": ["threshold"], "grids": []}, r"grids must be a non-empty list"),
    ({"caches": ["none"]}, r"no samplers"),
    ({"samplers": [{"name": "threshold", "args": {"tau": []}}]}, r"args.tau: an empty list of values is not allowed"),
    ({"samplers": [{"name": "threshold", "args": {1: 0.9}}]}, r"samplers\[0\] \(threshold\).args: argument name 1 "
                                                              r"must be a string"),
    ({"samplers": ["threshold"], "caches": [{"name": "dkv-decode", "args": {1: 4}}]}, r"caches\[0\] \(dkv-decode\)"
                                                                                      r".args: argument name 1"),
    ({"samplers": ["threshold"], "grids": [None]}, r"grid.grids\[0\] must be a mapping with keys models"),
    ({"samplers": ["threshold"], "suffix_dropouts": [None, {"window": 0}]}, r"suffix_dropouts\[1\]: suffix_dropout "
                                                                          r"window must be a positive integer"),
]


@pytest.mark.parametrize("data, message", BAD_GRIDS, ids=[m.split(":")[0][:30] for _, m in BAD_GRIDS])
def test_bad_grid_values_are_named_with_what_is_allowed(data, message):
    with pytest.raises(ValueError, match=message):
        sweep.parse_grid(data)


def test_bad_grid_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no grid file"):
        sweep.load_grid_file(tmp_path / "missing.yaml")
    (tmp_path / "g.json").write_text("{}")
    with pytest.raises(ValueError, match=r"suffix '.json'; allowed: .yaml, .yml, .toml"):
        sweep.load_grid_file(tmp_path / "g.json")
    (tmp_path / "bad.toml").write_text("samplers = [")
    with pytest.raises(ValueError, match="cannot parse grid file"):
        sweep.load_grid_file(tmp_path / "bad.toml")
    (tmp_path / "list.yaml").write_text("- threshold\n")
    with pytest.raises(ValueError, match="must hold a mapping at the top level, got list"):
        sweep.load_grid_file(tmp_path / "list.yaml")
    (tmp_path / "twice.yaml").write_text("samplers: [threshold]\nsamplers: [low_confidence]\n")
    with pytest.raises(ValueError, match="cannot parse grid file .*key 'samplers' appears twice"):
        sweep.load_grid_file(tmp_path / "twice.yaml")


def test_command_line_axes_replace_the_files_everywhere(tmp_path):
    from dllm.cli import build_parser

    (tmp_path / "g.yaml").write_text(GRID_YAML)
    args = build_parser().parse_args([
        "sweep", "--grid", str(tmp_path / "g.yaml"), "--out-dir", str(tmp_path / "o"), "--limit", "2",
        "--sampler", "threshold tau=0.7,0.9", "--sampler", "low_confidence tokens_per_step=1,2,4",
        "--sampler", "prophet thresholds=[7.5,5,2.5] base=threshold", "--cache", "dkv-decode refresh=2,4 warmup=1",
        "--block-length", "default,16", "--model", "default", "--pb", "75"])
    g = sweep.grid_from_args(args)
    assert g.settings.limit == 2 and g.settings.tasks == ["waiting_line/copy", "puzzle/*"]
    assert g.settings.levels == (75.0,)
    assert {p.model for p in g.points} == {None} and {p.generation.gen_length for p in g.points} == {None, 32, 64}
    requests = [p.generation for p in g.points]
    assert {r.cache for r in requests} == {"dkv-decode"} and {r.block_length for r in requests} == {None, 16}
    assert {(r.sampler, json.dumps(r.sampler_kwargs, sort_keys=True), r.tokens_per_step) for r in requests} == {
        ("threshold", '{"tau": 0.7}', None), ("threshold", '{"tau": 0.9}', None),
        ("low_confidence", "{}", 1), ("low_confidence", "{}", 2), ("low_confidence", "{}", 4),
        ("prophet", '{"base": "threshold", "thresholds": [7.5, 5, 2.5]}', None)}
    # 6 sampler settings x 2 caches x 2 block lengths x 2 gen lengths, + the sub-grid with its own gen_lengths [64]
    assert len(g.points) == 6 * 2 * 2 * 2 + 6 * 2 * 2 * 1
    for spec, message in [("=0.9", "must start with a name"), ("threshold tau", r"'tau' must look like key=value"),
                          ("threshold tau=[0.9", "cannot read the value of 'tau'"),
                          ("threshold tau=0.8 tau=0.7", "'tau' is given twice; list its values once"),
                          ("low_confidence tokens_per_step=1 tokens-per-step=4", "'tokens_per_step' is given twice")]:
        with pytest.raises(ValueError, match=message):
            sweep.parse_spec(spec, "--sampler")
    bad = build_parser().parse_args(["sweep", "--out-dir", "x", "--sampler", "threshold", "--gen-length", "32,x"])
    with pytest.raises(ValueError, match=r"--gen-length: 'x' is not allowed"):
        sweep.grid_from_args(bad)


def test_the_default_grid_covers_every_sampler_and_cache(capsys):
    path = ROOT / "benchmarks" / "grids" / "default.yaml"
    g = sweep.parse_grid(sweep.load_grid_file(path), str(path))
    from dllm.eval import generators
    from dllm.eval.tasks import GROUPS, select_tasks

    assert {p.model for p in g.points} == {None} and g.settings.data_dir is None
    tasks = select_tasks(g.settings.tasks, generators.generator_tasks())
    assert len(tasks) == 12 and set(tasks) == set(GROUPS["pure"])       # Waiting Line + Puzzle
    settings = {}
    for p in g.points:
        settings.setdefault(p.generation.sampler, set()).add(p.key())
    # Left out: LLaDA2's samplers (block-causal models only) and Dream's own schedules, whose
    # rules the grid runs on LLaDA's schedule (low_confidence, margin_topk, entropy_topk, random).
    left_out = {"llada2", "llada21", "origin", "maskgit_plus", "topk_margin", "entropy", "block_entropy",
                "dream_klass", "dream_dparallel"}
    families = sorted(set(samplers.available()) - left_out)
    assert set(settings) == set(families)
    for name in families:
        assert 3 <= len({k for k in settings[name] if '"cache": "none"' in k}) <= 5, name
    assert {r.tokens_per_step for r in (p.generation for p in g.points)
            if r.sampler == "low_confidence" and r.cache == "none"} == {1, 2, 4, 8}
    assert {p.generation.block_length for p in g.points if p.generation.sampler == "learn2pd"} == {32}
    assert {p.generation.cache for p in g.points} == {"none", "prefix", "dual", "dkv-decode", "dkv-greedy", "vicinity"}
    # The thin entry point lists the same configurations.
    argv = sys.argv
    sys.argv = ["benchmarks/sweep.py", "--grid", str(path), "--out-dir", "unused", "--dry-run"]
    try:
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(ROOT / "benchmarks" / "sweep.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert exit_info.value.code == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{len(g.points)} configuration(s), ") and last.endswith(" distinct run(s)")


def test_dry_run_marks_configurations_that_decode_the_same_run(capsys):
    from dllm.cli import main as cli_main

    code = cli_main(["sweep", "--out-dir", "unused", "--tasks", "waiting_line/copy", "--limit", "1",
                     "--model", "default", "--model", "llada-pb-tiny", "--sampler", "threshold tau=0.9,0.7",
                     "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out == ["default: threshold(tau=0.9)", "default: threshold(tau=0.7)",
                   "llada-pb-tiny: threshold(tau=0.9)  (the same run as default: threshold(tau=0.9))",
                   "llada-pb-tiny: threshold(tau=0.7)  (the same run as default: threshold(tau=0.7))",
                   "4 configuration(s), 2 distinct run(s)"]
    assert cli_main(["sweep", "--out-dir", "unused", "--sampler", "threshold", "--dry-run", "--compare", "d",
                     "--no-plots"]) == 2
    assert "--dry-run lists the configurations and exits; --compare, --no-plots do(es) not apply" in \
        capsys.readouterr().err
    # Without the data (or with tasks that match none) the configurations are listed and the error
    # the run would stop at is named.
    for flags, named in [(["--data-dir", "no/such/data"], "no/such/data"),
                         (["--tasks", "nope/xyz"], "task selection 'nope/xyz' matches none")]:
        code = cli_main(["sweep", "--out-dir", "unused", *flags, "--sampler", "threshold", "--dry-run"])
        out, err = capsys.readouterr()
        assert code == 2 and out.splitlines() == ["threshold", "1 configuration(s)"]
        assert err.startswith("error: ") and named in err
    assert cli_main(["sweep", "--out-dir", "unused", "--device", "bogus", "--sampler", "threshold", "--dry-run"]) == 2
    assert "device 'bogus' is not allowed" in capsys.readouterr().err


# -- Pareto front ---------------------------------------------------------------------------------
def _front_brute_force(points):
    def dominates(a, b):
        return a[0] >= b[0] and a[1] >= b[1] and (a[0] > b[0] or a[1] > b[1])
    return {i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)}


def test_pareto_front_matches_brute_force():
    rng = random.Random(0)
    for trial in range(300):
        n = rng.randint(0, 25)
        coarse = trial % 2 == 0          # small integer grids: many ties and duplicates
        pts = [(float(rng.randint(1, 6)), float(rng.randint(0, 5))) if coarse else
               (rng.uniform(0.5, 16), rng.uniform(0, 100)) for _ in range(n)]
        front = sweep.pareto_front(pts)
        assert set(front) == _front_brute_force(pts), pts
        assert front == sorted(front, key=lambda i: (pts[i][0], i))
        ys = [pts[i][1] for i in front]
        assert all(a >= b for a, b in itertools.pairwise(ys))   # along the front, accuracy only falls
    assert sweep.pareto_front([(1, 50), (2, 50), (2, 50), (4, 10)]) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"point 1 = \(nan, 3\) is not finite"):
        sweep.pareto_front([(1, 2), (float("nan"), 3)])


def test_best_configuration_per_level():
    s = [{"label": "a", "average": 90.0, "tokens_per_forward": 1.0},
         {"label": "b", "average": 75.0, "tokens_per_forward": 3.0, "tokens_per_second": 10.0},
         {"label": "c", "average": 75.0, "tokens_per_forward": 3.0, "tokens_per_second": 20.0},
         {"label": "d", "average": 60.0, "tokens_per_forward": 8.0},
         {"label": "e", "average": None, "tokens_per_forward": 16.0}]
    got = [(x, b["label"] if b else None) for x, b in sweep.best_per_level(s, (95, 80, 70, 60))]
    assert got == [(95, None), (80, "a"), (70, "c"), (60, "d")]


# -- running --------------------------------------------------------------------------------------
def _check_png(path):
    from matplotlib import image

    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 10_000, (path, len(data))            # axes, points and text, not a blank canvas
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert pixels[..., :3].std() > 0.05                     # not a single colour


def test_small_grid_rows_summaries_plots_report_and_skipped_failures(model_dir, tmp_path, capsys):
    spec = {
        "tasks": "waiting_line/copy,waiting_line/reverse", "limit": 2, "batch_size": 2, "dtype": "float32",
        "gen_lengths": [8], "models": [str(model_dir)], "levels": [80, 0],
        "samplers": [{"name": "low_confidence", "tokens_per_step": [2, 4, 3]},
                     {"name": "threshold", "args": {"tau": 0.9}},
                     {"name": "learn2pd", "block_lengths": [8]}],
        "caches": ["none"],
        "grids": [{}, {"samplers": [{"name": "threshold", "args": {"tau": 0.9}}], "caches": ["dual"]}]}
    with pytest.raises(ValueError, match=r"configuration low_confidence k=3 gen=8: tokens_per_step 3 does not divide "
                                         r"gen_length 8"):
        sweep.parse_grid(spec)                               # a given length is checked before any load
    spec["samplers"][0]["tokens_per_step"] = [2, 4]
    grid = sweep.parse_grid(spec)
    labels = [p.label for p in grid.points]
    assert labels == ["low_confidence k=2 gen=8", "low_confidence k=4 gen=8",
                      "threshold(tau=0.9) gen=8", "learn2pd blk=8 gen=8", "threshold(tau=0.9) +dual gen=8"]
    out = tmp_path / "sweep"
    result = sweep.run_sweep(grid, out)
    err = capsys.readouterr().err
    assert "sweep:" in err and "/20" in err              # one bar over 5 configurations x 4 samples
    assert "skipped learn2pd blk=8 gen=8: sampler 'learn2pd' needs a trained filter" in err

    rows = _lines(out / sweep.ROWS_FILE)
    ok = ["low_confidence k=2 gen=8", "low_confidence k=4 gen=8", "threshold(tau=0.9) gen=8",
          "threshold(tau=0.9) +dual gen=8"]
    assert len(rows) == 4 * 4 and len({r["run_id"] for r in rows}) == 4
    assert {(r["task"], r["index"]) for r in rows} == {(t, i) for t in ("waiting_line/copy", "waiting_line/reverse")
                                                       for i in range(2)}
    assert {r["data_mode"] for r in rows} == {"generated"} and {r["gen_length_used"] for r in rows} == {8}
    summaries = _lines(out / sweep.SUMMARIES_FILE)
    assert [s["label"] for s in summaries] == labels and [s["label"] for s in result.summaries] == labels
    by_label = {s["label"]: s for s in summaries}
    assert {s["label"] for s in summaries if s["status"] == "ok"} == set(ok)
    failed = by_label["learn2pd blk=8 gen=8"]
    assert failed["status"] == "failed" and "dllm train-filter" in failed["error"]
    for label in ok:
        s = by_label[label]
        mine = [r for r in rows if r["run_id"] == s["run_id"]]
        assert s["kind"] == "summary" and s["samples"] == 4 and s["tasks"] == ["waiting_line/copy",
                                                                                  "waiting_line/reverse"]
        for task in s["tasks"]:
            scores = [r["score"] for r in mine if r["task"] == task]
            assert s["accuracy"][task] == pytest.approx(100 * sum(scores) / len(scores))
        assert s["average"] == pytest.approx(sum(s["accuracy"].values()) / 2)
        assert s["tokens_per_forward"] == pytest.approx(sum(r["tokens_per_forward"] for r in mine) / 4)
        assert s["forwards"] == sum(r["nfe"] for r in mine) and s["nfe"] == pytest.approx(s["forwards"] / 4)
        assert s["tokens_per_second"] > 0 and s["seconds"] > 0 and s["hardware"]["world_size"] == 1
        assert {"torch", "dllm"} <= set(s["versions"]) and s["timestamp"]
    # The sweep knows each run id before loading the model (that is how finished configurations are skipped).
    from dllm.eval import runner
    dataset = runner.load_dataset(grid.points[0].bench_config(grid.settings))
    for p in grid.points:
        assert sweep.expected_run_id(p, grid.settings, dataset) == by_label[p.label]["run_id"]
    assert by_label["low_confidence k=4 gen=8"]["tokens_per_forward"] == 4.0
    assert by_label["low_confidence k=4 gen=8"]["nfe"] == 2.0

    for name in (sweep.PLOT_TPF, sweep.PLOT_TPS, sweep.PLOT_TASKS):
        _check_png(out / name)
    report = (out / sweep.REPORT_FILE).read_text()
    assert report == result.report
    assert "| configuration | average | tokens/forward | tokens/s | NFE | copy | reverse |" in report
    for label in ok:
        assert f"| {label}" in report
    table = [line for line in report.splitlines() if line.startswith("| low_confidence k=4 gen=8")]
    assert len(table) == 1 and "| 4.00 |" in table[0] and table[0].split("|")[1].strip().endswith("*")
    assert "| PB@80 | PB@0 |" in report and "## Best configuration per accuracy level" in report
    assert "- average >= 0: **low_confidence k=4 gen=8**: 4.00 tokens/forward" in report
    assert "## Failed configurations" in report and "- learn2pd blk=8 gen=8: sampler 'learn2pd' needs" in report
    # An average over fewer tasks than the run's says so (a Text Writing task without a grammar checker).
    partly = {**by_label["low_confidence k=4 gen=8"], "tasks_scored": 1}
    row = [line for line in sweep.markdown_report([partly], [80]).splitlines() if line.startswith("| low_conf")]
    assert row[0].split("|")[2].strip() == f"{partly['average']:.1f} (1 of 2 tasks scored)"

    # Run again: nothing is generated, no summary is duplicated, failures are retried and reported again.
    before = (out / sweep.ROWS_FILE).read_bytes()
    again = sweep.run_sweep(grid, out, progress=False, plots=False)
    assert (out / sweep.ROWS_FILE).read_bytes() == before
    assert [s["summary_id"] for s in _lines(out / sweep.SUMMARIES_FILE)] == [s["summary_id"] for s in summaries]
    finished = [s for s in summaries if s["status"] == "ok"]
    assert [s for s in _lines(out / sweep.SUMMARIES_FILE) if s["status"] == "ok"] == finished    # untouched
    assert again.report.split("## Configurations")[1] == result.report.split("## Configurations")[1]
    # The report names the configurations as this grid labels them, not as the stored summaries do.
    for p in grid.points:
        p.label = "renamed " + p.label
    renamed = sweep.run_sweep(grid, out, progress=False, plots=False, report_only=True)
    assert {s["label"] for s in renamed.summaries} == {"renamed " + label for label in labels}
    assert "| renamed low_confidence k=4 gen=8 *" in renamed.report
    # A configuration whose stored rows came from other prompts (edited data) is decoded again.
    stored = _lines(out / sweep.ROWS_FILE)
    first = stored[0]["run_id"]
    (out / sweep.ROWS_FILE).write_text("".join(
        json.dumps({**r, "prompt_id": "other"} if r["run_id"] == first else r) + "\n" for r in stored))
    sweep.run_sweep(grid, out, progress=False, plots=False)
    redone = _lines(out / sweep.ROWS_FILE)
    assert len(redone) == len(stored) + 4 and {r["run_id"] for r in redone[len(stored):]} == {first}


GRID_FOR_PROCESSES = """\
tasks: [waiting_line/copy, waiting_line/reverse]
limit: 2
batch_size: 1
dtype: float32
gen_lengths: [8]
models: [{model}]
samplers:
  - {{name: low_confidence, tokens_per_step: [2]}}
  - {{name: threshold, args: {{tau: 0.8}}}}
caches: [none]
grids:
  - {{}}
  - {{samplers: [{{name: low_confidence, tokens_per_step: 4}}], caches: [dual]}}
"""


@pytest.fixture(scope="module")
def grid_file(model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("grid") / "grid.yaml"
    path.write_text(GRID_FOR_PROCESSES.format(model=model_dir))
    return path


@pytest.fixture(scope="module")
def reference(grid_file, tmp_path_factory):
    """An uninterrupted single-process sweep of `grid_file`."""
    out = tmp_path_factory.mktemp("ref")
    sweep.run_sweep(sweep.parse_grid(sweep.load_grid_file(grid_file)), out, progress=False, plots=False)
    return _lines(out / sweep.ROWS_FILE), _lines(out / sweep.SUMMARIES_FILE)


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    env.pop("WORLD_SIZE", None)
    return env


def test_sigkill_mid_sweep_then_resume_loses_and_duplicates_nothing(grid_file, reference, tmp_path):
    ref_rows, ref_summaries = reference
    assert len(ref_rows) == 3 * 4 and len(ref_summaries) == 3
    out = tmp_path / "killed"
    rows_path = out / sweep.ROWS_FILE
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "sweep", "--grid", str(grid_file), "--out-dir",
                             str(out), "--no-progress", "--no-plots"], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if rows_path.exists() and rows_path.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = rows_path.read_bytes().count(b"\n")
    assert 2 <= partial < len(ref_rows)
    # Restart: the stored rows are kept, the rest is generated, nothing twice.
    sweep.run_sweep(sweep.parse_grid(sweep.load_grid_file(grid_file)), out, progress=False, plots=False)
    rows = _lines(rows_path)
    assert [(r["run_id"], r["task"], r["index"]) for r in rows] == \
        [(r["run_id"], r["task"], r["index"]) for r in ref_rows]
    assert _strip_rows(rows) == _strip_rows(ref_rows)
    summaries = _lines(out / sweep.SUMMARIES_FILE)
    assert _strip_summaries(summaries) == _strip_summaries(ref_summaries)


def test_two_processes_store_what_one_stores(grid_file, reference, tmp_path):
    pytest.importorskip("accelerate")
    ref_rows, ref_summaries = reference
    out = tmp_path / "two"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "dllm.cli", "sweep", "--grid", str(grid_file), "--out-dir", str(out),
                          "--no-progress"], env=_env(), capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _lines(out / sweep.ROWS_FILE)
    assert {r["hardware"]["world_size"] for r in rows} == {2}
    assert _strip_rows(rows) == _strip_rows(ref_rows)
    summaries = _lines(out / sweep.SUMMARIES_FILE)
    assert {s["hardware"]["world_size"] for s in summaries} == {2}
    assert _strip_summaries(summaries) == _strip_summaries(ref_summaries)
    assert res.stdout.count("# Sweep report") == 1           # only the main process reports
    for name in (sweep.PLOT_TPF, sweep.PLOT_TPS, sweep.PLOT_TASKS):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [sweep.ROWS_FILE, sweep.SUMMARIES_FILE, sweep.REPORT_FILE, sweep.PLOT_TPF, sweep.PLOT_TPS, sweep.PLOT_TASKS])


def test_compare_with_tasks_the_leaderboard_lacks_fails_before_decoding(tmp_path):
    figures = tmp_path / "figures" / "llada15"
    figures.mkdir(parents=True)
    (figures / "confidence-topk.csv").write_text("task,tps,accuracy\nwaitingline-copy,1.0,90.0\navg,1.0,90.0\n")
    grid = sweep.parse_grid({"tasks": "waiting_line_n15/copy", "limit": 1, "samplers": ["threshold"]})
    with pytest.raises(ValueError, match=r"--compare .*: task 'waiting_line_n15/copy' has no leaderboard id"):
        sweep.run_sweep(grid, tmp_path / "o", progress=False, plots=False, compare=str(tmp_path / "figures"))
    assert not (tmp_path / "o" / sweep.ROWS_FILE).exists()
    (tmp_path / "afile").write_text("")
    with pytest.raises(FileNotFoundError, match=r"leaderboard folder .*afile' is a file, not a folder"):
        sweep.run_sweep(grid, tmp_path / "o", progress=False, plots=False, compare=str(tmp_path / "afile"))
    grid = sweep.parse_grid({"tasks": "waiting_line/copy", "limit": 1, "samplers": ["threshold"]})
    with pytest.raises(ValueError, match=r"--out-dir .*afile' is a file; give a folder"):
        sweep.run_sweep(grid, tmp_path / "afile", progress=False, plots=False)


def test_report_only_needs_the_sweeps_summaries(tmp_path):
    from dllm.cli import build_parser

    args = build_parser().parse_args(["sweep", "--out-dir", str(tmp_path / "o"), "--sampler", "low_confidence",
                                      "--tasks", "waiting_line/copy", "--limit", "1", "--report-only"])
    grid = sweep.grid_from_args(args)
    with pytest.raises(FileNotFoundError, match=r"--report-only: no summaries.jsonl in .*'; give the --out-dir"):
        sweep.run_sweep(grid, tmp_path / "o", report_only=True, progress=False, plots=False)
    assert not (tmp_path / "o").exists()
    (tmp_path / "s").mkdir()
    other = {"kind": "summary", "version": sweep.SUMMARY_VERSION, "summary_id": "0123456789abcdef", "status": "ok"}
    (tmp_path / "s" / sweep.SUMMARIES_FILE).write_text(json.dumps(other) + "\n")
    (tmp_path / "s" / "report.md").write_text("kept")
    with pytest.raises(ValueError, match=r"none of this grid's 1 configuration\(s\) is among the 1 summarized"):
        sweep.run_sweep(grid, tmp_path / "s", report_only=True, progress=False, plots=False)
    assert (tmp_path / "s" / "report.md").read_text() == "kept"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_device_fails_the_sweep_once_before_any_configuration(tmp_path):
    from dllm.cli import build_parser

    args = build_parser().parse_args(["sweep", "--out-dir", str(tmp_path / "o"), "--sampler", "low_confidence",
                                      "--tasks", "waiting_line/copy", "--limit", "1", "--device", "cuda"])
    with pytest.raises(ValueError, match="CUDA is not available on this machine"):
        sweep.run_sweep(sweep.grid_from_args(args), tmp_path / "o", progress=False, plots=False)
    assert not (tmp_path / "o" / sweep.SUMMARIES_FILE).exists()


def test_a_sweep_with_a_bertscore_model_knows_its_run_ids(model_dir, tmp_path, monkeypatch):
    """The sweep computes the run id the runner gives, text scorers included, so a rerun skips."""
    import warnings

    from dllm.eval import data

    use_fixed_bertscore(monkeypatch)
    folder = data.write_official_layout(tmp_path / "d", PARAPHRASE_RECORDS)
    grid = sweep.parse_grid({"data_dir": str(folder), "bertscore_model": "roberta", "gen_lengths": [8],
                             "dtype": "float32", "models": [str(model_dir)], "samplers": ["low_confidence"]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = sweep.run_sweep(grid, tmp_path / "out", progress=False, plots=False).summaries[0]
        again = sweep.run_sweep(grid, tmp_path / "out", progress=False, plots=False).summaries[0]
    assert not [w for w in caught if "run id" in str(w.message)]   # "the runner gave run id ..., the sweep expected"
    assert first["status"] == again["status"] == "ok" and first["run_id"] == again["run_id"]
    assert len(_lines(tmp_path / "out" / sweep.ROWS_FILE)) == 1


def test_plot_titles_count_the_configurations_drawn_and_labels_say_log2_only_on_log_axes(tmp_path, monkeypatch):
    from matplotlib.figure import Figure as MplFigure

    figures = []
    savefig = MplFigure.savefig
    monkeypatch.setattr(MplFigure, "savefig", lambda fig, *a, **k: (figures.append(fig), savefig(fig, *a, **k))[1])
    base = {"status": "ok", "cache": "none", "average": 50.0, "accuracy": {"waiting_line/copy": 50.0}}
    summaries = [{**base, "label": "a", "sampler": "threshold", "tokens_per_forward": 0.0, "tokens_per_second": 3.0,
                  "per_task": [{"task": "waiting_line/copy", "tokens_per_forward": 0.0}]},
                 {**base, "label": "b", "sampler": "factor", "tokens_per_forward": 2.0, "tokens_per_second": None,
                  "per_task": [{"task": "waiting_line/copy", "tokens_per_forward": 2.0}]}]
    sweep.write_plots(summaries, tmp_path)
    tpf, tps = (fig.axes[0] for fig in figures[:2])
    assert tpf.get_title().endswith("2 configurations") and tpf.get_xlabel() == "tokens per forward"
    assert tps.get_title().endswith("1 configurations") and tps.get_xlabel() == "tokens per second (log2)"
    assert figures[2]._supxlabel.get_text() == "tokens per forward"


@pytest.mark.parametrize("count", [3, 10, 22, 40])
def test_every_sampler_in_a_plot_gets_its_own_colour(count):
    """Up to 40 samplers, each drawn in a colour no other one has (the default grid holds 22)."""
    from dllm.sweep.plots import sampler_styles
    styles = sampler_styles([f"s{i}" for i in range(count)])
    assert len({colour for colour, _ in styles.values()}) == count


def test_a_configuration_failing_on_another_process_is_skipped_here_too(grid_file, tmp_path, monkeypatch):
    """A configuration whose model or preflight fails on one process only is skipped on every
    process (this one would otherwise start its decode and wait for the other for ever)."""
    import dllm.sweep.run as sweep_run
    from dllm.distributed import Distributed

    class OtherFails(Distributed):
        def first_failure(self, failure):
            return failure or "process 1: ValueError: boom"
    monkeypatch.setattr(sweep_run, "Distributed", OtherFails)
    monkeypatch.setattr(sweep_run.runner, "run_bench", lambda *a, **k: pytest.fail("decoded a skipped configuration"))
    out = tmp_path / "o"
    sweep.run_sweep(sweep.parse_grid(sweep.load_grid_file(grid_file)), out, progress=False, plots=False)
    summaries = _lines(out / sweep.SUMMARIES_FILE)
    assert summaries and all(s["status"] == "failed" and s["error"] == "process 1: ValueError: boom"
                             for s in summaries)
