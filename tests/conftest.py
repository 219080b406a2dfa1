"""Shared fixtures. Set TRITON_INTERPRET before anything imports dllm.kernels (STYLE §2)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def llada_dir(tmp_path_factory):
    from tests.fixtures.checkpoints import write_llada_checkpoint
    return write_llada_checkpoint(tmp_path_factory.mktemp("llada"), seed=0)


@pytest.fixture(scope="session")
def llada_sharded_dir(tmp_path_factory):
    from tests.fixtures.checkpoints import write_llada_checkpoint
    return write_llada_checkpoint(tmp_path_factory.mktemp("llada_sharded"), seed=0, sharded=True)


@pytest.fixture(scope="session")
def dream_dir(tmp_path_factory):
    from tests.fixtures.checkpoints import write_dream_checkpoint
    return write_dream_checkpoint(tmp_path_factory.mktemp("dream"), seed=0)


@pytest.fixture(scope="session")
def dream_sharded_dir(tmp_path_factory):
    from tests.fixtures.checkpoints import write_dream_checkpoint
    return write_dream_checkpoint(tmp_path_factory.mktemp("dream_sharded"), seed=0, sharded=True)


@pytest.fixture(scope="session")
def llada(llada_dir):
    import dllm
    return dllm.load(llada_dir, dtype="float32")


@pytest.fixture(scope="session")
def dream(dream_dir):
    import dllm
    return dllm.load(dream_dir, dtype="float32")
