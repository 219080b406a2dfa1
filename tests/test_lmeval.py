"""`lm_eval --model dllm` (dllm.lmeval) end to end on the shipped model, offline: a local
generate-until task and a local multiple-choice (loglikelihood) task from local jsonl files, whose
logged answers and log-likelihoods equal `dllm.generate` and the estimator run directly; the
estimator against the exact log-probability where it is exact; data parallel over two processes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import dllm
from dllm.likelihood import dream_mc_loglikelihood, greedy_matches, mc_loglikelihood

pytest.importorskip("lm_eval", reason="lm_eval is not installed (pip install 'dllm[lmeval]')")
from dllm.lmeval import answer_text, cut_at_stops  # noqa: E402

GEN_DOCS = [{"question": "Copy the list: Ann Lee, Bo Chan", "answer": "Ann Lee, Bo Chan"},
            {"question": "Reverse: 1, 2, 3", "answer": "3, 2, 1"},
            {"question": "Sort the names: Zed, Amy", "answer": "Amy, Zed"}]
MC_DOCS = [{"question": "The list has", "choices": ["one name", "two names", "Sudoku"], "label": 1},
           {"question": "A grid of", "choices": ["4 rows", "names"], "label": 0}]
MODEL_ARGS = ("gen_length=16,sampler=threshold,sampler_kwargs=tau=0.8,cache=dual,block_length=8,"
              "mc_num=4,mc_batch_size=2,seed=3")


def _write_tasks(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, docs in (("gen", GEN_DOCS), ("mc", MC_DOCS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))

    def data(name):
        return f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / name}.jsonl\ntest_split: test\n"
    (folder / "gen.yaml").write_text(
        "task: dllm_local_gen\n" + data("gen") + "output_type: generate_until\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\", \"]\"]\n  max_gen_toks: 32\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
    (folder / "mc.yaml").write_text(
        "task: dllm_local_mc\n" + data("mc") + "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
    return folder


def _run_lm_eval(tmp_path: Path, launcher: list[str], out: str) -> tuple[dict[str, list[dict]], str]:
    """lm_eval's logged samples per task ("gen", "mc") and its log."""
    tasks = _write_tasks(tmp_path / "tasks")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [*launcher, "-m", "dllm.lmeval", "--model", "dllm", "--model_args", MODEL_ARGS, "--batch_size", "2",
           "--include_path", str(tasks), "--tasks", "dllm_local_gen,dllm_local_mc", "--device", "cpu",
           "--output_path", str(tmp_path / out), "--log_samples"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = {}
    for path in (tmp_path / out).rglob("samples_*.jsonl"):
        task = "gen" if "dllm_local_gen" in path.name else "mc"
        samples[task] = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda s: s["doc_id"])
    assert set(samples) == {"gen", "mc"}
    return samples, proc.stderr


def _direct_answers(model, tok):
    out = dllm.generate(model, tok, [f"Question: {d['question']}\nAnswer:" for d in GEN_DOCS], gen_length=16,
                        sampler="threshold", sampler_kwargs={"tau": 0.8}, cache="dual", block_length=8, chat=False)
    return [answer_text(tok, "llada", ids, ["\n", "]"]) for ids in out.generated.tolist()]


