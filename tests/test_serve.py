"""`dllm serve` end to end: a server on 127.0.0.1 (a free port) with the shipped model, driven by
the real `openai` client and raw HTTP: answers equal offline `dllm.generate`, streaming, the
extension fields, bad input, disconnects, a full queue, concurrency and the metrics."""
import concurrent.futures
import json
import threading
import time

import pytest
import torch

import dllm

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from dllm.serve import build_app, serve  # noqa: E402

GEN = 32
DEFAULTS = dllm.GenerationConfig(gen_length=GEN, sampler="low_confidence", seed=0)
QUESTIONS = ['["Ann Lee", "Bob Ray", "Cy Tam"]', '["Emma Hughes", "Paul Reed"]', '["Dee Fox", "Al Roe", "Jo Kim", "Ty Orr"]']


def copy_messages(names: str) -> list[dict]:
    return [{"role": "user", "content": "You are managing a waiting line at a customer service desk.\nYou need to "
             f"record the following people in the order they arrived:\n{names}\nPlease copy the list exactly and "
             "provide only the final list."}]


class RunningServer:
    """uvicorn serving an app in a thread, on a port the OS picks."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def shipped():
    return dllm.load(dtype="float32")


@pytest.fixture(scope="module")
def server(shipped):
    model, tok = shipped
    running = RunningServer(build_app(model, tok, model_name="llada-pb-tiny", defaults=DEFAULTS, max_batch_rows=8,
                                      max_queue=64))
    yield running
    running.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def offline(shipped, messages, **changes):
    model, tok = shipped
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    return dllm.generate(model, tok, [list(ids)], DEFAULTS.replace(**changes))


def test_chat_completion_equals_offline_generate(client, shipped):
    reply = client.chat.completions.create(model="llada-pb-tiny", messages=copy_messages(QUESTIONS[0]))
    want = offline(shipped, copy_messages(QUESTIONS[0]))
    assert reply.choices[0].message.content == want.texts[0]
    assert reply.choices[0].finish_reason == "stop" and reply.object == "chat.completion"
    assert reply.usage.completion_tokens == want.answer_lengths[0]
    assert reply.usage.model_extra["forwards"] <= want.nfe[0]


def test_completion_with_the_extension_object(client, shipped):
    model, tok = shipped
    prompt = tok.apply_chat_template(copy_messages(QUESTIONS[1]), add_generation_prompt=True, tokenize=False)
    extension = {"sampler": "threshold", "sampler_args": {"tau": 0.7}, "block_length": 16,
                 "suffix_dropout": {"window": 8}}
    reply = client.completions.create(model="llada-pb-tiny", prompt=prompt, max_tokens=48,
                                      extra_body={"dllm": extension})
    ids = tok(prompt)["input_ids"]                 # as dllm.generate(..., chat=False) encodes it
    want = dllm.generate(model, tok, [ids], DEFAULTS.replace(gen_length=48, sampler="threshold",
                                                              sampler_kwargs={"tau": 0.7}, block_length=16,
                                                              suffix_dropout={"window": 8}))
    assert reply.choices[0].text == want.texts[0]
    assert reply.usage.model_extra["forwards"] <= want.nfe[0] < 48       # answered once its prefix stops


def test_streaming_sends_the_growing_prefix_and_usage_last(client, shipped):
    kwargs = dict(model="llada-pb-tiny", messages=copy_messages(QUESTIONS[2]), stream=True)
    chunks = list(client.chat.completions.create(**kwargs, stream_options={"include_usage": True}))
    want = offline(shipped, copy_messages(QUESTIONS[2]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.texts[0]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(set(c.choices[0].model_dump(exclude_unset=True)) == {"index", "delta", "logprobs", "finish_reason"}
               for c in chunks if c.choices)
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1     # more than one piece
    # OpenAI's order: the finish reason, then a chunk with no choices that carries the usage
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == want.answer_lengths[0]
    assert all(c.usage is None for c in chunks[:-1])
    # without stream_options (or with include_usage absent or false) no usage is sent
    for extra in ({}, {"stream_options": {}}, {"stream_options": {"include_usage": False}}):
        plain = list(client.chat.completions.create(**kwargs, **extra))
        assert all(c.usage is None and c.choices for c in plain) and plain[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("sampler", ["remdm", "rcr"])
def test_a_sampler_that_rewrites_tokens_streams_its_final_text_once(client, shipped, sampler):
    messages = copy_messages(QUESTIONS[1])
    chunks = list(client.chat.completions.create(model="llada-pb-tiny", messages=messages, stream=True,
                                                 extra_body={"dllm": {"sampler": sampler}}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == [offline(shipped, messages, sampler=sampler).texts[0]]


def test_canvas_stream_shows_every_step(server):
    body = {"messages": copy_messages(QUESTIONS[0]), "stream": True, "dllm": {"stream_canvas": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    canvases = [json.loads(e)["dllm"]["canvas"] for e in events[:-1] if "dllm" in json.loads(e)]
    assert len(canvases) == GEN                                    # one token per step: one canvas per step
    assert canvases[0].count("<|mdm_mask|>") == GEN - 1 and "<|mdm_mask|>" not in canvases[-1]


def test_concurrent_requests_get_their_offline_answers(client, shipped):
    """Eight requests at once share batches that rows join and leave; each answer is its lone one."""
    asks = [QUESTIONS[i % 3][:-1] + f', "Zed {chr(65 + i)}"]' for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda q: client.chat.completions.create(messages=copy_messages(q), model="llada-pb-tiny"),
                                asks))
    for q, reply in zip(asks, replies):
        assert reply.choices[0].message.content == offline(shipped, copy_messages(q)).texts[0]


def test_stop_strings_cut_the_answer(client, shipped):
    want = offline(shipped, copy_messages(QUESTIONS[0])).texts[0]
    assert len(want) > 8
    stop = want[4:7]
    reply = client.chat.completions.create(model="llada-pb-tiny", messages=copy_messages(QUESTIONS[0]),
                                           stop=[stop, "never there"])
    assert reply.choices[0].message.content == want[:want.index(stop)] and reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body,param", [
    ({"n": 2}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0.5}, "top_p"),
    ({"model": "gpt-4"}, "model"),
    ({"best_of": 3}, "best_of"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"dllm": {"sampler": "nope"}}, "dllm.sampler"),
    ({"dllm": {"sampler": "threshold", "sampler_args": {"tau": 7}}}, "dllm.sampler_args"),
    ({"dllm": {"cache": "nope"}}, "dllm.cache"),
    ({"dllm": {"block_length": 5}}, "dllm.block_length"),
    ({"dllm": {"colour": 1}}, "dllm.colour"),
    ({"messages": []}, "messages"),
    ({"seed": 2 ** 64}, "seed"),
    ({"seed": -1}, "seed"),
    ({"dllm": {"sampler": "learn2pd", "sampler_args": {"filter": "/nonexistent/filter.safetensors"}}},
     "dllm.sampler_args"),
    ({"dllm": {"sampler": "dus", "sampler_args": {"base_skip": 10 ** 12}}}, "dllm.sampler_args"),
    ({"dllm": {"cache": "dual", "cache_args": {"refresh": 10 ** 20}}}, "dllm.cache_args"),
    ({"stop": 5}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"max_completion_tokens": 100000}, "max_completion_tokens"),
    ({"max_tokens": True}, "max_tokens"),                       # OpenAI's types, not their coercions
    ({"max_tokens": 8.0}, "max_tokens"),
    ({"seed": True}, "seed"),
    ({"temperature": "0.5"}, "temperature"),
    ({"dllm": {"block_length": True}}, "dllm.block_length"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),       # without stream
    ({"dllm": {"sampler": "learn2pd", "sampler_args": {"filter": "/etc/passwd"}}}, "dllm.sampler_args"),
    ({"dllm": {"sampler": "prophet", "sampler_args": {"base": "learn2pd", "base_kwargs": {"filter": "/etc/passwd"}}}},
     "dllm.sampler_args"),
    ({"dllm": {"sampler": "pc_sampler", "sampler_args": {"frequencies": "/etc/passwd"}}}, "dllm.sampler_args"),
    ({"dllm": {"sampler": "prophet", "sampler_args": {"base": "pc_sampler",
                                                      "base_kwargs": {"frequencies": "/nonexistent.json"}}}},
     "dllm.sampler_args"),
    ({"dllm": {"steps": 10 ** 6}}, "dllm.steps"),
    ({"dllm": {"suffix_dropout": {"window": 0}}}, "dllm.suffix_dropout"),
    ({"dllm": {"suffix_dropout": {"sigma": 2}}}, "dllm.suffix_dropout"),
    ({"dllm": {"suffix_dropout": 4}}, "dllm.suffix_dropout"),
    ({"dllm": {"suffix_dropout": {}}}, "dllm.suffix_dropout"),
    ({"dllm": {"suffix_dropout": True}}, "dllm.suffix_dropout"),
    ({"dllm": {"sampler": "remdm", "sampler_args": {"remdm_steps": 10 ** 6}}}, None),   # more forwards than the
                                                                                          # server takes per token
])
def test_bad_requests_get_a_400_naming_the_field(server, body, param):
    request = {"messages": copy_messages(QUESTIONS[0]), **body}
    r = httpx.post(server.url + "/v1/chat/completions", json=request, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_logprobs_take_each_endpoints_type_and_only_their_neutral_value(server):
    """Chat's logprobs is a flag (false is neutral); the completions API's is a count of 0 to 5 (any
    count asks for log-probabilities, so only null is neutral)."""
    chat = {"messages": copy_messages(QUESTIONS[0]), "max_tokens": 8}
    completion = {"prompt": "Hi", "max_tokens": 8}
    for path, body, status in [("chat/completions", {**chat, "logprobs": False}, 200),
                               ("chat/completions", {**chat, "logprobs": True}, 400),
                               ("completions", {**completion, "logprobs": None}, 200),
                               ("completions", {**completion, "logprobs": 0}, 400),
                               ("completions", {**completion, "logprobs": 2}, 400),
                               ("completions", {**completion, "logprobs": False}, 400),
                               ("completions", {**completion, "logprobs": 6}, 400)]:
        r = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)
        assert r.status_code == status, (path, body, r.text)
        if status == 200:        # OpenAI's choice fields, logprobs null
            choice = r.json()["choices"][0]
            assert set(choice) == {"index", "message" if path.startswith("chat") else "text", "logprobs",
                                   "finish_reason"} and choice["logprobs"] is None, r.text
        if status == 400:
            error = r.json()["error"]
            assert error["param"] == "logprobs", r.text
            if isinstance(body["logprobs"], int) and not isinstance(body["logprobs"], bool) and body["logprobs"] <= 5:
                assert "set it to null" in error["message"], r.text       # the count field takes no false


def test_a_body_that_is_not_json_or_a_prompt_of_no_known_form_is_named(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"not json", timeout=60,
                   headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] is None
    assert error["message"].startswith("the request body is not valid JSON")
    for prompt in ([[1, 2], [3]], {"text": "hi"}, [1.5], None):
        r = httpx.post(server.url + "/v1/completions", json={"model": "llada-pb-tiny", "prompt": prompt}, timeout=60)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "prompt", r.text
        assert error["message"].startswith("prompt: expected a string or a list of token ids"), error["message"]
    r = httpx.post(server.url + "/v1/completions", content=json.dumps({"prompt": "hi \ud800 there"}),   # ascii escapes
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_prompts_with_the_mask_token_or_unknown_ids_are_refused_and_an_empty_one_decodes(server, shipped):
    model, tok = shipped
    mask = model.config.mask_token_id
    mask_text = tok.decode([mask])
    for path, body, param in (("/v1/completions", {"prompt": [5, mask, 6]}, "prompt"),
                              ("/v1/completions", {"prompt": "a " + mask_text}, "prompt"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": mask_text}]},
                               "messages")):
        r = httpx.post(server.url + path, json=body, timeout=60)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == param, r.text
        assert f"the prompt ({param}) contains the mask token id {mask}" in error["message"]
    vocab = model.config.vocab_size
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [5, vocab + 3]}, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt", r.text
    assert f"holds token id {vocab + 3} outside the vocabulary [0, {vocab})" in error["message"]
    for prompt in ("", []):       # an empty prompt decodes from nothing, as dllm.generate does
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 0, r.text


def _job_config(model, tok, defaults, body):
    """The settings `Server.job` gives a request `body` on `model`."""
    from dllm.serve.api import Server
    from dllm.serve.engine import Engine

    server = Server(Engine(model, tok), "m", defaults, None)
    return server.job(body, [5, 6], body.max_tokens, lambda kind, payload: None).config


def test_lengths_are_checked_together_and_name_a_field_the_request_set(shipped):
    from dllm.serve.schema import ChatRequest, RequestError

    defaults = DEFAULTS.replace(gen_length=64, block_length=32, tokens_per_step=2)

    def config(**fields):
        return _job_config(*shipped, defaults, ChatRequest(messages=copy_messages(QUESTIONS[0]), **fields))

    assert config(max_tokens=16, dllm={"block_length": 8}).block_length == 8
    got = config(max_tokens=33, dllm={"steps": 11, "block_length": 3})
    assert (got.gen_length, got.steps, got.tokens_per_step, got.block_length) == (33, 11, None, 3)
    with pytest.raises(RequestError, match="block_length 32 exceeds gen_length 16") as err:
        config(max_tokens=16)
    assert err.value.param == "max_tokens"                     # the server's block length was not the request's
    with pytest.raises(RequestError, match="block_length 48 exceeds gen_length 40") as err:
        config(max_tokens=40, dllm={"block_length": 48})
    assert err.value.param == "dllm.block_length"


def test_lengths_are_checked_as_the_model_runs_them(shipped, llada2_dir, monkeypatch):
    """A request without max_tokens runs at the checkpoint's own length; a block-causal model's own
    block length is taken whatever the generation length (as `dllm.generate` takes them)."""
    from dllm.serve.schema import CompletionRequest

    model, tok = shipped
    monkeypatch.setattr(model, "generation_defaults", {**model.generation_defaults, "max_new_tokens": 256})
    got = _job_config(model, tok, dllm.GenerationConfig(), CompletionRequest(prompt="Hi", dllm={"block_length": 256,
                                                                                                  "steps": 8}))
    assert (got.gen_length, got.block_length) == (256, 256)
    got = _job_config(*dllm.load(llada2_dir, dtype="float32"), dllm.GenerationConfig(sampler="threshold"),
                      CompletionRequest(prompt=[1, 2, 3], max_tokens=8, dllm={"block_length": 32}))
    assert (got.gen_length, got.block_length) == (8, None)


def test_a_prompt_leaving_a_partial_attention_block_is_refused_naming_the_prompt(llada2_dir):
    from dllm.serve.api import Server
    from dllm.serve.engine import Engine
    from dllm.serve.schema import ChatRequest, CompletionRequest, RequestError

    model, tok = dllm.load(llada2_dir, dtype="float32")
    server = Server(Engine(model, tok), "m", dllm.GenerationConfig(sampler="low_confidence"), None)
    for body, param in ((CompletionRequest(prompt=[1, 2, 3, 4, 5], max_tokens=32), "prompt"),
                        (ChatRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=32), "messages")):
        with pytest.raises(RequestError, match=r"a prompt of 5 tokens leaves a partial first block") as err:
            server.job(body, [1, 2, 3, 4, 5], 32, lambda kind, payload: None)
        assert err.value.param == param
    whole = [1] * model.config.attention_block
    assert server.job(CompletionRequest(prompt=whole, max_tokens=32), whole, 32, lambda kind, payload: None)
    from dllm.decode import partial_block_problem
    sampler = dllm.samplers.get("low_confidence")
    assert "a prompt of 5 tokens" in partial_block_problem(sampler, [32, 5, 7], 32)
    assert partial_block_problem(sampler, [5], None) is None
    assert partial_block_problem(dllm.samplers.get("threshold"), [5], 32) is None


def test_request_arguments_add_to_the_servers_for_its_sampler_and_cache():
    from dllm.serve.schema import CompletionRequest, request_config

    defaults = DEFAULTS.replace(sampler_kwargs={"logits_eos_inf": True}, cache="dkv-decode",
                                cache_kwargs={"refresh": 4})

    def config(**dllm_fields):
        return request_config(CompletionRequest(prompt="Hi", dllm=dllm_fields), defaults, None)

    got = config(sampler_args={"confidence_eos_eot_inf": True}, cache_args={"twins": True})
    assert got.sampler_kwargs == {"logits_eos_inf": True, "confidence_eos_eot_inf": True}
    assert got.cache_kwargs == {"refresh": 4, "twins": True}
    got = config(sampler="low_confidence", sampler_args={"logits_eos_inf": False}, cache="dkv-decode")
    assert got.sampler_kwargs == {"logits_eos_inf": False} and got.cache_kwargs == {"refresh": 4}
    got = config(sampler="threshold", sampler_args={"tau": 0.8}, cache="dual")
    assert got.sampler_kwargs == {"tau": 0.8} and got.cache_kwargs == {}


def test_a_request_names_no_file_but_the_servers_own(tmp_path):
    from dllm.serve.schema import CompletionRequest, RequestError, request_config
    from dllm.token_frequencies import TokenFrequencies

    served = str(TokenFrequencies({1: 2}, 4).save(tmp_path / "served.json"))
    defaults = DEFAULTS.replace(sampler="pc_sampler", sampler_kwargs={"frequencies": served})

    def config(**dllm_fields):
        return request_config(CompletionRequest(prompt="Hi", dllm=dllm_fields), defaults, None)

    assert config(sampler_args={"lambd": 0.5}).sampler_kwargs == {"frequencies": served, "lambd": 0.5}
    assert config(sampler_args={"frequencies": served}).sampler_kwargs["frequencies"] == served
    assert config(sampler_args={"frequencies": "none"}).sampler_kwargs["frequencies"] == "none"
    with pytest.raises(RequestError, match="sampler_args.frequencies: a request cannot name a file") as err:
        config(sampler_args={"frequencies": str(tmp_path / "other.json")})
    assert err.value.param == "dllm.sampler_args"


def test_a_request_replaces_or_turns_off_the_servers_suffix_dropout():
    from dllm.serve.schema import CompletionRequest, request_config

    defaults = DEFAULTS.replace(suffix_dropout={"window": 64})

    def config(**dllm_fields):
        return request_config(CompletionRequest(prompt="Hi", dllm=dllm_fields), defaults, None)

    assert config().suffix_dropout["window"] == 64
    assert config(suffix_dropout={"window": 8, "sigma": 2}).suffix_dropout == dict(
        window=8, distribution="gaussian", seed=0, sigma=2.0, scale=2.0)
    assert config(suffix_dropout=False).suffix_dropout is None


def test_text_that_is_not_utf8_is_refused_by_name_in_messages_and_in_errors(server):
    def post(path, body):   # JSON's escape of a lone surrogate, as a client may send it
        return httpx.post(server.url + path, content=json.dumps(body), timeout=60,
                          headers={"content-type": "application/json"})

    r = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "ok"},
                                                   {"role": "user", "content": "\ud800"}]})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages", r.text
    assert error["message"] == "messages[1].content is not valid UTF-8 text (surrogates not allowed at character 0)"
    r = post("/v1/completions", {"prompt": "Hi", "dllm": {"sampler": "threshold", "sampler_args": {"\ud800": 1}}})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "dllm.sampler_args", r.text
    assert "has no argument(s) '\\ud800'" in error["message"]
    from dllm.serve.api import error_body
    assert error_body(400, "bad \ud800 name")["error"]["message"] == "bad \\ud800 name"    # encodable as UTF-8


def test_chat_messages_in_every_form_openai_takes(client, shipped):
    plain = [{"role": "system", "content": "Be brief."}, *copy_messages(QUESTIONS[0])]
    forms = [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             {**copy_messages(QUESTIONS[0])[0], "name": "desk"}]
    reply = client.chat.completions.create(model="llada-pb-tiny", messages=forms)
    assert reply.choices[0].message.content == offline(shipped, plain).texts[0]
    earlier = [*copy_messages(QUESTIONS[0]), {"role": "assistant", "content": None}, *copy_messages(QUESTIONS[1])]
    assert client.chat.completions.create(model="llada-pb-tiny", messages=earlier).choices[0].message.content == \
        offline(shipped, [*copy_messages(QUESTIONS[0]), {"role": "assistant", "content": ""},
                          *copy_messages(QUESTIONS[1])]).texts[0]


def test_every_error_has_the_openai_shape(client, server):
    assert client.models.retrieve("llada-pb-tiny").id == "llada-pb-tiny"
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4")
    for r in (httpx.post(server.url + "/v1/completions", content=b"\xff\xfe{", timeout=60,
                         headers={"content-type": "application/json"}),
              httpx.get(server.url + "/v1/chat/completions", timeout=60),
              httpx.get(server.url + "/v1/nowhere", timeout=60)):
        assert r.status_code in (400, 404, 405) and set(r.json()["error"]) == {"message", "type", "param", "code"}, \
            r.text


def test_null_n_stream_and_flags_read_as_the_apis_defaults(server, shipped):
    """OpenAI's optional fields may be null: n 1, stream false, include_usage / stream_canvas false."""
    body = {"model": "llada-pb-tiny", "messages": copy_messages(QUESTIONS[0]), "n": None, "stream": None,
            "dllm": {"stream_canvas": None}}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == offline(shipped, copy_messages(QUESTIONS[0])).texts[0]
    streamed = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                          json={**body, "stream": True, "stream_options": {"include_usage": None}})
    assert streamed.status_code == 200 and '"usage":{' not in streamed.text and streamed.text.endswith("[DONE]\n\n")
    r = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream_options": {}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model="llada-pb-tiny", messages=copy_messages(QUESTIONS[0]), n=2)


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == ["llada-pb-tiny"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    client.chat.completions.create(model="llada-pb-tiny", messages=copy_messages(QUESTIONS[1]))
    text = httpx.get(server.url + "/metrics").text
    for name in ("dllm_queue_depth", "dllm_running_rows", "dllm_tokens_per_second", "dllm_completion_tokens_total",
                 "dllm_forwards_total", "dllm_step_seconds_bucket", "dllm_requests_total"):
        assert name in text, name
    forwards = float(next(line.split()[-1] for line in text.splitlines() if line.startswith("dllm_forwards_total")))
    assert forwards >= GEN


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(next((line.split()[-1] for line in text.splitlines() if line.startswith(name)), 0))


def test_disconnect_mid_stream_drops_the_request(server):
    before = metric(server, 'dllm_requests_total{outcome="disconnected"}')
    body = {"messages": copy_messages(QUESTIONS[2]), "stream": True, "max_tokens": 128}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        next(r.iter_lines())                                     # the first chunk, then hang up
    deadline = time.monotonic() + 30
    while metric(server, 'dllm_requests_total{outcome="disconnected"}') == before or metric(server, "dllm_running_rows"):
        assert time.monotonic() < deadline, "the disconnected request kept decoding"
        time.sleep(0.05)


def test_a_client_that_hangs_up_before_its_whole_answer_is_dropped(server):
    before = metric(server, 'dllm_requests_total{outcome="disconnected"}')
    body = {"prompt": "hi", "max_tokens": 512, "dllm": {"sampler": "low_confidence", "block_length": 8}}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.0)
    deadline = time.monotonic() + 5          # far less than its 512 forwards take
    while metric(server, 'dllm_requests_total{outcome="disconnected"}') == before or metric(server, "dllm_running_rows"):
        assert time.monotonic() < deadline, "the request kept decoding after its client left"
        time.sleep(0.05)


