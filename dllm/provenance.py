"""Where a result came from: the run id of a set of settings, the library versions and the
hardware, as stored in every bench row and sweep summary."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform

import torch
import transformers

from . import __version__


def run_id(identity: dict) -> str:
    """A 16-hex-digit hash of `identity` (everything that decides a run's tokens)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def versions() -> dict:
    """Versions of dllm, torch, transformers and Python."""
    return {"dllm": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "transformers": transformers.__version__}


def _cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def hardware(world_size: int = 1) -> dict:
    """The device (first GPU's name, else the CPU model), core and thread counts, and the number
    of processes of the run."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else _cpu_name()
    return {"device": device, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "world_size": world_size}


def timestamp() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