def _direct_loglikelihood(model, tok, context, continuation):
    whole = tok(context + continuation)["input_ids"]
    prefix = tok(context)["input_ids"]
    return mc_loglikelihood(model, prefix, whole[len(prefix):], mc_num=4, batch_size=2,
                            generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def shipped():
    return dllm.load(dtype="float32")


def test_lm_eval_runs_local_tasks_and_equals_direct_runs(tmp_path, shipped):
    samples, _ = _run_lm_eval(tmp_path, [sys.executable], "out")
    model, tok = shipped
    assert [s["resps"][0][0] for s in samples["gen"]] == _direct_answers(model, tok)
    for s, doc in zip(samples["mc"], MC_DOCS):
        assert len(s["resps"]) == len(doc["choices"])
        for (ll, greedy), choice in zip((r[0] for r in s["resps"]), doc["choices"]):
            assert float(ll) == pytest.approx(_direct_loglikelihood(model, tok, doc["question"], " " + choice), rel=1e-5)
            assert greedy in (False, "False")


def test_lm_eval_data_parallel_equals_one_process(tmp_path):
    """Two processes of one launch (torchrun here, the launcher `accelerate launch --multi_gpu` runs
    on GPUs; both set the environment accelerate reads) split the requests and gather them."""
    one, _ = _run_lm_eval(tmp_path, [sys.executable], "one")
    two, log = _run_lm_eval(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"], "two")
    assert "dllm_local_gen on rank 1" in log and "dllm_local_mc on rank 1" in log
    # lm_eval pads the shorter rank with a copy of its last request, whose answer it logs twice.
    for task in ("gen", "mc"):
        assert [[r[0] for r in s["resps"]] for s in two[task]] == [[r[0] for r in s["resps"]] for s in one[task]]
        assert [s["filtered_resps"] for s in two[task]] == [s["filtered_resps"] for s in one[task]]


def test_estimator_is_exact_for_one_token_and_follows_guidance(shipped):
    model, _ = shipped
    prefix, target = [5, 17, 33, 40], [60]
    x = torch.tensor([prefix + [model.config.mask_token_id]])
    exact = F.log_softmax(model(x).float()[0, -1], dim=-1)[60].item()
    assert mc_loglikelihood(model, prefix, target, mc_num=4, batch_size=2) == pytest.approx(exact, rel=1e-5)
    un = x.clone()
    un[0, :4] = model.config.mask_token_id
    c, u = model(x).float()[0, -1], model(un).float()[0, -1]
    guided = F.log_softmax(u + 1.5 * (c - u), dim=-1)[60].item()
    assert mc_loglikelihood(model, prefix, target, mc_num=2, batch_size=1, cfg_scale=0.5) == pytest.approx(guided, rel=1e-5)


def test_estimator_counts_and_greedy_check(shipped, monkeypatch):
    model, _ = shipped
    prefix, target = [5, 17, 33, 40], [60, 61, 62, 63, 64]
    seen = []
    real = model.forward

    def counting(x, *args, **kwargs):
        seen.append((x == model.config.mask_token_id)[:, 4:].sum(1).tolist())
        return real(x, *args, **kwargs)
    monkeypatch.setattr(model, "forward", counting)
    a = mc_loglikelihood(model, prefix, target, mc_num=8, batch_size=4, generator=torch.Generator().manual_seed(0))
    # Each round: one forward of 4 rows whose mask counts are k, k + 1.25, k + 2.5, k + 3.75 rounded, wrapped into 1..5.
    assert len(seen) == 2 and all(len(c) == 4 and all(1 <= m <= 5 for m in c) for c in seen)
    for counts in seen:
        k = counts[0]
        assert counts == [((round(k + i * 1.25) - 1) % 5) + 1 for i in range(4)]
    b = mc_loglikelihood(model, prefix, target, mc_num=8, batch_size=4, generator=torch.Generator().manual_seed(0))
    assert a == b < 0
    decoded = dllm.generate(model, None, [prefix], gen_length=5, steps=5, sampler="low_confidence", chat=False)
    assert greedy_matches(model, prefix, decoded.generated[0].tolist())
    with pytest.raises(ValueError, match="mc_num must be a positive multiple of batch_size >= 1, got mc_num=6, batch_size=4"):
        mc_loglikelihood(model, prefix, target, mc_num=6, batch_size=4)
    for bad in (-1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=rf"cfg_scale must be a finite number >= 0 \(0: no guidance\), got {bad!r}"):
            mc_loglikelihood(model, prefix, target, mc_num=2, batch_size=1, cfg_scale=bad)
    # An empty prefix scores the target unconditionally.
    x = torch.tensor([[model.config.mask_token_id]])
    alone = F.log_softmax(model(x).float()[0, -1], dim=-1)[60].item()
    assert mc_loglikelihood(model, [], [60], mc_num=2, batch_size=1) == pytest.approx(alone, rel=1e-5)


class _ContextFree(torch.nn.Module):
    """A model whose logits are one fixed vector at every position, whatever the canvas: each
    target token is independent of the rest, so log p(target) is the sum of its tokens'
    log-probabilities, and for a target repeating one token every masked subset's loss, weighted
    by L / m, equals it exactly."""

    def __init__(self, vocab_size=11, mask_token_id=10):
        super().__init__()
        self.config = type("Config", (), dict(vocab_size=vocab_size, mask_token_id=mask_token_id, max_seq_len=64))
        self.logits = torch.linspace(-2.0, 3.0, vocab_size)
        self.device = torch.device("cpu")

    def forward(self, x):
        return self.logits.expand(*x.shape, -1)


def test_estimator_weights_each_row_by_its_mask_count():
    model = _ContextFree()
    exact = F.log_softmax(model.logits, dim=-1)[7].item()
    for length in (2, 3, 5):
        for batch in (1, 2, 3, 4):
            got = mc_loglikelihood(model, [1, 2], [7] * length, mc_num=2 * batch, batch_size=batch,
                                   generator=torch.Generator().manual_seed(length + batch))
            assert got == pytest.approx(length * exact, rel=1e-6), (length, batch)
            guided = mc_loglikelihood(model, [1, 2], [7] * length, mc_num=batch, batch_size=batch, cfg_scale=0.5)
            assert guided == pytest.approx(length * exact, rel=1e-6), (length, batch)   # u = c: guidance keeps c


def test_stop_strings_cut_in_turn(shipped):
    assert cut_at_stops("a, b. c", [".", ","]) == "a" and cut_at_stops("a, b", ["", "x"]) == "a, b"
    assert cut_at_stops("ab", "b") == "a" and cut_at_stops("abc", ["bc", "c"]) == "a"
    # As the references: a later stop is looked for in what the earlier ones left.
    assert cut_at_stops("xabc", ["bc", "ab"]) == "xa" and cut_at_stops("xabc", ["ab", "bc"]) == "x"
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu", gen_length=16)
    context = "Copy the list: Ann Lee, Bo Chan\nAnswer:"
    (whole,) = lm.generate_until([_generation(context)])
    assert whole.find(" Je") > 0
    (cut,) = lm.generate_until([_generation(context, until=["never there", " Je", "e J"])])
    assert cut == whole[:whole.find(" Je")]
    from dllm.lmeval import request_length
    assert request_length({"max_gen_toks": 16.0}) == 16 and request_length({"max_gen_toks": " 12 "}) == 12
    # lm_eval's HF models take the length by four names, the first given winning.
    assert request_length({"max_new_tokens": 8}) == 8 and request_length({"max_tokens": "9"}) == 9
    assert request_length({"max_completion_tokens": 7, "max_tokens": 6}) == 6 == request_length(
        {"max_gen_toks": None, "max_tokens": 6, "max_new_tokens": None})
    assert request_length({"max_gen_toks": 5, "max_new_tokens": 3}) == 5 and request_length({}) == 256
    assert request_length({"max_new_tokens": 8, "max_tokens": 9, "max_completion_tokens": 10}) == 8
    for bad in ("abc", 8.7, True, 0, "\u00b2"):
        with pytest.raises(ValueError, match=rf"a request's max_gen_toks must be a positive integer, got {bad!r}"):
            DLLMEvalModel(dtype="float32", device="cpu").generate_until([_generation("Copy: a", max_gen_toks=bad)])
    with pytest.raises(ValueError, match=r"a request's max_new_tokens must be a positive integer, got -1"):
        request_length({"max_new_tokens": -1})


def test_adapter_guidance_and_greedy_check_equal_the_estimator_run_directly(shipped):
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu", mc_num=2, mc_batch_size=2, seed=3, cfg=0.5,
                       is_check_greedy=True)
    context = "Copy: Ann Lee, Bo Chan\nAnswer:"
    prefix = lm.tokenizer(context)["input_ids"]
    first = dllm.generate(lm.model, None, [prefix], gen_length=1, steps=1, sampler="low_confidence", chat=False,
                          cfg_scale=0.5).generated[0].tolist()
    pairs = [(context, lm.tokenizer.decode(first)), (context, " Bo Chan")]
    got = lm.loglikelihood([_request(*pair) for pair in pairs])
    for (ctx, continuation), (ll, greedy) in zip(pairs, got):
        p, t = lm.encode_pair(ctx, continuation)
        assert ll == mc_loglikelihood(lm.model, p, t, mc_num=2, batch_size=2, cfg_scale=0.5,
                                      generator=torch.Generator().manual_seed(3))
        assert greedy is greedy_matches(lm.model, p, t, cfg_scale=0.5)
    assert lm.encode_pair(*pairs[0])[1] == first and got[0][1] is True and got[1][1] is False
    # With chat the context is the user turn of the template, for log-likelihoods as for generations.
    chat = DLLMEvalModel(dtype="float32", device="cpu", mc_num=2, mc_batch_size=2, chat=True)
    prompt = chat._fit_context("Copy: Ann", 8)
    assert prompt != lm.tokenizer("Copy: Ann")["input_ids"]
    assert chat.encode_pair("Copy: Ann", " Ann") == (prompt, lm.tokenizer(" Ann", add_special_tokens=False)["input_ids"])


def test_estimator_takes_tensors_as_the_reference_and_names_bad_ids(shipped):
    model, _ = shipped
    prefix, target = [5, 17, 33, 40], [60, 61]
    want = mc_loglikelihood(model, prefix, target, mc_num=2, batch_size=2, generator=torch.Generator().manual_seed(1))
    got = mc_loglikelihood(model, torch.tensor(prefix), torch.tensor(target), mc_num=2, batch_size=2,
                           generator=torch.Generator().manual_seed(1))
    assert got == want
    assert greedy_matches(model, torch.tensor(prefix), torch.tensor([60])) == greedy_matches(model, prefix, [60])
    vocab = model.config.vocab_size
    for bad, message in ((([1], [vocab]), rf"target holds token id\(s\) \[{vocab}\] outside the vocabulary "
                                          rf"\(0 .. {vocab - 1}\)"),
                         (([-3], [5]), r"prefix holds token id\(s\) \[-3\]"),
                         (([1], torch.ones(1, 2, dtype=torch.long)), r"target must be a 1-D integer tensor"),
                         (([1], [5.0]), r"target must be a list of token ids")):
        with pytest.raises(ValueError, match=message):
            mc_loglikelihood(model, *bad, mc_num=1, batch_size=1)
    mask = model.config.mask_token_id
    for bad, name, at in ((([5, mask], [6]), "prefix", 1), (([5], [6, 7, mask]), "target", 2)):
        for estimate in (mc_loglikelihood, dream_mc_loglikelihood):
            with pytest.raises(ValueError, match=rf"{name} contains the mask token id {mask} at position {at}; "):
                estimate(model, *bad, mc_num=1, batch_size=1)
        with pytest.raises(ValueError, match=rf"{name} contains the mask token id {mask}"):
            greedy_matches(model, *bad)
    with pytest.raises(ValueError, match=r"generator must be a torch.Generator or None, got 0 \(int\)"):
        mc_loglikelihood(model, [5], [6], mc_num=1, batch_size=1, generator=0)
    import numpy as np
    assert mc_loglikelihood(model, [np.int64(5), 17, 33, 40], target, mc_num=2, batch_size=2,
                            generator=torch.Generator().manual_seed(1)) == want


def _request(context, continuation):
    from lm_eval.api.instance import Instance
    return Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)