def test_a_stop_string_that_straddles_two_pieces_never_reaches_the_stream(client, shipped):
    _, tok = shipped
    ids = offline(shipped, copy_messages(QUESTIONS[0])).generated[0].tolist()
    for stop in ['"An', 'Lee"', "y"]:
        kwargs = dict(model="llada-pb-tiny", messages=copy_messages(QUESTIONS[0]), stop=[stop])
        reply = client.chat.completions.create(**kwargs)
        whole = reply.choices[0].message.content
        chunks = client.chat.completions.create(stream=True, **kwargs)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole, stop
        n = reply.usage.completion_tokens                  # the tokens of the text before the stop string
        assert tok.decode(ids[:n], skip_special_tokens=True).startswith(whole)
        assert len(tok.decode(ids[:n - 1], skip_special_tokens=True)) < len(whole) or not whole


def test_a_request_past_its_timeout_in_the_queue_is_answered_there(shipped):
    from dllm.serve.engine import Engine, Job

    model, tok = shipped
    events = []
    engine = Engine(model, tok)
    engine.submit(Job([5, 6], DEFAULTS, lambda kind, payload: events.append((kind, payload)), timeout=1e-6))
    time.sleep(0.01)
    turns = iter([True, False])
    engine.run(keep_running=lambda: next(turns))
    assert [kind for kind, _ in events] == ["error"] and events[0][1][0] == 408


