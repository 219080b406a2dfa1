"""The serving engine: one thread owns the model and steps the running batches.

That thread is the caller's (`Engine.run`, as `dllm.serve.serve` runs it) or one of the engine's
own (`Engine.start`). torch's OpenMP runtime on CPU keeps one team of worker threads per thread
that has run a parallel region; while another thread's team lives, the engine's parallel regions
run much slower. `serve` therefore steps the batches in the thread that loaded the model, and
serves HTTP from another.

Requests wait in a bounded queue. Between steps the engine admits them: those with the same
settings are built into one fresh batch, which joins a running batch of those settings when the
sampler and cache allow it (`Decoder.join`: greedy, nothing stored between steps) and otherwise
runs as a group of its own. Every group takes one forward per turn. After each step every request
gets the text its finished left-to-right prefix has grown by; a finished row leaves its batch at
once. Greedy rows decode exactly as `dllm.generate` decodes them alone, whatever else is in the
batch.
"""
from __future__ import annotations

import copy
import itertools
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..config import GenerationConfig
from ..decode import (Decoder, answer_length, build_state, resolve_request, resolve_sampler, special_ids,
                      with_instances)
from .schema import RequestError, refusal_param

# The most forwards a request's settings may allow: MAX_FORWARDS_PER_TOKEN per generated token plus
# MAX_FORWARDS_EXTRA (its steps, an editing or remasking sampler's extra forwards). A request above
# it is refused rather than holding the engine; a forward cap the server sets bounds it instead.
MAX_FORWARDS_PER_TOKEN = 4
MAX_FORWARDS_EXTRA = 64


class QueueFull(Exception):
    """The queue holds `max_queue` requests already."""


class EngineStopped(Exception):
    """The engine has stopped (or is stopping): it takes no more requests."""


@dataclass
class Job:
    """One request: its prompt ids, its resolved settings and where its events go.

    emit(kind, payload) is called from the engine thread: ("started", None) once its batch is
    built, ("delta", text) as its finished prefix grows, ("canvas", text) after every step when
    `stream_canvas`, then one ("done", result) or ("error", (status, message, param))."""

    prompt: list[int]
    config: GenerationConfig
    emit: Callable[[str, object], None]
    stop: tuple[str, ...] = ()
    stream_canvas: bool = False
    timeout: float | None = None
    length_field: str = "max_tokens"          # the request's name of its generation length
    length_fields: tuple[str, ...] = ()       # the length fields the request set (`schema.length_fields_set`)
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    created: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    sent: str = ""               # text sent so far


_ids = itertools.count(1)


class _Group:
    """A running batch: one decoder and the job of each of its rows, in row order."""

    def __init__(self, key: str, decoder: Decoder, jobs: list[Job]):
        self.key, self.decoder, self.jobs = key, decoder, jobs


def forward_limit(gen_length: int) -> int:
    """The most forwards the settings of a request of `gen_length` tokens may allow."""
    return MAX_FORWARDS_PER_TOKEN * gen_length + MAX_FORWARDS_EXTRA


def batch_key(config: GenerationConfig) -> str:
    """Requests with equal keys can share a batch: every setting but the seed of a greedy request."""
    fields = {k: v for k, v in config.__dict__.items() if not (k == "seed" and config.temperature == 0)}
    return json.dumps(fields, sort_keys=True, default=repr)


