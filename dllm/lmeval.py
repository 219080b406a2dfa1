"""An lm-evaluation-harness model: `lm_eval --model dllm --model_args pretrained=PATH,...`
(docs/parallelbench.md, "lm-evaluation-harness").

`generate_until` runs `dllm.generate` on batches of `--batch_size` requests sharing a length, stop
strings and temperature (the `temperature` model argument when given, else the request's
`temperature` / `do_sample`, as lm_eval's HF models take them; 0 when it names none), each batch
with its own seed (`seed + k * world + rank` for batch k of a process), contexts cut from the left
to fit the model with the generation, and reads each answer as the family's evaluation reads it
(`answer_text`), cut at the stop strings in turn. Generation kwargs it does not read are named in a
warning.
`loglikelihood` is LLaDA's Monte-Carlo estimator (`dllm.likelihood.mc_loglikelihood`; on Dream,
Dream's, `dream_mc_loglikelihood`, the continuation followed by the EOS) with
`mc_num` samples in batches of `mc_batch_size` rows and `cfg` guidance; the greedy flag is
`greedy_matches` when `is_check_greedy`, else False. `loglikelihood_rolling` is not offered (a
masked-diffusion model has no left-to-right likelihood).

Model arguments: pretrained (a checkpoint folder or a shipped model name; the shipped default
model when absent), sampler, sampler_kwargs and cache_kwargs (`key=value` pairs separated by `;`,
values read as in `--sampler-arg`), cache, gen_length (default: each request's length, the first
of `LENGTH_KEYS` it gives), block_length, steps, tokens_per_step, temperature (None: the
request's), seed, chat (False, a flag: contexts are used as given; lm_eval's
`--apply_chat_template` goes through the tokenizer's template; True: each context is rendered as
the user turn of the template, for generations and log-likelihoods alike), dtype, mc_num (128),
mc_batch_size (32), cfg (0), is_check_greedy (False), checked before the model loads. Under
`accelerate launch` each process takes its share of the requests, as lm_eval expects (rank,
world size, gather, barrier); lm_eval's default CUDA device falls back to the CPU on a machine
without CUDA.

The lm_eval releases without model plugins (0.4.13 and before) do not find `--model dllm` by
themselves: `python -m dllm.lmeval ...` takes the same arguments as `lm_eval` with the model
registered. Later releases load it through the `lm_eval.models` entry point.
"""
from __future__ import annotations

import math
import warnings

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

import dllm
from dllm.cli.options import parse_kv
from dllm.decode import check_request, encode_prompts, with_instances
from dllm.distributed import Distributed
from dllm.likelihood import check_settings, dream_mc_loglikelihood, greedy_matches, mc_loglikelihood

SEEDS = 2 ** 64          # the batches' seeds run from `seed` modulo this (torch reads a negative seed modulo 2**64)
# The names a request may give its generation length by, first found wins (as lm_eval's HF models read them).
LENGTH_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
# The generation kwargs `generate_until` reads; others (top_p, top_k, ...) are named in a warning and not used.
READ_KEYS = frozenset({"until", "temperature", "do_sample", *LENGTH_KEYS})


def _pairs(text, what: str) -> dict:
    """`k=v;k2=v2` model-argument text (lm_eval splits its arguments at commas) as a dict."""
    if isinstance(text, dict):
        return text
    items = [item for item in str(text or "").split(";") if item.strip()]
    try:
        return parse_kv(items, what)
    except SystemExit as err:
        raise ValueError(str(err).removeprefix("error: ")) from None


