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
"""
from __future__ import annotations

import hashlib
import importlib
import re
from functools import lru_cache

NAME_SOURCES = ("lists", "open")
FAKER_LOCALES = ("en_US", "en_GB", "en_IE", "en_NZ")
STAND_IN_LOCALES = ("en", "en_IN", "en_KE", "en_NG", "en_PK", "en_TH")
HELD_OUT_ONE_IN = 5
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
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r}; splits: train, test")
    firsts, lasts = _faker_words(FAKER_LOCALES)
    test = split == "test"
    return NamePool(tuple(w for w in firsts if held_out(w) == test), tuple(w for w in lasts if held_out(w) == test))
