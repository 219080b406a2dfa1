"""`benchmarks/bench_peers.py` without the peer: the random checkpoint it writes loads back with the
logits of the model it was built from, its prompts avoid the special ids, and a missing peer
checkout (Fast-dLLM, LLaDA), model code or peer interpreter is a clear error, on both sides of the
subprocess."""
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import dllm
from dllm.models.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    yield _module("bench_peers_under_test", ROOT / "benchmarks" / "bench_peers.py")
    sys.modules.pop("bench_peers_under_test", None)


@pytest.fixture(scope="module")
def driver():
    yield _module("peer_driver_under_test", ROOT / "benchmarks" / "peers" / "driver.py")
    sys.modules.pop("peer_driver_under_test", None)


def _without_tokenizer_ids(cfg):
    """`cfg` less the ids a checkpoint's tokenizer gives (no tokenizer is written)."""
    return dataclasses.replace(cfg, eot_token_id=None, bos_token_id=None)


@pytest.mark.parametrize("preset, architecture", [("llada-tiny", "LLaDAModelLM"), ("dream-tiny", "DreamModel")])
def test_written_checkpoint_loads_back_with_equal_logits(bench, tmp_path, preset, architecture):
    cfg = dllm.ModelConfig.from_name(preset)
    folder = bench.write_checkpoint(cfg, tmp_path / "ckpt", seed=3)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == [architecture] and raw["mask_token_id"] == cfg.mask_token_id
    loaded = load_model(folder, dtype="float32")
    assert _without_tokenizer_ids(loaded.config) == _without_tokenizer_ids(cfg)
    built = dllm.build_model(cfg, seed=3)
    x = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(x), built(x))


def test_a_written_dream_config_has_the_published_keys(bench, tmp_path):
    from tests.fixtures.checkpoints import dream_config
    cfg = dllm.ModelConfig.from_name("dream-7b")
    written = dllm.models.dream.config_to_hf(cfg, torch_dtype="bfloat16")   # the 7B model itself is not built
    assert set(written) == set(dream_config()) - {"transformers_version"}
    assert (written["hidden_size"], written["num_hidden_layers"], written["num_key_value_heads"],
            written["intermediate_size"], written["vocab_size"], written["mask_token_id"]) == (
        3584, 28, 4, 18944, 152064, 151666)
    assert _without_tokenizer_ids(dllm.models.dream.config_from_hf(written)) == _without_tokenizer_ids(cfg)
    with pytest.raises(ValueError, match="a Dream config.json describes.*family 'llada'"):
        dllm.models.dream.config_to_hf(dllm.ModelConfig.from_name("llada-tiny"))


def test_prompts_avoid_special_ids_and_are_seeded(bench):
    cfg = dllm.ModelConfig.from_name("llada-tiny")
    prompts = bench.make_prompts(cfg, 3, 50, seed=1)
    special = min(cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id, cfg.eot_token_id)
    assert len(prompts) == 3 and all(len(p) == 50 and max(p) < special for p in prompts)
    assert prompts == bench.make_prompts(cfg, 3, 50, seed=1) != bench.make_prompts(cfg, 3, 50, seed=2)


def test_first_difference(bench):
    assert bench.first_difference([[1, 2, 3]], [[1, 2, 3]]) == (None, None, 0)
    assert bench.first_difference([[1, 2], [5, 6, 7]], [[1, 2], [5, 0, 0]]) == (1, 1, 2)


def _fastdllm_checkout(folder: Path) -> Path:
    (folder / "llada" / "model").mkdir(parents=True)
    (folder / "llada" / "generate.py").write_text("")
    (folder / "llada" / "model" / "modeling_llada.py").write_text("")
    return folder