def _whole(value):
    """A float with no fraction (lm_eval reads 128.0 as a float) as that integer; else as given."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _flag(value, name: str) -> bool:
    """A boolean model argument (lm_eval reads true/false as bools and 0/1 as numbers)."""
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false (or 1 / 0), got {value!r}")


def request_temperature(gen_kwargs: dict) -> float:
    """The temperature a request's generation kwargs ask for, as lm_eval's HF models read them:
    `do_sample` false is greedy; else its `temperature`, or 1 when it asks to sample without one,
    else 0 (greedy)."""
    if gen_kwargs.get("do_sample") is False:
        return 0.0
    value = gen_kwargs.get("temperature")
    if value is None:
        return 1.0 if gen_kwargs.get("do_sample") is True else 0.0
    try:
        temperature = float(value)          # lm_eval passes numbers, and text from --gen_kwargs
    except (TypeError, ValueError):
        temperature = math.nan
    if isinstance(value, bool) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"a request's temperature must be a finite number >= 0, got {value!r}")
    return temperature


def request_length(gen_kwargs: dict) -> int:
    """The tokens a request asks to generate: the first of its `LENGTH_KEYS` it gives (an integer, a
    whole float or digit text, as lm_eval passes it from a task or --gen_kwargs), 256 when none."""
    key = next((k for k in LENGTH_KEYS if gen_kwargs.get(k) is not None), None)
    if key is None:
        return 256
    value = gen_kwargs[key]
    count = _positive_count(_whole(value))
    if count is None:
        raise ValueError(f"a request's {key} must be a positive integer, got {value!r}")
    return count


def request_stops(gen_kwargs: dict) -> tuple[str, ...]:
    """A request's stop strings: its `until`, one string or a list of them (none when absent)."""
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else until
    if not isinstance(until, (list, tuple)) or not all(isinstance(stop, str) for stop in until):
        raise ValueError(f"a request's until must be a string or a list of strings, got {gen_kwargs['until']!r}")
    return tuple(until)


def _positive_count(value) -> int | None:
    """`value` (an integer or its text) as an integer >= 1, else None."""
    text = str(value).strip()
    if isinstance(value, bool) or not (text.isascii() and text.isdigit()) or int(text) < 1:
        return None
    return int(text)


def _batch_size(value) -> int:
    """lm_eval's --batch_size (an integer, or its text): requests decoded together."""
    count = _positive_count(value)
    if count is None:
        raise ValueError(f"batch_size must be an integer >= 1 (dllm has no 'auto'), got {value!r}")
    return count


