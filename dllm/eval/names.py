"""The people of the Waiting Line generators: a pool of "First Last" names, indexable without
building every pair, and the two name sources.

NAME_SOURCES:
    "lists"  the project's own word lists (`dllm.eval.wordlists`): 96 first names x 180 last names,
             the same pool for the train and the test split.
    "open"   the English person names of Faker's locale providers (MIT licence; en_US, en_GB, en_IE,
             en_NZ; one capitalised ASCII word each), split by word into two disjoint pools: a word
             goes to the test pool when the SHA-256 of its text is 0 mod 5. A word that is both a
             first and a last name lands in the same pool for both, so no first or last name of a
             test record ever appears in a training record. The train split draws from the train
             pool, the test split from the held-out pool.
    "pseudo" made-up names: words drawn from a character model (letter trigrams) of the stand-in
             names (`stand_in_pool`), none of them a word of the "open" pools; split into train and
             test pools by the same hash. No name repeats often enough to be remembered, so a model
             trained on them must copy names letter piece by letter piece.
"""
from __future__ import annotations

import hashlib
import importlib
import random
import re
from collections import Counter, defaultdict
from functools import lru_cache

NAME_SOURCES = ("lists", "open", "pseudo")
DEFAULT_SOURCE = "open"          # what bench, sweep, train and train-filter use unless told
FAKER_LOCALES = ("en_US", "en_GB", "en_IE", "en_NZ")
STAND_IN_LOCALES = ("en", "en_IN", "en_KE", "en_NG", "en_PK", "en_TH")
HELD_OUT_ONE_IN = 5
PSEUDO_WORDS = 6000             # made-up first names, and as many last names, before the split
PSEUDO_LENGTHS = range(3, 11)   # letters per made-up word
_WORD = re.compile(r"[A-Z][a-z]+")


class NamePool:
    """Every "First Last" pair of two word tuples, first-name-major, as a read-only sequence: entry i
    is `firsts[i // len(lasts)] + " " + lasts[i % len(lasts)]`."""

    def __init__(self, firsts: tuple[str, ...], lasts: tuple[str, ...]):
        bad = [w for w in firsts + lasts if not _WORD.fullmatch(w)]
        if bad:
            raise ValueError(f"pool names must be one capitalised ASCII word each, got {bad[0]!r}")
        self.firsts, self.lasts = firsts, lasts

    def __len__(self) -> int:
        return len(self.firsts) * len(self.lasts)

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(f"name index {i} outside the pool of {len(self)}")
        first, last = divmod(i, len(self.lasts))
        return f"{self.firsts[first]} {self.lasts[last]}"

    def words(self) -> frozenset[str]:
        """Every first and last name of the pool."""
        return frozenset(self.firsts) | frozenset(self.lasts)


def held_out(word: str) -> bool:
    """Whether a name word belongs to the held-out (test) side of the "open" source."""
    return int.from_bytes(hashlib.sha256(word.encode()).digest(), "big") % HELD_OUT_ONE_IN == 0


@lru_cache(maxsize=None)
def _faker_words(locales: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(first names, last names) of Faker's person providers of `locales`, sorted, one capitalised
    ASCII word each."""
    try:
        importlib.import_module("faker")
    except ImportError:
        raise ImportError("the 'open' name source needs Faker: pip install faker") from None
    firsts, lasts = set(), set()
    for locale in locales:
        provider = importlib.import_module(f"faker.providers.person.{locale}").Provider
        firsts.update(w for w in getattr(provider, "first_names", ()) if _WORD.fullmatch(w))
        lasts.update(w for w in getattr(provider, "last_names", ()) if _WORD.fullmatch(w))
    return tuple(sorted(firsts)), tuple(sorted(lasts))


@lru_cache(maxsize=1)
def stand_in_pool() -> NamePool:
    """Names of `STAND_IN_LOCALES` that are no word of the train or the test pool."""
    used = set().union(*_faker_words(FAKER_LOCALES))
    firsts, lasts = _faker_words(STAND_IN_LOCALES)
    return NamePool(tuple(w for w in firsts if w not in used), tuple(w for w in lasts if w not in used))


def check_source(source: str) -> str:
    """`source` if it is one of NAME_SOURCES, else a ValueError naming it."""
    if source not in NAME_SOURCES:
        raise ValueError(f"unknown name source {source!r}; sources: {', '.join(NAME_SOURCES)}")
    return source


@lru_cache(maxsize=None)
def open_pool(split: str) -> NamePool:
    """The pool of the "open" source that `split` ("train" or "test") draws from."""
    return _split_pool(*_faker_words(FAKER_LOCALES), split)


def _split_pool(firsts: tuple[str, ...], lasts: tuple[str, ...], split: str) -> NamePool:
    """The words of `split` ("train" or "test"; the test side is `held_out`) as a pool."""
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; splits: train, test")
    test = split == "test"
    return NamePool(tuple(w for w in firsts if held_out(w) == test), tuple(w for w in lasts if held_out(w) == test))


@lru_cache(maxsize=None)
def pseudo_pool(split: str) -> NamePool:
    """The pool of the "pseudo" source that `split` ("train" or "test") draws from."""
    return _split_pool(*_all_pseudo_words(), split)


@lru_cache(maxsize=1)
def _all_pseudo_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(first names, last names) of the "pseudo" source before the split."""
    stand_in = stand_in_pool()
    taken = set().union(*_faker_words(FAKER_LOCALES), stand_in.words())
    firsts = pseudo_words(stand_in.firsts, PSEUDO_WORDS, seed=1, avoid=taken)
    return firsts, pseudo_words(stand_in.lasts, PSEUDO_WORDS, seed=2, avoid=taken | set(firsts))


def pseudo_words(examples: tuple[str, ...], count: int, seed: int, avoid: set[str]) -> tuple[str, ...]:
    """`count` distinct capitalised words, sorted, none in `avoid`, from a letter-trigram model of
    `examples` (each letter drawn given the two before it, `^` marking the start and `$` the end),
    kept when their length is in PSEUDO_LENGTHS. Deterministic for a seed."""
    following: dict[str, Counter] = defaultdict(Counter)
    for word in examples:
        letters = "^^" + word.lower() + "$"
        for i in range(2, len(letters)):
            following[letters[i - 2:i]][letters[i]] += 1
    table = {ctx: (list(c), list(c.values())) for ctx, c in following.items()}
    rng, words, tries = random.Random(seed), set(), 0
    while len(words) < count:
        tries += 1
        if tries > 100 * count:
            raise ValueError(f"the letter model of {len(examples)} words made only {len(words)} of {count} new words")
        ctx, word = "^^", ""
        while len(word) <= PSEUDO_LENGTHS.stop:
            letters, weights = table[ctx]
            letter = rng.choices(letters, weights)[0]
            if letter == "$":
                break
            word += letter
            ctx = ctx[1] + letter
        word = word.capitalize()
        if len(word) in PSEUDO_LENGTHS and word not in avoid:
            words.add(word)
    return tuple(sorted(words))
