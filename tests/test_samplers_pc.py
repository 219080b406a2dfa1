"""PC-Sampler against its loop re-stated (tests/reference/pc_sampler_ref.py) on the tiny LLaDA
checkpoint, peaked random weights (float32 and bfloat16), the tiny Dream checkpoint and the shipped
model, alone and in a ragged batch; its frequency tables (`dllm.token_frequencies`) and the
`dllm token-frequencies` command."""
from __future__ import annotations

import json

import pytest
import torch

import dllm
from dllm import samplers, token_frequencies
from dllm.cli import main as cli
from dllm.token_frequencies import TokenFrequencies
from tests.reference.pc_sampler_ref import pc_sampler_ref
from tests.test_generate import PROMPTS4, equal_alone_and_batched, llada_logits_fn


def random_counts(vocab: int, seed: int) -> dict[int, int]:
    """Counts for about two thirds of the ids, spread over four orders of magnitude."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=gen)[: 2 * vocab // 3].tolist()
    return {i: int(10 ** (4 * float(torch.rand(1, generator=gen)))) for i in ids}


def frequency_table(counts: dict[int, int], total: int, vocab: int) -> torch.Tensor:
    """The reference's table written out: count / total, 1 / total for ids never counted, float32."""
    return torch.tensor([counts[i] / total if i in counts else 1 / total for i in range(vocab)],
                        dtype=torch.float32)


def _table_file(tmp_path, model, seed=0):
    vocab = model.config.vocab_size
    counts = random_counts(vocab, seed)
    total = sum(counts.values()) + 7
    path = tmp_path / f"freq{seed}.json"
    path.write_text(json.dumps({"num_token": total, "p_baseline_dict": {str(k): v for k, v in counts.items()}}))
    return path, frequency_table(counts, total, vocab)


CASES = [  # (model, gen_length, block_length, steps, lambd, alpha, score_dtype, calibrated)
    ("llada", 16, 16, 16, 0.25, 10.0, "float32", True), ("llada", 16, 8, 8, 0.25, 10.0, "float32", True),
    ("peaked", 16, 16, 16, 0.25, 10.0, "float32", True), ("peaked", 24, 8, 12, 1.0, 10.0, "float32", True),
    ("peaked", 16, 16, 8, 0.0, 3.0, "float32", True), ("peaked", 20, 10, 6, 0.5, 0.5, "float64", True),
    ("peaked", 16, 8, 16, 0.25, 10.0, "float32", False), ("bf16", 16, 16, 16, 0.25, 10.0, "logits", True),
    ("dream", 16, 8, 16, 0.25, 10.0, "float32", True),
]
LINEAR_CASES = [  # the linear-position baseline: (model, gen_length, block_length, steps, lambd, alpha, calibrated)
    ("llada", 16, 16, 16, 0.25, 10.0, True), ("peaked", 24, 8, 12, 0.5, 10.0, True),
    ("peaked", 16, 16, 8, 1.0, 3.0, True), ("peaked", 16, 8, 16, 0.0, 10.0, False), ("shipped", 32, 32, 32, 0.25, 10.0, True),
]


@pytest.mark.parametrize("which,gen,block,steps,lambd,alpha,score_dtype,calibrated", CASES, ids=str)
def test_pc_sampler_equals_reference_alone_and_in_a_ragged_batch(model_named, tmp_path, which, gen, block, steps, lambd,
                                                                  alpha, score_dtype, calibrated):
    model = model_named(which)
    path, table = _table_file(tmp_path, model)
    dtype = {"float64": torch.float64, "float32": torch.float32, "logits": model.dtype}[score_dtype]
    args = dict(lambd=lambd, alpha=alpha, frequencies=str(path) if calibrated else "none")

    def ref(fn, prompt, **kw):
        return pc_sampler_ref(fn, prompt, steps=steps, lambd=lambd, alpha=alpha, dtype=dtype,
                              frequency=table if calibrated else None, **kw)

    # Dream's model hands over logits already shifted onto the canvas columns, as the loop reads them.
    forwards = equal_alone_and_batched(model, "pc_sampler", args, ref, gen, block, steps=steps, score_dtype=score_dtype)
    assert forwards == [steps] * len(PROMPTS4)