def test_missing_checkout_and_peer_python_are_clear_errors(bench, tmp_path):
    with pytest.raises(FileNotFoundError, match="no Fast-dLLM checkout given: pass --fastdllm DIR"):
        bench.check_peers(["dual"], None, None, "python")
    with pytest.raises(FileNotFoundError, match=r"nowhere has no llada/generate.py"):
        bench.check_peers(["dual"], str(tmp_path / "nowhere"), None, sys.executable)
    checkout = _fastdllm_checkout(tmp_path / "fd")
    missing = tmp_path / "venv" / "bin" / "python"
    with pytest.raises(FileNotFoundError, match=rf"no peer Python at {missing}.*setup_env.sh {tmp_path / 'venv'}"):
        bench.check_peers(["dual"], str(checkout), None, str(missing))
    assert bench.check_peers(["dual"], str(checkout), None, sys.executable) == (
        {"fastdllm": checkout.resolve()}, Path(sys.executable))
    # before any model is built: main fails on the missing checkout at once
    with pytest.raises(FileNotFoundError, match="nowhere"):
        bench.main(["--fastdllm", str(tmp_path / "nowhere"), "--quick", "--workdir", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


def test_llada_configuration_needs_its_checkout_and_model_code(bench, tmp_path):
    assert bench.CONFIGS["llada"]["llada"].peer == "llada" and bench.CONFIGS["llada"]["llada"].score_dtype == "logits"
    assert bench.dllm_request("llada", bench.parse_args(["--configs", "llada"]))["sampler"] == "low_confidence"
    with pytest.raises(FileNotFoundError, match="no LLaDA checkout given: pass --llada DIR.*ML-GSAI/LLaDA"):
        bench.check_peers(["llada"], None, None, sys.executable)
    with pytest.raises(FileNotFoundError, match=r"LLaDA checkout .*nowhere has no generate.py"):
        bench.check_peers(["llada"], None, str(tmp_path / "nowhere"), sys.executable)
    llada = tmp_path / "llada"
    llada.mkdir()
    (llada / "generate.py").write_text("")
    fastdllm = _fastdllm_checkout(tmp_path / "fd")
    assert bench.check_peers(["llada"], None, str(llada), sys.executable)[0] == {"llada": llada.resolve()}
    # a Fast-dLLM checkout given alongside is checked and passed on, as the model's code
    assert bench.check_peers(["llada"], str(fastdllm), str(llada), sys.executable)[0] == {
        "fastdllm": fastdllm.resolve(), "llada": llada.resolve()}
    # without Fast-dLLM's class, the checkpoint must bring its own remote code
    with pytest.raises(FileNotFoundError, match="needs model code: pass --fastdllm DIR.*a random preset"):
        bench.check_peer_model({"llada": llada}, None)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(FileNotFoundError, match="modeling_llada.py"):
        bench.check_peer_model({"llada": llada}, str(ckpt))
    (ckpt / "modeling_llada.py").write_text("")
    bench.check_peer_model({"llada": llada}, str(ckpt))
    bench.check_peer_model({"fastdllm": fastdllm, "llada": llada}, None)


def test_a_peer_commit_comes_from_git_or_an_exported_trees_commit_file(bench, tmp_path):
    assert bench.peer_commit(tmp_path, None) == "unknown"
    (tmp_path / "COMMIT").write_text("24cc59e75f20a6384bae8c905965bb090b96388e\n")
    assert bench.peer_commit(tmp_path, None) == "24cc59e75f20a6384bae8c905965bb090b96388e"


def test_variants_are_parsed(bench):
    assert bench.parse_args(["--variants", "eager, compile"]).variants == ["eager", "compile"]
    assert bench.parse_args([]).variants == ["eager"]


@pytest.mark.parametrize("argv, message", [
    (["--configs", "threshold,nope"], "unknown configuration"),
    (["--gen-length", "100", "--block-length", "32"], "does not divide"),
    (["--configs", "low_confidence", "--steps", "12"], "not a multiple of the 8 blocks"),
    (["--configs", "dual,llada", "--steps", "12"], r"not a multiple of the 8 blocks \(llada: the peers"),
    (["--threshold", "1.5"], r"\[0, 1\]"),
    (["--variants", "eager,fast"], "unknown variant.*fast.*eager, graphs, compile, graphs\\+compile"),
    (["--variants", "graphs", "--device", "cpu"], "CUDA graphs need --device cuda"),
])
def test_bad_arguments(bench, argv, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_args(argv)


@pytest.mark.parametrize("peer_args, functions, message", [
    ([], ["generate"], "no peer checkout given: pass --fastdllm DIR, --llada DIR or both"),
    (["--fastdllm", "nowhere"], ["generate"], "nowhere/llada/generate.py not found"),
    (["--llada", "nowhere"], [{"name": "llada", "peer": "llada", "function": "generate"}],
     "nowhere/generate.py not found: --llada must be a checkout of https://github.com/ML-GSAI/LLaDA"),
])
def test_driver_names_a_missing_checkout(driver, tmp_path, capsys, peer_args, functions, message):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"prompts": [[1]], "gen_length": 4, "block_length": 4, "steps": 4,
                                   "functions": functions, "mask_id": 3}))
    peer_args = [str(tmp_path / a) if a == "nowhere" else a for a in peer_args]
    with pytest.raises(SystemExit) as exit_info:
        driver.main([*peer_args, "--checkpoint", str(ckpt), "--request", str(request),
                     "--out", str(tmp_path / "out.json")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_driver_without_fastdllm_needs_the_checkpoints_model_code(driver, tmp_path, capsys):
    llada = tmp_path / "llada"
    llada.mkdir()
    (llada / "generate.py").write_text("def generate(model, prompt, steps=1):\n    return prompt\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"prompts": [[1]], "gen_length": 4, "block_length": 4, "steps": 4,
                                   "functions": [{"name": "llada", "peer": "llada", "function": "generate"}],
                                   "mask_id": 3}))
    with pytest.raises(SystemExit) as exit_info:
        driver.main(["--llada", str(llada), "--checkpoint", str(ckpt), "--request", str(request),
                     "--out", str(tmp_path / "out.json")])
    assert exit_info.value.code == 2
    assert "holds no remote modeling code (modeling_llada.py): pass --fastdllm DIR" in capsys.readouterr().err


