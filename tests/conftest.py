"""Shared fixtures. Set TRITON_INTERPRET before anything imports dllm.kernels (docs/contributing.md §Tests)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def _checkpoint(tmp_path_factory, family, **kwargs):
    from tests.fixtures import checkpoints
    writer = getattr(checkpoints, f"write_{family}_checkpoint")
    return writer(tmp_path_factory.mktemp(family), seed=0, **kwargs)


@pytest.fixture(scope="session")
def llada_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "llada")


@pytest.fixture(scope="session")
def llada_sharded_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "llada", sharded=True)


@pytest.fixture(scope="session")
def dream_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "dream")


@pytest.fixture(scope="session")
def dream_sharded_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "dream", sharded=True)


@pytest.fixture(scope="session")
def lladamoe_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "lladamoe")


@pytest.fixture(scope="session")
def lladamoe(lladamoe_dir):
    import dllm
    return dllm.load(lladamoe_dir, dtype="float32")


@pytest.fixture(scope="session")
def llada2_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "llada2")


@pytest.fixture(scope="session")
def llada(llada_dir):
    import dllm
    return dllm.load(llada_dir, dtype="float32")


@pytest.fixture(scope="session")
def dream(dream_dir):
    import dllm
    return dllm.load(dream_dir, dtype="float32")


@pytest.fixture(scope="session")
def peaked_llada():
    """llada-tiny with random weights at init_std 1: peaked distributions (entropies around 1 nat),
    so confidence and entropy thresholds split the masks."""
    import dllm
    return dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=1.0)


@pytest.fixture(scope="session")
def peaked_llada_bf16():
    import dllm
    return dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=1.0, dtype=torch.bfloat16)


@pytest.fixture(scope="session")
def shipped_float32():
    """The shipped model and its tokenizer, float32."""
    import dllm
    return dllm.load(dtype="float32")


@pytest.fixture
def model_named(request):
    """`model_named(which)`: the tiny LLaDA ("llada") or Dream ("dream") checkpoint, peaked random
    LLaDA weights in float32 ("peaked") or bfloat16 ("bf16"), or the shipped model ("shipped")."""
    fixtures = {"llada": "llada", "dream": "dream", "peaked": "peaked_llada", "bf16": "peaked_llada_bf16",
                "shipped": "shipped_float32"}

    def get(which):
        value = request.getfixturevalue(fixtures[which])
        return value[0] if isinstance(value, tuple) else value
    return get
