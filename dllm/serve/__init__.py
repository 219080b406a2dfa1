"""`dllm serve`: an OpenAI-compatible HTTP server with streaming and continuous batching
(docs/serving.md). `engine` steps the running batches, `schema` reads requests, `api` holds the
routes, `metrics` the Prometheus metrics, `runner` runs a server.

    from dllm.serve import build_app, serve
    app = build_app(model, tokenizer, model_name="llada-pb-tiny", engine_thread=False)
    serve(app, port=8000)          # HTTP in a thread, the batches stepped in this one
"""
from __future__ import annotations

from ..config import GenerationConfig
from ..decode import check_request
from .runner import check_port, serve

__all__ = ["build_app", "check_port", "serve"]


def build_app(model, tokenizer, *, model_name: str, defaults: GenerationConfig | None = None,
              max_batch_rows: int = 32, max_queue: int = 256, timeout: float | None = None,
              engine_thread: bool = True):
    """The FastAPI application serving `model`: requests decode with `defaults` where they give
    nothing else; at most `max_batch_rows` rows decode at once and `max_queue` requests wait
    (beyond that: 429); a request running longer than `timeout` seconds is dropped (408).
    Raises ValueError when `model` refuses `defaults` (as `dllm.generate` would).
    With `engine_thread` the engine starts and stops with the application in a thread of its own
    (for `uvicorn.run(app)`); without it, `serve(app)` steps the batches in the calling thread."""
    from .api import Server, create_app
    from .engine import Engine

    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    defaults = defaults or GenerationConfig()
    check_request(model, defaults, tokenizer)       # defaults the model refuses would fail every request
    engine = Engine(model, tokenizer, max_batch_rows=max_batch_rows, max_queue=max_queue)
    return create_app(Server(engine, model_name, defaults, timeout), engine_thread)
