"""Where a result came from: the run id of a set of settings, the library versions, the source
commit and the hardware, as stored in every bench row and sweep summary."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

import torch
import transformers

from . import __version__


def run_id(identity: dict) -> str:
    """A 16-hex-digit hash of `identity` (everything that decides a run's tokens)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def versions() -> dict:
    """Versions of dllm, torch, transformers, Python, triton (None without it; its kernels decide
    tokens on CUDA) and the CUDA runtime torch was built with (None for a CPU build)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"dllm": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "transformers": transformers.__version__, "triton": triton_version, "cuda": torch.version.cuda}


def cpu_name() -> str:
    """The CPU model (/proc/cpuinfo), else what `platform` knows."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def source_commit() -> tuple[str | None, bool | None]:
    """The git commit of the source tree dllm is imported from, and whether its tracked files differ
    from it; (None, None) when it is not a git checkout."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None, None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, check=True, timeout=10).stdout.strip())
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def hardware(world_size: int = 1, device: torch.device | str | None = None) -> dict:
    """The device the run used (`device`: that GPU's name, the CPU model for a CPU; None: the first
    GPU's name where there is one, else the CPU model), core and thread counts, and the number of
    processes of the run."""
    if device is None:
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else cpu_name()
    else:
        device = torch.device(device)
        name = torch.cuda.get_device_name(device.index or 0) if device.type == "cuda" else cpu_name()
    return {"device": name, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "world_size": world_size}


def timestamp() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