def test_the_linear_weighting_stays_finite_on_a_flat_float16_block():
    from types import SimpleNamespace

    sampler = samplers.get("pc_sampler", frequencies="none", weighting="linear", lambd=0.5)
    state = SimpleNamespace(block_start=torch.tensor([0]), block_length=4, x=torch.tensor([[9, 9, 9, 9]]),
                            ids=SimpleNamespace(mask=9))
    scores = SimpleNamespace(prob=torch.full((1, 4), 0.5, dtype=torch.float16), token=torch.tensor([[1, 2, 3, 4]]))
    got = sampler.scores_for(state, torch.tensor([0]), torch.arange(4)[None], torch.ones(1, 4, dtype=torch.bool), scores)
    assert torch.isfinite(got).all() and got[0].tolist() == sorted(got[0].tolist(), reverse=True)


@pytest.mark.parametrize("which,gen,block,steps,lambd,alpha,calibrated", LINEAR_CASES, ids=str)
def test_the_linear_position_baseline_equals_reference(model_named, tmp_path, which, gen, block, steps, lambd, alpha,
                                                         calibrated):
    model = model_named(which)
    path, table = _table_file(tmp_path, model)
    args = dict(lambd=lambd, alpha=alpha, frequencies=str(path) if calibrated else "none", weighting="linear")

    def ref(fn, prompt, **kw):
        return pc_sampler_ref(fn, prompt, steps=steps, lambd=lambd, alpha=alpha, frequency=table if calibrated else None,
                              weighting="linear", **kw)

    assert equal_alone_and_batched(model, "pc_sampler", args, ref, gen, block, steps=steps,
                                   score_dtype="float32") == [steps] * len(PROMPTS4)


def test_the_shipped_model_reads_its_shipped_table(shipped_float32):
    model, tok = shipped_float32
    table = token_frequencies.load(token_frequencies.shipped(str(dllm.models.loading.default_model_path())))
    frequency = frequency_table(table.counts, table.total, model.config.vocab_size)
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)["input_ids"]
               for q in ("Sort the list: [\"Ann Lee\", \"Bob Stone\", \"Cy Young\"]", "Copy the list: [\"Dee Ray\"]")]
    out = dllm.generate(model, None, prompts, gen_length=32, block_length=16, steps=32, sampler="pc_sampler")
    lp = max(map(len, prompts))
    for b, row in enumerate(prompts):
        want, _ = pc_sampler_ref(llada_logits_fn(model), torch.tensor([row]), gen_length=32, block_length=16,
                                 steps=32, mask_id=model.config.mask_token_id, lambd=0.25, alpha=10.0,
                                 frequency=frequency)
        assert out.sequences[b, lp:].tolist() == want[0, len(row):].tolist()
    assert out.sampler_args["frequencies"].endswith(token_frequencies.FILE_NAME)
    wrapped = dllm.generate(model, None, prompts[:1], gen_length=32, block_length=16, steps=32, sampler="prophet",
                            sampler_kwargs=dict(base="pc_sampler"))
    assert wrapped.sampler_args["base_kwargs"]["frequencies"] == out.sampler_args["frequencies"]
    assert "frequencies" not in wrapped.sampler_args
    plain = dllm.generate(model, None, prompts, gen_length=32, block_length=16, steps=32, sampler="low_confidence")
    assert not torch.equal(out.sequences, plain.sequences)     # the calibration and the weights change the order


def test_gumbel_candidates_at_temperature(tmp_path, peaked_llada):
    model, row = peaked_llada, PROMPTS4[0]
    path, table = _table_file(tmp_path, model, seed=1)
    kw = dict(gen_length=16, block_length=8, steps=16, sampler="pc_sampler", sampler_kwargs=dict(frequencies=str(path)))
    out = dllm.generate(model, None, [row], temperature=4.0, seed=3, **kw)
    want, _ = pc_sampler_ref(llada_logits_fn(model), torch.tensor([row]), gen_length=16, block_length=8, steps=16,
                             mask_id=model.config.mask_token_id, lambd=0.25, alpha=10.0, frequency=table,
                             temperature=4.0, generator=torch.Generator().manual_seed(3))
    assert out.sequences[0].tolist() == want[0].tolist()
    assert not torch.equal(out.sequences, dllm.generate(model, None, [row], **kw).sequences)


