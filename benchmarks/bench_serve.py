"""Bounded load on `dllm serve`: requests/s, output tokens/s, latency and time to first chunk at
several concurrency levels, every answer checked against offline `dllm.generate`.

    python benchmarks/bench_serve.py                                   # the shipped model, 1 / 8 / 32
    python benchmarks/bench_serve.py --requests 128 --concurrency 1,8,32 --out runs/serve.jsonl
    python benchmarks/bench_serve.py --sampler threshold --sampler-arg tau=0.9 --cache dual --block-length 32

The server runs in this process on 127.0.0.1 (a free port) with the given model and defaults, as
`dllm serve` runs it (`dllm.serve.serve`: HTTP in a thread, the batches stepped in the main thread);
the load comes from the real `openai` client (streaming chat completions) in a process of its
own, `--concurrency` workers each sending its next request as soon as its last one is answered,
until `--requests` are done. Prompts are the generated ParallelBench test records of `--tasks`, taken in turn.
Before the load, each prompt is decoded alone with `dllm.generate`; a row is checked when its
streamed text equals that answer. Prints one Markdown row per level and the throughput of each
level relative to concurrency 1; `--out` appends JSON rows. `--offline-batches 1,8,32` first
times `dllm.generate` on the same prompts in batches of those sizes, the most batching can gain
without the server (`--concurrency ''` then skips the server). `--breakdown` adds, per level, where
the engine's time went in milliseconds per request (`Breakdown`): forwards over the whole canvas,
forwards over fewer columns, the rest of the steps, and the engine's time outside its steps.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import queue
import sys
import time
from pathlib import Path

import torch

import dllm
from dllm.cli import parse_kv
from dllm.eval import generators
from dllm.eval.tasks import encode_messages, messages
from dllm.provenance import hardware, source_commit, timestamp, versions


def prompts_of(tasks: list[str], count: int) -> list[tuple[str, list[dict]]]:
    """(task, chat messages) of the first test records of each task, interleaved, `count` in all."""
    per_task = -(-count // len(tasks))
    records = {t: generators.make_records(t, num_samples=min(per_task, 100)) for t in tasks}
    out = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        recs = records[task]
        out.append((task, messages(task, recs[(i // len(tasks)) % len(recs)])))
    return out


async def one_request(client, model_name: str, msgs: list[dict]) -> dict:
    start = time.perf_counter()
    first, text, usage = None, "", None
    stream = await client.chat.completions.create(model=model_name, messages=msgs, stream=True,
                                                  stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - start
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    return {"seconds": time.perf_counter() - start, "first_chunk": first if first is not None else float("nan"),
            "text": text, "tokens": usage.completion_tokens if usage else 0}


async def load(url: str, model_name: str, prompts: list, concurrency: int) -> tuple[list, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    todo = list(enumerate(prompts))
    results: list = [None] * len(prompts)

    async def worker():
        while todo:
            i, (_, msgs) = todo.pop(0)
            try:
                results[i] = await one_request(client, model_name, msgs)
            except openai.OpenAIError as err:   # a failed request is counted as not answered
                print(f"request {i} failed: {type(err).__name__}: {err}", file=sys.stderr)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    await client.close()
    return results, seconds


def _client_process(url: str, model_name: str, prompts: list, concurrency: int, out) -> None:
    out.put(asyncio.run(load(url, model_name, prompts, concurrency)))


def load_in_a_process(url: str, model_name: str, prompts: list, concurrency: int) -> tuple[list, float]:
    """`load` in a separate process, so that the clients do not share the server's interpreter."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_client_process, args=(url, model_name, prompts, concurrency, out))
    proc.start()
    while True:   # a client process that dies would otherwise leave the parent waiting for ever
        try:
            result = out.get(timeout=1.0)
            break
        except queue.Empty:
            if not proc.is_alive():
                try:   # what it put just before it ended
                    result = out.get(timeout=1.0)
                    break
                except queue.Empty:
                    raise RuntimeError(f"the client process ended (exit code {proc.exitcode}) without its "
                                       f"results") from None
    proc.join()
    return result


