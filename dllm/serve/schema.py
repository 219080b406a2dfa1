"""The request bodies `dllm serve` accepts (pydantic), and how they become a `GenerationConfig`.

The OpenAI fields that apply to a masked-diffusion model are read: `max_tokens` (or
`max_completion_tokens`) is the generation length, `temperature`, `seed`, `stop`, `n` (1 only),
`stream` with `stream_options`. Sampling knobs a diffusion sampler has no use for (`top_p`,
`frequency_penalty`, `presence_penalty`, `logprobs`) are accepted only at their neutral values.
The extension object `dllm` chooses the sampler and its arguments, the cache policy and its
arguments, the block length and the steps; the server's defaults apply to whatever is absent.
Any other field is an error that names it.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationInfo, field_validator,
                      model_validator)

from ..cache import available_policies
from ..config import GenerationConfig
from ..decode import with_instances
from ..samplers import available as available_samplers, sampler_class


class RequestError(ValueError):
    """A bad request: HTTP 400 with an OpenAI-style error body naming `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


class DllmOptions(BaseModel):
    """The `dllm` extension object of a request."""

    model_config = ConfigDict(extra="forbid")
    sampler: str | None = None
    sampler_args: dict[str, Any] | None = None
    cache: str | None = None
    cache_args: dict[str, Any] | None = None
    block_length: StrictInt | None = Field(None, ge=1)
    steps: StrictInt | None = Field(None, ge=1)
    suffix_dropout: dict[str, Any] | Literal[False] | None = None    # false: off, whatever the server's default
    stream_canvas: StrictBool | None = None      # null: false, as OpenAI's own optional booleans


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: StrictInt | None = Field(None, ge=0, lt=2 ** 63)
    stop: str | list[str] | None = None
    n: StrictInt | None = None          # null: the API's default (1, false)
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: StrictBool | None = None
    dllm: DllmOptions | None = None

    @field_validator("temperature", "top_p", "frequency_penalty", "presence_penalty", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        """A JSON number: true/false and strings are refused, as OpenAI refuses them."""
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"expected a number, got {value!r}")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        """Named by its own field (`stream` is validated before it)."""
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4 or not all(stops):
            raise RequestError(f"stop takes up to 4 non-empty strings, got {self.stop!r}", "stop")
        return tuple(stops)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message as OpenAI's API takes it: its content a string or text parts (joined), a
    `developer` message read as a system one; an assistant message may have no content."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_unless_assistant(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def for_template(self) -> dict:
        """The message as a chat template reads it: {"role", "content"} with plain text."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)


class CompletionRequest(_Request):
    prompt: str | list[int]
    logprobs: StrictInt | None = Field(None, ge=0, le=5)   # the completions API's count (chat's is a flag)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        """One prompt per request: a string, or a list of token ids."""
        if isinstance(value, str) or (isinstance(value, list) and all(type(t) is int for t in value)):
            return value
        raise ValueError(f"expected a string or a list of token ids (one prompt per request), got {str(value)[:80]}")


def param_of(message: str, length_field: str = "max_tokens") -> str | None:
    """The request field a refusal names (the first length setting, or the temperature, its message
    mentions as a word), or None."""
    words = set(re.findall(r"\w+", message))
    fields = (("block_length", "dllm.block_length"), ("steps", "dllm.steps"), ("tokens_per_step", "dllm.steps"),
              ("gen_length", length_field), ("temperature", "temperature"))
    return next((param for word, param in fields if word in words), None)


def length_fields_set(body: _Request, max_tokens: int | None, length_field: str = "max_tokens") -> tuple[str, ...]:
    """The length fields the request itself set (its `max_tokens` and the extension's lengths)."""
    options = body.dllm or DllmOptions()
    return tuple(param for param, value in ((length_field, max_tokens), ("dllm.block_length", options.block_length),
                                            ("dllm.steps", options.steps)) if value is not None)


def refusal_param(message: str, set_fields: tuple[str, ...], length_field: str = "max_tokens") -> str | None:
    """The field a refusal names: for a refusal of the lengths, the length field it mentions when
    the request set that one, else the first the request set, else `length_field` (the clash is
    with the server's defaults); otherwise the field its message mentions (`param_of`), or None."""
    named = param_of(message, length_field)
    if named not in (length_field, "dllm.block_length", "dllm.steps"):
        return named
    return named if named in set_fields else (set_fields[0] if set_fields else length_field)


def check_neutral(body: _Request) -> None:
    """Refuse the OpenAI knobs a diffusion sampler does not have, unless they are at their neutral value."""
    if body.n not in (None, 1):
        raise RequestError(f"n must be 1 (one answer per request), got {body.n}", "n")
    for name, neutral in (("top_p", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        value = getattr(body, name)
        if value is not None and value != neutral:
            raise RequestError(f"{name} is not supported by dllm's samplers; leave it out or set it to {neutral}", name)
    if body.logprobs is not None and body.logprobs is not False:   # a completion's count 0 asks for some too
        neutral = "false" if isinstance(body, ChatRequest) else "null"
        raise RequestError(f"logprobs is not supported by dllm's samplers; leave it out or set it to {neutral}",
                           "logprobs")


def request_config(body: _Request, defaults: GenerationConfig, max_tokens: int | None,
                   length_field: str = "max_tokens") -> GenerationConfig:
    """The request's `GenerationConfig`: the server's defaults with the request's fields. Each field
    is checked on its own, so that an error names the field it comes from (the lengths are checked
    together against the model by `dllm.serve.api.Server.job`)."""
    check_neutral(body)
    options = body.dllm or DllmOptions()
    _check_files(options, defaults)
    stages = [
        (length_field, dict(gen_length=max_tokens) if max_tokens is not None else {}),
        ("temperature", dict(temperature=body.temperature) if body.temperature is not None else {}),
        ("seed", dict(seed=body.seed) if body.seed is not None else {}),
        (_param("dllm.sampler", options.sampler, options.sampler_args, available_samplers()),
         _sampler_fields(options, defaults)),
        (_param("dllm.cache", options.cache, options.cache_args, available_policies()), _cache_fields(options, defaults)),
        ("dllm.block_length", dict(block_length=options.block_length) if options.block_length else {}),
        ("dllm.steps", dict(steps=options.steps, tokens_per_step=None) if options.steps else {}),
        ("dllm.suffix_dropout", {} if options.suffix_dropout is None else
         dict(suffix_dropout=None if options.suffix_dropout is False else options.suffix_dropout)),
    ]
    config = defaults
    for param, changes in stages:
        if not changes:
            continue
        try:
            config = config.replace(**changes)
            if param.startswith(("dllm.sampler", "dllm.cache")):
                with_instances(config)
        except (ValueError, TypeError, OSError) as err:   # OSError: a file argument (a Learn2PD filter)
            raise RequestError(str(err), param) from None
    return config


@functools.lru_cache(maxsize=1)
def file_arguments() -> frozenset[str]:
    """The sampler arguments that name a file (`Sampler.file_arguments` of every registered sampler)."""
    return frozenset(name for sampler in available_samplers() for name in sampler_class(sampler).file_arguments)


def _file_values(args: dict) -> list[tuple[str, Any]]:
    """(name, value) of every file argument in `args`, also inside a wrapper's arguments (Prophet's
    base_kwargs)."""
    found = [(name, value) for name, value in args.items() if name in file_arguments()]
    for value in args.values():
        if isinstance(value, dict):
            found += _file_values(value)
    return found


def _check_files(options: DllmOptions, defaults: GenerationConfig) -> None:
    """A request names no file on the server: a file argument (Learn2PD's `filter`, PC-Sampler's
    `frequencies`) may be left out, "none", or the server's own (its --sampler-arg)."""
    for name, value in _file_values(options.sampler_args or {}):
        if value not in (None, "none", defaults.sampler_kwargs.get(name)):
            raise RequestError(f"dllm.sampler_args.{name}: a request cannot name a file on the server; leave it out "
                               f"(the model's or the server's file) or give \"none\"", "dllm.sampler_args")


def _param(field: str, name: str | None, args: dict | None, names: list[str]) -> str:
    """The request field a refusal of the sampler or cache names: its arguments once its name (or the
    server's default) is a registered one."""
    return f"{field}_args" if args and (name is None or name in names) else field


def _sampler_fields(options: DllmOptions, defaults: GenerationConfig) -> dict:
    if options.sampler is None and options.sampler_args is None:
        return {}
    if options.sampler is None and defaults.sampler is None:
        raise RequestError("dllm.sampler_args needs dllm.sampler (the server has no default sampler)",
                           "dllm.sampler_args")
    sampler = options.sampler or defaults.sampler
    return dict(sampler=sampler, sampler_kwargs=_arguments(options.sampler, defaults.sampler, defaults.sampler_kwargs,
                                                           options.sampler_args))


def _cache_fields(options: DllmOptions, defaults: GenerationConfig) -> dict:
    if options.cache is None and options.cache_args is None:
        return {}
    return dict(cache=options.cache or defaults.cache,
                cache_kwargs=_arguments(options.cache, defaults.cache, defaults.cache_kwargs, options.cache_args))


def _arguments(name, default_name, default_args: dict, args: dict | None) -> dict:
    """A request's sampler (or cache) arguments: added to the server's when it keeps the server's
    sampler (leaving the name out or naming it), on their own when it names another."""
    keeps = name is None or name == default_name
    return {**(default_args if keeps else {}), **(args or {})}