def test_prompt_ids_file_is_checked(bench, tmp_path):
    cfg = dllm.ModelConfig.from_name("llada-tiny")
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([[1, 2, 3], [4, 5]]))
    assert bench.read_prompt_ids(path, cfg) == [[1, 2, 3], [4, 5]]
    path.write_text(json.dumps([[1, cfg.mask_token_id]]))
    with pytest.raises(ValueError, match="other than the mask id"):
        bench.read_prompt_ids(path, cfg)
    path.write_text(json.dumps([]))
    with pytest.raises(ValueError, match="non-empty JSON list"):
        bench.read_prompt_ids(path, cfg)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        bench.read_prompt_ids(tmp_path / "missing.json", cfg)


def test_a_dream_run_takes_dreams_configurations_and_steps(bench, tmp_path):
    args = bench.parse_args(["--preset", "dream-tiny", "--gen-length", "64", "--block-length", "16"])
    assert (args.family, args.configs) == ("dream", ["threshold", "prefix", "dual"])
    # Fast-dLLM's Dream scripts: gen_length / block_length steps for the threshold loops, gen_length for entropy
    assert [bench.config_steps(c, args) for c in ("threshold", "dual", "entropy", "entropy_prefix")] == [4, 4, 64, 64]
    assert bench.dllm_request("entropy", args) == dict(gen_length=64, sampler="entropy", cache="none",
                                                       score_dtype="logits", temperature=0.0, steps=64)
    assert bench.dllm_request("entropy_dual", args)["sampler"] == "block_entropy"
    assert bench.dllm_request("threshold", args) == dict(
        gen_length=64, sampler="budget_threshold", cache="none", score_dtype="logits", temperature=0.0, steps=4,
        sampler_kwargs={"threshold": 0.9})
    assert bench.dllm_request("dual", args)["sampler_kwargs"] == {"tau": 0.9, "commit_block_start": True}
    assert bench.CONFIGS["dream"]["dual"].peer_options == {"use_cache": True, "dual_cache": True}
    model = dllm.build_model(dllm.ModelConfig.from_name("dream-tiny"), seed=0)
    for name in bench.CONFIGS["dream"]:      # every request is one dllm runs
        out = dllm.generate(model, None, [[5, 6, 7]], **bench.dllm_request(name, args))
        assert out.generated.shape == (1, 64) and out.forwards > 0
    folder = bench.write_checkpoint(dllm.ModelConfig.from_name("dream-tiny"), tmp_path / "dream")
    assert bench.parse_args(["--checkpoint", str(folder), "--quick"]).family == "dream"
    # each peer function's own assertion only: the loop without blocks needs steps dividing gen_length,
    # the block loops steps a multiple of the blocks
    small = ["--preset", "dream-tiny", "--gen-length", "64", "--block-length", "16"]
    assert bench.parse_args([*small, "--configs", "threshold", "--steps", "2"]).steps == 2
    assert bench.parse_args([*small, "--configs", "prefix,dual", "--steps", "12"]).steps == 12
    assert bench.parse_args(["--quick", "--configs", "low_confidence", "--steps", "8"]).steps == 8