def test_pairs_condition_on_the_context_encoded_alone(shipped):
    """As LLaDA's evaluation and lm_eval's HF models: the prefix is the context's own encoding and
    the continuation the joint encoding after it (an empty context the encoding of "", as in the
    reference); an empty continuation scores 0 and matches greedily."""
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu", mc_num=2, mc_batch_size=2, seed=3)
    tok = lm.tokenizer
    for context, continuation, kept in (("Sudo", "ku", "Sudo"), ("The list has", " two names", "The list has"),
                                        ("Q: ", "yes", "Q:")):          # trailing spaces go to the continuation
        prefix, target = lm.encode_pair(context, continuation)
        assert prefix == tok(kept)["input_ids"]
        assert target == tok(context + continuation)["input_ids"][len(prefix):]
    assert tok("")["input_ids"] == []
    assert lm.encode_pair("", "Sudoku") == ([], tok("Sudoku")["input_ids"])
    assert lm.encode_pair(" \n", "Sudoku") == ([], tok(" \nSudoku")["input_ids"])
    # A continuation the joint encoding merges into the context's last token is encoded alone.
    merged = tok("Answer: th")["input_ids"]
    assert tok("Answer: the")["input_ids"][len(merged):] == []
    assert lm.encode_pair("Answer: th", "e") == (merged, tok("e", add_special_tokens=False)["input_ids"])
    (empty_target, empty_context, merged_target) = lm.loglikelihood(
        [_request("Q:", ""), _request("", "Sudoku"), _request("Answer: th", "e")])
    assert empty_target == (0.0, True) and merged_target[0] < 0
    assert empty_context[0] == mc_loglikelihood(lm.model, [], tok("Sudoku")["input_ids"], mc_num=2, batch_size=2,
                                                generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("args,message", [
    ({"batch_size": "auto"}, "batch_size must be an integer >= 1 (dllm has no 'auto'), got 'auto'"),
    ({"batch_size": "\u00b2"}, "batch_size must be an integer >= 1 (dllm has no 'auto'), got '\u00b2'"),
    ({"mc_num": 100}, "mc_num must be a positive multiple of mc_batch_size >= 1, got mc_num=100, mc_batch_size=32"),
    ({"mc_num": 4.7, "mc_batch_size": 2}, "got mc_num=4.7"),
    ({"cfg": float("nan")}, "cfg must be a finite number >= 0"),
    ({"sampler": "bogus"}, "unknown sampler 'bogus'"),
    ({"mc_num": 128.5}, "got mc_num=128.5"),
    ({"seed": None}, "seed must be an integer, got None"),
    ({"is_check_greedy": "no"}, "is_check_greedy must be true or false (or 1 / 0), got 'no'"),
])
def test_model_arguments_are_checked_before_the_model_loads(args, message):
    from dllm.lmeval import DLLMEvalModel

    with pytest.raises(ValueError) as err:
        DLLMEvalModel(pretrained="/no/such/checkpoint", device="cpu", **args)
    assert message in str(err.value)


def test_a_context_longer_than_the_model_loses_its_oldest_tokens(shipped):
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu", mc_num=2, mc_batch_size=2, seed=3)
    assert lm.device == lm.model.device
    if not torch.cuda.is_available():     # lm_eval's default device names CUDA even where there is none
        assert DLLMEvalModel(dtype="float32", device="cuda:0").model.device == torch.device("cpu")
    longest = lm.model.config.max_seq_len
    context = "a b " * longest
    prefix, target = lm.encode_pair(context, " Sudoku")
    assert len(prefix) + len(target) > longest
    with pytest.raises(ValueError, match=rf"exceeds the model's maximum sequence length {longest}"):
        mc_loglikelihood(lm.model, prefix, target, mc_num=2, batch_size=2)
    (got,) = lm.loglikelihood([_request(context, " Sudoku")])
    kept = prefix[len(prefix) + len(target) - longest:]
    assert got[0] == mc_loglikelihood(lm.model, kept, target, mc_num=2, batch_size=2,
                                      generator=torch.Generator().manual_seed(3))
    # A continuation longer than the window keeps its last tokens, without a context.
    from dllm.lmeval import fit_window
    assert fit_window([1, 2], [3, 4, 5, 6], 3) == ([], [4, 5, 6]) and fit_window([1, 2], [3], 2) == ([2], [3])
    (long_target,) = lm.loglikelihood([_request("Q:", " a b" * longest)])
    assert long_target[0] < 0


def _generation(context, **gen_kwargs):
    from lm_eval.api.instance import Instance
    return Instance(request_type="generate_until", doc={}, arguments=(context, {"until": [], **gen_kwargs}), idx=0)


def test_sampled_repeats_differ_and_requests_set_their_temperature(shipped, monkeypatch):
    """Each batch draws with the next seed of the stream started at `seed` (a task's repeats are
    separate samples); the request's do_sample / temperature apply unless the model argument sets one."""
    from dllm.lmeval import DLLMEvalModel, request_temperature

    assert [request_temperature(k) for k in ({}, {"do_sample": False, "temperature": 0.7}, {"temperature": 0.7},
                                             {"do_sample": True}, {"temperature": "0.5"})] == [0.0, 0.0, 0.7, 1.0, 0.5]
    for bad in (-1.0, "warm", float("nan"), True):
        with pytest.raises(ValueError, match=r"a request's temperature must be a finite number >= 0, got"):
            request_temperature({"temperature": bad})
    lm = DLLMEvalModel(dtype="float32", device="cpu", seed=5, gen_length=8)
    seen = []
    real = dllm.generate

    def recording(model, tok, prompts, config):
        seen.append((len(prompts), config.seed, config.temperature))
        return real(model, tok, prompts, config=config)
    monkeypatch.setattr(dllm, "generate", recording)
    sampled = lm.generate_until([_generation("Copy: a b c", do_sample=True, temperature=1.0)] * 3)
    assert seen == [(1, 5, 1.0), (1, 6, 1.0), (1, 7, 1.0)] and len(set(sampled)) > 1
    seen.clear()
    lm.generate_until([_generation("Copy: a b c", do_sample=False), _generation("Copy: a b c")])
    assert seen == [(1, 8, 0.0), (1, 9, 0.0)]
    seen.clear()
    fixed = DLLMEvalModel(dtype="float32", device="cpu", gen_length=8, temperature=0.5)
    fixed.generate_until([_generation("Copy: a b c", do_sample=False)])
    assert seen == [(1, 0, 0.5)]                                   # the model argument wins


def test_generation_cuts_a_long_context_and_names_a_length_that_does_not_fit(shipped):
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu")
    longest = lm.model.config.max_seq_len
    context = "a b " * longest
    (answer,) = lm.generate_until([_generation(context, max_gen_toks=16)])
    ids = lm.tokenizer(context)["input_ids"][-(longest - 16):]
    want = dllm.generate(lm.model, lm.tokenizer, [ids], config=lm.config.replace(gen_length=16, seed=0))
    assert answer == want.texts[0]
    blocks = DLLMEvalModel(dtype="float32", device="cpu", block_length=8)
    with pytest.raises(ValueError, match=r"a request's length 20 \(temperature 0.0\) does not fit the model "
                                         r"arguments: .*multiple of block_length 8; give gen_length"):
        blocks.generate_until([_generation("Copy: a", max_gen_toks=16), _generation("Copy: b", max_gen_toks=20)])
    assert blocks.batches == 0                                      # refused before any decode
    with pytest.raises(ValueError, match=rf"a request's length {longest} leaves no room for a context"):
        lm.generate_until([_generation("Copy: a", max_gen_toks=longest)])
    with pytest.raises(ValueError, match="gen_length 20 must be a multiple of block_length 8"):
        DLLMEvalModel(dtype="float32", device="cpu", gen_length=20, block_length=8)   # once the model is loaded


def test_numbers_lm_eval_reads_from_its_arguments_are_taken():
    """lm_eval's argument parser turns chat=1 and mc_num=128.0 into numbers."""
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel.create_from_arg_string("chat=1,mc_num=64.0,mc_batch_size=32", {"device": "cpu"})
    assert lm.config.chat is True and lm.mc_num == 64 and isinstance(lm.mc_num, int)


def test_stop_strings_and_unread_generation_kwargs(shipped, recwarn):
    """`until` must be a string or a list of strings; kwargs the model does not read (top_p, ...)
    are named in one warning each, not dropped in silence."""
    from dllm.lmeval import DLLMEvalModel, request_stops

    assert request_stops({"until": "\n"}) == ("\n",) and request_stops({}) == () == request_stops({"until": None})
    for bad in (5, ["a", 3], {"a": 1}):
        with pytest.raises(ValueError, match=re.escape(f"a request's until must be a string or a list of strings, "
                                                       f"got {bad!r}")):
            request_stops({"until": bad})
    lm = DLLMEvalModel(dtype="float32", device="cpu", gen_length=8)
    lm.generate_until([_generation("Copy: a", top_p=0.95, top_k=1, max_gen_toks=8)] * 2)
    messages = [str(w.message) for w in recwarn if "generation kwargs" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("dllm does not use the generation kwargs top_k, top_p (")
    lm.generate_until([_generation("Copy: a", top_p=0.5, bogus=3)])
    messages = [str(w.message) for w in recwarn if "generation kwargs" in str(w.message)]
    assert len(messages) == 2 and messages[1].startswith("dllm does not use the generation kwargs bogus (")
    read = dict(until=["\n"], temperature=0.0, do_sample=False, max_gen_toks=8, max_new_tokens=8, max_tokens=8,
                max_completion_tokens=8)
    DLLMEvalModel(dtype="float32", device="cpu", gen_length=8).generate_until([_generation("Copy: a", **read)])
    assert len([w for w in recwarn if "generation kwargs" in str(w.message)]) == 2     # none of these


def record_seeds(monkeypatch) -> list:
    """The seed of every `dllm.generate` call from now on, in order (the calls still decode)."""
    seen = []
    real = dllm.generate

    def recording(model, tok, prompts, config):
        seen.append(config.seed)
        return real(model, tok, prompts, config=config)
    monkeypatch.setattr(dllm, "generate", recording)
    return seen


def test_chat_must_be_a_flag_and_batch_seeds_wrap_at_two_to_the_64(shipped, monkeypatch):
    """chat=None would render generations with the template and log-likelihood contexts without
    it; a seed stream started at -1 or past 2**63 keeps its 64 bits (CUDA generators read them)."""
    from dllm.lmeval import DLLMEvalModel

    with pytest.raises(ValueError, match="chat must be true or false \\(or 1 / 0\\), got None"):
        DLLMEvalModel(pretrained="/no/such/checkpoint", device="cpu", chat=None)
    seen = record_seeds(monkeypatch)
    for seed, want in ((-1, [2 ** 64 - 1, 0]), (2 ** 63 + 7, [2 ** 63 + 7, 2 ** 63 + 8])):
        seen.clear()
        DLLMEvalModel(dtype="float32", device="cpu", gen_length=8, seed=seed).generate_until(
            [_generation("Copy: a"), _generation("Copy: b", until=["x"])])
        assert seen == want


class _MaskFavouring(torch.nn.Module):
    """A toy model: the last column is sure of token 9, the others lean to 9; the first masked
    column favours the mask token (then token 7), for good or (`while_last_masked`) only while the
    last column is masked."""

    def __init__(self, mask: int, while_last_masked: bool, vocab: int = 16):
        super().__init__()
        from types import SimpleNamespace
        self.config = SimpleNamespace(mask_token_id=mask, vocab_size=vocab, max_seq_len=64)
        self.device = torch.device("cpu")
        self.mask, self.vocab, self.while_last_masked = mask, vocab, while_last_masked

    def forward(self, x):
        logits = torch.zeros(*x.shape, self.vocab)
        logits[..., 9] = 2.0
        logits[:, -1, 9] = 10.0
        rows = torch.arange(x.shape[0])
        first = (x == self.mask).int().argmax(1)
        logits[rows, first, 7] = 5.0
        favour = (x[:, -1] == self.mask) | (not self.while_last_masked)
        logits[rows, first, self.mask] = torch.where(favour, 6.0, 0.0)
        return logits


def _reference_greedy(model, prefix, target):
    """LLaDA's `suffix_greedy_prediction` restated: L steps; every masked column's argmax over the
    whole vocabulary and its softmax probability; only the most confident column keeps its token."""
    mask = model.config.mask_token_id
    seq = torch.tensor([list(prefix) + [mask] * len(target)])
    for _ in range(len(target)):
        masked = seq == mask
        logits = model(seq)[masked]
        x0 = logits.argmax(-1)
        confidence = torch.softmax(logits.float(), -1).gather(-1, x0[:, None])[:, 0]
        order = torch.sort(confidence, descending=True).indices
        x0[order[1:]] = mask
        seq[masked] = x0
    return seq[0, len(prefix):].tolist() == list(target)


def test_greedy_check_is_the_references_with_the_mask_token_a_candidate():
    """As the reference: a column whose argmax is the mask token stays masked when it is the most
    confident one (for good, here: False for every target), and is decoded once it is not."""
    targets = ([7, 9, 9], [9, 9, 9], [9, 7, 9], [7, 7, 9], [9, 9, 7])
    for while_last_masked, matching in ((False, []), (True, [[7, 7, 9]])):
        model = _MaskFavouring(mask=15, while_last_masked=while_last_masked)
        got = [t for t in targets if greedy_matches(model, [3, 4], t)]
        assert got == [t for t in targets if _reference_greedy(model, [3, 4], t)] == matching


def test_processes_draw_batches_with_seeds_no_other_process_uses(shipped, monkeypatch):
    """Batch k of process r of w draws with seed + k w + r: two processes' batches never share a
    seed (process 1's first batch drew seed, as process 0's first)."""
    from dllm.lmeval import DLLMEvalModel

    seen = record_seeds(monkeypatch)
    lm = DLLMEvalModel(dtype="float32", device="cpu", gen_length=8, seed=5)
    lm._rank, lm._world_size = 1, 2
    lm.generate_until([_generation("Copy: a"), _generation("Copy: b", until=["x"])])
    assert seen == [6, 8]


def test_settings_are_checked_with_the_tokenizer_generate_gets(shipped):
    """AdaBlock reads its default delimiter's id from the tokenizer: the model arguments and each
    request's settings are checked with it, as `dllm.generate` decodes with it."""
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu", gen_length=32, sampler="adablock")
    assert lm.config.gen_length == 32
    (answer,) = DLLMEvalModel(dtype="float32", device="cpu", sampler="adablock").generate_until(
        [_generation("Copy: a", max_gen_toks=32)])
    assert isinstance(answer, str)


def test_answers_are_read_as_each_familys_evaluation_reads_them(shipped, dream):
    """LLaDA's evaluation keeps the text after a special token (it cuts at the stops, then drops
    special tokens); Dream's keeps the text before the first EOS string, special tokens included."""
    _, tok = shipped
    eos = tok.eos_token_id
    ids = tok("The answer is 4.")["input_ids"] + [eos] + tok(" Question: next")["input_ids"] + [eos] * 3
    assert answer_text(tok, "llada", ids, []) == "The answer is 4. Question: next"
    assert answer_text(tok, "llada", ids, ["Question:", "next"]) == "The answer is 4. "
    _, dream_tok = dream
    end_of_turn = dream_tok.convert_tokens_to_ids("<|im_end|>")
    ids = dream_tok("The answer is 4.")["input_ids"] + [end_of_turn] + dream_tok(" More")["input_ids"]
    ids += [dream_tok.eos_token_id] + dream_tok(" after")["input_ids"]
    assert answer_text(dream_tok, "dream", ids, []) == "The answer is 4.<|im_end|> More"
    assert answer_text(dream_tok, "dream", ids, ["<|im_end|>"]) == "The answer is 4."


def test_chat_template_continues_a_final_assistant_message(shipped):
    """As lm_eval's HF models: without the generation prompt the last (assistant) message is
    continued, not closed."""
    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu")
    history = [{"role": "user", "content": "Q: 2+2?"}, {"role": "assistant", "content": "The answer is"}]
    assert lm.apply_chat_template(history, add_generation_prompt=False).endswith("\n\nThe answer is")
    opened = lm.apply_chat_template(history[:1])
    assert opened == lm.tokenizer.apply_chat_template(history[:1], tokenize=False, add_generation_prompt=True)


def _dream_reference_nll(model, prefix, target, mc_num, batch_size, generator, eps=1e-3):
    """Dream's evaluation loop (nll_type mc, log_type ftb) restated, drawing from `generator`."""
    seq = torch.tensor(prefix + target)[None].repeat(batch_size, 1)
    mask_id, losses = model.config.mask_token_id, []
    for _ in range(max(mc_num // batch_size, 1)):
        u0 = torch.rand(1, generator=generator, dtype=torch.float32)
        t = (u0 + torch.arange(batch_size).float() / batch_size) % 1
        p_mask = ((1 - eps) * t + eps)[:, None].repeat(1, seq.shape[1])
        mask_indices = torch.rand(seq.shape, generator=generator) < p_mask
        mask_indices[:, 0] = False
        mask_indices[:, -1] = False
        perturbed = seq.clone()
        perturbed[:, -len(target):] = torch.where(mask_indices, mask_id, seq)[:, -len(target):]
        masked = perturbed == mask_id
        logits = model(perturbed).float()
        loss = F.cross_entropy(logits[masked], seq[masked], reduction="none") / p_mask[masked]
        losses.append(loss.sum().item() / batch_size)
    return sum(losses) / len(losses)


def test_dream_log_likelihoods_follow_dreams_evaluation(dream_dir, dream, monkeypatch):
    """Dream's pairs end with the EOS its evaluation appends, scored by its own estimator (the
    restated loop above); the first and last columns are never masked."""
    from dllm.lmeval import DLLMEvalModel

    model, tok = dream
    for prefix, target in (([5, 17, 33], [60, 61, 62, 63, 64, tok.eos_token_id]), ([], [70, 71, 72, 73])):
        got = dream_mc_loglikelihood(model, prefix, target, mc_num=6, batch_size=3,
                                     generator=torch.Generator().manual_seed(2))
        want = _dream_reference_nll(model, prefix, target, 6, 3, torch.Generator().manual_seed(2))
        assert got == pytest.approx(-want, rel=1e-6) and got < 0
    assert dream_mc_loglikelihood(model, [], [70, 71], mc_num=2, batch_size=2) == 0.0      # nothing to mask
    with pytest.raises(ValueError, match=r"sampling_eps must be a number in \[0, 1\), got 1"):
        dream_mc_loglikelihood(model, [5], [6], mc_num=1, batch_size=1, sampling_eps=1)
    lm = DLLMEvalModel(pretrained=str(dream_dir), dtype="float32", device="cpu", mc_num=4, mc_batch_size=2, seed=3,
                       is_check_greedy=True)
    context, continuation = "The cat", " sat"
    prefix, target = lm.encode_pair(context, continuation)
    assert target == tok(context + continuation)["input_ids"][len(prefix):]
    ((ll, greedy),) = lm.loglikelihood([_request(context, continuation)])
    assert ll == dream_mc_loglikelihood(model, prefix, target + [tok.eos_token_id], mc_num=4, batch_size=2,
                                        generator=torch.Generator().manual_seed(3))
    assert greedy is greedy_matches(model, prefix, target)
    checked = []                                    # the greedy check reads the continuation without the EOS
    monkeypatch.setattr(dllm.lmeval, "greedy_matches", lambda m, p, t, **k: checked.append(list(t)) or True)
    assert lm.loglikelihood([_request(context, continuation)])[0][1] is True and checked == [target]


def test_chat_contexts_are_rendered_once_and_decoded_as_rendered(shipped):
    """With `chat` the adapter renders each context itself and hands `generate` token ids, which it
    decodes as given (no warning that chat=True does not apply to them)."""
    import warnings

    from dllm.lmeval import DLLMEvalModel

    lm = DLLMEvalModel(dtype="float32", device="cpu", gen_length=8, chat=True, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (answer,) = lm.generate_until([_generation("Copy: Ann Lee")])
    out = dllm.generate(lm.model, lm.tokenizer, [lm._fit_context("Copy: Ann Lee", 8)], gen_length=8, seed=0)
    assert answer == answer_text(lm.tokenizer, "llada", out.generated[0].tolist(), [])


def test_estimators_make_only_the_scored_logits_float32(shipped, monkeypatch):
    """The (B, N, V) logits stay in the model's dtype: only the scored positions' rows are converted."""
    model, _ = shipped
    shapes, to_float = [], torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t, *a, **k: shapes.append(tuple(t.shape)) or to_float(t, *a, **k))
    mc_loglikelihood(model, [5, 17, 33], [60, 61, 62], mc_num=2, batch_size=2, cfg_scale=0.5)
    dream_mc_loglikelihood(model, [5, 17, 33], [60, 61, 62], mc_num=2, batch_size=2)
    greedy_matches(model, [5, 17, 33], [60, 61])
    vocab = model.config.vocab_size
    assert shapes and all(len(shape) == 2 and shape[1] == vocab for shape in shapes if shape[-1] == vocab)
