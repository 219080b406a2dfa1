"""The training data: records of the generators' train split rendered as the benchmark renders them,
the tokenizer built on them, their token ids, the synthetic copy and pair-binding examples, and
left-padded batches."""
from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ..eval import generators
from ..eval.names import stand_in_pool
from ..eval.tasks import get_task, messages
from .config import TrainConfig

BOS, EOS, EOT, MASK = "<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = [BOS, EOS, HEADER_START, HEADER_END, EOT, MASK]
CHAT_TEMPLATE = (
    "{{- '" + BOS + "' -}}"
    "{%- for message in messages -%}"
    "{{- '" + HEADER_START + "' + message['role'] + '" + HEADER_END + "\\n\\n' + (message['content'] | trim)"
    " + '" + EOT + "' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '" + HEADER_START + "assistant" + HEADER_END + "\\n\\n' -}}"
    "{%- endif -%}"
)


# The made-up-names records come from another shard than the rest, so that they do not repeat the
# other records' list lengths and positions.
PSEUDO_SHARD_OFFSET = 500


def training_records(cfg: TrainConfig) -> dict[str, list[dict]]:
    """Records of the generators' train split, `samples_per_task` per task (shard = seed), with the
    people of the `names` source; in the Waiting Line tasks a share `pseudo_share` of them (rounded)
    have made-up people instead (the "pseudo" source)."""
    records = {}
    for task in cfg.tasks:
        made_up = round(cfg.pseudo_share * cfg.samples_per_task) if task.startswith("waiting_line/") else 0
        records[task] = _train_split(task, cfg.samples_per_task - made_up, cfg.seed, cfg.names)
        records[task] += _train_split(task, made_up, cfg.seed + PSEUDO_SHARD_OFFSET, "pseudo")
    return records


def _train_split(task: str, count: int, seed: int, names: str) -> list[dict]:
    """`count` train-split records of `task` from shard `seed` mod 1000 with people from `names`."""
    if count == 0:
        return []
    return generators.make_records(task, split="train", num_samples=count, shard=seed % 1000, names=names)


def record_people(record: dict) -> set[str]:
    """The people a Waiting Line record names (its list, its new person, those of its in-context
    examples); empty for other tasks."""
    people = set()
    for rec in [record, *record["input"].get("icl_examples", ())]:
        inp = rec["input"]
        if "context" in inp:
            people.update(json.loads(inp["context"]))
        if inp.get("word"):
            people.add(inp["word"])
    return people


def tokenizer_texts(records: dict[str, list[dict]], names: str) -> list[str]:
    """The text the tokenizer is fitted on: each record's rendered prompt and answer. With any name
    source but "lists", every person is swapped for a name of `stand_in_pool()` (a seeded draw), so
    the BPE learns the tasks' text and how names split, but no name of the train or test pool."""
    texts, rng = [], random.Random(0)
    pool = stand_in_pool() if names != "lists" else None
    for task_id, recs in records.items():
        for r in recs:
            text = render_prompt(task_id, r) + answer_text(r)
            if pool is not None:
                for person in sorted(record_people(r)):
                    text = text.replace(person, pool[rng.randrange(len(pool))])
            texts.append(text)
    return texts


def answer_text(record: dict) -> str:
    """The answer a record trains on: the answer itself, or its `example` when it has several."""
    ans = record["answer"]
    return ans if isinstance(ans, str) else ans["example"]


@functools.lru_cache(maxsize=1)
def _chat_template():
    from jinja2 import Template   # optional: the chat template is only rendered when training

    return Template(CHAT_TEMPLATE)


def render_prompt(task_id: str, record: dict) -> str:
    """The chat-formatted prompt text (generation prompt included), as the tokenizer's chat
    template renders it."""
    return _chat_template().render(messages=messages(task_id, record), add_generation_prompt=True)


# A person's "First Last" name, kept as one pre-token when `whole_names` is on; otherwise text is
# split as GPT-2's byte-level BPE splits it (the alternatives after the first).
WHOLE_NAME = r"[A-Z][a-z]+ [A-Z][a-z]+"
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def build_tokenizer(texts, vocab_size: int, whole_names: bool = False):
    """A byte-level BPE (`tokenizers`) with digits split one per token and LLaDA's special tokens;
    returned as a transformers PreTrainedTokenizerFast carrying the chat template.

    whole_names: a capitalised word, one space and another capitalised word ("Ann Lee") stay one
    pre-token, so the BPE can learn one token per full name of the training text; other text is
    split as GPT-2 splits it. Names the training text never held fall back to smaller pieces."""
    tok = Tokenizer(models.BPE())
    steps = [pre_tokenizers.Digits(individual_digits=True)]
    if whole_names:
        steps.append(pre_tokenizers.Split(Regex(WHOLE_NAME + "|" + GPT2_SPLIT), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not whole_names))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                   mask_token=MASK, additional_special_tokens=[HEADER_START, HEADER_END, EOT],
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass
class Encoded:
    """One training example as token ids."""

    task: str
    prompt: list[int]
    response: list[int]      # answer + EOT + EOS padding, exactly the task's canvas length
    examples: tuple = ()     # (start, stop) of each in-context example's answer inside `prompt`
    sides: tuple = ()        # per response token: 1 first name, 2 last name of a list item, 0 other