SEEDS = (10, 11, 12, 13)     # seeds whose answers to QUESTIONS[0] differ under the samplers that draw


def test_samplers_that_draw_over_their_batch_run_alone_with_their_seed(client, shipped):
    messages = copy_messages(QUESTIONS[0])
    with concurrent.futures.ThreadPoolExecutor(len(SEEDS)) as pool:
        got = list(pool.map(lambda seed: client.chat.completions.create(
            model="llada-pb-tiny", messages=messages, seed=seed,
            extra_body={"dllm": {"sampler": "random"}}).choices[0].message.content, SEEDS))
    want = [offline(shipped, messages, sampler="random", seed=seed).texts[0] for seed in SEEDS]
    assert got == want and len(set(want)) > 1           # the seed decides the answer


def test_a_greedy_request_shares_its_batch_only_when_its_built_sampler_keeps_rows_apart(shipped):
    from dllm.serve.engine import Engine

    engine = Engine(*shipped)
    assert engine._batches_with_others(DEFAULTS.replace(sampler="entropy"))
    assert not engine._batches_with_others(DEFAULTS.replace(sampler="entropy", sampler_kwargs={"alg_temp": 100}))


def test_the_forward_limit_counts_the_settings_not_a_cap_the_server_sets(shipped):
    from dllm.serve.engine import Engine, Job, forward_limit

    model, tok = shipped
    remasking = DEFAULTS.replace(sampler="remdm", sampler_kwargs={"remdm_steps": 10 ** 4})
    for config, refused in ((remasking, True), (remasking.replace(max_forwards=200), False),
                            (DEFAULTS.replace(sampler="llada21", gen_length=8), False)):
        events = []
        engine = Engine(model, tok)
        engine._admit([Job([5, 6], config, lambda kind, payload: events.append((kind, payload)))])
        assert (events[0][0] == "error") == refused, (config, events)
        if refused:
            assert f"the server takes at most {forward_limit(GEN)}" in events[0][1][1]
            assert events[0][1][1].endswith("lower the sampler arguments") and events[0][1][2] is None
    events = []
    Engine(model, tok)._admit([Job([5, 6], DEFAULTS.replace(sampler="entropy", steps=1000),
                                   lambda kind, payload: events.append((kind, payload)),
                                   length_fields=("dllm.steps",))])
    (kind, (status, message, param)), = events
    assert (kind, status, param) == ("error", 400, "dllm.steps") and message.endswith("lower dllm.steps")
    events = []     # steps the request set, well under the limit: the sampler's arguments are the cause
    Engine(model, tok)._admit([Job([5, 6], remasking.replace(steps=8),
                                   lambda kind, payload: events.append((kind, payload)), length_fields=("dllm.steps",))])
    (kind, (status, message, param)), = events
    assert (kind, status, param) == ("error", 400, None) and message.endswith("lower the sampler arguments")