def test_a_large_decay_decodes_left_to_right(tmp_path, peaked_llada):
    path, _ = _table_file(tmp_path, peaked_llada)
    out = dllm.generate(peaked_llada, None, PROMPTS4, gen_length=16, block_length=16, steps=16, trace=True,
                        sampler="pc_sampler", sampler_kwargs=dict(lambd=50.0, frequencies=str(path)))
    assert out.trace.tolist() == [list(range(16))] * len(PROMPTS4)


def test_the_arguments_and_the_missing_table_are_errors(tmp_path, peaked_llada, llada):
    with pytest.raises(ValueError, match="lambd must be >= 0"):
        samplers.get("pc_sampler", lambd=-0.1)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        samplers.get("pc_sampler", alpha=0)
    with pytest.raises(ValueError, match="weighting must be one of exponential, linear, got 'cosine'"):
        samplers.get("pc_sampler", weighting="cosine")
    with pytest.raises(ValueError, match="lambd must be <= 1"):
        samplers.get("pc_sampler", weighting="linear", lambd=1.5)
    with pytest.raises(ValueError, match="frequencies must be a file path, 'none' or a TokenFrequencies"):
        samplers.get("pc_sampler", frequencies=3)
    with pytest.raises(FileNotFoundError, match="dllm token-frequencies"):
        samplers.get("pc_sampler", frequencies=str(tmp_path / "missing.json"))
    for model in (peaked_llada, llada[0]):
        with pytest.raises(ValueError, match="needs token frequencies and .* ships none.*dllm token-frequencies"):
            dllm.generate(model, None, PROMPTS4[:1], gen_length=8, block_length=8, steps=8, sampler="pc_sampler")
    small = tmp_path / "small.json"
    TokenFrequencies({5: 3, 10_000: 1}, 4).save(small)
    with pytest.raises(ValueError, match="token id 10000, and the model's vocabulary has"):
        dllm.generate(peaked_llada, None, PROMPTS4[:1], gen_length=8, block_length=8, steps=8, sampler="pc_sampler",
                      sampler_kwargs=dict(frequencies=str(small)))


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_joining_rows_decode_as_alone_and_reading_the_device_as_low_confidence(tmp_path, cache):
    from dllm.overhead import count_decode
    from tests.test_join import PROMPTS, run_with_joins

    model = dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)
    path, _ = _table_file(tmp_path, model)
    cfg = dllm.GenerationConfig(sampler="pc_sampler", sampler_kwargs=dict(frequencies=str(path), lambd=0.1),
                                gen_length=16, block_length=8, steps=16, cache=cache)
    joined = run_with_joins(model, cfg)
    for i, prompt in enumerate(PROMPTS):
        alone = dllm.generate(model, None, [prompt], cfg)
        assert joined[i] == (alone.generated[0].tolist(), alone.nfe[0], alone.hit_cap[0]), i
    counts = count_decode(model, PROMPTS[:3], cfg).counts["loop"]
    plain = count_decode(model, PROMPTS[:3], cfg.replace(sampler="low_confidence", sampler_kwargs={})).counts["loop"]
    assert counts.sync_sites == plain.sync_sites
    assert counts.syncs == (1 if cache == "none" else 16 + 1)      # without a cache the widths are planned


