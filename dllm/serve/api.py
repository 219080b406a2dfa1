"""The OpenAI-compatible HTTP API of `dllm serve` (FastAPI): `/v1/chat/completions`,
`/v1/completions`, `/v1/models`, `/health` and `/metrics`. docs/serving.md describes it."""
from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import GenerationConfig
from ..decode import encode_prompts, model_lengths, partial_block_problem, prompt_problem, resolve_sampler
from .engine import Engine, EngineStopped, Job, QueueFull
from .metrics import ServerMetrics
from .schema import ChatRequest, CompletionRequest, RequestError, length_fields_set, refusal_param, request_config

RETRY_AFTER_S = 1          # what a 429 asks the client to wait
DISCONNECT_CHECK_S = 0.5   # how often a waiting request asks whether its client is still there


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """An OpenAI-style error body; its `type` tells the HTTP status."""
    kind = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
            408: "timeout_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(status, "server_error")
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")   # echoed input may hold lone surrogates
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


class Server:
    """What the routes share: the engine, the model's name and tokenizer, the defaults, the metrics."""

    def __init__(self, engine: Engine, model_name: str, defaults: GenerationConfig, timeout: float | None):
        self.engine, self.model_name, self.defaults, self.timeout = engine, model_name, defaults, timeout
        self.tokenizer = engine.tokenizer
        self.metrics = ServerMetrics(engine)
        engine.on_step = self.metrics.on_step
        self.created = int(time.time())

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "dllm"}

    def job(self, body, prompt: list[int], max_tokens: int | None, emit) -> Job:
        if body.model is not None and body.model != self.model_name:
            raise RequestError(f"model {body.model!r} is not served here; this server serves {self.model_name!r}",
                               "model")
        field = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
        set_fields = length_fields_set(body, max_tokens, field)
        model = self.engine.model
        try:                        # the lengths as the model runs them (a checkpoint's own length, say)
            config = model_lengths(model, request_config(body, self.defaults, max_tokens, field))
        except RequestError:
            raise
        except ValueError as err:
            raise RequestError(str(err), refusal_param(str(err), set_fields, field)) from None
        gen, limit = config.gen_length, model.config.max_seq_len
        if len(prompt) + gen > limit:
            raise RequestError(f"the prompt's {len(prompt)} tokens + {field} {gen} exceed the model's "
                               f"{limit}-token context", field)
        self._check_blocks(prompt, config, "messages" if isinstance(body, ChatRequest) else "prompt")
        canvas = bool(body.dllm and body.dllm.stream_canvas)
        return Job(prompt, config, emit, stop=body.stops(), stream_canvas=canvas,
                   timeout=self.timeout, length_field=field, length_fields=set_fields)

    def _check_blocks(self, prompt: list[int], config: GenerationConfig, param: str) -> None:
        """A prompt leaving a partial first attention block is refused, naming the prompt's field,
        for a sampler that spreads its steps over whole blocks."""
        model = self.engine.model
        if model.config.attention_block is None:
            return
        try:
            sampler = resolve_sampler(model, config)
        except (ValueError, TypeError):
            return                  # refused, naming its field, when the batch is set up
        problem = partial_block_problem(sampler, [len(prompt)], model.config.attention_block)
        if problem:
            raise RequestError(problem, param)

    def chat_prompt(self, body: ChatRequest) -> list[int]:
        messages = [m.for_template() for m in body.messages]
        for i, message in enumerate(messages):
            try:
                message["content"].encode("utf-8")
            except UnicodeEncodeError as err:
                raise RequestError(f"messages[{i}].content is not valid UTF-8 text ({err.reason} at character "
                                   f"{err.start})", "messages") from None
        try:
            ids = list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                          return_dict=False))
        except Exception as err:   # a template that refuses the roles or their order
            raise RequestError(f"the model's chat template cannot render these messages: {err}", "messages") from None
        return self._checked(ids, "messages")

    def completion_prompt(self, body: CompletionRequest) -> list[int]:
        if isinstance(body.prompt, str):
            try:
                ids = encode_prompts(self.tokenizer, [body.prompt], chat=False)[0]   # as dllm.generate encodes it
            except Exception as err:   # text the tokenizer cannot encode (e.g. a lone surrogate)
                raise RequestError(f"the tokenizer cannot encode this prompt: {err}", "prompt") from None
            return self._checked(ids, "prompt")
        return self._checked(list(body.prompt), "prompt")

    def _checked(self, ids: list[int], param: str) -> list[int]:
        """The prompt's ids, refused (naming the request field) when `dllm.generate` would refuse them."""
        problem = prompt_problem(ids, self.engine.model.config, self.engine.mask_id)
        if problem:
            raise RequestError(f"the prompt ({param}) {problem}", param)
        return ids


