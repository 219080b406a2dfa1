"""`DiffusionTransformer.set_compile`: inference forwards through torch.compile (inductor on CPU)
give the tokens the eager model gives, for samplers x cache policies on ragged batches. Compiling
costs seconds per input layout, so the default run checks a few combinations and the rest carry
the `slow` marker. The weights are drawn at std 0.3, so the predictions are peaked as a trained
model's are: at the default 0.02 every candidate of the tiny models is near-tied, and the float32
rounding of the compiled kernels' fused reductions (logits within 1e-6) reorders entropies."""
import pytest
import torch

import dllm
from dllm.config import ModelConfig

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
FAST = [("threshold", "dual"), ("low_confidence", "none")]
MORE = [(s, c) for s in ("low_confidence", "threshold", "factor", "eb") for c in ("none", "prefix", "dual",
                                                                               "dkv-decode")
        if (s, c) not in FAST]
DREAM = [("entropy", "dual"), ("maskgit_plus", "none")]


@pytest.fixture(scope="module")
def models():
    out = {}
    for preset in ("llada-tiny", "dream-tiny"):
        eager = dllm.build_model(ModelConfig.from_name(preset), seed=0, init_std=0.3)
        compiled = dllm.build_model(ModelConfig.from_name(preset), seed=0, init_std=0.3)
        compiled.set_compile(True)
        out[preset] = (eager, compiled)
    return out


def _same_tokens(models, preset, sampler, cache):
    eager, compiled = models[preset]
    kw = dict(gen_length=16, block_length=8, sampler=sampler, cache=cache, temperature=0.0)
    want = dllm.generate(eager, None, PROMPTS, **kw)
    got = dllm.generate(compiled, None, PROMPTS, **kw)
    assert torch.equal(got.sequences, want.sequences), (preset, sampler, cache)
    assert got.forwards == want.forwards


@pytest.mark.parametrize("sampler,cache", FAST)
def test_compiled_gives_the_eager_tokens(models, sampler, cache):
    _same_tokens(models, "llada-tiny", sampler, cache)


@pytest.mark.slow
@pytest.mark.parametrize("sampler,cache", MORE)
def test_compiled_gives_the_eager_tokens_for_every_combination(models, sampler, cache):
    _same_tokens(models, "llada-tiny", sampler, cache)


@pytest.mark.slow
@pytest.mark.parametrize("sampler,cache", DREAM)
def test_compiled_dream_gives_the_eager_tokens(models, sampler, cache):
    _same_tokens(models, "dream-tiny", sampler, cache)


def test_a_copy_of_a_compiled_model_runs_its_own_weights(models):
    """A deep copy (an EMA or evaluation copy) with changed weights: its compiled forward follows
    its own weights, not the original's; a pickled one loads compiled."""
    import copy
    import io

    _, compiled = models["llada-tiny"]
    twin = copy.deepcopy(compiled)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.5)
    x, at = torch.tensor([[5, 6, 7, 310, 310]]), torch.tensor([[3, 4]])
    eager = copy.deepcopy(twin)
    eager.set_compile(False)
    with torch.no_grad():
        torch.testing.assert_close(twin(x, at), eager(x, at), rtol=1e-4, atol=1e-4)
        assert (twin(x, at) - compiled(x, at)).abs().max() > 0.1
        buffer = io.BytesIO()
        torch.save(twin, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert loaded.compiled and torch.equal(loaded(x, at), twin(x, at))


def test_a_model_with_leased_graph_buffers_pickles_without_them():
    import io

    from dllm.models.graphs import ForwardGraphs

    class Holder:
        pass

    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)
    model._graphs, holder = ForwardGraphs(), Holder()
    model._graphs.persistent(("kv", 0), lambda: torch.zeros(2), holder=holder)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.cuda_graphs is not None and not loaded.cuda_graphs._kept


def test_training_forwards_stay_eager(models):
    _, compiled = models["llada-tiny"]
    x = torch.tensor([[5, 6, 7, 310, 310]])
    logits = compiled(x, torch.tensor([[3, 4]]))
    assert logits.requires_grad            # autograd ran through the eager body
    assert compiled.compiled


@pytest.mark.parametrize("bad", [dict(enabled="yes"), dict(max_layouts=0), dict(max_layouts=True)])
def test_bad_compile_settings_are_refused(bad):
    model = dllm.build_model(ModelConfig.from_name("llada-tiny"), seed=0)
    with pytest.raises(ValueError, match="enabled|max_layouts"):
        model.set_compile(**bad)
    assert not model.compiled


def test_load_compile_bench_and_sweep_settings(llada_dir, monkeypatch):
    """`dllm.load(compile=True)` compiles the loaded model; bench and sweep pass their setting to
    the load; bad values are refused by name."""
    model, _ = dllm.load(llada_dir, device="cpu", compile=True)
    assert model.compiled
    with pytest.raises(ValueError, match=r"compile must be True or False, got 'yes'"):
        dllm.load(llada_dir, device="cpu", compile="yes")
    from dllm.sweep.grid import SweepSettings
    with pytest.raises(ValueError, match=r"compile 'yes' is not allowed; give true or false"):
        SweepSettings(compile="yes")
    from dllm.cli import main
    from dllm.eval import runner
    seen = {}

    def fake_load(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(runner.dllm, "load", fake_load)
    assert main(["bench", "--model", str(llada_dir), "--compile", "--generated", "--limit", "1",
                 "--device", "cpu"]) != 0
    assert seen.get("compile") is True