def test_a_prompt_the_decode_refuses_fails_only_its_own_request(dream):
    """Requests admitted together start one batch; when the decode refuses one of them (a Dream
    row with no prompt token), the others still start and answer as alone."""
    from dllm.serve.api import Server
    from dllm.serve.engine import Engine, Job
    from dllm.serve.schema import CompletionRequest, RequestError

    model, tok = dream
    config = DEFAULTS.replace(gen_length=8, sampler="entropy", steps=8)
    engine = Engine(model, tok)
    events = {name: [] for name in ("first", "empty", "last")}
    jobs = [Job(prompt, config, lambda kind, payload, name=name: events[name].append((kind, payload)))
            for name, prompt in (("first", [5, 6]), ("empty", []), ("last", [7, 8, 9]))]
    engine._admit(jobs)
    assert [kind for kind, _ in events["first"]] == ["started"] == [kind for kind, _ in events["last"]]
    (kind, (status, message, _)), = events["empty"]
    assert (kind, status) == ("error", 400) and "is empty; dream predicts token i from position i-1" in message
    # the API refuses it before it reaches the engine, naming the prompt
    server = Server(engine, "m", config, None)
    with pytest.raises(RequestError, match=r"the prompt \(prompt\) is empty; dream predicts") as err:
        server.completion_prompt(CompletionRequest(prompt=[]))
    assert err.value.param == "prompt"