def test_one_instance_decodes_two_models_with_their_own_tables(tmp_path, llada_dir):
    """A sampler instance shared by decodes of two checkpoints, stepped in turn, reads each one's
    shipped table, and records no table of either in its arguments."""
    import shutil

    from tests.test_join import fresh, step_in_turn

    models = []
    for seed in (0, 1):
        folder = tmp_path / f"m{seed}"
        shutil.copytree(llada_dir, folder)
        model = dllm.load(folder, dtype="float32")[0]
        counts = random_counts(model.config.vocab_size, seed)
        TokenFrequencies(counts, sum(counts.values())).save(folder / token_frequencies.FILE_NAME)
        models.append(model)
    sampler = samplers.get("pc_sampler", lambd=0.0)
    cfg = dllm.GenerationConfig(sampler=sampler, gen_length=16, block_length=16, steps=16)
    alone = [dllm.generate(model, None, PROMPTS4[:2], cfg).generated.tolist() for model in models]
    assert alone[0] != alone[1]
    decoders = [fresh(model, PROMPTS4[:2], cfg) for model in models]
    step_in_turn(decoders)
    assert [d.state.generated().tolist() for d in decoders] == alone
    assert sampler.arguments()["frequencies"] is None
    assert [sampler.resolved_arguments(d.state)["frequencies"] for d in decoders] == [
        str(tmp_path / f"m{seed}" / token_frequencies.FILE_NAME) for seed in (0, 1)]


def test_tables_without_a_file_are_named_by_their_content():
    def shown(counts, total):
        return samplers.get("pc_sampler", frequencies=TokenFrequencies(counts, total)).arguments()["frequencies"]

    assert shown({1: 2, 5: 3}, 9) == shown({5: 3, 1: 2}, 9) != shown({1: 2, 5: 4}, 9) != shown({1: 2, 5: 3}, 10)
    assert shown({1: 2}, 9).startswith("sha256:")


# -- the tables -------------------------------------------------------------------------------

def test_probabilities_save_and_load(tmp_path):
    table = TokenFrequencies({0: 6, 3: 2}, 10, {"texts": 2})
    assert table.probabilities(5).tolist() == pytest.approx([0.6, 0.1, 0.1, 0.2, 0.1])
    loaded = token_frequencies.load(table.save(tmp_path / "t.json"))
    assert (loaded.counts, loaded.total, loaded.metadata["texts"]) == ({0: 6, 3: 2}, 10, 2)
    assert loaded.metadata["format"] == token_frequencies.FORMAT and loaded.path == str(tmp_path / "t.json")
    written = tmp_path / "counted.json"     # the key the reference's counting script writes
    written.write_text(json.dumps({"num_token": 4, "token_frequency_dict": {"2": 4}}))
    assert token_frequencies.load(written).probabilities(3).tolist() == [0.25, 0.25, 1.0]


@pytest.mark.parametrize("body,match", [
    ("[1, 2]", "must be a JSON object with 'num_token' and 'p_baseline_dict'"),
    ("{not json", "is not JSON"),
    ('{"num_token": 0, "p_baseline_dict": {}}', "num_token must be an integer >= 1, got 0"),
    ('{"num_token": 5, "p_baseline_dict": [1]}', "p_baseline_dict must map token ids to counts"),
    ('{"num_token": 5, "p_baseline_dict": {"a": 1}}', "entry 'a': 1; token ids must be integers >= 0"),
    ('{"num_token": 5, "p_baseline_dict": {"3": -1}}', "entry '3': -1"),
    ('{"num_token": 5, "p_baseline_dict": {"3": 1.5}}', "entry '3': 1.5"),
])
def test_malformed_tables_are_errors_naming_the_file(tmp_path, body, match):
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=match) as err:
        token_frequencies.load(path)
    assert str(path) in str(err.value)