def percentile(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def level_row(concurrency: int, results: list, seconds: float, expected: list[str]) -> dict:
    done = [r for r in results if r is not None]
    tokens = sum(r["tokens"] for r in done)
    lat = [r["seconds"] for r in done]
    ttfc = [r["first_chunk"] for r in done]
    return {"concurrency": concurrency, "requests": len(results), "answered": len(done),
            "equal_offline": sum(r["text"] == e for r, e in zip(results, expected) if r is not None),
            "seconds": round(seconds, 3), "requests_per_s": round(len(done) / seconds, 3),
            "output_tokens_per_s": round(tokens / seconds, 1),
            "latency_p50_s": round(percentile(lat, 0.5), 4), "latency_p99_s": round(percentile(lat, 0.99), 4),
            "first_chunk_p50_s": round(percentile(ttfc, 0.5), 4), "first_chunk_p99_s": round(percentile(ttfc, 0.99), 4)}


class Breakdown:
    """Where the engine's time goes during a level (`--breakdown`), summed over the level and given
    in milliseconds per request: forwards that recompute every column of their canvas (`full`: a
    step without a cache, a refresh, a joining row's first forward) and forwards that recompute
    fewer (`partial`), the rest of the engine's steps (scoring, sampler, commits, the plan) and the
    engine's time outside its steps (admission, streaming the text, waiting for requests). Times are
    the host's wall clock: on a CPU the work itself; on a GPU a forward's time is its launch, and
    the device's queued work lands in whatever next waits for it."""

    def __init__(self, model, engine):
        self.engine_step = engine.on_step
        engine.on_step = self._on_step
        self.hooks = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                      model.register_forward_hook(self._after, with_kwargs=True)]
        self.reset()

    def reset(self) -> None:
        self.seconds = {"full": 0.0, "partial": 0.0, "steps": 0.0}
        self.calls = {"full": 0, "partial": 0, "partial_rows": 0}
        self._step = dict.fromkeys(["full", "partial", "partial_rows"], 0) | {"full_s": 0.0, "partial_s": 0.0}
        self._start = None

    def _before(self, model, args, kwargs) -> None:
        self._start = time.perf_counter()

    def _after(self, model, args, kwargs, output) -> None:
        x, plan = args[0], kwargs.get("positions")
        kind = "full" if plan is None or plan.shape[1] >= x.shape[1] else "partial"
        self._step[kind + "_s"] += time.perf_counter() - self._start
        self._step[kind] += 1
        if kind == "partial":
            self._step["partial_rows"] += x.shape[0]

    def _on_step(self, seconds: float, rows: int, tokens: int) -> None:
        # a step's forwards count with the step, so that a level's last step (which the engine
        # reports after the answers it streamed) falls wholly in one level
        step, self._step = self._step, dict.fromkeys(self._step, 0)
        self.seconds["steps"] += seconds
        for kind in ("full", "partial"):
            self.seconds[kind] += step[kind + "_s"]
            self.calls[kind] += step[kind]
        self.calls["partial_rows"] += step["partial_rows"]
        if self.engine_step is not None:
            self.engine_step(seconds, rows, tokens)

    def row(self, requests: int, wall: float) -> dict:
        """The level's figures, then `reset` for the next level."""
        ms = lambda seconds: round(seconds / requests * 1e3, 2)   # noqa: E731
        forwards = self.seconds["full"] + self.seconds["partial"]
        out = {"full_forward_ms": ms(self.seconds["full"]), "partial_forward_ms": ms(self.seconds["partial"]),
               "rest_of_steps_ms": ms(self.seconds["steps"] - forwards),
               "outside_steps_ms": ms(wall - self.seconds["steps"]),
               "full_forwards": self.calls["full"], "partial_forwards": self.calls["partial"],
               "rows_per_partial_forward": round(self.calls["partial_rows"] / max(self.calls["partial"], 1), 2)}
        self.reset()
        return out


def offline_batches(model, tokenizer, prompt_ids: list[list[int]], config, sizes: list[int]) -> None:
    """What batching gains without the server: `dllm.generate` on the same prompts in batches of each
    size (one warm-up batch first), printed as seconds, batched forwards, answer tokens per second
    and the speedup over the first size."""
    dllm.generate(model, tokenizer, prompt_ids[:sizes[0]], config)
    print("| offline batch | prompts | seconds | forwards | answer tokens/s | speedup |")
    print("|---|---|---|---|---|---|")
    first = None
    for size in sizes:
        start, forwards, tokens = time.perf_counter(), 0, 0
        for i in range(0, len(prompt_ids), size):
            out = dllm.generate(model, tokenizer, prompt_ids[i:i + size], config)
            forwards, tokens = forwards + out.forwards, tokens + sum(out.answer_lengths)
        seconds = time.perf_counter() - start
        first = first or seconds
        print(f"| {size} | {len(prompt_ids)} | {seconds:.2f} | {forwards} | {tokens / seconds:.1f} "
              f"| {first / seconds:.2f}x |", flush=True)