class Engine:
    """Continuous batching over `dllm`'s decode loop (module docstring).

    max_batch_rows: rows decoding at once, over all groups; max_queue: requests waiting beyond
    them (`submit` raises QueueFull past it). `on_step(seconds, rows, tokens)` is called after
    every forward (metrics)."""

    def __init__(self, model, tokenizer, *, max_batch_rows: int = 32, max_queue: int = 256,
                 on_step: Callable[[float, int, int], None] | None = None):
        for name, value in (("max_batch_rows", max_batch_rows), ("max_queue", max_queue)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_rows, self.max_queue = max_batch_rows, max_queue
        self.on_step = on_step
        self.queue: deque[Job] = deque()
        self.groups: list[_Group] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._admitting = 0          # requests taken from the queue whose batches are being built
        ids = special_ids(model)
        self.stop_ids, self.mask_id = ids.stop_ids, ids.mask

    # -- the caller's side ----------------------------------------------------------------
    def start(self) -> None:
        """Step the batches in a new thread of the engine's own (`run` there)."""
        self._thread = threading.Thread(target=self.run, name="dllm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Make `run` return after the step under way (and wait for the engine's own thread)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def submit(self, job: Job) -> None:
        """Queue a request; raises QueueFull when `max_queue` are waiting beyond the rows free now,
        EngineStopped once the engine is stopping."""
        with self._wake:
            if self._stopping:
                raise EngineStopped("the server is shutting down")
            free = max(0, self.max_batch_rows - self.running_rows - self._admitting)
            if len(self.queue) >= self.max_queue + free:
                raise QueueFull(f"{len(self.queue)} requests are queued for {free} free row(s) "
                                f"(max_queue {self.max_queue})")
            self.queue.append(job)
            self._wake.notify()

    def cancel(self, job: Job) -> None:
        """Drop a request (client gone): it leaves the queue now, or its batch at the next step
        boundary."""
        job.cancelled = True
        with self._wake:
            if job in self.queue:
                self.queue.remove(job)
            self._wake.notify()

    @property
    def stopped(self) -> bool:
        """Whether the engine has stopped stepping (stopped, or its loop ended on an error)."""
        return self._stopping

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    @property
    def running_rows(self) -> int:
        return sum(len(g.jobs) for g in self.groups)

    # -- the engine thread ----------------------------------------------------------------
    def run(self, keep_running: Callable[[], bool] | None = None) -> None:
        """Step the batches in the calling thread until `stop`, until `keep_running()` (checked at
        least once a second while idle, and between steps) turns false, or until an exception such
        as KeyboardInterrupt; the requests still open are then answered 503."""
        admitted: list[Job] = []
        try:
            while keep_running is None or keep_running():
                with self._wake:
                    if not self._stopping and not self.queue and not self.groups:
                        self._wake.wait(timeout=1.0)
                    if self._stopping:
                        break
                    admitted = self._take_admissible()
                    self._admitting = len(admitted)
                self._admit(admitted)
                with self._wake:
                    self._admitting = 0
                admitted = []
                for group in list(self.groups):
                    self._turn(group)
        finally:
            with self._wake:
                self._stopping = True
                waiting, self.queue = list(self.queue), deque()
            running = [j for g in self.groups for j in g.jobs]
            for job in running + [j for j in admitted if j not in running] + waiting:
                job.emit("error", (503, "the server is shutting down", None))
            self.groups = []

    def _take_admissible(self) -> list[Job]:
        """Pop the queued requests that fit in the rows left (cancelled ones are dropped, and those
        past their timeout answered 408 wherever they stand in the queue)."""
        now = time.monotonic()
        for job in [j for j in self.queue if j.timeout is not None and now - j.created > j.timeout]:
            self.queue.remove(job)
            _time_out(job)
        room = self.max_batch_rows - self.running_rows
        taken = []
        while self.queue and len(taken) < room:
            job = self.queue.popleft()
            if not job.cancelled:
                taken.append(job)
        return taken

    def _admit(self, jobs: list[Job]) -> None:
        same: dict[str, list[Job]] = {}
        for job in self._defer_shared_buffers(jobs):
            same.setdefault(batch_key(job.config), []).append(job)
        by_key: dict[str, list[Job]] = {}
        for key, group_jobs in same.items():
            if self._batches_with_others(group_jobs[0].config):
                by_key[key] = group_jobs
            else:
                by_key.update((f"{job.id}:{key}", [job]) for job in group_jobs)
        for key, group_jobs in by_key.items():
            self._start_or_refuse(key, group_jobs)

    def _start_or_refuse(self, key: str, jobs: list[Job]) -> None:
        """Start a batch of `jobs`, or answer why not. A refusal of several requests together may
        come from one of them (its prompt): each then tries alone, so only its own fails."""
        try:
            self._start_group(key, jobs)
        except (ValueError, TypeError) as err:   # the sampler, the cache or the decode refuses
            if len(jobs) > 1:
                for job in jobs:
                    self._start_or_refuse(key, [job])
                return
            job = jobs[0]
            param = err.param if isinstance(err, RequestError) else refusal_param(
                str(err), job.length_fields, job.length_field)
            job.emit("error", (400, str(err), param))
        except Exception as err:                 # a failing batch fails its own requests only
            for job in jobs:
                job.emit("error", (500, f"starting the batch failed: {type(err).__name__}: {err}", None))

    def _batches_with_others(self, config: GenerationConfig) -> bool:
        """Whether a request can share its batch with others of its settings and decode as it would
        alone: greedy, with a sampler that keeps what it needs per row (`Sampler.row_state`; the
        others draw over the whole batch or keep batch-wide state). A sampling request draws from
        its own seeded generator. Settings that fail to resolve run alone, to fail alone."""
        if config.temperature != 0:
            return False
        try:   # the built sampler: its arguments can change row_state (Dream's alg_temp draws)
            return resolve_sampler(self.model, config).row_state is not None
        except Exception:
            return False

    def _start_group(self, key: str, jobs: list[Job]) -> None:
        """A batch of `jobs`, joined to a running batch of the same settings when both can."""
        decoder = self._decoder([j.prompt for j in jobs], jobs[0].config)
        gen_length, limit = decoder.state.gen_length, forward_limit(decoder.state.gen_length)
        if decoder.request.config.max_forwards is None and decoder.cap > limit:
            steps = decoder.request.config.steps           # the request's own steps, past the limit alone
            by_steps = (decoder.request.sampler.uses_steps and "dllm.steps" in jobs[0].length_fields
                        and steps is not None and steps > limit)
            raise RequestError(f"these settings allow up to {decoder.cap} forwards for {gen_length} tokens; the server "
                               f"takes at most {limit} ({MAX_FORWARDS_PER_TOKEN} per token + {MAX_FORWARDS_EXTRA}): "
                               f"lower {'dllm.steps' if by_steps else 'the sampler arguments'}",
                               "dllm.steps" if by_steps else None)
        # rows join a batch of the same canvas (a block-causal decode's runs on to whole attention blocks)
        running = next((g for g in self.groups if g.key == key and g.decoder.joinable
                        and g.decoder.state.gen_length == decoder.state.gen_length), None)
        if running is not None and decoder.joinable:
            running.decoder.join(decoder)
            running.jobs += jobs
        else:
            self.groups.append(_Group(key, decoder, jobs))
        for job in jobs:
            job.emit("started", None)

    def shares_kv_buffers(self) -> bool:
        """Whether batches of one layout share their K/V buffers: with CUDA graphs on, a graph
        replays the addresses it captured, so `KVCache.for_model` hands every batch of a layout
        the same buffers."""
        return getattr(self.model, "cuda_graphs", None) is not None

    def _defer_shared_buffers(self, jobs: list[Job]) -> list[Job]:
        """When batches share K/V buffers, batches of a cache policy that stores K/V run one at a
        time (and take no joins): while one runs, such requests go back to the front of the queue;
        otherwise the first one and the greedy requests of its settings start a batch."""
        if not self.shares_kv_buffers():
            return jobs
        storing = [j for j in jobs if _stores_kv(j.config)]
        if not storing:
            return jobs
        if any(g.decoder.request.policy.needs_storage for g in self.groups):
            deferred = storing
        else:
            first = storing[0]
            together = self._batches_with_others(first.config)     # else each starts a batch of its own
            deferred = [j for j in storing[1:]
                        if not (together and j.config.temperature == 0 and batch_key(j.config) == batch_key(first.config))]
        with self._wake:
            self.queue.extendleft(reversed(deferred))
        waiting = {id(j) for j in deferred}
        return [j for j in jobs if id(j) not in waiting]

    def _decoder(self, prompts: list[list[int]], config: GenerationConfig) -> Decoder:
        # a sampler or policy given as an instance keeps state per batch: each batch gets its own copy
        config = config.replace(**{name: copy.deepcopy(getattr(config, name)) for name in ("sampler", "cache")
                                   if not isinstance(getattr(config, name), (str, type(None)))})
        request = resolve_request(self.model, config)
        state = build_state(self.model, prompts, request.config, request.block_length)
        state.tokenizer = self.tokenizer
        return Decoder(self.model, state, request)

    def _turn(self, group: _Group) -> None:
        """One forward of a group, its streaming, and the rows that leave it."""
        decoder = group.decoder
        now = time.monotonic()
        for r, job in enumerate(group.jobs):
            if job.timeout is not None and now - job.created > job.timeout and not job.cancelled:
                _time_out(job)
            if job.cancelled:
                decoder.state.finished[r] = True
        try:
            start = time.perf_counter()
            progressed = decoder.step()
            decoder.check_finite()       # before any row of this step is answered
            seconds = time.perf_counter() - start
        except Exception as err:   # a failing batch fails its own requests only
            for job in group.jobs:
                job.emit("error", (500, f"decoding failed: {type(err).__name__}: {err}", None))
            self.groups.remove(group)
            return
        rows = self._stream(group)
        if progressed and self.on_step is not None:
            self.on_step(seconds, len(group.jobs), rows)
        if not group.jobs:
            self.groups.remove(group)

    def _stream(self, group: _Group) -> int:
        """Send each row's new text (a sampler that rewrites written tokens: all of it once the row is
        done), answer the rows that are done and drop them from the batch; returns the answer
        tokens of the rows answered."""
        state = group.decoder.state
        generated, finished = state.generated().tolist(), state.finished.tolist()
        rewrites = group.decoder.request.sampler.rewrites_tokens   # a written token may still change
        answered = 0
        for r, job in enumerate(group.jobs):
            if job.cancelled:
                continue
            text, n, stopped = self._prefix(job, generated[r])
            stopped = stopped and (finished[r] or not rewrites)
            if job.stream_canvas:
                job.emit("canvas", self.tokenizer.decode(generated[r], skip_special_tokens=False))
            # every answer column written: final, though a block-causal row's tail may still decode
            complete = not rewrites and self.mask_id not in generated[r]
            done = finished[r] or stopped or complete
            if not done:       # text a stop string may still cut is sent once it cannot
                text = text[:len(text) - _stop_prefix_length(text, job.stop)]
            grown = text[len(job.sent):] if text.startswith(job.sent) else ""
            if grown and (done or not (rewrites or grown.endswith("\ufffd"))):   # hold back a split character
                job.sent += grown
                job.emit("delta", grown)
            if done:
                finished[r] = True
                answered += n
                job.emit("done", {"text": text, "finish_reason": "stop" if stopped else "length",
                                  "prompt_tokens": len(job.prompt), "completion_tokens": n,
                                  "forwards": int(state.nfe[r])})
        gone = [r for r, job in enumerate(group.jobs) if finished[r] or job.cancelled]
        if gone:
            state.finished[gone] = True
            group.jobs = [group.jobs[k] for k in group.decoder.drop_finished()]
        return answered

    def _prefix(self, job: Job, ids: list[int]) -> tuple[str, int, bool]:
        """(text, answer tokens, stopped) of a row's finished left-to-right prefix: the columns
        before its first mask, cut at the first stop token, then at the first stop string. A row
        whose prefix has stopped is answered at once: the rest of its canvas cannot change the text
        (unless its sampler rewrites tokens)."""
        prefix = ids.index(self.mask_id) if self.mask_id in ids else len(ids)
        n = answer_length(ids[:prefix], self.stop_ids)
        stopped = n < prefix
        text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
        cut = _first_stop(text, job.stop)
        if cut is not None:
            text, stopped = text[:cut], True
            n = self._tokens_holding(ids[:n], cut)
        return text, n, stopped

    def _tokens_holding(self, ids: list[int], length: int) -> int:
        """The fewest leading tokens of `ids` whose text holds its first `length` characters (the
        answer's tokens when a stop string cuts it)."""
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= length:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _time_out(job: Job) -> None:
    job.cancelled = True
    job.emit("error", (408, f"the request took longer than its timeout of {job.timeout:g} s", None))


def _stores_kv(config: GenerationConfig) -> bool:
    """Whether the request's cache policy keeps K/V between steps."""
    return with_instances(config).cache.needs_storage


def _stop_prefix_length(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins one of the stop strings."""
    return max((n for stop in stops for n in range(min(len(stop) - 1, len(text)), 0, -1)
                if text.endswith(stop[:n])), default=0)


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the first of the stop strings begins in `text`, or None."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None