def test_count_and_corpus_files(tmp_path, shipped_float32):
    tok = shipped_float32[1]
    lines = tmp_path / "c.jsonl"
    lines.write_text(json.dumps({"prompt": "Sort the list", "response": "Ann Lee", "id": 3}) + "\n\n"
                     + json.dumps({"prompt": "Copy", "note": "x"}) + "\n")
    assert list(token_frequencies.corpus_texts(lines)) == ["Sort the list Ann Lee", "Copy x"]
    assert list(token_frequencies.corpus_texts(lines, ("prompt", "response"))) == ["Sort the list Ann Lee", "Copy"]
    listed = tmp_path / "c.json"
    listed.write_text(json.dumps([{"text": "a b"}]))
    assert list(token_frequencies.corpus_texts(listed)) == ["a b"]
    plain = tmp_path / "c.txt"
    plain.write_text("one line\n\nanother\n")
    assert list(token_frequencies.corpus_texts(plain)) == ["one line", "another"]
    table = token_frequencies.count(tok, ["Sort the list Ann Lee", "Copy x"])
    ids = tok("Sort the list Ann Lee", add_special_tokens=False)["input_ids"] + tok("Copy x", add_special_tokens=False)["input_ids"]
    assert table.total == len(ids) and table.counts == {i: ids.count(i) for i in set(ids)}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": "x"}\n[1]\n')
    with pytest.raises(ValueError, match="line 2: a record must be a JSON object"):
        list(token_frequencies.corpus_texts(bad))
    bad.write_text('{"a": "x"}\n{oops\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        list(token_frequencies.corpus_texts(bad))
    with pytest.raises(ValueError, match="holds no tokens"):
        token_frequencies.count(tok, ["", ""])
    upper = tmp_path / "C.JSONL"
    upper.write_text(json.dumps({"text": "a b"}) + "\n")
    assert list(token_frequencies.corpus_texts(upper)) == ["a b"]


@pytest.mark.parametrize("name,body,match", [
    ("deep.json", "[" * 200_000, "nests too deep"),
    ("bad.json", "{not json", "is not JSON"),
    ("latin.txt", b"caf\xe9\n", "after line 0 is not UTF-8 text"),
    ("deep.jsonl", "[" * 200_000 + "\n", "line 1 is not JSON"),
])
def test_corpus_files_that_cannot_be_read_are_errors_naming_them(tmp_path, name, body, match):
    path = tmp_path / name
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    with pytest.raises(ValueError, match=match) as err:
        list(token_frequencies.corpus_texts(path))
    assert str(path) in str(err.value)
    if name == "deep.json":
        with pytest.raises(ValueError, match="token frequency file .* nests too deep"):
            token_frequencies.load(path)


def test_the_command_counts_files_and_generated_tasks(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"prompt": "Sort the list", "response": "Ann Lee"}) + "\n")
    out = tmp_path / "f.json"
    assert cli(["token-frequencies", "--data", str(corpus), "--keys", "prompt", "--out", str(out), "--no-progress"]) == 0
    written = token_frequencies.load(out)
    assert written.metadata["keys"] == ["prompt"] and written.metadata["sources"] == [str(corpus)]
    assert written.total == len(dllm.load()[1]("Sort the list", add_special_tokens=False)["input_ids"])
    assert "token frequencies written to" in capsys.readouterr().out
    for bad, match in ((["--tasks", "puzzle/*", "--shard", "1000"], "--shard must lie in 0..999"),
                       (["--tasks", "puzzle/*", "--samples-per-task", "0"], "--samples-per-task must be >= 1"),
                       (["--tasks", "nope"], "nope"),
                       (["--data", str(tmp_path / "missing.jsonl")], "no corpus file")):
        assert cli(["token-frequencies", *bad, "--out", str(out), "--no-progress"]) == 2
        assert match in capsys.readouterr().err


def test_the_shipped_table_is_the_commands_count(tmp_path):
    """The table shipped with the model is reproduced by the command its README gives."""
    shipped_path = token_frequencies.shipped(str(dllm.models.loading.default_model_path()))
    recipe = token_frequencies.load(shipped_path).metadata
    out = tmp_path / "recount.json"
    assert cli(["token-frequencies", "--tasks", ",".join(recipe["tasks"]), "--samples-per-task",
                str(recipe["samples_per_task"]), "--shard", str(recipe["shard"]), "--names", recipe["names"],
                "--out", str(out), "--no-progress"]) == 0
    recount = token_frequencies.load(out)
    assert (recount.counts, recount.total) == (token_frequencies.load(shipped_path).counts,
                                               token_frequencies.load(shipped_path).total)
