"""CUDA graphs of the inference forward: one graph per input layout, replayed step after step.

At batch 1 on a GPU a decoding step can be paced by the host: a cached step launches many small
kernels, and launching them takes longer than running them (measurements: docs/kernels.md
§Measurements). A CUDA graph records those launches once and replays them in one call.

A graph replays fixed addresses, so everything it touches must stay where it was captured: the
weights (`DiffusionTransformer._apply` drops the graphs when the model moves or changes dtype), the
cache buffers (their addresses are part of the key) and the input tensors (static copies, filled
before each replay). Shapes are fixed too, so a layout is everything that changes the kernels:
batch rows, recomputed columns, logit columns, canvas width, padding mask present or not, the
cache's buffers and which of `KVCache.update`'s branches runs. Nothing is padded to a shared
shape: a replay runs the kernels an eager call would, so graphs leave the tokens as they are.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class _Graph:
    graph: "torch.cuda.CUDAGraph"
    inputs: dict[str, torch.Tensor | None]
    output: torch.Tensor


class ForwardGraphs:
    """Captured forwards keyed by layout, least recently used dropped beyond `max_graphs`.

    `run(fn, key, inputs, **fixed)` returns `fn(**inputs, **fixed)`. The first `capture_after - 1`
    calls with a `key` run `fn` eagerly: a capture costs about two forwards, which a layout met
    once (a batch of its own prompt length) never pays back. The next call runs `fn` once more
    eagerly (library plans and lazy allocations happen outside the capture), then captures it;
    from then on each call replays the graph after copying `inputs` into the captured ones. `fn`
    must be a pure function of its tensor inputs and of state at fixed addresses; its in-place
    writes (the cache's K/V) happen again at each replay, as they would eagerly. The output is a
    fresh tensor each call.
    """

    max_kept = 4      # buffers kept by `persistent`, least recently used dropped beyond

    def __init__(self, max_graphs: int = 64, capture_after: int = 2):
        for name, v in (("max_graphs", max_graphs), ("capture_after", capture_after)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.max_graphs, self.capture_after = max_graphs, capture_after
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._seen: OrderedDict[tuple, int] = OrderedDict()     # eager calls of layouts not captured yet
        self._failed: set[tuple] = set()                         # layouts whose capture raised: eager for good
        self.eager = 0
        self._kept: OrderedDict[tuple, object] = OrderedDict()
        self._leases: dict[tuple, weakref.ref] = {}              # key -> the holder using the kept object
        self._pool = None
        self.captures = 0
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every graph and kept buffer (the weights they point at moved)."""
        self._graphs.clear()
        self._seen.clear()
        self._failed.clear()
        self._kept.clear()
        self._leases.clear()
        self._pool = None

    def persistent(self, key: tuple, make: Callable[[], object], holder: object | None = None):
        """The object kept under `key`, made by `make()` the first time. Buffers a graph writes (the
        KV cache) must keep their addresses from one request to the next for the next request to
        replay the graphs this one captured; `KVCache.for_model` takes its buffers from here.
        A `holder` (a decode's cache policy) leases the object while it lives: another holder then
        gets a fresh object of its own, not kept, so two live decodes never share buffers."""
        lease = self._leases.get(key)
        if holder is not None and lease is not None and lease() not in (None, holder):
            return make()
        if key in self._kept:
            self._kept.move_to_end(key)
            obj = self._kept[key]
        else:
            obj = self._kept[key] = make()
            if len(self._kept) > self.max_kept:
                self._leases.pop(self._kept.popitem(last=False)[0], None)
        if holder is not None:
            self._leases[key] = weakref.ref(holder)
        return obj

    def run(self, fn: Callable[..., torch.Tensor], key: tuple, inputs: dict[str, torch.Tensor | None],
            **fixed) -> torch.Tensor:
        device = next(t.device for t in inputs.values() if t is not None)
        # Captures and replays run with the inputs' device current (a model on cuda:1 while cuda:0 is current).
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            entry = self._graphs.get(key)
            if entry is None:
                if key in self._failed:
                    self.eager += 1
                    return fn(**inputs, **fixed)
                seen = self._seen.pop(key, 0) + 1
                if seen < self.capture_after:
                    self._seen[key] = seen
                    if len(self._seen) > 4 * self.max_graphs:
                        self._seen.popitem(last=False)
                    self.eager += 1
                    return fn(**inputs, **fixed)
                try:
                    entry = self._capture(fn, inputs, fixed, device)
                except RuntimeError as err:   # an operation the capture refuses: this layout stays eager
                    self._failed.add(key)
                    warnings.warn(f"CUDA graph capture failed ({type(err).__name__}: {err}); this input layout "
                                  f"runs eagerly from now on", RuntimeWarning, stacklevel=3)
                    self.eager += 1
                    return fn(**inputs, **fixed)
                self._graphs[key] = entry
                if len(self._graphs) > self.max_graphs:
                    self._graphs.popitem(last=False)
            else:
                self._graphs.move_to_end(key)
                for name, t in inputs.items():
                    if t is not None:
                        entry.inputs[name].copy_(t)
            entry.graph.replay()
            self.replays += 1
            return entry.output.clone()

    def _capture(self, fn, inputs, fixed, device: torch.device) -> _Graph:
        static = {n: None if t is None else t.clone(memory_format=torch.contiguous_format) for n, t in inputs.items()}
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            fn(**static, **fixed)                    # warm-up, outside the capture
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        capture = torch.cuda.Stream(device)
        # The outer context restores the current stream even when the capture fails (torch.cuda.graph
        # ends the capture before it restores the stream, and a failed capture raises there).
        with torch.cuda.stream(capture), torch.cuda.graph(graph, pool=self._pool, stream=capture):
            output = fn(**static, **fixed)
        self.captures += 1
        return _Graph(graph, static, output)