def name_sides(tokens: list[str]) -> tuple:
    """Per token of a rendered answer: 1 for the first-name tokens of a quoted list item, 2 for its
    last-name tokens (from the first token that starts with a space), 0 for everything else. An
    item opens at a token ending in a quote outside an item ('["', ' "') and closes at a token
    starting with one ('",', '"]'). Tokens are the tokenizer's own strings ('Ġ' marks a space)."""
    sides, inside = [], 0
    for t in tokens:
        if inside and t.startswith('"'):
            inside = 0
            sides.append(0)
        elif inside:
            if inside == 1 and t.startswith("Ġ"):
                inside = 2
            sides.append(inside)
        else:
            sides.append(0)
            inside = 1 if t.endswith('"') else 0
    return tuple(sides)


def _find(seq: list[int], sub: list[int], start: int) -> int:
    """First index >= start where `sub` occurs in `seq`, or -1."""
    n = len(sub)
    for i in range(start, len(seq) - n + 1):
        if seq[i:i + n] == sub:
            return i
    return -1


def example_spans(tokenizer, prompt: list[int], turns: list[dict]) -> tuple:
    """Where the answers of the in-context examples sit in a prompt's ids: one (start, stop) per
    assistant turn, searched in order after the end of the turn before it (a copy example's
    question holds the same list as its answer)."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    spans, at = [], 0
    for turn in turns:
        if turn["role"] == "user":
            at = prompt.index(eot, at) + 1
            continue
        ids = tokenizer(turn["content"].strip(), add_special_tokens=False)["input_ids"]
        i = _find(prompt, ids, at)
        if i < 0 or not ids:
            raise ValueError(f"an in-context answer ({turn['content'][:40]!r}) does not tokenize the same inside "
                             f"the prompt")
        spans.append((i, i + len(ids)))
        at = prompt.index(eot, i + len(ids)) + 1
    return tuple(spans)


def encode_records(tokenizer, records: dict[str, list[dict]], canvas: int = 0) -> tuple[list[Encoded], dict[str, int]]:
    """Token ids of every record on a response canvas of `canvas` tokens (0: the task's max_tokens);
    records whose answer and EOT do not fit are counted, not kept. A task none of whose records fits
    is a ValueError naming it."""
    eos, eot = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(EOT)
    out, dropped = [], {}
    for task_id, recs in records.items():
        length = canvas or get_task(task_id).max_tokens
        prompts = tokenizer([render_prompt(task_id, r) for r in recs], add_special_tokens=False)["input_ids"]
        answers = tokenizer([answer_text(r) for r in recs], add_special_tokens=False)["input_ids"]
        for r, p, a in zip(recs, prompts, answers):
            if len(a) + 1 > length:
                dropped[task_id] = dropped.get(task_id, 0) + 1
                continue
            spans = example_spans(tokenizer, p, messages(task_id, r))
            response = a + [eot] + [eos] * (length - len(a) - 1)
            sides = name_sides(tokenizer.convert_ids_to_tokens(a)) + (0,) * (length - len(a))
            out.append(Encoded(task_id, p, response, spans, sides))
        if recs and dropped.get(task_id) == len(recs):
            longest = max(len(a) for a in answers) + 1
            raise ValueError(f"no record of task {task_id!r} fits a canvas of {length} tokens (its answers with the "
                             f"end token take up to {longest}); give a canvas of at least {longest} tokens "
                             f"(canvas 0: each task's max_tokens)")
    return out, dropped


# -- synthetic examples ---------------------------------------------------------------------------
COPY_WARMUP_LENGTHS = (4, 10)     # symbols per synthetic copy example; the canvas is 12


@functools.lru_cache(maxsize=4)
def copy_vocab(tokenizer):
    """What the synthetic examples are made of: (the regular, non-special token ids, the ids of a
    newline, the BOS id, the EOT id, the EOS id)."""
    special = set(tokenizer.all_special_ids)
    regular = [i for i in range(len(tokenizer)) if i not in special]
    ids = tokenizer.convert_tokens_to_ids
    return regular, tokenizer("\n", add_special_tokens=False)["input_ids"], ids(BOS), ids(EOT), ids(EOS)


def copy_example(tokenizer, rng: random.Random) -> Encoded:
    """One synthetic copy example of the warm-up: `n` distinct random non-special tokens; the
    prompt is BOS, the tokens and a newline, the response the same tokens, EOT and EOS padding."""
    regular, newline, bos, eot, eos = copy_vocab(tokenizer)
    ids = rng.sample(regular, rng.randint(*COPY_WARMUP_LENGTHS))
    canvas = COPY_WARMUP_LENGTHS[1] + 2
    return Encoded("copy-warmup", [bos] + ids + newline, ids + [eot] + [eos] * (canvas - len(ids) - 1))


PAIR_BIND_ROWS = 0.5               # share of pair-curriculum rows masked on one side of every pair


def global_pairing(regular: list[int], seed: int) -> dict[int, int]:
    """A fixed pairing of the regular tokens: half of them (in a seeded random order) each mapped to
    a distinct token of the other half."""
    order = list(regular)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return dict(zip(order[:half], order[half:2 * half]))


def pair_example(rng: random.Random, vocab, pairs: int, order: str = "shuffled",
                 pairing: dict[int, int] | None = None) -> Encoded:
    """One synthetic pair-binding example: the prompt is BOS, n pairs `a1 b1 ... an bn` (n drawn
    in [3, pairs]) and a newline; the response is the n pairs in a random order (`order="shuffled"`)
    or in the prompt's order (`"same"`), then EOT and EOS padding on a 2 * pairs + 2 canvas. With
    `pairing`, every b is pairing[a] (a global bigram), else the 2n tokens are distinct random
    regular tokens. `vocab` is `copy_vocab(tokenizer)`; sides mark a's 1 and b's 2."""
    if order not in ("shuffled", "same"):
        raise ValueError(f"order {order!r} is not 'shuffled' or 'same'")
    regular, newline, bos, eot, eos = vocab
    n = rng.randint(3, pairs)
    if pairing is None:
        toks = rng.sample(regular, 2 * n)
        items = [(toks[2 * i], toks[2 * i + 1]) for i in range(n)]
    else:
        items = [(a, pairing[a]) for a in rng.sample(sorted(pairing), n)]
    out = items[:]
    if order == "shuffled":
        rng.shuffle(out)
    canvas = 2 * pairs + 2
    response = [t for item in out for t in item]
    sides = (1, 2) * n + (0,) * (canvas - 2 * n)
    prompt = [bos] + [t for item in items for t in item] + newline
    return Encoded("pair-binding", prompt, response + [eot] + [eos] * (canvas - 2 * n - 1), (), sides)


# -- batches --------------------------------------------------------------------------------------
def make_batch(items: list[Encoded], pad_id: int):
    """Left-padded (B, L) ids, key validity, recounted positions and the response columns (B, G)."""
    lp = max(len(e.prompt) for e in items)
    g = len(items[0].response)
    B, L = len(items), lp + g
    x = torch.full((B, L), pad_id, dtype=torch.long)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, e in enumerate(items):
        x[b, lp - len(e.prompt):lp] = torch.tensor(e.prompt)
        x[b, lp:] = torch.tensor(e.response)
        valid[b, lp - len(e.prompt):] = True
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    cols = torch.arange(lp, L).expand(B, g)
    return x, valid, pos, cols


def response_sides(items: list[Encoded]) -> torch.Tensor:
    """(B, G) name sides of the response tokens of a batch (see `name_sides`)."""
    g = len(items[0].response)
    return torch.tensor([list(e.sides) or [0] * g for e in items], dtype=torch.long)


def example_columns(items: list[Encoded], L: int):
    """Canvas columns of the in-context answers of a batch made by `make_batch` (prompts end at
    column L - G): (B, E) columns and (B, E) validity. Rows with fewer are padded with column 0,
    which is never masked (a prompt starts with BOS; a shorter row's column 0 is padding)."""
    g = len(items[0].response)
    lp = L - g
    per_row = [[lp - len(e.prompt) + j for a, b in e.examples for j in range(a, b)] for e in items]
    E = max(1, max(len(c) for c in per_row))
    cols = torch.zeros(len(items), E, dtype=torch.long)
    ok = torch.zeros(len(items), E, dtype=torch.bool)
    for b, c in enumerate(per_row):
        if c:
            cols[b, :len(c)] = torch.tensor(c)
            ok[b, :len(c)] = True
    return cols, ok