def test_greedy_requests_whose_sampler_draws_run_alone_with_their_seed(client, shipped):
    """Dream's confidence rules with alg_temp draw their order from the request's seed, even greedy."""
    messages = copy_messages(QUESTIONS[0])
    extension = {"sampler": "entropy", "sampler_args": {"alg_temp": 100}}
    with concurrent.futures.ThreadPoolExecutor(len(SEEDS)) as pool:
        got = list(pool.map(lambda seed: client.chat.completions.create(
            model="llada-pb-tiny", messages=messages, seed=seed, max_tokens=GEN,
            extra_body={"dllm": extension}).choices[0].message.content, SEEDS))
    want = [offline(shipped, messages, sampler="entropy", sampler_kwargs={"alg_temp": 100}, seed=seed).texts[0]
            for seed in SEEDS]
    assert got == want and len(set(want)) > 1           # the seed decides the answer


def test_the_url_of_a_server_on_an_ipv6_address_has_brackets():
    from types import SimpleNamespace

    from dllm.serve.runner import _announce

    socket = SimpleNamespace(getsockname=lambda: ("::1", 8123, 0, 0))
    server = SimpleNamespace(started=True, servers=[SimpleNamespace(sockets=[socket])])
    urls = []
    _announce(server, threading.current_thread(), urls.append)
    assert urls == ["http://[::1]:8123"]


