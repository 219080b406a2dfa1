"""Cover names: made-up names that put every name piece of the tokenizer into training records.

The tokenizer is fitted on text whose people are stand-in names, so some of its name pieces (a
first name's opening "Pear", an inner "odi") occur in few or none of the training pool's words. Their
embeddings then barely move from their init, and a held-out name made of them is copied wrong. Cover
words are made-up words built around such pieces until every piece occurs in at least
`COVER_MINIMUM` words of the training side; a share of the Waiting Line records (`cover_share`) get
their people renamed to names made of them.

A piece is one of three kinds, from its token text (byte-level BPE, "Ġ" for a leading space):
"first" (a capitalised piece without a space: it opens a first name, which follows a quote), "last"
(a capitalised piece with a space: it opens a last name) and "inner" (lower-case letters: inside
either)."""
from __future__ import annotations

import random
import re
from collections import Counter

from ..eval.names import NamePool, open_pool, pseudo_pool
from .data import record_people

COVER_MINIMUM = 24        # training-side words each name piece occurs in, at least
COVER_TRIES = 200         # candidate words tried per word a piece still needs
_KINDS = {"first": re.compile(r"[A-Z][a-z]*"), "last": re.compile(r"Ġ[A-Z][a-z]*"), "inner": re.compile(r"[a-z]+")}
_WORD = re.compile(r"[A-Z][a-z]{1,11}")
# The one Waiting Line task whose answer changes when its people are renamed: its order depends on the names.
NAME_ORDERED = ("waiting_line/sort",)


def renameable(task: str) -> bool:
    """Whether a task's answers stay right when every person is renamed: the Waiting Line tasks but sort."""
    return task.startswith("waiting_line/") and task not in NAME_ORDERED


def piece_kind(token: str) -> str | None:
    """"first", "last" or "inner" for a name piece's token text; None for any other token."""
    return next((kind for kind, pattern in _KINDS.items() if pattern.fullmatch(token)), None)


def name_pieces(tokenizer) -> dict[int, str]:
    """Every name-piece token id of `tokenizer` with its kind."""
    kinds = {i: piece_kind(t) for i, t in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))}
    return {i: k for i, k in kinds.items() if k is not None}


def word_ids(tokenizer, words, side: str) -> list[list[int]]:
    """The token ids of each word as it sits in a name: a first name bare (after a quote), a last
    name after a space."""
    lead = "" if side == "first" else " "
    return tokenizer([lead + w for w in words], add_special_tokens=False)["input_ids"] if words else []


def piece_counts(tokenizer, firsts, lasts) -> Counter:
    """In how many of the words each token id occurs (firsts as first names, lasts as last names)."""
    counts = Counter()
    for side, words in (("first", firsts), ("last", lasts)):
        for ids in word_ids(tokenizer, words, side):
            counts.update(set(ids))
    return counts


def training_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(first, last) words of the training side: the train pools of the "open" and "pseudo" sources."""
    pools = (open_pool("train"), pseudo_pool("train"))
    return sum((p.firsts for p in pools), ()), sum((p.lasts for p in pools), ())


def held_out_words() -> frozenset[str]:
    """Every word of the held-out (test) pools, which no cover word may be."""
    return open_pool("test").words() | pseudo_pool("test").words()


def _candidate(piece: str, kind: str, side: str, donors: tuple[str, ...], rng: random.Random) -> str:
    """A made-up word holding `piece` (its text without the space mark): the piece opens it
    ("first", "last") or follows the first one or two letters of a donor word ("inner"), and most
    often the last one to four letters of another donor word follow it."""
    tail = rng.choice(donors)[-rng.randint(1, 4):] if rng.random() < 0.8 else ""
    if kind == "inner":
        head = rng.choice(donors)[:rng.randint(1, 2)]
        return (head + piece + tail).capitalize()
    return piece.lstrip("Ġ") + tail


def cover_words(tokenizer, minimum: int = COVER_MINIMUM, seed: int = 0) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(first, last) made-up words such that every name piece of `tokenizer` occurs in at least
    `minimum` words of the training side and these together (a piece that no candidate word keeps
    as a token is skipped). No word is a word of the training or held-out pools. Deterministic for a
    seed."""
    firsts, lasts = training_words()
    counts = piece_counts(tokenizer, firsts, lasts)
    taken = set(firsts) | set(lasts) | held_out_words()
    rng = random.Random(seed)
    out = {"first": [], "last": []}
    for piece_id, kind in sorted(name_pieces(tokenizer).items()):
        sides = ("first",) if kind == "first" else ("last",) if kind == "last" else ("first", "last")
        piece = tokenizer.convert_ids_to_tokens(piece_id)
        for tries in range(COVER_TRIES * minimum):
            if counts[piece_id] >= minimum:
                break
            side = sides[tries % len(sides)]
            word = _candidate(piece, kind, side, firsts if side == "first" else lasts, rng)
            if not _WORD.fullmatch(word) or word in taken:
                continue
            ids = word_ids(tokenizer, [word], side)[0]
            if piece_id in ids:
                taken.add(word)
                out[side].append(word)
                counts.update(set(ids))
    return tuple(out["first"]), tuple(out["last"])


def cover_pool(tokenizer, minimum: int = COVER_MINIMUM, seed: int = 0) -> NamePool:
    """The cover words as a pool of "First Last" names."""
    return NamePool(*cover_words(tokenizer, minimum, seed))


def rename_people(record: dict, people: dict[str, str]) -> dict:
    """A copy of `record` with every person (a "First Last" name) replaced by people[person] in every
    string it holds (lists, JSON text, answers, in-context examples)."""
    if not people:
        return record
    pattern = re.compile(r"(?<![A-Za-z])(" + "|".join(re.escape(p) for p in sorted(people, key=len, reverse=True))
                         + r")(?![A-Za-z])")

    def walk(value):
        if isinstance(value, str):
            return pattern.sub(lambda m: people[m.group(1)], value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v) for v in value)
        return value

    return walk(record)


def with_cover_names(records: dict[str, list[dict]], pool: NamePool, share: float, seed: int) -> dict[str, list[dict]]:
    """`records` with the people of the last round(share * n) records of each renameable Waiting
    Line task (`renameable`; the made-up-name records sit last) renamed to distinct names drawn
    from `pool`."""
    rng = random.Random(seed)
    out = {}
    for task, recs in records.items():
        k = round(share * len(recs)) if renameable(task) else 0
        renamed = []
        for r in recs[len(recs) - k:]:
            people = sorted(record_people(r))
            names = [pool[i] for i in rng.sample(range(len(pool)), len(people))]
            renamed.append(rename_people(r, dict(zip(people, names))))
        out[task] = recs[:len(recs) - k] + renamed
    return out