def print_levels(rows: list[dict]) -> None:
    """One Markdown row per level, with its throughput relative to concurrency 1."""
    base = rows[0]["output_tokens_per_s"] if rows and rows[0]["concurrency"] == 1 else None
    print("| concurrency | answered | equal offline | requests/s | output tokens/s | vs c=1 | p50 s | p99 s "
          "| first chunk p50 s | p99 s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['output_tokens_per_s'] / base:.2f}x" if base else "-"
        print(f"| {r['concurrency']} | {r['answered']}/{r['requests']} | {r['equal_offline']} | {r['requests_per_s']} "
              f"| {r['output_tokens_per_s']} | {ratio} | {r['latency_p50_s']} | {r['latency_p99_s']} "
              f"| {r['first_chunk_p50_s']} | {r['first_chunk_p99_s']} |")


def append_rows(path: str, rows: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def print_breakdown(rows: list[dict]) -> None:
    print("\n| concurrency | full forwards ms/request | partial forwards ms/request | rest of steps ms/request "
          "| outside steps ms/request | full / partial forwards | rows per partial forward |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['full_forward_ms']} | {r['partial_forward_ms']} | {r['rest_of_steps_ms']} "
              f"| {r['outside_steps_ms']} | {r['full_forwards']} / {r['partial_forwards']} "
              f"| {r['rows_per_partial_forward']} |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model folder or name (default: the shipped model)")
    p.add_argument("--requests", type=int, default=64, help="requests per concurrency level")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--tasks", default="waiting_line/copy,waiting_line/reverse,puzzle/sudoku_n4_12")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--sampler", default="low_confidence")
    p.add_argument("--sampler-arg", action="append", metavar="KEY=VALUE", help="sampler argument (repeatable)")
    p.add_argument("--cache", default="none")
    p.add_argument("--cache-arg", action="append", metavar="KEY=VALUE", help="cache argument (repeatable)")
    p.add_argument("--block-length", type=int, default=None)
    p.add_argument("--max-batch-rows", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--offline-batches", default=None, metavar="SIZES",
                   help="first time dllm.generate on the first max(SIZES) prompts in batches of each size "
                        "(e.g. 1,8,32); --concurrency '' skips the server")
    p.add_argument("--breakdown", action="store_true",
                   help="also report where the engine's time goes at each level, in ms per request (Breakdown)")
    p.add_argument("--out", default=None, help="append one JSON row per level here")
    args = p.parse_args(argv)
    if args.requests < 1:
        p.error(f"--requests must be at least 1, got {args.requests}")
    levels = counts(p, "--concurrency", args.concurrency, None)
    sizes = counts(p, "--offline-batches", args.offline_batches or "", args.requests)
    return args, levels, sizes


def counts(p: argparse.ArgumentParser, option: str, text: str, most: int | None) -> list[int]:
    """A comma list of positive integers (at most `most`), or a parser error naming `option`."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = None
    if values is None or any(v < 1 or (most is not None and v > most) for v in values):
        bound = f"between 1 and --requests ({most})" if most is not None else "at least 1"
        p.error(f"{option} must be a comma list of integers {bound}, got {text!r}")
    return values


def run_meta(args, name: str, defaults, device: torch.device) -> dict:
    """The fields every row of a run shares: the settings, the software and the machine (`device`:
    the model's)."""
    commit, dirty = source_commit()
    return {"model": name, "gen_length": args.gen_length, "block_length": args.block_length,
            "sampler": args.sampler, "sampler_args": defaults.sampler_kwargs, "cache": args.cache,
            "cache_args": defaults.cache_kwargs, "dtype": args.dtype, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "timestamp": timestamp(), "versions": versions(),
            "hardware": hardware(device=device), "git_commit": commit, "git_dirty": dirty}


def main(argv=None) -> int:
    args, levels, sizes = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from dllm.serve import build_app, serve

    if levels:   # the server's stack and the client, checked before the model loads
        try:
            import fastapi, openai, uvicorn  # noqa: F401,E401
        except ImportError as err:
            print(f"error: {err.name} is not installed (pip install 'dllm[serve]' openai)", file=sys.stderr)
            return 2
    model, tok = dllm.load(args.model, dtype=args.dtype, device=args.device)
    name = args.model or model.name_or_path
    defaults = dllm.GenerationConfig(gen_length=args.gen_length, block_length=args.block_length, sampler=args.sampler,
                                     sampler_kwargs=parse_kv(args.sampler_arg, "--sampler-arg"), cache=args.cache,
                                     cache_kwargs=parse_kv(args.cache_arg, "--cache-arg"), seed=0)
    prompts = prompts_of(args.tasks.split(","), args.requests)
    if sizes:
        offline_batches(model, tok, [encode_messages(tok, m) for _, m in prompts[:max(sizes)]], defaults, sizes)
    if not levels:
        return 0
    expected = [dllm.generate(model, tok, [encode_messages(tok, m)], defaults).texts[0] for _, m in prompts]
    app = build_app(model, tok, model_name=name, defaults=defaults, max_batch_rows=args.max_batch_rows,
                    max_queue=max(levels) * 4, engine_thread=False)
    breakdown = Breakdown(model, app.state.engine) if args.breakdown else None
    rows = []
    meta = run_meta(args, name, defaults, model.device) if args.out else None

    def run_levels(base_url: str) -> None:
        try:
            for c in levels:
                if breakdown:
                    breakdown.reset()
                results, seconds = load_in_a_process(base_url + "/v1", name, prompts, c)
                rows.append(level_row(c, results, seconds, expected))
                if breakdown:
                    rows[-1].update(breakdown.row(len(prompts), seconds))
                if args.out:      # each level's row as it is made: a stopped run keeps the finished ones
                    append_rows(args.out, [{**meta, **rows[-1]}])
        finally:
            app.state.engine.stop()

    serve(app, host="127.0.0.1", port=0, log_level="warning", on_started=run_levels)
    print_levels(rows)
    if breakdown:
        print_breakdown(rows)
    lost = len(rows) < len(levels) or any(r["answered"] < r["requests"] or r["equal_offline"] < r["requests"]
                                          for r in rows)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