def create_app(server: Server, engine_thread: bool = True) -> FastAPI:
    """The FastAPI application of a `Server`. The engine stops with it; with `engine_thread` it
    also starts with it, in a thread of its own, and otherwise the caller runs it
    (`app.state.engine.run()`, as `dllm.serve.serve` does)."""
    app = FastAPI(title="dllm serve", lifespan=_lifespan(server, engine_thread))
    app.state.engine, app.state.engine_thread = server.engine, engine_thread

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        server.metrics.requests.labels("invalid").inc()
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            reason = first.get("ctx", {}).get("error", first["msg"])
            return error_response(400, f"the request body is not valid JSON: {reason}", None)
        # a union's member names its type ("stop.str"); the field is the path without them
        param = ".".join(str(p) for p in first["loc"] if p != "body" and not _is_type_tag(p)) or None
        message = first["msg"].removeprefix("Value error, ")   # a validator's own message, as it wrote it
        return error_response(400, f"{param}: {message}" if param else message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        if err.status_code == 400:
            server.metrics.requests.labels("invalid").inc()
        return error_response(err.status_code, str(err.detail), None, getattr(err, "headers", None))

    @app.get("/health")
    async def health():
        if server.engine.stopped:   # no request would be answered: a balancer should route elsewhere
            return error_response(503, "the engine has stopped; requests are answered 503")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [server.model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != server.model_name:
            return error_response(404, f"model {model_id!r} is not served here; this server serves "
                                       f"{server.model_name!r}", "model")
        return server.model_card()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        return await _complete(server, request, body, "chat", lambda: server.chat_prompt(body),
                               body.max_completion_tokens or body.max_tokens)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _complete(server, request, body, "text", lambda: server.completion_prompt(body), body.max_tokens)

    return app


def _lifespan(server: Server, engine_thread: bool):
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        if engine_thread:
            server.engine.start()
        elif not getattr(app.state, "served", False):
            raise RuntimeError("this app was built with engine_thread=False: nothing would step its batches; "
                               "run it with dllm.serve.serve(app), or build it with engine_thread=True")
        yield
        server.engine.stop()

    return lifespan


async def _complete(server: Server, request: Request, body, kind: str, prompt_of, max_tokens):
    """Queue the request, wait until its batch is built, then answer it whole or as a stream."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def emit(event, payload):
        loop.call_soon_threadsafe(events.put_nowait, (event, payload))

    try:
        job = server.job(body, prompt_of(), max_tokens, emit)
        server.engine.submit(job)
    except RequestError as err:
        server.metrics.requests.labels("invalid").inc()
        return error_response(err.status, str(err), err.param)
    except QueueFull as err:
        server.metrics.requests.labels("rejected").inc()
        return error_response(429, f"the server is busy: {err}; retry later", None,
                              {"Retry-After": str(RETRY_AFTER_S)})
    except EngineStopped as err:
        server.metrics.requests.labels("rejected").inc()
        return error_response(503, str(err))
    try:
        event, payload = await _next_event(events, request)
        if event == "error":
            return _failed(server, payload)
        reply = _Reply(server, job, kind, body)
        if body.stream:
            return StreamingResponse(_stream(events, request, server, job, reply, body),
                                     media_type="text/event-stream")
        while event != "done":
            event, payload = await _next_event(events, request)
            if event == "error":
                return _failed(server, payload)
    except _Disconnected:
        server.engine.cancel(job)
        server.metrics.requests.labels("disconnected").inc()
        return error_response(499, "the client closed the connection")
    server.metrics.requests.labels("ok").inc()
    return reply.whole(payload)


async def _next_event(events: asyncio.Queue, request: Request):
    """The job's next event; raises _Disconnected when the client has gone away, asked at least
    every DISCONNECT_CHECK_S, also while events keep coming."""
    now = time.monotonic()
    last = getattr(request.state, "disconnect_checked", now)
    if now - last >= DISCONNECT_CHECK_S:
        if await request.is_disconnected():
            raise _Disconnected
        last = now
    request.state.disconnect_checked = last
    while True:
        try:
            return await asyncio.wait_for(events.get(), timeout=DISCONNECT_CHECK_S)
        except asyncio.TimeoutError:
            request.state.disconnect_checked = time.monotonic()
            if await request.is_disconnected():
                raise _Disconnected from None


class _Disconnected(Exception):
    """The client closed the connection before its answer was complete."""


def _is_type_tag(part) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def _failed(server: Server, payload) -> JSONResponse:
    status, message, param = payload
    _count_failure(server, status)
    return error_response(status, message, param)


def _count_failure(server: Server, status: int) -> None:
    server.metrics.requests.labels("invalid" if status == 400 else "failed").inc()


async def _stream(events: asyncio.Queue, request: Request, server: Server, job: Job, reply: "_Reply", body):
    """Server-sent events in the OpenAI chunk format; with `stream_options.include_usage` a last
    chunk without choices carries the usage."""
    finished = False
    try:
        yield reply.sse(reply.first_chunk())
        while True:
            event, payload = await _next_event(events, request)
            if event == "delta":
                yield reply.sse(reply.chunk(payload))
            elif event == "canvas":
                yield reply.sse(reply.canvas_chunk(payload))
            elif event == "error":
                status, message, param = payload
                yield reply.sse(error_body(status, message, param))
                _count_failure(server, status)
                break
            elif event == "done":
                yield reply.sse(reply.last_chunk(payload))
                if body.stream_options is not None and body.stream_options.include_usage:
                    yield reply.sse(reply.usage_chunk(payload))
                server.metrics.requests.labels("ok").inc()
                break
        finished = True
        yield "data: [DONE]\n\n"
    except _Disconnected:
        return
    finally:
        if not finished:   # the client went away (or the stream broke): stop decoding for it
            server.engine.cancel(job)
            server.metrics.requests.labels("disconnected").inc()


class _Reply:
    """The OpenAI response and chunk bodies of one request (`kind` "chat" or "text")."""

    def __init__(self, server: Server, job: Job, kind: str, body):
        self.kind, self.model = kind, server.model_name
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    @staticmethod
    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    @staticmethod
    def usage(result: dict) -> dict:
        return {"prompt_tokens": result["prompt_tokens"], "completion_tokens": result["completion_tokens"],
                "total_tokens": result["prompt_tokens"] + result["completion_tokens"], "forwards": result["forwards"]}

    def _base(self, choices, chunk: bool) -> dict:
        obj = "chat.completion.chunk" if chunk and self.kind == "chat" else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _choice(self, text: str | None, finish_reason, chunk: bool) -> dict:
        if self.kind == "text":
            return {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
        if chunk:
            return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                    "finish_reason": finish_reason}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                "finish_reason": finish_reason}

    def whole(self, result: dict) -> dict:
        body = self._base([self._choice(result["text"], result["finish_reason"], False)], False)
        body["usage"] = self.usage(result)
        return body

    def first_chunk(self) -> dict:
        if self.kind == "chat":
            return self._base([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}], True)
        return self._base([self._choice("", None, True)], True)

    def chunk(self, text: str) -> dict:
        return self._base([self._choice(text, None, True)], True)

    def canvas_chunk(self, canvas: str) -> dict:
        body = self._base([self._choice(None if self.kind == "chat" else "", None, True)], True)
        body["dllm"] = {"canvas": canvas}
        return body

    def last_chunk(self, result: dict) -> dict:
        return self._base([self._choice(None if self.kind == "chat" else "", result["finish_reason"], True)], True)

    def usage_chunk(self, result: dict) -> dict:
        """OpenAI's usage chunk: after the finish reason, no choices."""
        body = self._base([], True)
        body["usage"] = self.usage(result)
        return body