@register_model("dllm")
class DLLMEvalModel(LM):
    """dllm models in lm-evaluation-harness (module docstring)."""

    def __init__(self, pretrained: str | None = None, sampler: str | None = None, sampler_kwargs="", cache: str = "none",
                 cache_kwargs="", gen_length: int | None = None, block_length: int | None = None,
                 steps: int | None = None, tokens_per_step: int | None = None, temperature: float | None = None,
                 seed: int = 0, chat: bool = False, dtype: str = "auto", mc_num: int = 128, mc_batch_size: int = 32,
                 cfg: float = 0.0, is_check_greedy: bool = False, batch_size=1, max_batch_size=None, device=None,
                 **unknown):
        super().__init__()
        if unknown:
            raise ValueError(f"unknown dllm model argument(s) {', '.join(sorted(unknown))}; see dllm.lmeval")
        self.dist = Distributed()
        self._rank, self._world_size = self.dist.rank, self.dist.world
        # lm_eval names a CUDA device by default, also on machines without one: there, the CPU.
        if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            device = "auto"
        chat = _flag(chat, "chat")                                    # lm_eval reads chat=1 as the number 1
        mc_num, mc_batch_size = _whole(mc_num), _whole(mc_batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.config = dllm.GenerationConfig(
            gen_length=gen_length, block_length=block_length, steps=steps, tokens_per_step=tokens_per_step,
            sampler=sampler, sampler_kwargs=_pairs(sampler_kwargs, "sampler_kwargs"), cache=cache,
            cache_kwargs=_pairs(cache_kwargs, "cache_kwargs"), temperature=temperature or 0.0, seed=seed, chat=chat)
        with_instances(self.config if gen_length is None else self.config.for_length())   # fail before the load
        self.temperature = None if temperature is None else self.config.temperature
        self.batch_size = _batch_size(batch_size)
        check_settings(mc_num, mc_batch_size, cfg, names=("mc_batch_size", "cfg"))
        self.mc_num, self.mc_batch_size, self.cfg = mc_num, mc_batch_size, float(cfg)
        self.is_check_greedy, self.seed = _flag(is_check_greedy, "is_check_greedy"), seed
        self.batches = 0                            # generate_until batches of this process so far
        self._warned: set[str] = set()              # generation kwargs already named as not used
        self.model, self.tokenizer = dllm.load(pretrained, dtype=dtype, device=self.dist.device or device)
        if gen_length is not None:
            check_request(self.model, self.config, self.tokenizer)   # the sampler's own rules, before any request
        self._device = self.model.device            # lm_eval puts its per-rank request counts here

    # -- requests ----------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each context decoded with the model's settings, its answer read as the family's
        evaluation reads it (`answer_text`)."""
        answers: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            kwargs = dict(request.args[1])
            self._warn_unread(kwargs)
            length = self.config.gen_length or request_length(kwargs)
            temperature = request_temperature(kwargs) if self.temperature is None else self.temperature
            groups.setdefault((length, request_stops(kwargs), temperature), []).append(i)
        configs = {key: self._request_config(key[0], key[2]) for key in groups}    # every setting checked first
        for key, indices in groups.items():
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start:start + self.batch_size]
                seed = self.seed + self.batches * self._world_size + self._rank     # distinct across processes
                config = configs[key].replace(seed=seed % SEEDS, chat=None)     # the contexts are rendered here
                self.batches += 1
                prompts = [self._fit_context(requests[i].args[0], config.gen_length) for i in batch]
                out = dllm.generate(self.model, self.tokenizer, prompts, config=config)
                for i, ids in zip(batch, out.generated.tolist()):
                    answers[i] = answer_text(self.tokenizer, self.model.config.family, ids, key[1])
        return answers

    def _warn_unread(self, gen_kwargs: dict) -> None:
        """A warning, once per key, naming generation kwargs this model does not read."""
        unread = sorted(set(gen_kwargs) - READ_KEYS - self._warned)
        if unread:
            self._warned.update(unread)
            warnings.warn(f"dllm does not use the generation kwargs {', '.join(unread)} (it reads "
                          f"{', '.join(sorted(READ_KEYS))}; sampler settings go in sampler_kwargs)", stacklevel=3)

    def _request_config(self, length: int, temperature: float) -> dllm.GenerationConfig:
        """The model's settings at a request's generation length and temperature, checked; a
        ValueError says where a length the model arguments do not fit came from."""
        longest = self.model.config.max_seq_len
        source = "gen_length" if self.config.gen_length else "a request's length"
        if length >= longest:
            raise ValueError(f"{source} {length} leaves no room for a context in the model's maximum sequence "
                             f"length {longest}")
        try:
            config = self.config.replace(gen_length=length, temperature=temperature)
            check_request(self.model, config, self.tokenizer)
        except ValueError as err:
            advice = "" if self.config.gen_length else "; give gen_length to decode one length for every request"
            raise ValueError(f"{source} {length} (temperature {temperature!r}) does not fit the model arguments: "
                             f"{err}{advice}") from None
        return config

    def _fit_context(self, context: str, length: int) -> list[int]:
        """The context's token ids, its oldest tokens cut so that it and `length` generated tokens
        fit the model (as lm_eval's HF models cut theirs)."""
        ids = encode_prompts(self.tokenizer, [context], self.config.chat)[0]
        room = self.model.config.max_seq_len - length
        return ids[len(ids) - room:] if len(ids) > room else ids

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = []
        for request in requests:
            prefix, target = self.encode_pair(*request.args)
            if not target:              # an empty continuation: log p(nothing) = 0, and greedy decoding matches
                out.append((0.0, True))
                continue
            out.append(self._score(prefix, target))
        return out

    def _score(self, prefix: list[int], target: list[int]) -> tuple[float, bool]:
        """The family's estimate of log p(target | prefix), the pair cut to the model's window, and
        the greedy flag. Dream's evaluation scores the target followed by the EOS (given, never
        masked) with its own estimator; the greedy check reads the target alone."""
        longest, settings = self.model.config.max_seq_len, dict(mc_num=self.mc_num, batch_size=self.mc_batch_size,
                                                                cfg_scale=self.cfg)
        generator = torch.Generator().manual_seed(self.seed)
        if self.model.config.family == "dream":
            eos = self.tokenizer.eos_token_id
            prefix, scored = fit_window(prefix, target + [self.model.config.eos_token_id if eos is None else eos],
                                        longest)
            ll = dream_mc_loglikelihood(self.model, prefix, scored, generator=generator, **settings)
            target = scored[:-1]
        else:
            prefix, target = fit_window(prefix, target, longest)
            ll = mc_loglikelihood(self.model, prefix, target, generator=generator, **settings)
        greedy = self.is_check_greedy and bool(target) and greedy_matches(self.model, prefix, target,
                                                                          cfg_scale=self.cfg)
        return ll, bool(greedy)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("dllm models do not give rolling (left-to-right) log-likelihoods; tasks with "
                                  "output_type loglikelihood_rolling (perplexity) are not supported")

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The context's token ids (encoded alone) and the continuation's, the context's trailing
        spaces moved to the continuation and the continuation's ids taken from the joint encoding
        after the context's length (as LLaDA's and Dream's evaluations do; an empty context is the
        tokenizer's encoding of "", no tokens unless it adds special ones). A continuation the
        joint encoding merges into the context's last token ("th" + "e") is encoded alone after the
        context: only an empty continuation has no tokens. With the `chat` model
        argument the context is the user turn of the chat template, as `generate_until` renders it,
        and the continuation is encoded alone after it."""
        if self.config.chat:
            prefix = encode_prompts(self.tokenizer, [context], True)[0]
            return prefix, self.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer(context + continuation)["input_ids"]
        prefix = self.tokenizer(context)["input_ids"]
        target = whole[len(prefix):]
        if not target and continuation:
            target = self.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        return prefix, target

    # -- chat templates and data parallel ----------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    def all_gather(self, tensor):
        if self._world_size <= 1:
            return tensor
        from accelerate.utils import gather
        return gather(tensor)

    def gather_object(self, obj, dst: int = 0):
        if self._world_size <= 1:
            return [obj]
        result = [None] * self._world_size if self._rank == dst else None
        torch.distributed.gather_object(obj=obj, object_gather_list=result, dst=dst)
        return result

    def barrier(self) -> None:
        self.dist.barrier()


def fit_window(prefix: list[int], target: list[int], longest: int) -> tuple[list[int], list[int]]:
    """The pair cut to `longest` tokens from the left, as lm_eval's HF models cut theirs: the
    context loses its oldest tokens, and a continuation longer than the window its first ones."""
    if len(target) >= longest:
        return [], target[len(target) - longest:]
    return prefix[max(0, len(prefix) + len(target) - longest):], target


def cut_at_stops(text: str, stops) -> str:
    """`text` cut before each stop string in turn, in the order given (as the references and
    lm_eval's HF models cut it: a later stop is looked for in what the earlier ones left)."""
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


def answer_text(tokenizer, family: str, ids: list[int], stops) -> str:
    """A generated region's answer as the family's evaluation reads it: Dream's (Fast-dLLM
    `dream/eval.py`) decodes every token, keeps the text before the first EOS string and cuts at
    the stops; LLaDA's (`eval_llada.py`, used for every other family) decodes every token, cuts at
    the stops, and decodes the re-encoded text without special tokens, so text after a special
    token such as an EOS is kept."""
    if family == "dream":
        text = tokenizer.decode(ids)
        return cut_at_stops(text.split(tokenizer.eos_token)[0] if tokenizer.eos_token else text, stops)
    text = cut_at_stops(tokenizer.decode(ids, skip_special_tokens=False), stops)
    return tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)


def main() -> None:
    """`python -m dllm.lmeval ARGS`: lm_eval's command line with the dllm model registered."""
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()


if __name__ == "__main__":
    main()
