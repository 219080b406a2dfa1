"""`benchmarks/bench_peers.py` without the peer: the random checkpoint it writes loads back with the
logits of the model it was built from, its prompts avoid the special ids, and a missing Fast-dLLM
checkout or peer interpreter is a clear error, on both sides of the subprocess."""
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
    yield _module("fastdllm_driver_under_test", ROOT / "benchmarks" / "peers" / "fastdllm_driver.py")
    sys.modules.pop("fastdllm_driver_under_test", None)


def test_written_checkpoint_loads_back_with_equal_logits(bench, tmp_path):
    cfg = dllm.ModelConfig.from_name("llada-tiny")
    folder = bench.write_checkpoint(cfg, tmp_path / "ckpt", seed=3)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["LLaDAModelLM"] and raw["mask_token_id"] == cfg.mask_token_id
    loaded = load_model(folder, dtype="float32")
    built = dllm.build_model(cfg, seed=3)
    x = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(x), built(x))


def test_prompts_avoid_special_ids_and_are_seeded(bench):
    cfg = dllm.ModelConfig.from_name("llada-tiny")
    prompts = bench.make_prompts(cfg, 3, 50, seed=1)
    special = min(cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id, cfg.eot_token_id)
    assert len(prompts) == 3 and all(len(p) == 50 and max(p) < special for p in prompts)
    assert prompts == bench.make_prompts(cfg, 3, 50, seed=1) != bench.make_prompts(cfg, 3, 50, seed=2)


def test_first_difference(bench):
    assert bench.first_difference([[1, 2, 3]], [[1, 2, 3]]) == (None, None, 0)
    assert bench.first_difference([[1, 2], [5, 6, 7]], [[1, 2], [5, 0, 0]]) == (1, 1, 2)


def test_missing_checkout_and_peer_python_are_clear_errors(bench, tmp_path):
    with pytest.raises(FileNotFoundError, match="--fastdllm DIR"):
        bench.check_peer(None, "python")
    with pytest.raises(FileNotFoundError, match=r"nowhere has no llada/generate.py"):
        bench.check_peer(str(tmp_path / "nowhere"), sys.executable)
    checkout = tmp_path / "fd"
    (checkout / "llada" / "model").mkdir(parents=True)
    (checkout / "llada" / "generate.py").write_text("")
    (checkout / "llada" / "model" / "modeling_llada.py").write_text("")
    missing = tmp_path / "venv" / "bin" / "python"
    with pytest.raises(FileNotFoundError, match=rf"no peer Python at {missing}.*setup_env.sh {tmp_path / 'venv'}"):
        bench.check_peer(str(checkout), str(missing))
    assert bench.check_peer(str(checkout), sys.executable) == (checkout.resolve(), Path(sys.executable))
    # before any model is built: main fails on the missing checkout at once
    with pytest.raises(FileNotFoundError, match="nowhere"):
        bench.main(["--fastdllm", str(tmp_path / "nowhere"), "--quick", "--workdir", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


def test_variants_are_parsed(bench):
    assert bench.parse_args(["--variants", "eager, compile"]).variants == ["eager", "compile"]
    assert bench.parse_args([]).variants == ["eager"]


@pytest.mark.parametrize("argv, message", [
    (["--configs", "threshold,nope"], "unknown configuration"),
    (["--gen-length", "100", "--block-length", "32"], "does not divide"),
    (["--configs", "low_confidence", "--steps", "12"], "not a multiple of the 8 blocks"),
    (["--threshold", "1.5"], r"\[0, 1\]"),
    (["--variants", "eager,fast"], "unknown variant.*fast.*eager, graphs, compile, graphs\\+compile"),
    (["--variants", "graphs", "--device", "cpu"], "CUDA graphs need --device cuda"),
])
def test_bad_arguments(bench, argv, message):
    with pytest.raises(ValueError, match=message):
        bench.parse_args(argv)


def test_driver_names_a_missing_checkout(driver, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"prompts": [[1]], "gen_length": 4, "block_length": 4, "steps": 4,
                                   "functions": ["generate"], "mask_id": 3}))
    with pytest.raises(SystemExit) as exit_info:
        driver.main(["--fastdllm", str(tmp_path / "nowhere"), "--checkpoint", str(ckpt), "--request", str(request),
                     "--out", str(tmp_path / "out.json")])
    assert exit_info.value.code == 2
    assert "nowhere/llada/generate.py not found" in capsys.readouterr().err


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