@pytest.mark.parametrize("argv, error, message", [
    (["--preset", "dream-tiny", "--configs", "dual,llada"], ValueError,
     "unknown configuration.*llada for a dream checkpoint; valid: threshold, prefix, dual"),
    (["--preset", "dream-tiny", "--configs", "prefix,dual", "--steps", "12"], ValueError,
     r"--steps 12 is not a multiple of the 8 blocks \(prefix: the peers assert it\)"),
    (["--preset", "dream-tiny", "--configs", "entropy_prefix", "--steps", "8"], ValueError,
     "--steps 8 gives fewer than 2 per block over the 8 blocks"),
    (["--preset", "dream-tiny", "--steps", "24", "--gen-length", "256"], ValueError,
     "--steps 24 does not divide --gen-length 256"),
    (["--preset", "llada-moe-tiny"], ValueError, "llada-moe-tiny is a llada-moe model; the peers' code runs llada and "
                                                 "dream models"),
    (["--checkpoint", "/nowhere/ckpt"], FileNotFoundError, "no config.json in --checkpoint /nowhere/ckpt"),
    (["--preset", "dream-tiny", "--gen-length", "16", "--block-length", "32"], ValueError,
     "--block-length 32 does not divide --gen-length 16"),
])
def test_bad_family_arguments(bench, argv, error, message):
    with pytest.raises(error, match=message):
        bench.parse_args(argv)


def test_a_dream_run_needs_fastdllms_dream_code(bench, driver, tmp_path, capsys):
    checkout = _fastdllm_checkout(tmp_path / "fd")       # llada/ only
    with pytest.raises(FileNotFoundError, match=r"fd has no dream/model/modeling_dream.py.*holds dream/model"):
        bench.check_peers(["dual"], str(checkout), None, sys.executable, "dream")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    request = tmp_path / "req.json"
    (tmp_path / "llada").mkdir()
    (tmp_path / "llada" / "generate.py").write_text("")
    for peer_args, message in ((["--llada", str(tmp_path / "llada")],
                                "a Dream request runs Fast-dLLM's Dream code: pass --fastdllm DIR"),
                               (["--fastdllm", str(checkout)], "dream/model/modeling_dream.py not found")):
        request.write_text(json.dumps({"family": "dream", "prompts": [[1]], "gen_length": 4, "block_length": 4,
                                       "steps": 1, "functions": ["diffusion_generate"], "mask_id": 3}))
        with pytest.raises(SystemExit):
            driver.main([*peer_args, "--checkpoint", str(ckpt), "--request", str(request),
                         "--out", str(tmp_path / "out.json")])
        assert message in capsys.readouterr().err


def test_the_peer_forward_is_counted_and_never_proposes_the_mask_token(driver):
    class Output:
        def __init__(self, logits):
            self.logits = logits

    class Model(torch.nn.Module):
        def forward(self, x):
            return Output(torch.zeros(1, x.shape[1], 8))

    model = Model()
    counter = driver.ForwardCounter(model, cap=2, mask_id=5)
    logits = model(torch.zeros(1, 3, dtype=torch.long)).logits
    assert counter.calls == 1 and torch.isneginf(logits[..., 5]).all() and (logits[..., :5] == 0).all()
    model(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="more than 2 forwards for one prompt"):
        model(torch.zeros(1, 3, dtype=torch.long))


def test_a_dream_request_without_a_threshold_is_named(driver, capsys):
    with pytest.raises(SystemExit):
        driver.dream_call({"name": "dual", "use_cache": True}, {"threshold": None, "gen_length": 8, "steps": 1}, {})
    assert "dual: Fast-dLLM's Dream loops run alg confidence_threshold and need a threshold, got None" in \
        capsys.readouterr().err
