"""GPU fast paths, each beside its pure-torch reference (installed as `dllm.kernels`).

This file is also the single place that decides whether a Triton kernel can run (the gate below):
Triton must be importable, and the tensors must live on a CUDA device, or on the CPU while
`TRITON_INTERPRET=1` (Triton's interpreter, used by the tests on machines without CUDA). Triton
reads that variable when a kernel is defined, i.e. when `dllm.kernels` is first imported, so the
gate reads it once, at the same moment.

`DLLM_SCORING` (read by `token_scores` on every call) picks the scoring implementation:
"auto" (default: the Triton kernel on CUDA tensors, the torch reference elsewhere), "torch", or
"triton" (the kernel wherever the gate allows it, e.g. on CPU tensors under the interpreter).
"""
from __future__ import annotations

import contextlib
import os

import torch

try:  # the kernel modules import it anyway; one that raises ImportError counts as missing
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False


def _interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter, as Triton itself reads TRITON_INTERPRET
    (`triton.knobs`; a Triton older than 3.4 has none and takes exactly "1")."""
    if not HAS_TRITON:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


INTERPRET = _interpreted()
INTERPRET_VARIABLE = os.environ.get("TRITON_INTERPRET")   # as it was when INTERPRET was read


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors of `device` in this process."""
    device = torch.device(device)
    if not HAS_TRITON:
        return False
    return device.type == "cuda" or (device.type == "cpu" and INTERPRET)


def interpreter_bf16(device: torch.device | str, dtype: torch.dtype | None) -> bool:
    """Whether `dtype` tensors on `device` are bf16 under the interpreter, whose float32-to-bfloat16
    conversion truncates where a GPU rounds to nearest: kernels that write bf16 results (the rotary
    write, the head scoring's bf16 logits) are not run there."""
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and INTERPRET


def writes_as_on_a_gpu(device: torch.device | str, dtype: torch.dtype | None, dtypes: tuple) -> bool:
    """Whether a kernel taking `dtypes` runs on `device` for `dtype` and writes what a GPU would:
    Triton runs there, the dtype is one it takes, and it is not bf16 under the interpreter."""
    return triton_runs_on(device) and dtype in dtypes and not interpreter_bf16(device, dtype)


def refuse_interpreter_bf16(device: torch.device | str, dtype: torch.dtype, what: str) -> None:
    """Raise a ValueError saying `what` (e.g. "the X kernel cannot write bf16") is not run on bf16
    under the interpreter, if `device` and `dtype` are that."""
    if interpreter_bf16(device, dtype):
        raise ValueError(f"{what} under TRITON_INTERPRET=1 (the interpreter truncates to bf16 where a GPU rounds); "
                         f"use float16 or float32 there")


def require_triton(device: torch.device | str, what: str) -> None:
    """Raise a RuntimeError saying why `what` cannot run on `device`, if it cannot."""
    device = torch.device(device)
    if not HAS_TRITON:
        raise RuntimeError(f"{what} needs triton, which is not installed (pip install 'dllm[triton]')")
    if not triton_runs_on(device):
        raise RuntimeError(f"{what} runs on CUDA tensors, or on CPU tensors under TRITON_INTERPRET=1 set before "
                           f"dllm.kernels is imported; got tensors on {device} "
                           f"(TRITON_INTERPRET={INTERPRET_VARIABLE!r} at import)")


def chosen_impl(impl: str | None, variable: str, impls: tuple[str, ...], what: str) -> str:
    """The implementation `impl` names, or else the environment variable `variable`'s (default
    "auto"), in any case, checked against `impls`; the error names where the bad value came from."""
    source = "impl"
    if impl is None:
        impl, source = os.environ.get(variable, "auto").strip() or "auto", variable
    impl = impl.lower() if isinstance(impl, str) else impl
    if impl not in impls:
        raise ValueError(f"unknown {what} implementation {source}={impl!r}; valid: {', '.join(impls)}")
    return impl


def on_device(device: torch.device | None):
    """Context making the CUDA `device` current where another one is: Triton launches on the
    current device and its current stream, whatever device the tensors are on (a model on cuda:1
    while cuda:0 is current). Nothing elsewhere."""
    if device is None or device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


class _Launch:
    """The context of one kernel launch with listeners (`launching`)."""

    def __init__(self, name: str, listeners: list, device_context):
        self.name, self.listeners, self.device_context = name, listeners, device_context

    def __enter__(self):
        self.device_context.__enter__()
        for listener in self.listeners:
            listener.enter_launch(self.name)

    def __exit__(self, *exc):
        for listener in self.listeners:
            listener.exit_launch(self.name)
        return self.device_context.__exit__(*exc)


_LAUNCH_LISTENERS: list = []


def launching(name: str, device: torch.device | None = None):
    """Context around one Triton kernel launch, named `name`, on the tensors' `device` (made
    current for the launch, `on_device`). Listeners (`add_launch_listener`; `dllm.overhead` counts
    a launch as one operation, as a GPU launches one kernel, and leaves aside the torch operations
    the interpreter dispatches inside it) are told when it starts and ends; without listeners
    and on the current device it costs nothing."""
    device_context = on_device(device)
    if not _LAUNCH_LISTENERS:
        return device_context
    return _Launch(name, list(_LAUNCH_LISTENERS), device_context)


def add_launch_listener(listener) -> None:
    """`listener.enter_launch(name)` and `listener.exit_launch(name)` run around every launch."""
    _LAUNCH_LISTENERS.append(listener)


def remove_launch_listener(listener) -> None:
    _LAUNCH_LISTENERS.remove(listener)


from .scoring import TokenScores, token_scores, token_scores_ref, token_scores_triton  # noqa: E402

__all__ = ["HAS_TRITON", "INTERPRET", "TokenScores", "add_launch_listener", "launching", "on_device",
           "remove_launch_listener", "require_triton", "token_scores", "token_scores_ref", "token_scores_triton",
           "interpreter_bf16", "refuse_interpreter_bf16", "triton_runs_on", "writes_as_on_a_gpu"]