def test_cancelling_a_queued_request_frees_its_place(shipped):
    from dllm.serve.engine import Engine, Job, QueueFull

    model, tok = shipped
    engine = Engine(model, tok, max_batch_rows=3, max_queue=2)   # not started: the requests stay queued
    jobs = [Job([5, 6], DEFAULTS, lambda kind, payload: None) for _ in range(5)]
    for job in jobs:                                   # 3 for the free rows, 2 waiting beyond them
        engine.submit(job)
    with pytest.raises(QueueFull, match=r"5 requests are queued for 3 free row\(s\) \(max_queue 2\)"):
        engine.submit(Job([5, 6], DEFAULTS, lambda kind, payload: None))
    engine.cancel(jobs[0])
    assert engine.queue_depth == 4
    engine.submit(Job([5, 6], DEFAULTS, lambda kind, payload: None))


def test_requests_whose_batch_is_being_built_hold_their_rows(shipped):
    """A request arriving while the engine builds the batches of those it took from the queue
    finds their rows taken: one row and a queue of one hold two requests, not three."""
    from dllm.serve.engine import Engine, Job, QueueFull

    model, tok = shipped
    engine = Engine(model, tok, max_batch_rows=1, max_queue=1)
    arrivals = []
    admit = engine._admit

    def admit_while_others_arrive(jobs):
        for _ in range(2):
            try:
                engine.submit(Job([5, 6], DEFAULTS, lambda kind, payload: None))
                arrivals.append("queued")
            except QueueFull:
                arrivals.append("refused")
        admit(jobs)

    engine._admit = admit_while_others_arrive
    engine.submit(Job([5, 6], DEFAULTS.replace(gen_length=8, block_length=8), lambda kind, payload: None))
    engine.run(keep_running=lambda: not arrivals)
    assert arrivals == ["queued", "refused"]


def test_batches_of_a_policy_given_as_an_instance_keep_their_own(shipped):
    """Defaults naming a cache policy instance: a request joining a running batch, and another
    batch beside it, decode with copies of it and give their offline answers."""
    from dllm.cache import get_policy

    model, tok = shipped
    defaults = dllm.GenerationConfig(gen_length=64, block_length=8, sampler="low_confidence", cache=get_policy("dual"))
    running = RunningServer(build_app(model, tok, model_name="m", defaults=defaults))
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = pool.submit(httpx.post, running.url + "/v1/completions", json={"prompt": "hi"}, timeout=120)
            time.sleep(0.3)
            later = [pool.submit(httpx.post, running.url + "/v1/completions", json={"prompt": p}, timeout=120)
                     for p in ("hello there, friend", "ok")]
            answers = [f.result() for f in [first, *later]]
        assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
        for prompt, r in zip(("hi", "hello there, friend", "ok"), answers):
            ids = tok(prompt)["input_ids"]                 # as dllm.generate(..., chat=False) encodes it
            want = dllm.generate(model, tok, [ids], defaults.replace(cache="dual")).texts[0]
            assert r.json()["choices"][0]["text"] == want, prompt
    finally:
        running.close()


def test_a_full_queue_answers_429_with_retry_after(shipped):
    model, tok = shipped
    running = RunningServer(build_app(model, tok, model_name="m", defaults=DEFAULTS.replace(gen_length=64),
                                      max_batch_rows=1, max_queue=1))
    try:
        body = {"messages": copy_messages(QUESTIONS[0])}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: httpx.post(running.url + "/v1/chat/completions", json=body, timeout=120),
                                  range(6)))
        assert {r.status_code for r in codes} == {200, 429}
        busy = next(r for r in codes if r.status_code == 429)
        assert busy.headers["retry-after"] == "1" and busy.json()["error"]["type"] == "rate_limit_error"
    finally:
        running.close()


def test_a_request_past_its_timeout_gets_408_and_failures_are_counted(shipped):
    model, tok = shipped
    running = RunningServer(build_app(model, tok, model_name="m", defaults=DEFAULTS.replace(gen_length=64),
                                      timeout=1e-6))
    try:
        r = httpx.post(running.url + "/v1/chat/completions", json={"messages": copy_messages(QUESTIONS[0])}, timeout=60)
        assert r.status_code == 408 and "timeout" in r.json()["error"]["message"]
        body = {"messages": copy_messages(QUESTIONS[0]), "stream": True}
        r = httpx.post(running.url + "/v1/chat/completions", json=body, timeout=60)   # timed out while queued
        assert r.status_code == 408 and "timeout" in r.json()["error"]["message"]
        assert metric(running, 'dllm_requests_total{outcome="failed"}') == 2
        for bad in ({"messages": copy_messages(QUESTIONS[0]), "max_tokens": 0}, {"prompt": [[1], [2]]}):
            path = "/v1/chat/completions" if "messages" in bad else "/v1/completions"
            assert httpx.post(running.url + path, json=bad, timeout=60).status_code == 400
        assert metric(running, 'dllm_requests_total{outcome="invalid"}') == 2
    finally:
        running.close()


