"""The model shipped in the package: its layout, a held-out generation and a short bench on CPU."""
import json
import re

import pytest
import torch

import dllm
from dllm.eval import generators, runner
from dllm.models import loading
from dllm.eval.tasks import encode_messages, messages

FOLDER = loading.ASSETS_DIR / loading.DEFAULT_MODEL


@pytest.fixture(scope="module")
def shipped():
    return dllm.load(dtype="float32")


def _held_out_copies(tok, n):
    """The first `n` records of the generated copy test split (held-out names) and their prompt ids,
    as the bench renders them."""
    records = generators.make_records("waiting_line/copy", split="test", num_samples=n, shard=0, names="open")
    return records, [encode_messages(tok, messages("waiting_line/copy", r)) for r in records]


def test_shipped_model_has_the_llada_layout_and_fits_the_budget():
    names = {p.name for p in FOLDER.iterdir()}
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "README.md", "train_info.json", "learn2pd_filter.safetensors"):
        assert f in names, f
    cfg = json.loads((FOLDER / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["weight_tying"] is True
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) <= 25 * 2 ** 20
    assert loading.DEFAULT_MODEL in loading.shipped_models()
    assert json.loads((FOLDER / "generation_config.json").read_text())["max_new_tokens"] == 64


def test_shipped_tokenizer_splits_held_out_names_into_several_tokens(shipped):
    """The model reads names it never saw: the people of its test split are held out of training and
    are no single token of its tokenizer."""
    from dllm.eval import names

    _, tok = shipped
    pool = names.open_pool("test")
    sample = [pool[i] for i in range(0, len(pool), max(1, len(pool) // 200))]
    counts = [len(tok(" " + name, add_special_tokens=False)["input_ids"]) for name in sample]
    assert min(counts) >= 2 and sum(counts) / len(counts) >= 4, counts


def test_default_train_config_is_the_shipped_recipe():
    """`dllm train` with no recipe flag reproduces the shipped model: the recipe recorded in its
    train_info.json is the default, and its phases are what that recipe runs (each later one going
    on from the model of the one before)."""
    import dataclasses

    from dllm import train as T

    info = json.loads((FOLDER / "train_info.json").read_text())
    default = T.TrainConfig()
    assert T.complete_recipe(info["recipe"]) == T.recipe_fields(default)
    runs = T.phase_configs(default)
    assert len(info["phases"]) == len(runs) == len(default.then_steps) + 1
    for k, (phase, run) in enumerate(zip(info["phases"], runs)):
        recorded = phase["recipe"]
        want = T.recipe_fields(dataclasses.replace(run, init_from=recorded["init_from"]))
        assert not set(recorded) - set(want)
        # the phases were recorded by single runs, some before the then_ fields or in their older
        # one-value form; every other field they record matches, and none had later phases itself
        assert {f: want[f] for f in recorded if f not in T.THEN_FIELDS} == {
            f: v for f, v in recorded.items() if f not in T.THEN_FIELDS}
        assert not recorded.get("then_steps")
        assert bool(recorded["init_from"]) == (k > 0)
        assert k == 0 or re.fullmatch(r"[0-9a-f]{64}", phase["init_from_sha256"])
    assert info["steps"] == default.steps + sum(default.then_steps) == sum(p["steps"] for p in info["phases"])


def test_shipped_model_copies_held_out_lists(shipped):
    model, tok = shipped
    records, ids = _held_out_copies(tok, 4)
    out = dllm.generate(model, tok, ids, steps=64, sampler="low_confidence")    # the checkpoint's 64 tokens
    assert out.sequences.shape[1] == max(map(len, ids)) + 64
    right = sum(text.strip() == r["answer"] for text, r in zip(out.texts, records))
    assert right >= 3, list(zip(out.texts, [r["answer"] for r in records]))


def test_three_sample_bench_on_the_shipped_model(shipped, tmp_path):
    model, tok = shipped
    cfg = runner.config_from_dict(dict(tasks="waiting_line/copy", generated=True, limit=3,
                                       out=str(tmp_path / "b.jsonl"), sampler="low_confidence"))
    rows = runner.run_bench(cfg, model=model, tokenizer=tok, progress=False)
    assert [r["task"] for r in rows] == ["waiting_line/copy"] * 3
    assert sum(r["score"] for r in rows) >= 2


def test_learn2pd_finds_the_filter_shipped_with_the_default_model(shipped):
    model, tok = shipped
    assert model.name_or_path == loading.DEFAULT_MODEL
    _, ids = _held_out_copies(tok, 2)
    settings = dict(gen_length=64, block_length=32, steps=64, sampler="learn2pd")
    found = dllm.generate(model, tok, ids, **settings)
    named = dllm.generate(model, tok, ids, **settings, sampler_kwargs={"filter": str(FOLDER / "learn2pd_filter.safetensors")})
    alone = dllm.generate(model, tok, ids, **settings, sampler_kwargs={"filter": "none"})
    assert torch.equal(found.sequences, named.sequences) and found.nfe == named.nfe
    assert max(found.nfe) < min(alone.nfe)          # the filter accepts positions beyond the base count


def test_prophet_keeps_learn2pds_end_of_text_cut(shipped):
    """A Prophet that never fires decodes as its base, the base's truncation included."""
    model, tok = shipped
    _, ids = _held_out_copies(tok, 4)
    settings = dict(gen_length=64, block_length=32)
    base = dllm.generate(model, tok, ids, **settings, sampler="learn2pd")
    wrapped = dllm.generate(model, tok, ids, **settings, sampler="prophet",
                            sampler_kwargs={"base": "learn2pd", "thresholds": [1e9, 1e9, 1e9]})
    assert torch.equal(wrapped.sequences, base.sequences) and wrapped.nfe == base.nfe
    assert min(base.nfe) < 64 // 4              # the cut ends rows long before one token per forward would


def test_shipped_and_saved_tokenizers_have_the_published_layout(tmp_path):
    """tokenizer_config.json as the published LLaDA checkpoints write it, so that transformers 4.x
    (the peers' and the references' environments) loads it too: transformers 5's own class name and
    keys are rewritten by `save_pretrained`, and the tokenizer reads the same either way."""
    from dllm.train import save_pretrained

    model, tok = dllm.load(dtype="float32")
    save_pretrained(model, tok, tmp_path / "saved")
    for folder in (FOLDER, tmp_path / "saved"):
        config = json.loads((folder / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert not {"backend", "is_local", "local_files_only", "extra_special_tokens"} & set(config)
        assert config["additional_special_tokens"] == ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    _, again = dllm.load(tmp_path / "saved", dtype="float32")
    turns = [{"role": "user", "content": "Copy: Ann Lee"}]
    assert encode_messages(again, turns) == encode_messages(tok, turns)
    assert again.all_special_tokens == tok.all_special_tokens
