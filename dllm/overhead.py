"""What one decode dispatches: aten operations and host-device synchronisations, counted per step
type with a torch dispatch mode.

    counts = count_decode(model, [[1, 2, 3]], GenerationConfig(gen_length=32, sampler="threshold", cache="dual"))
    counts.per_call("cached")      # (ops, syncs) of one cached forward

A step is split into its forward and the rest (scoring, the sampler's decision, the commit and
the loop's bookkeeping, kind "loop"). A forward is "full" when it recomputes every column (no
recompute plan) and "cached" when it recomputes a planned subset against stored K/V.

A synchronisation is an operation whose result the host must wait for on a GPU: reading a value
(`.item()`, `int()`, `bool()`, `.tolist()`, `.cpu()`, `.numpy()`), and the operations whose output shape depends on
the data (`nonzero`, boolean-mask indexing, `masked_select`, `unique`, `repeat_interleave`
without an output size). The counts do not depend on the machine: they are the same on every
CPU, so tests assert them. The same decode on a GPU dispatches the same aten operations."""
from __future__ import annotations

import collections
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .config import GenerationConfig
from .decode import build_state, decode, resolve_request
from .kernels import add_launch_listener, remove_launch_listener

KINDS = ("full", "cached", "loop")
# Operations whose output the host must read, or whose output shape depends on the data.
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "argwhere", "masked_select", "unique", "_unique",
                      "_unique2", "unique_consecutive", "unique_dim", "equal", "repeat_interleave", "allclose",
                      "bincount", "histc"})
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
# Tensor methods that read a tensor on the host and, on a CPU tensor, dispatch no aten operation.
HOST_READS = ("tolist", "cpu", "numpy")
_ROOT = Path(__file__).resolve().parents[1]


def _has_bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


def is_sync(name: str, args, kwargs) -> bool:
    """Whether the aten operation `name` called with `args` / `kwargs` makes the host wait on a GPU."""
    if name == "repeat_interleave":
        return (kwargs or {}).get("output_size") is None
    if name in SYNC_OPS:
        return True
    return name in _INDEXING and _has_bool_index(args)


def _call_site() -> str:
    """file:line of the innermost frame in this repository outside this module."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path != Path(__file__).resolve() and _ROOT in path.parents:
            return f"{path.relative_to(_ROOT)}:{frame.lineno}"
    return "?"


@dataclass
class KindCounts:
    """Totals of one step type over a decode."""

    calls: int = 0
    ops: int = 0
    syncs: int = 0
    sync_sites: collections.Counter = field(default_factory=collections.Counter)   # "op at file:line" -> count


class DispatchCounter(TorchDispatchMode):
    """Counts every aten operation dispatched inside it, and the synchronising ones with their
    call sites, into the bucket of the step type running (`kind`). A Triton kernel launch counts
    as one operation (`dllm.kernels.launching`; the counter listens to launches while it is
    entered), what it dispatches itself (Triton's interpreter on a CPU) as none."""

    def __init__(self):
        super().__init__()
        self.kind = "loop"
        self.counts = {k: KindCounts() for k in KINDS}
        self.launch_depth = 0

    def __enter__(self):
        add_launch_listener(self)
        self._host_reads = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name, method in self._host_reads.items():
            setattr(torch.Tensor, name, self._counted(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._host_reads.items():
            setattr(torch.Tensor, name, method)
        remove_launch_listener(self)
        return super().__exit__(*exc)

    def _counted(self, name: str, method):
        """`method` (a `HOST_READS` Tensor method) recording a host read each call."""
        def counted(tensor, *args, **kwargs):
            self.record_host_read(name)
            return method(tensor, *args, **kwargs)
        return counted

    def enter_launch(self, name: str) -> None:
        if not self.launch_depth:
            self.counts[self.kind].ops += 1
        self.launch_depth += 1

    def exit_launch(self, name: str) -> None:
        self.launch_depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.launch_depth:
            return func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        bucket = self.counts[self.kind]
        bucket.ops += 1
        if is_sync(name, args, kwargs):
            bucket.syncs += 1
            bucket.sync_sites[f"{name} at {_call_site()}"] += 1
        return func(*args, **(kwargs or {}))

    def record_host_read(self, name: str) -> None:
        """A `HOST_READS` method read a tensor on the host, which on a CPU tensor dispatches no aten
        operation (inside a Triton launch it counts as none, as the launch's own operations do)."""
        if self.launch_depth:
            return
        bucket = self.counts[self.kind]
        bucket.syncs += 1
        bucket.sync_sites[f"{name} at {_call_site()}"] += 1


@dataclass
class DecodeCounts:
    """Operations and synchronisations of one decode, per step type."""

    forwards: int
    steps: int
    counts: dict[str, KindCounts]

    def per_call(self, kind: str) -> tuple[float, float]:
        """(operations, synchronisations) per call of `kind` ("loop": per step)."""
        c = self.counts[kind]
        n = self.steps if kind == "loop" else c.calls
        return (c.ops / n, c.syncs / n) if n else (0.0, 0.0)


def count_decode(model, prompts: list[list[int]], config: GenerationConfig) -> DecodeCounts:
    """Decode the token-id `prompts` with `config` and count the denoising loop's operations per
    step type (the request's setup and the output's decoding are not counted). A forward counts
    as "full" or "cached" by whether it was given a recompute plan; the rest is "loop"."""
    request = resolve_request(model, config)
    state = build_state(model, prompts, request.config, request.block_length)
    counter = DispatchCounter()

    def enter_forward(module, args, kwargs):
        counter.kind = "full" if kwargs.get("positions") is None else "cached"
        counter.counts[counter.kind].calls += 1

    def leave_forward(module, args, kwargs, output):
        counter.kind = "loop"

    hooks = [model.register_forward_pre_hook(enter_forward, with_kwargs=True),
             model.register_forward_hook(leave_forward, with_kwargs=True)]
    try:
        with counter, torch.no_grad():
            forwards = decode(model, state, request)
    finally:
        for hook in hooks:
            hook.remove()
    return DecodeCounts(forwards=forwards, steps=forwards, counts=counter.counts)
