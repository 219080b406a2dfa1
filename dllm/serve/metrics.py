"""Prometheus metrics of a `dllm serve` process, on a registry of its own (`/metrics`)."""
from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TOKENS_WINDOW_S = 10.0     # the span `dllm_tokens_per_second` averages over


class ServerMetrics:
    """queue depth, running rows, answer tokens (a counter and their rate over the last
    `TOKENS_WINDOW_S` seconds), forwards, step latency and requests by outcome."""

    def __init__(self, engine):
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("dllm_queue_depth", "requests waiting to join a batch", registry=r).set_function(
            lambda: engine.queue_depth)
        Gauge("dllm_running_rows", "rows decoding now, over all batches", registry=r).set_function(
            lambda: engine.running_rows)
        Gauge("dllm_tokens_per_second", f"answer tokens per second over the last {TOKENS_WINDOW_S:g} s",
              registry=r).set_function(self._rate)
        self.tokens = Counter("dllm_completion_tokens", "answer tokens sent", registry=r)
        self.forwards = Counter("dllm_forwards", "batched forwards run", registry=r)
        self.step_seconds = Histogram("dllm_step_seconds", "seconds of one batched step (forward, scoring, commits)",
                                      registry=r, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                           1.0, 2.5, 5.0))
        self.requests = Counter("dllm_requests", "requests answered, by outcome", ["outcome"], registry=r)
        self._recent: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def on_step(self, seconds: float, rows: int, answered_tokens: int) -> None:
        """Called by the engine after every forward."""
        self.forwards.inc()
        self.step_seconds.observe(seconds)
        if answered_tokens:
            self.tokens.inc(answered_tokens)
            with self._lock:
                self._recent.append((time.monotonic(), answered_tokens))

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and now - self._recent[0][0] > TOKENS_WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / TOKENS_WINDOW_S

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
