"""`dllm.provenance`: what every result row records about where it came from."""
from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest
import torch

import dllm
from dllm import provenance

SOURCE = Path(dllm.__file__).resolve().parents[1]


def test_run_id_depends_on_the_settings_not_their_order():
    a = provenance.run_id({"sampler": "threshold", "tau": 0.9})
    assert a == provenance.run_id({"tau": 0.9, "sampler": "threshold"})
    assert a != provenance.run_id({"sampler": "threshold", "tau": 0.8})
    assert len(a) == 16 and int(a, 16) >= 0


def test_source_commit_is_the_checkouts_head():
    if not (SOURCE / ".git").exists():
        pytest.skip("dllm is not imported from a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=SOURCE, capture_output=True, text=True,
                          check=True).stdout.strip()
    commit, dirty = provenance.source_commit()
    assert commit == head and isinstance(dirty, bool)


def test_hardware_versions_and_timestamp():
    hw = provenance.hardware(world_size=3)
    assert hw["device"] and hw["threads"] >= 1 and hw["world_size"] == 3
    assert provenance.cpu_name()
    assert provenance.versions()["dllm"] == dllm.__version__
    assert provenance.versions()["cuda"] == torch.version.cuda
    stamp = dt.datetime.fromisoformat(provenance.timestamp())
    assert stamp.tzinfo is not None and abs(dt.datetime.now(dt.timezone.utc) - stamp) < dt.timedelta(minutes=1)


def test_hardware_names_the_device_the_run_used(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: f"GPU {getattr(index, 'index', index)}")
    assert provenance.hardware(device="cpu")["device"] == provenance.cpu_name()       # a CPU run on a GPU host
    assert provenance.hardware(device="cuda:1")["device"] == "GPU 1"
    assert provenance.hardware(device="cuda")["device"] == provenance.hardware()["device"] == "GPU 0"


def test_triton_version_is_recorded():
    triton = pytest.importorskip("triton")
    assert provenance.versions()["triton"] == triton.__version__