def test_bad_server_settings_are_refused_before_serving(shipped, capsys):
    from dllm.cli import main
    from dllm.serve.engine import Engine

    model, tok = shipped
    with pytest.raises(ValueError, match="timeout"):
        build_app(model, tok, model_name="m", timeout=0)
    with pytest.raises(ValueError, match="max_batch_rows"):
        Engine(model, tok, max_batch_rows=0)
    assert main(["serve", "--sampler", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    for port in (70000, -5):
        assert main(["serve", "--port", str(port)]) == 2
        assert f"port must be an integer in 0-65535 (0 picks a free one), got {port}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="port must be an integer in 0-65535"):
        serve(build_app(model, tok, model_name="m", engine_thread=False), port=65536)
    # defaults the model refuses, as `dllm generate` refuses them
    with pytest.raises(ValueError, match="block_length 32 exceeds gen_length 16"):
        build_app(model, tok, model_name="m", defaults=dllm.GenerationConfig(gen_length=16, block_length=32))
    assert main(["serve", "--cache", "block"]) == 2
    assert "cache 'block' is exact only under block-causal attention" in capsys.readouterr().err


def test_the_servers_default_seed_is_none_unless_given(monkeypatch):
    """As OpenAI's API: without --seed, a sampling request without a seed draws anew each time."""
    import dllm.serve as serve_module
    from dllm.cli import main

    seen = []
    monkeypatch.setattr(serve_module, "build_app", lambda model, tok, **kw: seen.append(kw["defaults"].seed))
    monkeypatch.setattr(serve_module, "serve", lambda app, **kw: None)
    assert main(["serve", "--port", "0"]) == 0 and main(["serve", "--port", "0", "--seed", "3"]) == 0
    assert seen == [None, 3]


def test_a_failing_batch_fails_only_its_own_requests(shipped):
    """A batch whose step raises answers its requests 500; a batch beside it decodes on."""
    import queue

    from dllm.samplers import get as get_sampler
    from dllm.serve.engine import Engine, Job

    class Breaks(type(get_sampler("threshold"))):
        def step(self, state, rows, positions, valid, scores):
            if state.global_step == 2:
                raise RuntimeError("broken on purpose")
            return super().step(state, rows, positions, valid, scores)

    model, tok = shipped
    ids = tok.apply_chat_template(copy_messages(QUESTIONS[0]), add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    events = {"bad": queue.Queue(), "good": queue.Queue()}
    engine = Engine(model, tok)
    engine.start()
    try:
        for name, config in (("bad", DEFAULTS.replace(sampler=Breaks())), ("good", DEFAULTS)):
            engine.submit(Job(list(ids), config, lambda kind, payload, q=events[name]: q.put((kind, payload))))
        last = {}
        for name, q in events.items():
            while name not in last or last[name][0] not in ("done", "error"):
                last[name] = q.get(timeout=60)
    finally:
        engine.stop()
    assert last["bad"][0] == "error" and last["bad"][1][0] == 500 and "broken on purpose" in last["bad"][1][1]
    assert last["good"][0] == "done" and last["good"][1]["text"] == offline(shipped, copy_messages(QUESTIONS[0])).texts[0]


def test_a_length_refusal_met_when_the_batch_is_built_names_a_field_the_request_set(shipped):
    """gen_length 24 with the server's block length 16 is refused by the sampler when the batch is
    built: the error names the request's own length field, not the server's block length."""
    import queue

    from dllm.serve.engine import Engine, Job

    model, tok = shipped
    engine = Engine(model, tok)
    engine.start()
    got = {}
    try:
        config = DEFAULTS.replace(gen_length=24, block_length=16)
        for fields in ((), ("max_completion_tokens",), ("max_completion_tokens", "dllm.block_length")):
            events = queue.Queue()
            engine.submit(Job([1, 2, 3], config, lambda kind, payload, q=events: q.put((kind, payload)),
                              length_field="max_completion_tokens", length_fields=fields))
            kind, payload = events.get(timeout=60)
            while kind not in ("done", "error"):
                kind, payload = events.get(timeout=60)
            got[fields] = (kind, payload[0], payload[2]) if kind == "error" else kind
    finally:
        engine.stop()
    assert got == {(): ("error", 400, "max_completion_tokens"),
                   ("max_completion_tokens",): ("error", 400, "max_completion_tokens"),
                   ("max_completion_tokens", "dllm.block_length"): ("error", 400, "dllm.block_length")}


def test_a_row_whose_last_forward_gave_nan_logits_gets_an_error_not_an_answer(shipped):
    """A request done in one forward is answered after that step: the NaN check runs first."""
    import copy
    import queue

    from dllm.serve.engine import Engine, Job

    model, tok = shipped
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.norm.weight.fill_(float("nan"))
    events = queue.Queue()
    engine = Engine(broken, tok)
    engine.start()
    try:
        config = DEFAULTS.replace(gen_length=1)           # done at its first forward
        engine.submit(Job([1, 2, 3], config, lambda kind, payload: events.put((kind, payload))))
        kind, payload = events.get(timeout=60)
        while kind not in ("done", "error"):
            kind, payload = events.get(timeout=60)
    finally:
        engine.stop()
    assert kind == "error" and payload[0] == 500 and "NaN/inf logits" in payload[1]


def test_with_shared_kv_buffers_storing_batches_run_one_at_a_time(shipped, monkeypatch):
    """CUDA graphs make batches of one layout share K/V buffers; the engine then never runs two
    batches of a storing cache policy at once, and every answer is still the offline one."""
    import queue

    from dllm.serve import engine as E

    model, tok = shipped
    monkeypatch.setattr(E.Engine, "shares_kv_buffers", lambda self: True)
    most = [0]
    turn = E.Engine._turn

    def counting_turn(self, group):
        storing = sum(g.decoder.request.policy.needs_storage for g in self.groups)
        most[0] = max(most[0], storing)
        return turn(self, group)

    monkeypatch.setattr(E.Engine, "_turn", counting_turn)
    engine = E.Engine(model, tok)
    done = queue.Queue()
    configs = [DEFAULTS.replace(sampler="threshold", sampler_kwargs={"tau": tau}, cache="dual", block_length=16)
               for tau in (0.5, 0.7, 0.9)] + [DEFAULTS]
    # greedy requests of one setting whose sampler keeps batch-wide state each start their own batch
    configs += [DEFAULTS.replace(sampler="klass", cache="dual", block_length=16)] * 2
    asks = [copy_messages(QUESTIONS[i % 3]) for i in range(len(configs))]
    engine.start()
    try:
        for i, (config, msgs) in enumerate(zip(configs, asks)):
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
            engine.submit(E.Job(list(ids), config, lambda kind, payload, i=i: done.put((i, kind, payload))))
        results = {}
        while len(results) < len(configs):
            i, kind, payload = done.get(timeout=60)
            if kind in ("done", "error"):
                results[i] = (kind, payload)
    finally:
        engine.stop()
    assert most[0] == 1
    for i, (config, msgs) in enumerate(zip(configs, asks)):
        assert results[i][0] == "done", results[i]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert results[i][1]["text"] == dllm.generate(model, tok, [list(ids)], config).texts[0]


def test_serve_steps_the_batches_in_the_calling_thread(shipped):
    """`serve` answers over HTTP from another thread while this one steps the batches; it returns
    once the engine stops, and the stopped engine answers later requests 503."""
    model, tok = shipped
    app = build_app(model, tok, model_name="m", defaults=DEFAULTS, engine_thread=False)
    engine, stepped_in, answers = app.state.engine, set(), {}
    metrics_on_step = engine.on_step
    engine.on_step = lambda *a: (stepped_in.add(threading.get_ident()), metrics_on_step(*a))

    def ask(url):
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            reply = client.chat.completions.create(model="m", messages=copy_messages(QUESTIONS[1]))
            answers["text"] = reply.choices[0].message.content
        finally:
            engine.stop()

    serve(app, port=0, log_level="warning", on_started=ask)
    assert stepped_in == {threading.get_ident()}
    assert answers["text"] == offline(shipped, copy_messages(QUESTIONS[1])).texts[0]
    from dllm.serve.engine import EngineStopped, Job
    with pytest.raises(EngineStopped, match="shutting down"):
        engine.submit(Job([1, 2], DEFAULTS, lambda kind, payload: None))


def test_stopping_the_engine_answers_open_requests_503(shipped):
    model, tok = shipped
    app = build_app(model, tok, model_name="m", defaults=DEFAULTS, engine_thread=False)
    events = []

    def stream_then_stop(url):
        body = {"messages": copy_messages(QUESTIONS[2]), "stream": True, "max_tokens": 256}
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                lines = (line for line in r.iter_lines() if line.startswith("data: "))
                events.append(next(lines))                      # the first chunk: decoding has begun
                app.state.engine.stop()
                events.extend(lines)
        finally:
            app.state.engine.stop()

    serve(app, port=0, log_level="warning", on_started=stream_then_stop)
    errors = [json.loads(e[6:])["error"] for e in events if '"error"' in e]
    assert errors and errors[0]["type"] == "service_unavailable" and "shutting down" in errors[0]["message"]
    assert set(errors[0]) == {"message", "type", "param", "code"} and errors[0]["code"] is None   # as OpenAI's
    assert events[-1] == "data: [DONE]"


def test_health_says_503_once_the_engine_has_stopped(shipped):
    model, tok = shipped
    running = RunningServer(build_app(model, tok, model_name="m", defaults=DEFAULTS))
    try:
        assert httpx.get(running.url + "/health", timeout=30).json() == {"status": "ok"}
        running.server.config.app.state.engine.stop()          # as a crashed engine thread leaves it
        r = httpx.get(running.url + "/health", timeout=30)
        assert r.status_code == 503 and "engine has stopped" in r.json()["error"]["message"]
    finally:
        running.close()


def test_serve_refuses_a_threaded_engine_and_reports_a_port_in_use(shipped):
    import socket

    model, tok = shipped
    with pytest.raises(ValueError, match="engine_thread=False"):
        serve(build_app(model, tok, model_name="m"), port=0)
    unserved = uvicorn.Server(uvicorn.Config(build_app(model, tok, model_name="m", engine_thread=False),
                                             host="127.0.0.1", port=0, log_level="critical"))
    with pytest.raises(SystemExit):       # uvicorn.run(app) of such an app stops at its startup
        unserved.run()
    assert not unserved.started
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"did not start on 127.0.0.1:{port}"):
            serve(build_app(model, tok, model_name="m", engine_thread=False), port=port, log_level="critical")


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM"])
def test_dllm_serve_answers_and_stops_on_a_signal(stop_signal):
    import os
    import re
    import signal
    import subprocess
    import sys

    # started as a shell's background job is (SIGINT ignored): the server still stops on it
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", "--port", "0", "--gen-length", "16"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    reader = None
    try:
        url, log = None, []
        deadline = time.monotonic() + 120
        while url is None:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(log)
            line = proc.stderr.readline()
            log.append(line)
            found = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            url = found and found.group(1)
        # keep reading the server's stderr, so that a full pipe never blocks it, and show it on failure
        reader = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)
        reader.start()
        assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
        reply = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 16}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 16
        proc.send_signal(getattr(signal, stop_signal))
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"exit status {code}; the server's stderr:\n" + "".join(log[-60:])
    finally:
        proc.kill()
        proc.wait()
        if reader is not None:
            reader.join(timeout=10)          # the pipe ends with the process
        proc.stderr.close()
