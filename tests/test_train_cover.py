"""Cover names (`dllm.train.cover`): made-up words that put every name piece of a tokenizer into
training words, and Waiting Line records renamed to them that stay right answers."""
import json

import pytest
from transformers import PreTrainedTokenizerFast

from dllm import train as T
from dllm.eval import metrics
from dllm.eval.names import open_pool
from dllm.eval.tasks import get_task
from dllm.train import cover as C

TOKENIZER = "dllm/assets/llada-pb-tiny"


@pytest.fixture(scope="module")
def tokenizer():
    return PreTrainedTokenizerFast.from_pretrained(TOKENIZER)


@pytest.fixture(scope="module")
def words(tokenizer):
    return C.cover_words(tokenizer, minimum=6, seed=0)


def test_piece_kinds_follow_the_token_text():
    assert C.piece_kind("Pear") == "first" and C.piece_kind("J") == "first"
    assert C.piece_kind("ĠJ") == "last" and C.piece_kind("ĠRo") == "last"
    assert C.piece_kind("odi") == "inner"
    for other in ("Ġand", '["', '",', "\n", "A1", "ĠMcD", "user_"):
        assert C.piece_kind(other) is None, other


def test_every_name_piece_reaches_the_minimum_in_training_and_cover_words(tokenizer, words):
    firsts, lasts = C.training_words()
    before = C.piece_counts(tokenizer, firsts, lasts)
    after = C.piece_counts(tokenizer, firsts + words[0], lasts + words[1])
    pieces = C.name_pieces(tokenizer)
    # the training words alone leave pieces below it (the reason cover words exist)
    assert sum(before[i] < 6 for i in pieces) > 100
    # brute force over every piece, counted from scratch
    short = [tokenizer.convert_ids_to_tokens(i) for i in pieces if after[i] < 6]
    assert not short


def test_cover_words_are_new_capitalised_words_of_no_pool(tokenizer, words):
    firsts, lasts = C.training_words()
    held_out = C.held_out_words()
    for w in words[0] + words[1]:
        assert w[0].isupper() and w[1:].islower() and w.isalpha() and 2 <= len(w) <= 12, w
    every = set(words[0]) | set(words[1])
    assert len(every) == len(words[0]) + len(words[1])
    assert not every & held_out and not every & (set(firsts) | set(lasts))
    assert not every & open_pool("test").words()
    assert C.cover_words(tokenizer, minimum=6, seed=0) == words     # deterministic for a seed


def test_held_out_names_made_of_rare_pieces_share_their_pieces_with_cover_words(tokenizer, words):
    """A held-out word whose piece the training words lack: after cover words, that piece sits in
    training words in the same position (first or last name)."""
    firsts, lasts = C.training_words()
    before = C.piece_counts(tokenizer, firsts, lasts)
    after = C.piece_counts(tokenizer, firsts + words[0], lasts + words[1])
    test = open_pool("test")
    rare = [(w, side) for side, pool in (("first", test.firsts), ("last", test.lasts)) for w in pool
            if min(before[i] for i in C.word_ids(tokenizer, [w], side)[0]) == 0]
    assert rare
    for w, side in rare:
        ids = C.word_ids(tokenizer, [w], side)[0]
        assert all(after[i] >= 6 or C.piece_kind(tokenizer.convert_ids_to_tokens(i)) is None for i in ids), w


def test_rename_people_replaces_whole_names_everywhere_and_nothing_else():
    record = {"input": {"context": json.dumps(["Ann Lee", "Ann Leeson", "Bo Ray"]), "word": "Bo Ray",
                        "icl_examples": [{"input": {"context": '["Ann Lee"]'}, "answer": '["Ann Lee"]'}]},
              "answer": {"input": ["Ann Lee", "Bo Ray"], "example": '["Bo Ray", "Ann Lee"]'}, "metadata": {"length": 2}}
    out = C.rename_people(record, {"Ann Lee": "Xo Pa", "Bo Ray": "Ann Lee"})
    assert json.loads(out["input"]["context"]) == ["Xo Pa", "Ann Leeson", "Ann Lee"]
    assert out["input"]["word"] == "Ann Lee"
    assert out["input"]["icl_examples"][0] == {"input": {"context": '["Xo Pa"]'}, "answer": '["Xo Pa"]'}
    assert out["answer"] == {"input": ["Xo Pa", "Ann Lee"], "example": '["Ann Lee", "Xo Pa"]'}
    assert out["metadata"] == {"length": 2} and record["input"]["word"] == "Bo Ray"   # the original kept


def test_renamed_records_keep_right_answers_and_sort_is_left_alone(tokenizer, words):
    cfg = T.TrainConfig(samples_per_task=8)
    records = T.training_records(cfg)
    pool = C.NamePool(*words)
    renamed = C.with_cover_names(records, pool, 0.5, seed=1)
    cover = set(words[0]) | set(words[1])
    for task, recs in records.items():
        new = renamed[task]
        assert len(new) == len(recs)
        changed = [i for i, (a, b) in enumerate(zip(recs, new)) if a != b]
        if task.startswith("waiting_line/") and task != "waiting_line/sort":   # sort's answer follows the names
            assert changed == list(range(4, 8)), task
        else:
            assert not changed, task
        for i in changed:
            people = T.record_people(new[i])
            assert people and all(set(p.split(" ")) <= cover for p in people)
            assert len(people) == len(T.record_people(recs[i]))
            # the benchmark's own metric still scores the renamed answer right
            metric = get_task(task).metric
            assert metrics.compute(metric, T.answer_text(new[i]), new[i]["answer"])["headline"] == 1, task


def test_cover_share_is_checked():
    assert T.TrainConfig(cover_share=0.25).cover_share == 0.25
    for bad in (-0.1, 1.5, True, "x"):
        with pytest.raises(ValueError, match="cover_share must be a number in \\[0, 1\\]"):
            T.TrainConfig(cover_share=bad)


def test_a_phase_with_cover_names_trains_on_other_records(tmp_path):
    """cover_share reaches the records a phase trains on: the same recipe with and without it makes
    different weights from the same init, and a later phase takes its own share."""
    import torch
    from safetensors.torch import load_file

    tiny = dict(tasks="waiting_line/copy", samples_per_task=24, vocab_size=600, d_model=32, n_layers=2, n_heads=2,
                mlp_hidden=64, steps=3, batch_size=4, warmup=1, threads=1, compile=False, then_steps=0,
                precision="fp32")
    plain = T.train(T.TrainConfig(out=str(tmp_path / "plain"), **tiny), progress=False)
    cover = T.train(T.TrainConfig(out=str(tmp_path / "cover"), cover_share=1.0, **tiny), progress=False)
    a, b = load_file(str(plain / "model.safetensors")), load_file(str(cover / "model.safetensors"))
    assert not all(torch.equal(a[k], b[k]) for k in a)
    later = dict(then_steps=(2, 2), then_lr=1e-3, then_min_lr=1e-4, then_seed=(1, 2), then_task_weights="",
                 then_cover_share=(0.5, 0.0))
    phases = T.phase_configs(T.TrainConfig(**{**tiny, **later}))
    assert [p.cover_share for p in phases] == [0.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="then_cover_share must be numbers in \\[0, 1\\]"):
        T.TrainConfig(then_steps=(1,), then_lr=1e-3, then_min_lr=1e-4, then_seed=1, then_task_weights="",
                      then_cover_share=2.0)
