"""The "open" name source: Faker's names split into disjoint train and held-out pools, a third
pool the tokenizer is fitted on, and names of every pool splitting into several tokens; the
"pseudo" source of made-up names and the training records that mix them in."""
import json
import random
import statistics

import pytest

from dllm import train as T
from dllm.eval import generators as G
from dllm.eval import names as N

LINE_TASKS = [t for t in G.generator_tasks() if t.startswith("waiting_line/")]


def _words(people) -> set[str]:
    return {w for p in people for w in p.split(" ")}


def test_train_test_and_stand_in_pools_share_no_word():
    train, test, stand_in = N.open_pool("train"), N.open_pool("test"), N.stand_in_pool()
    assert len(train.firsts) > 500 and len(train.lasts) > 1000 and len(test.firsts) > 100 and len(test.lasts) > 200
    assert not train.words() & test.words()
    assert not stand_in.words() & (train.words() | test.words())
    assert all(N.held_out(w) for w in test.words()) and not any(N.held_out(w) for w in train.words())
    # a pool is every pair, first-name-major, without building them
    assert train[0] == f"{train.firsts[0]} {train.lasts[0]}" and train[1] == f"{train.firsts[0]} {train.lasts[1]}"
    assert train[len(train) - 1] == f"{train.firsts[-1]} {train.lasts[-1]}"
    with pytest.raises(IndexError, match="outside the pool"):
        train[len(train)]


@pytest.mark.parametrize("task", LINE_TASKS)
def test_no_name_of_the_test_split_appears_in_training_records(task):
    test = set().union(*(T.record_people(r) for r in G.make_records(task, names="open")))
    train = set().union(*(T.record_people(r) for r in G.make_records(task, split="train", num_samples=400,
                                                                        names="open")))
    assert _words(test) <= N.open_pool("test").words()
    assert _words(train) <= N.open_pool("train").words()
    assert not _words(test) & _words(train)
    # the "lists" source keeps the project's word lists, the same records as before
    lists = G.make_records(task, num_samples=5)
    assert lists == G.make_records(task, num_samples=5, names="lists")
    assert _words(set().union(*(T.record_people(r) for r in lists))) <= set(G.FIRST_NAMES) | set(G.LAST_NAMES)


def test_open_tokenizer_splits_names_of_both_pools_alike_into_several_tokens():
    records = {t: G.make_records(t, split="train", num_samples=60, names="open")
               for t in ("waiting_line/copy", "waiting_line/insert_index", "puzzle/sudoku_n4_12")}
    texts = T.tokenizer_texts(records, "open")
    joined = "\n".join(texts)
    people = set().union(*(T.record_people(r) for recs in records.values() for r in recs))
    assert people and not any(p in joined for p in people)          # the people are swapped out
    assert '["' in joined and '", "' in joined                        # the list punctuation stays
    tok = T.build_tokenizer(texts, 1024)
    rng = random.Random(0)
    counts = {}
    for split in ("train", "test"):
        pool = N.open_pool(split)
        sample = [pool[rng.randrange(len(pool))] for _ in range(300)]
        counts[split] = [len(tok(name, add_special_tokens=False)["input_ids"]) for name in sample]
        assert statistics.mean(counts[split]) >= 4
        assert sum(c >= 3 for c in counts[split]) / len(sample) > 0.95
    assert statistics.mean(counts["train"]) == pytest.approx(statistics.mean(counts["test"]), rel=0.15)


def test_bad_name_sources_are_errors():
    with pytest.raises(ValueError, match="unknown name source 'faker'; sources: lists, open, pseudo"):
        G.make_records("waiting_line/copy", names="faker")
    with pytest.raises(ValueError, match="names 'faker' is not one of lists, open, pseudo"):
        T.TrainConfig(names="faker")
    with pytest.raises(ValueError, match="pool names must be one capitalised ASCII word each, got 'o Neil'"):
        N.NamePool(("Ann",), ("o Neil",))


def test_pseudo_pools_are_made_up_words_apart_from_every_other_pool():
    train, test = N.pseudo_pool("train"), N.pseudo_pool("test")
    assert len(train.firsts) > 4000 and len(train.lasts) > 4000 and len(test.firsts) > 900 and len(test.lasts) > 900
    assert not train.words() & test.words()
    real = N.open_pool("train").words() | N.open_pool("test").words() | N.stand_in_pool().words()
    assert not (train.words() | test.words()) & real
    assert all(len(w) in N.PSEUDO_LENGTHS for w in train.words() | test.words())
    assert not set(train.firsts) & set(train.lasts)
    # letter trigrams of the examples: every trigram of a made-up word occurs in some example
    examples = N.stand_in_pool().firsts
    seen = {f"^^{w.lower()}$"[i:i + 3] for w in examples for i in range(len(w) + 1)}
    assert all(f"^^{w.lower()}$"[i:i + 3] in seen for w in train.firsts[:300] for i in range(len(w) + 1))
    assert N.pseudo_words(examples, 50, seed=1, avoid=set()) == N.pseudo_words(examples, 50, seed=1, avoid=set())
    with pytest.raises(ValueError, match="made only 2 of 5 new words"):
        N.pseudo_words(("Abe", "Ace"), 5, seed=0, avoid=set())
    with pytest.raises(ValueError, match="unknown split 'dev'; splits: train, test"):
        N.pseudo_pool("dev")


def test_pseudo_share_mixes_made_up_people_into_waiting_line_training_records():
    cfg = T.TrainConfig(names="open", pseudo_share=0.25, samples_per_task=40,
                        tasks="waiting_line/sort,puzzle/sudoku_n4_12")
    records = T.training_records(cfg)
    assert [len(v) for v in records.values()] == [40, 40]
    sort = records["waiting_line/sort"]
    made_up = [r for r in sort if _words(T.record_people(r)) <= N.pseudo_pool("train").words()]
    real = [r for r in sort if _words(T.record_people(r)) <= N.open_pool("train").words()]
    assert len(made_up) == 10 and len(real) == 30
    for r in made_up:          # the generator's answers hold for made-up people too (sorted by full name)
        people = json.loads(r["input"]["context"])
        assert json.loads(r["answer"]) == sorted(people)
    all_real = T.training_records(T.TrainConfig(**{**cfg.__dict__, "pseudo_share": 0.0}))
    assert all_real["waiting_line/sort"][:30] == real and all_real["puzzle/sudoku_n4_12"] == records["puzzle/sudoku_n4_12"]
    with pytest.raises(ValueError, match="pseudo_share must be a number in \\[0, 1\\), got 1"):
        T.TrainConfig(pseudo_share=1)
