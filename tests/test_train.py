"""Masked-diffusion training: the objective, the saved LLaDA layout, resume after interruption."""
import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import dllm
from dllm import train as T
from tests.fixtures.scripts import load_benchmark

TINY = dict(tasks="waiting_line/copy,puzzle/sudoku_n4_12", samples_per_task=40, vocab_size=700, d_model=32,
            n_layers=2, n_heads=2, mlp_hidden=64, steps=7, copy_warmup_steps=2, pair_warmup_steps=1, batch_size=4, warmup=2, save_every=3,
            threads=1, compile=False, then_steps=0, precision="fp32")


class _Uniform(torch.nn.Module):
    """Uniform logits; remembers the noisy canvas it was given."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab
        self.seen = None

    def forward(self, x, logits_at, position_ids=None, key_valid=None):
        self.seen = x.clone()
        return torch.zeros(*logits_at.shape, self.vocab, requires_grad=True)


def test_loss_masks_only_the_response_and_is_unbiased():
    items = [T.Encoded("t", [5, 6, 7][: 1 + b % 3], [8 + b % 4] * 10) for b in range(4000)]
    x, valid, pos, cols = T.make_batch(items, pad_id=0)
    fake = _Uniform(50)
    loss = T.diffusion_loss(fake, x, valid, pos, cols, mask_id=49, eps=1e-3, generator=torch.Generator().manual_seed(0))
    noisy = fake.seen
    lp = x.shape[1] - 10
    assert torch.equal(noisy[:, :lp], x[:, :lp])                       # the prompt is never masked
    resp = noisy[:, lp:]
    assert ((resp == 49) | (resp == x[:, lp:])).all() and (resp == 49).any()
    # E[#masked / t] / G = 1, so uniform logits give log V on average.
    assert loss.item() == pytest.approx(math.log(50), rel=0.05)
    # Positions recount from each row's first real token.
    assert pos[0, lp - 1] == 0 and pos[0, lp] == 1


class _FixedLogits(torch.nn.Module):
    """Logits (or, for `head=`, states) drawn once per (row, canvas column) from a seed."""

    def __init__(self, shape, vocab):
        super().__init__()
        self.table = torch.randn(*shape, vocab, generator=torch.Generator().manual_seed(3)) * 3
        self.seen = None

    def forward(self, x, logits_at, position_ids=None, key_valid=None):
        self.seen = x.clone()
        return self.table.gather(1, logits_at[..., None].expand(*logits_at.shape, self.table.shape[-1]))


def test_mask_distances_match_a_brute_force_count():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.rand(50, 17, generator=gen) < torch.rand(50, 1, generator=gen)
    hidden[0] = True                                                   # a row with nothing shown
    got = T.mask_distances(hidden)
    for b in range(50):
        shown = [j for j in range(17) if not hidden[b, j]]
        for j in range(17):
            want = min((abs(j - k) for k in shown), default=18)
            assert got[b, j] == want, (b, j)


def test_distance_smoothing_smooths_targets_by_the_distance_to_shown_tokens():
    """Against a direct statement: each masked token's loss is the cross-entropy of the smoothed
    target (1 - e) onehot + e / V with e = 1 - (1 - s)^(d - 1), d its distance to the nearest
    shown column; the head path gives the same loss; s = 0 is plain cross-entropy."""
    V = 23
    items = [T.Encoded("t", [5, 6, 7, 3][: 1 + b % 4], [(8 + 3 * b + j) % 20 for j in range(11)]) for b in range(64)]
    x, valid, pos, cols = T.make_batch(items, pad_id=0)
    model = _FixedLogits(x.shape, V)
    losses = {}
    for s, head in ((0.0, None), (0.3, None), (0.3, lambda h: h)):
        losses[s, head is None] = T.diffusion_loss(model, x, valid, pos, cols, mask_id=22, eps=1e-3,
                                                   generator=torch.Generator().manual_seed(1), loss="masked-mean",
                                                   head=head, distance_smoothing=s).item()
    noisy = model.seen
    want = {0.0: [], 0.3: []}
    for b in range(len(items)):
        row = [j for j in range(x.shape[1]) if valid[b, j]]
        shown = [j for j in row if noisy[b, j] != 22]
        for j in cols[b].tolist():
            if noisy[b, j] != 22:
                continue
            logp = torch.log_softmax(model.table[b, j], -1)
            d = min(abs(j - k) for k in shown)
            for s in want:
                e = 1 - (1 - s) ** (d - 1)
                want[s].append(-((1 - e) * logp[x[b, j]] + e * logp.mean()).item())
    assert losses[0.0, True] == pytest.approx(sum(want[0.0]) / len(want[0.0]), rel=1e-5)
    assert losses[0.3, True] == pytest.approx(sum(want[0.3]) / len(want[0.3]), rel=1e-5)
    assert losses[0.3, False] == pytest.approx(losses[0.3, True], rel=1e-5)
    assert losses[0.3, True] != pytest.approx(losses[0.0, True], rel=1e-3)
    with pytest.raises(ValueError, match="distance_smoothing must be in \\[0, 1\\), got 1.0"):
        T.TrainConfig(distance_smoothing=1.0)


def test_auto_precision_is_bf16_only_on_a_cpu_with_bf16_matrix_units(monkeypatch):
    for amx, avx512_bf16, want in ((True, False, "bf16"), (False, True, "bf16"), (False, False, "fp32")):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        assert T.cpu_has_bf16_units() is (want == "bf16")
        assert T.step_precision("auto") == want
        assert T.step_precision("fp32") == "fp32" and T.step_precision("bf16") == "bf16"
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert T.step_precision("auto") == "fp32"
    with pytest.raises(ValueError, match="precision 'half' is not one of auto, bf16, fp32"):
        T.step_precision("half")


def test_a_resumed_auto_precision_run_keeps_the_precision_its_steps_ran_in(tmp_path, monkeypatch):
    units = {"bf16": True}
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: units["bf16"])
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: units["bf16"])
    cfg = T.TrainConfig(out=str(tmp_path / "auto"), **{**TINY, "precision": "auto"})
    assert T.train(cfg, progress=False, stop_after=1) is None
    assert torch.load(tmp_path / "auto" / "checkpoint.pt", weights_only=False)["precision"] == "bf16"
    units["bf16"] = False                                   # resumed on a CPU without bf16 units
    T.train(cfg, progress=False)
    assert json.loads((tmp_path / "auto" / "train_info.json").read_text())["precision"] == "bf16"
    assert torch.load(tmp_path / "auto" / "checkpoint.pt", weights_only=False)["precision"] == "bf16"


def test_llada_loss_weights_a_fixed_mask_by_its_share_of_the_response():
    """A row given a fixed mask of m of G columns stands for t = m / G, whatever t was drawn: with
    uniform logits its loss is log V for every seed."""
    items = [T.Encoded("t", [5, 6], [8] * 20) for _ in range(3)]
    x, valid, pos, cols = T.make_batch(items, pad_id=0)
    fixed = torch.zeros(3, 20, dtype=torch.bool)
    fixed[:, :10] = True
    fixed[2, :15] = True
    rows = torch.tensor([[True], [True], [True]])
    for seed in range(20):
        loss = T.diffusion_loss(_Uniform(50), x, valid, pos, cols, mask_id=49, eps=1e-3, loss="llada",
                                generator=torch.Generator().manual_seed(seed), fixed=fixed, fixed_rows=rows)
        assert loss.item() == pytest.approx(math.log(50), rel=1e-5)
    # The prompt's example columns keep the t they were masked at: E of them add E / G log V on average.
    items = [T.Encoded("t", [1, 2, 3, 4, 5, 6], [8] * 20, ((1, 3),)) for _ in range(4000)]
    x, valid, pos, cols = T.make_batch(items, pad_id=0)
    ex_cols, ex_ok = T.example_columns(items, x.shape[1])
    fixed = torch.zeros(4000, 20, dtype=torch.bool)
    fixed[:, :5] = True
    loss = T.diffusion_loss(_Uniform(50), x, valid, pos, cols, mask_id=49, eps=1e-3, loss="llada",
                            generator=torch.Generator().manual_seed(0), fixed=fixed,
                            fixed_rows=torch.ones(4000, 1, dtype=torch.bool), extra_cols=ex_cols, extra_ok=ex_ok)
    assert loss.item() == pytest.approx(math.log(50) * (1 + 2 / 20), rel=0.02)


def test_masked_mean_loss_draws_t_as_a_power_of_u():
    items = [T.Encoded("t", [5, 6, 7][: 1 + b % 3], [8 + b % 4] * 10) for b in range(4000)]
    x, valid, pos, cols = T.make_batch(items, pad_id=0)
    fake = _Uniform(50)
    loss = T.diffusion_loss(fake, x, valid, pos, cols, mask_id=49, eps=1e-3,
                            generator=torch.Generator().manual_seed(0), loss="masked-mean", t_power=2.0)
    assert loss.item() == pytest.approx(math.log(50), rel=1e-5)         # the mean CE over masked tokens
    lp = x.shape[1] - 10
    assert torch.equal(fake.seen[:, :lp], x[:, :lp])
    frac = (fake.seen[:, lp:] == 49).float().mean().item()
    assert frac == pytest.approx(1 / 3, abs=0.02)                        # E[u^2] = 1/3
    with pytest.raises(ValueError, match="loss 'elbo'"):
        T.diffusion_loss(fake, x, valid, pos, cols, mask_id=49, eps=1e-3, generator=torch.Generator(), loss="elbo")


def test_end_weights_count_the_end_token_and_its_neighbours_that_many_times():
    target = torch.tensor([[5, 6, 9, 7, 7], [9, 7, 7, 7, 7], [5, 6, 5, 6, 5]])
    w = T.end_weights(target, end_id=9, end_weight=4.0)
    assert w.tolist() == [[1, 4, 4, 4, 1], [4, 4, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert T.end_weights(target, 9, 1.0) is None and T.end_weights(target, None, 4.0) is None
    # the masked-mean loss is the weighted mean CE: with uniform logits it stays log V, and a
    # model that is wrong only on the end token loses end_weight times as much there
    items = [T.Encoded("t", [5, 6], [3, 4, 9, 7, 7, 7])] * 64
    x, valid, pos, cols = T.make_batch(items, pad_id=0)

    class _RightButEnd(torch.nn.Module):
        def forward(self, noisy, logits_at, position_ids=None, key_valid=None):
            good = torch.nn.functional.one_hot(x.gather(1, logits_at), 12).float() * 20
            good[..., 2, :] = 0                                           # uniform on the end column
            return good.requires_grad_()

    losses = [T.diffusion_loss(_RightButEnd(), x, valid, pos, cols, mask_id=11, eps=1.0,
                               generator=torch.Generator().manual_seed(0), loss="masked-mean", end_id=9,
                               end_weight=weight).item() for weight in (1.0, 5.0)]
    # every token masked (t = 1): the end column's CE is log 12, the others ~0
    assert losses[0] == pytest.approx(math.log(12) / 6, rel=1e-3)
    assert losses[1] == pytest.approx(5 * math.log(12) / (3 * 5 + 3), rel=1e-3)


def test_encode_records_lays_answers_on_the_canvas_asked_for():
    cfg = T.TrainConfig(**{**TINY, "samples_per_task": 5})
    records = {"waiting_line/copy": T.training_records(cfg)["waiting_line/copy"]}
    tok = T.build_tokenizer(T.tokenizer_texts(records, "lists"), 700)
    for canvas, length in ((0, 32), (48, 48)):
        enc, dropped = T.encode_records(tok, records, canvas)
        assert {len(e.response) for e in enc} == {length} and not dropped
    need = sorted(len(tok(T.answer_text(r), add_special_tokens=False)["input_ids"]) + 1
                  for r in records["waiting_line/copy"])
    assert need[0] < need[-1]
    enc, dropped = T.encode_records(tok, records, need[-1] - 1)        # the longest answers are dropped
    assert len(enc) == sum(n < need[-1] for n in need) and dropped == {"waiting_line/copy": 5 - len(enc)}
    with pytest.raises(ValueError, match=rf"no record of task 'waiting_line/copy' fits a canvas of 3 tokens "
                                         rf"\(its answers with the end token take up to {need[-1]}\)"):
        T.encode_records(tok, records, 3)


def test_example_answers_join_the_loss_masked_with_their_rows_t():
    items = [T.Encoded("t", [1, 2, 3, 4, 5, 6][: 4 + b % 3], [8 + b % 4] * 10, ((1, 3),) if b % 5 else ())
             for b in range(4000)]
    x, valid, pos, cols = T.make_batch(items, pad_id=0)
    ex_cols, ex_ok = T.example_columns(items, x.shape[1])
    lp = x.shape[1] - 10
    for b in (0, 1, 2):
        assert ex_ok[b].sum() == (2 if b % 5 else 0)
        assert x[b, ex_cols[b][ex_ok[b]]].tolist() == ([2, 3] if b % 5 else [])
        assert (ex_cols[b][~ex_ok[b]] == 0).all()                       # padding points at column 0
    fake = _Uniform(50)
    loss = T.diffusion_loss(fake, x, valid, pos, cols, mask_id=49, eps=1e-3, generator=torch.Generator().manual_seed(0),
                            loss="masked-mean", t_power=1.0, extra_cols=ex_cols, extra_ok=ex_ok)
    assert loss.item() == pytest.approx(math.log(50), rel=1e-5)
    seen = fake.seen
    ex_mask = (seen == 49)
    ex_mask[:, lp:] = False
    rows = torch.arange(len(items))[:, None]
    allowed = torch.zeros_like(ex_mask)
    allowed[rows, ex_cols] = ex_ok
    assert not (ex_mask & ~allowed).any()                                 # only the example answers, never padding
    assert ex_mask.any()
    has_ex = torch.tensor([b % 5 != 0 for b in range(len(items))])
    assert (seen[~has_ex, :lp] == x[~has_ex, :lp]).all()
    # The example is masked at its row's rate: it tracks the response's masked fraction.
    resp_frac = (seen[has_ex, lp:] == 49).float().mean(1)
    ex_frac = ex_mask[has_ex].float().sum(1) / 2
    assert torch.corrcoef(torch.stack([resp_frac, ex_frac]))[0, 1] > 0.6
    assert ex_frac.mean().item() == pytest.approx(0.5, abs=0.03)


def test_example_spans_locate_the_in_context_answer_in_real_prompts(trained):
    from transformers import PreTrainedTokenizerFast

    out, _ = trained
    tok = PreTrainedTokenizerFast.from_pretrained(str(out / "a" / "tokenizer"))
    records = T.training_records(T.TrainConfig(tasks="waiting_line/copy,puzzle/sudoku_n4_12", samples_per_task=5))
    checked = 0
    for task, rec in [(t, r) for t, recs in records.items() for r in recs]:
        (e,), _ = T.encode_records(tok, {task: [rec]}, canvas=256)     # room for this small tokenizer's answers
        checked += 1
        (a, b), = e.examples
        ex = rec["input"]["icl_examples"][0]
        shown = ex["answer"] if isinstance(ex["answer"], str) else ex["answer"]["example"]
        assert tok.decode(e.prompt[a:b]) == shown
        # a copy example's question holds the same list: the span is the assistant's, after it
        assert e.prompt[a - 1] != tok.convert_tokens_to_ids(T.EOT) and e.prompt[b] == tok.convert_tokens_to_ids(T.EOT)
        assert tok.convert_tokens_to_ids(T.HEADER_END) in e.prompt[a - 3:a]
    assert checked == 10
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "zzqx unseen"}]
    with pytest.raises(ValueError, match="does not tokenize the same"):
        T.example_spans(tok, tok("<|startoftext|>a<|eot_id|>b", add_special_tokens=False)["input_ids"], turns)


def test_copy_warmup_examples_repeat_distinct_regular_tokens(trained):
    import random

    from transformers import PreTrainedTokenizerFast

    out, _ = trained
    tok = PreTrainedTokenizerFast.from_pretrained(str(out / "a" / "tokenizer"))
    rng = random.Random(0)
    special = set(tok.all_special_ids)
    bos, eot, eos = (tok.convert_tokens_to_ids(t) for t in (T.BOS, T.EOT, T.EOS))
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    lengths = set()
    for _ in range(200):
        e = T.copy_example(tok, rng)
        n = len(e.prompt) - 1 - len(newline)
        lengths.add(n)
        body = e.prompt[1:1 + n]
        assert e.prompt[0] == bos and e.prompt[1 + n:] == newline
        assert len(set(body)) == n and not special & set(body)
        assert e.response == body + [eot] + [eos] * (11 - n)
    assert lengths == set(range(4, 11))


def test_make_batch_left_pads():
    x, valid, pos, cols = T.make_batch([T.Encoded("t", [1, 2, 3], [9, 9]), T.Encoded("t", [4], [8, 8])], pad_id=0)
    assert x.tolist() == [[1, 2, 3, 9, 9], [0, 0, 4, 8, 8]]
    assert valid.tolist() == [[True] * 5, [False, False, True, True, True]]
    assert pos[1].tolist()[2:] == [0, 1, 2] and cols.tolist() == [[3, 4], [3, 4]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    folder = T.train(T.TrainConfig(out=str(out / "a"), **TINY), progress=False)
    return out, folder


def test_saved_model_is_a_llada_checkpoint_that_generates(trained):
    out, folder = trained
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["d_model"] == 32 and cfg["weight_tying"] is True
    names = set(load_file(str(folder / "model.safetensors")))
    assert "model.transformer.wte.weight" in names and "model.transformer.blocks.1.ff_proj.weight" in names
    assert "model.transformer.ff_out.weight" not in names                 # tied: the head is wte
    model, tok = dllm.load(folder, dtype="float32")
    assert model.config.family == "llada"
    assert model.config.mask_token_id == tok.convert_tokens_to_ids("<|mdm_mask|>")
    assert model.config.eot_token_id == tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.chat_template is not None
    assert [tok.convert_ids_to_tokens(i) for i in tok("1342")["input_ids"]] == ["1", "3", "4", "2"]
    out_ = dllm.generate(model, tok, ["hello"], gen_length=8, steps=8)
    assert out_.generated.shape == (1, 8)
    info = json.loads((out / "a" / "train_info.json").read_text())
    assert info["steps"] == TINY["steps"] and info["parameters"] == model.config.n_params
    assert info["name"] == "pb-tiny"                              # the run's name, outside its recipe
    assert info["precision"] == "fp32"


def test_a_canvas_past_the_models_length_after_its_prompt_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"prompt of \d+ tokens and its canvas of 1000 take \d+ tokens, more than the "
                                         r"model's maximum sequence length 1024"):
        T.train(T.TrainConfig(out=str(tmp_path / "r"), **{**TINY, "canvas": 1000}), progress=False)


def test_an_out_that_cannot_be_a_folder_is_a_usage_error(tmp_path, capsys):
    from dllm.cli import main
    (tmp_path / "file").write_text("")
    assert main(["train", "--out", str(tmp_path / "file"), "--steps", "3", "--compile", "false"]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "o"), "--then-steps", "0", "--then-lr", "5"]) == 2
    assert "--then-lr set(s) later phases, and --then-steps gives none" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_multi_process_launch_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"one of 2 launched processes \(WORLD_SIZE=2\)"):
        T.train(T.TrainConfig(out=str(tmp_path / "r"), **TINY), progress=False)
    assert not (tmp_path / "r").exists()
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match=r"WORLD_SIZE='abc' must be a process count >= 1"):
        T.train(T.TrainConfig(out=str(tmp_path / "r"), **TINY), progress=False)


def test_a_tokenizer_left_without_a_checkpoint_is_not_reused(tmp_path):
    """A session stopped before its first checkpoint leaves its tokenizer behind; a run with other
    settings in that folder builds its own."""
    out = tmp_path / "r"
    assert T.train(T.TrainConfig(out=str(out), **{**TINY, "vocab_size": 700}), progress=False, stop_after=1) is None
    (out / "checkpoint.pt").unlink()
    folder = T.train(T.TrainConfig(out=str(out), **{**TINY, "vocab_size": 400}), progress=False)
    fresh = T.train(T.TrainConfig(out=str(tmp_path / "f"), **{**TINY, "vocab_size": 400}),
                    progress=False)
    assert (folder / "tokenizer.json").read_text() == (fresh / "tokenizer.json").read_text()
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == \
        json.loads((fresh / "config.json").read_text())["vocab_size"]


def test_interrupted_run_resumes_to_the_same_weights(trained, tmp_path):
    out, folder = trained
    cfg = T.TrainConfig(out=str(tmp_path / "b"), **TINY)
    assert T.train(cfg, progress=False, stop_after=4) is None
    assert T.train(cfg, progress=False, stop_after=4) is None                 # already there: no step more
    assert (tmp_path / "b" / "checkpoint.pt").is_file() and not (tmp_path / "b" / "model").exists()
    _check_export_of_checkpoint(tmp_path / "b" / "checkpoint.pt", tmp_path / "step4")
    resumed = T.train(cfg, progress=False)
    a, b = load_file(str(folder / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the smoothed loss goes on from where it stood: the steps both logs hold have the same loss
    whole, cut = ({e["step"]: e["loss"] for e in json.loads((f.parent / "train_info.json").read_text())["loss_log"]}
                  for f in (folder, resumed))
    assert {6, 7} <= set(whole) & set(cut) and all(whole[k] == cut[k] for k in set(whole) & set(cut))


def _check_export_of_checkpoint(checkpoint, out):
    """benchmarks/export_checkpoint.py writes a folder that loads with the checkpoint's weights."""
    export = load_benchmark("export_checkpoint")
    assert export.export_checkpoint(checkpoint, out) == 4
    saved = torch.load(checkpoint, weights_only=False)["model"]
    model, _ = dllm.load(out, dtype="float32")
    assert set(model.state_dict()) == set(saved)
    assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)
    with pytest.raises(SystemExit, match="is not a file"):
        export.export_checkpoint(out / "missing.pt", out)
    older = torch.load(checkpoint, weights_only=False)     # a checkpoint saved without its model config
    del older["model_config"]
    torch.save(older, checkpoint.parent / "older.pt")
    assert export.export_checkpoint(checkpoint.parent / "older.pt", out.parent / "older") == 4
    again, first = (load_file(str(folder / "model.safetensors")) for folder in (out.parent / "older", out))
    assert set(again) == set(first) and all(torch.equal(again[k], first[k]) for k in first)


def test_a_canvas_recipe_names_its_canvas_as_the_generation_length(trained, tmp_path):
    from dllm.decode import checkpoint_gen_length

    _, folder = trained
    model, tok = dllm.load(folder, dtype="float32")
    assert checkpoint_gen_length(model) == 64                      # the default canvas
    assert T.generation_defaults(T.TrainConfig(canvas=0)) == {}
    T.save_pretrained(model, tok, tmp_path / "m", T.generation_defaults(T.TrainConfig(canvas=48)))
    again, _ = dllm.load(tmp_path / "m", dtype="float32")
    assert checkpoint_gen_length(again) == 48


def test_save_pretrained_writes_llada_and_dream_and_names_other_families(tmp_path):
    model = dllm.build_model(dllm.ModelConfig.from_name("llada-moe-tiny"), seed=0)
    with pytest.raises(ValueError, match=r"save_pretrained writes LLaDA and Dream models; got a llada-moe model"):
        T.save_pretrained(model, None, tmp_path / "moe")
    assert not (tmp_path / "moe").exists()
    for preset in ("llada-tiny", "dream-tiny"):      # fields their config.json cannot hold: refused, not dropped
        cfg = dataclasses.replace(dllm.ModelConfig.from_name(preset), qk_norm=True, rotary_dim=8)
        with pytest.raises(ValueError, match=r"config.json cannot describe qk_norm True, rotary_dim 8 \(it holds"):
            T.save_pretrained(dllm.build_model(cfg, seed=0), None, tmp_path / preset)


def test_a_later_phase_made_with_other_settings_is_refused_before_any_phase_trains(tmp_path):
    two = dict(TINY, then_steps=(1,), then_seed=(5,), then_lr=1e-3, then_min_lr=1e-4, then_task_weights="",
               then_cover_share=0.0)
    T.train(T.TrainConfig(out=str(tmp_path / "r"), **two), progress=False)
    three = T.TrainConfig(out=str(tmp_path / "r"), **{**two, "then_steps": (1, 1), "then_seed": (5, 6)})
    with pytest.raises(ValueError, match=r"r/checkpoint.pt was made with other settings \(init_from, seed\)"):
        T.train(three, progress=False)
    assert not (tmp_path / "r" / "phase2").exists()          # nothing trained before the refusal


def test_a_run_whose_start_weights_changed_does_not_resume(trained, tmp_path):
    import shutil

    from safetensors.torch import save_file

    _, folder = trained
    start = shutil.copytree(folder, tmp_path / "start")
    cfg = T.TrainConfig(out=str(tmp_path / "ft"), **{**TINY, "init_from": str(start)})
    assert T.train(cfg, progress=False, stop_after=1) is None
    weights = load_file(str(start / "model.safetensors"))
    save_file({k: v + 1 for k, v in weights.items()}, str(start / "model.safetensors"))   # same path and shape
    with pytest.raises(ValueError, match=r"made with other settings \(init_from \(its weights changed\)\)"):
        T.train(cfg, progress=False)


def test_a_missing_start_or_other_settings_are_refused_before_the_records_are_made(tmp_path, monkeypatch):
    import dllm.train.loop as loop
    cfg = T.TrainConfig(out=str(tmp_path / "r"), **TINY)
    assert T.train(cfg, progress=False, stop_after=1) is None

    def no_records(cfg):
        raise AssertionError("the records were made before the settings were checked")
    monkeypatch.setattr(loop, "training_records", no_records)
    with pytest.raises(ValueError, match=r"r/checkpoint.pt was made with other settings \(canvas\)"):
        T.train(T.TrainConfig(out=str(tmp_path / "r"), **{**TINY, "canvas": 8}), progress=False)
    with pytest.raises(FileNotFoundError, match=r"init_from '.*none' is not a model folder"):
        T.train(T.TrainConfig(out=str(tmp_path / "s"), **{**TINY, "init_from": str(tmp_path / "none")}), progress=False)


def test_start_weights_are_hashed_whole_or_shard_by_shard(tmp_path):
    import hashlib

    from dllm.train.model_init import weights_sha256
    assert weights_sha256(tmp_path) is None
    (tmp_path / "learn2pd_filter.safetensors").write_bytes(b"not the model")
    (tmp_path / "b.safetensors").write_bytes(b"second")
    (tmp_path / "a.safetensors").write_bytes(b"first")
    index = {"weight_map": {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weights_sha256(tmp_path) == hashlib.sha256(b"firstsecond").hexdigest()
    (tmp_path / "b.safetensors").write_bytes(b"changed")
    assert weights_sha256(tmp_path) == hashlib.sha256(b"firstchanged").hexdigest()
    (tmp_path / "model.safetensors").write_bytes(b"whole")
    assert weights_sha256(tmp_path) == hashlib.sha256(b"whole").hexdigest()


def test_a_start_model_with_fewer_embedding_rows_than_the_recipe_is_refused():
    from dllm.train.model_init import start_config
    want = dllm.ModelConfig.from_name("llada2-tiny")
    have = dataclasses.replace(want, vocab_size=want.vocab_size - 8)
    with pytest.raises(ValueError, match=rf"has {want.vocab_size - 8} embedding rows, fewer than the"):
        start_config("start", have, want)


def test_init_from_goes_on_from_a_model_folder(trained, tmp_path):
    out, folder = trained
    start = load_file(str(folder / "model.safetensors"))
    cfg = T.TrainConfig(out=str(tmp_path / "ft"), **{**TINY, "init_from": str(folder), "steps": 1,
                                                     "copy_warmup_steps": 0, "pair_warmup_steps": 0,
                                                     "lr": 1e-9, "min_lr": 0.0, "warmup": 1})
    went_on = T.train(cfg, progress=False)
    after = load_file(str(went_on / "model.safetensors"))
    # one step at a negligible rate: the weights are the start model's, not a fresh init
    assert all(torch.allclose(start[k], after[k], atol=1e-6) for k in start)
    assert (went_on / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
    info = json.loads((tmp_path / "ft" / "train_info.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{64}", info["init_from_sha256"]) and info["recipe"]["init_from"] == str(folder)
    with pytest.raises(ValueError, match=r"another shape than the recipe: d_model 32 \(recipe 48\)"):
        T.train(T.TrainConfig(out=str(tmp_path / "bad"), **{**TINY, "init_from": str(folder), "d_model": 48}),
                progress=False)
    with pytest.raises(FileNotFoundError, match="is not a model folder"):
        T.train(T.TrainConfig(out=str(tmp_path / "bad2"), **{**TINY, "init_from": str(tmp_path)}), progress=False)
    # A start model whose embedding has more rows than its tokenizer has tokens (as LLaDA pads its
    # own) keeps them.
    shaped = tmp_path / "padded"
    shutil.copytree(folder, shaped)
    by_rows = {"model.transformer.wte.weight", "model.transformer.ff_out.weight"} & set(start)
    save_file({k: torch.cat([v, v[:6]]) if k in by_rows else v for k, v in start.items()},
              str(shaped / "model.safetensors"))
    rows = start["model.transformer.wte.weight"].shape[0] + 6
    config = json.loads((shaped / "config.json").read_text())
    (shaped / "config.json").write_text(json.dumps({**config, "embedding_size": rows, "vocab_size": rows,
                                                    "rms_norm_eps": 1e-6}))
    run = T.TrainConfig(out=str(tmp_path / "ft-padded"), **{**TINY, "init_from": str(shaped), "steps": 1,
                                                            "copy_warmup_steps": 0, "pair_warmup_steps": 0,
                                                            "warmup": 1})
    padded = T.train(run, progress=False)
    assert load_file(str(padded / "model.safetensors"))["model.transformer.wte.weight"].shape[0] == rows
    assert json.loads((padded / "config.json").read_text())["rms_norm_eps"] == 1e-6     # the start model's
    assert load_benchmark("export_checkpoint").export_checkpoint(tmp_path / "ft-padded" / "checkpoint.pt",
                                                                 tmp_path / "exported") == 1
    assert load_file(str(tmp_path / "exported" / "model.safetensors"))["model.transformer.wte.weight"].shape[0] == rows
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["rms_norm_eps"] == 1e-6
    older = torch.load(tmp_path / "ft-padded" / "checkpoint.pt", weights_only=False)     # saved without its config
    del older["model_config"]
    torch.save(older, tmp_path / "ft-padded" / "older.pt")
    assert load_benchmark("export_checkpoint").export_checkpoint(tmp_path / "ft-padded" / "older.pt",
                                                                 tmp_path / "older") == 1
    assert load_file(str(tmp_path / "older" / "model.safetensors"))["model.transformer.wte.weight"].shape[0] == rows


def test_later_phases_go_on_from_the_model_before(trained, tmp_path):
    """A recipe with then_steps is the plain recipe followed by one init_from run per later phase with
    that phase's then_ settings: every phase's weights equal those runs made by hand; an interrupted
    three-phase run resumes to the same weights; train_info holds the whole recipe, totals and
    every phase."""
    out, folder = trained
    then = dict(then_steps=(2, 1), then_lr=(2e-3, 1e-3), then_min_lr=(1e-4, 1e-4), then_seed=(5, 6),
                then_task_weights=("puzzle/*=3", ""), then_cover_share=0.0)
    cfg = T.TrainConfig(out=str(tmp_path / "three"), **{**TINY, **then})
    final = T.train(cfg, progress=False)
    assert final == tmp_path / "three" / "model"
    weights = lambda f: load_file(str(Path(f) / "model.safetensors"))   # noqa: E731
    a, first = weights(folder), weights(tmp_path / "three" / "phase1" / "model")
    assert all(torch.equal(a[k], first[k]) for k in a)               # the then_ fields leave phase 1 alone
    start = str(tmp_path / "three" / "phase1" / "model")
    second = T.train(T.TrainConfig(out=str(tmp_path / "hand2"), **{
        **TINY, "init_from": start, "steps": 2, "lr": 2e-3, "min_lr": 1e-4,
        "copy_warmup_steps": 0, "pair_warmup_steps": 0, "seed": 5, "task_weights": "puzzle/*=3"}), progress=False)
    b = weights(second)
    assert all(torch.equal(b[k], weights(tmp_path / "three" / "phase2" / "model")[k]) for k in b)
    third = T.train(T.TrainConfig(out=str(tmp_path / "hand3"), **{
        **TINY, "init_from": str(second), "steps": 1, "lr": 1e-3, "min_lr": 1e-4,
        "copy_warmup_steps": 0, "pair_warmup_steps": 0, "seed": 6}), progress=False)    # "": the first weights
    c, d = weights(third), weights(final)
    assert all(torch.equal(c[k], d[k]) for k in c) and not all(torch.equal(b[k], d[k]) for k in d)
    info = json.loads((tmp_path / "three" / "train_info.json").read_text())
    assert info["recipe"]["then_steps"] == [2, 1] and info["steps"] == TINY["steps"] + 3 and info["name"] == "pb-tiny"
    assert info["recipe"]["then_task_weights"] == ["puzzle/*=3", ""]
    p1, p2, p3 = info["phases"]
    assert p1["recipe"]["then_steps"] == [] and p1["recipe"]["init_from"] == ""
    assert p2["recipe"]["init_from"] == start and p3["recipe"]["init_from"] == str(tmp_path / "three" / "phase2" / "model")
    assert (p2["recipe"]["seed"], p2["recipe"]["lr"], p2["recipe"]["task_weights"]) == (5, 2e-3, "puzzle/*=3")
    assert (p3["recipe"]["seed"], p3["recipe"]["steps"], p3["recipe"]["task_weights"]) == (6, 1, T.DEFAULT_TASK_WEIGHTS)
    assert p2["init_from_sha256"] and info["batches_per_task"] == {
        t: sum(p["batches_per_task"].get(t, 0) for p in (p1, p2, p3)) for t in p3["batches_per_task"]}
    cut = T.TrainConfig(out=str(tmp_path / "cut"), **{**TINY, **then})
    assert T.train(cut, progress=False, stop_after=TINY["steps"]) is None     # phase 1 done, phase 2 not begun
    assert (tmp_path / "cut" / "phase1" / "model").is_dir() and not (tmp_path / "cut" / "phase2").exists()
    assert T.train(cut, progress=False, stop_after=TINY["steps"] + 1) is None  # one step into phase 2
    (tmp_path / "cut").rename(tmp_path / "moved")              # phase 2 started from cut/phase1/model ...
    cut = dataclasses.replace(cut, out=str(tmp_path / "moved"))  # ... and resumes from the same weights here
    assert T.train(cut, progress=False, stop_after=TINY["steps"] + 2) is None  # phase 2 done, phase 3 not begun
    assert not (tmp_path / "moved" / "checkpoint.pt").exists()
    e = weights(T.train(cut, progress=False))
    assert all(torch.equal(d[k], e[k]) for k in d)
    # one value for all later phases; command-line text; then_steps 0 is no later phase
    two = T.TrainConfig(then_steps="5,7", then_lr="1e-3", then_min_lr=1e-4, then_seed="3,4",
                        then_task_weights="puzzle/*=2;", then_cover_share="0,0.5")
    assert [getattr(two, k) for k in T.THEN_FIELDS] == [
        (5, 7), (1e-3, 1e-3), (1e-4, 1e-4), (3, 4), ("puzzle/*=2", ""), (0.0, 0.5)]
    with pytest.raises(ValueError, match=r"then_lr set\(s\) later phases, and then_steps gives none"):
        T.TrainConfig(then_steps=0, then_lr=5.0)                        # then_ values act only with then_steps
    # ... so a single-phase run records none, and its checkpoint resumes as the first phase of a longer recipe
    single = T.recipe_fields(T.TrainConfig(then_steps=0))
    assert single == T.recipe_fields(T.phase_configs(T.TrainConfig())[0])
    assert all(single[k] == [] for k in T.THEN_FIELDS)
    assert T.complete_recipe({**single, "then_lr": [8e-4, 5e-4], "then_seed": [1, 2]}) == single
    import argparse
    parser = argparse.ArgumentParser()
    T.add_train_arguments(parser)
    args = parser.parse_args(["--then-steps", "300,200", "--then-lr", "1e-3,5e-4", "--then-min-lr", "1e-4",
                              "--then-seed", "7,8", "--then-cover-share", "0.25,0",
                              "--then-task-weights", "puzzle/*=2,waiting_line/copy=0.5;puzzle/*=4"])
    cli = T.config_from_args({k: v for k, v in vars(args).items() if v is not None})
    assert [(c.steps, c.lr, c.min_lr, c.seed, c.task_weights, c.cover_share) for c in T.phase_configs(cli)[1:]] == [
        (300, 1e-3, 1e-4, 7, "puzzle/*=2,waiting_line/copy=0.5", 0.25), (200, 5e-4, 1e-4, 8, "puzzle/*=4", 0.0)]
    one = dict(then_steps=2, then_lr=1e-3, then_min_lr=1e-4, then_seed=1, then_task_weights="", then_cover_share=0.0)
    for bad, msg in [(dict(then_steps=-1), r"then_steps must be integers >= 1.*got \[-1\]"),
                     (dict(then_steps="4,x"), "then_steps must be int values.*'4,x'"),
                     (dict(then_steps=2.5), "then_steps must be int values.*2.5"),
                     (dict(then_steps="5,"), "then_steps has an empty entry in '5,'"),
                     (dict(out=" "), "train option out must name a folder, got ' '"),
                     (dict(one, then_lr="1e-3,,5e-4"), "then_lr has an empty entry"),
                     (dict(then_steps=2), r"then_lr has 5 value\(s\) \[0.0008, 0.0005, 0.0003, 0.0003, 0.0003\] for 1 later"),
                     (dict(one, then_lr=0.0, then_min_lr=0.0), "need 0 < then_lr < 1"),
                     (dict(one, then_lr=1e-4, then_min_lr=1e-3), "then_min_lr <= then_lr"),
                     (dict(one, then_seed=1.5), "then_seed must be int values"),
                     (dict(one, then_task_weights="puzzle/nope=2"), "matches none of the generated")]:
        with pytest.raises(ValueError, match=msg):
            T.TrainConfig(**bad)


def test_recipe_change_on_resume_and_bad_options_are_errors(trained, tmp_path):
    cfg = T.TrainConfig(out=str(tmp_path / "c"), **TINY)
    T.train(cfg, progress=False, stop_after=1)
    with pytest.raises(ValueError, match="other settings \\(lr\\)"):
        T.train(T.TrainConfig(out=str(tmp_path / "c"), **{**TINY, "lr": 5e-4}), progress=False)
    # a checkpoint made before a field existed ran at its default
    ckpt = tmp_path / "c" / "phase1" / "checkpoint.pt" if TINY["then_steps"] else tmp_path / "c" / "checkpoint.pt"
    ck = torch.load(ckpt, weights_only=False)
    del ck["recipe"]["end_weight"]
    torch.save(ck, ckpt)
    with pytest.raises(ValueError, match="other settings \\(end_weight\\)"):
        T.train(T.TrainConfig(out=str(tmp_path / "c"), **{**TINY, "end_weight": 2.0}), progress=False, stop_after=2)
    T.train(T.TrainConfig(out=str(tmp_path / "c"), **TINY), progress=False, stop_after=2)
    with pytest.raises(ValueError, match="d_model 30 is not divisible by n_heads 4"):
        T.TrainConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="cannot train on task"):
        T.TrainConfig(tasks="waiting_line/cpy")
    with pytest.raises(ValueError, match="unknown train option"):
        T.config_from_args({"setps": 3})
    with pytest.raises(ValueError, match="rope_theta must be a finite number > 0, got 0"):
        T.TrainConfig(rope_theta=0.0)
    with pytest.raises(ValueError, match="loss 'l1' is not one of masked-mean, llada"):
        T.TrainConfig(loss="l1")
    with pytest.raises(ValueError, match="t_power must be in"):
        T.TrainConfig(t_power=0.0)
    with pytest.raises(ValueError, match="copy_warmup_steps must be an integer in \\[0, steps=10\\), got 10"):
        T.TrainConfig(steps=10, copy_warmup_steps=10)
    with pytest.raises(ValueError, match="init 'xavier' is not one of mimetic, normal"):
        T.TrainConfig(init="xavier")
    with pytest.raises(ValueError, match="qk_std must be in \\(0, 1\\], got 0.0"):
        T.TrainConfig(qk_std=0.0)
    with pytest.raises(ValueError, match="mask_example must be in \\[0, 1\\], got 1.5"):
        T.TrainConfig(mask_example=1.5)
    with pytest.raises(ValueError, match="bind_mask must be in \\[0, 1\\], got -0.1"):
        T.TrainConfig(bind_mask=-0.1)
    with pytest.raises(ValueError, match="precision 'fp16' is not one of auto, bf16, fp32"):
        T.TrainConfig(precision="fp16")
    with pytest.raises(ValueError, match="compile must be true or false, got 'yes'"):
        T.TrainConfig(compile="yes")
    with pytest.raises(ValueError, match="canvas must be an integer in \\[0, 1024\\] \\(0: each task's max_tokens\\), "
                                         "got -8"):
        T.TrainConfig(canvas=-8)
    with pytest.raises(ValueError, match="end_weight must be in \\[1, 100\\], got 0.5"):
        T.TrainConfig(end_weight=0.5)


@pytest.mark.parametrize("field", T.config.NUMBER_FIELDS)
@pytest.mark.parametrize("bad", ["1e-3", True, float("nan"), None])
def test_a_real_valued_option_of_another_type_is_refused_naming_it(field, bad):
    with pytest.raises(ValueError, match=rf"train option {field} must be a finite number, got {bad!r}"):
        T.TrainConfig(**{field: bad})


def _tiny_model(init):
    from dllm.config import ModelConfig
    from dllm.models.llada import LLaDAModel

    mc = ModelConfig(family="llada", vocab_size=50, d_model=24, n_layers=3, n_heads=3, n_kv_heads=3, mlp_hidden=40,
                     norm_eps=1e-5, rope_theta=1e4, max_seq_len=64, mask_token_id=49, eos_token_id=48,
                     pad_token_id=48, bos_token_id=47, eot_token_id=46, qkv_bias=False, tie_embeddings=True,
                     rope_fp32=True, logit_shift=False)
    torch.manual_seed(0)
    model = LLaDAModel(mc)
    T.init_weights(model, T.TrainConfig(init=init, embed_std=0.3, qk_std=0.2, vo_std=0.1, prev_token_head=False,
                                        next_token_head=False))
    return model


def test_mimetic_init_ties_query_key_and_value_output():
    model = _tiny_model("mimetic")
    assert model.embed.weight.std().item() == pytest.approx(0.3, rel=0.15)
    for layer in model.layers:
        a = layer.attn
        assert torch.equal(a.k.weight, a.q.weight) and torch.equal(a.o.weight, a.v.weight.T)
        assert a.q.weight.std().item() == pytest.approx(0.2, rel=0.2)
        assert a.v.weight.std().item() == pytest.approx(0.1, rel=0.2)
        # W_q W_k^T is positive semi-definite: a token's key scores its own query highest on average
        qk = a.q.weight.T @ a.k.weight
        assert torch.linalg.eigvalsh((qk + qk.T) / 2).min() > -1e-5
        assert layer.mlp.down.weight.std().item() == pytest.approx(0.02, rel=0.2)
    normal = _tiny_model("normal")
    assert normal.embed.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert not torch.equal(normal.layers[0].attn.k.weight, normal.layers[0].attn.q.weight)


def _copy_batch(trained, n):
    """A freshly initialised tiny model and a batch of `n` copy examples from the trained fixture's
    tokenizer: (model, x, valid, pos, cols, example_cols, example_ok)."""
    from transformers import PreTrainedTokenizerFast

    from dllm.models.llada import LLaDAModel

    out, _ = trained
    tok = PreTrainedTokenizerFast.from_pretrained(str(out / "a" / "tokenizer"))
    cfg = T.TrainConfig(**TINY)
    data, _ = T.encode_records(tok, T.training_records(cfg))
    items = [e for e in data if e.task == "waiting_line/copy"][:n]
    x, valid, pos, cols = T.make_batch(items, tok.convert_tokens_to_ids(T.EOS))
    ex_cols, ex_ok = T.example_columns(items, x.shape[1])
    torch.manual_seed(0)
    model = LLaDAModel(T.model_config(cfg, tok), attention="eager")
    T.init_weights(model, cfg)
    return model, x, valid, pos, cols, ex_cols, ex_ok


def test_compiled_and_bf16_losses_equal_the_eager_fp32_loss(trained, tmp_path):
    """torch.compile and bf16 autocast change how a step is computed, not what it computes: on a
    real batch the compiled loss equals the eager one, and the bf16 loss and gradients are close."""
    model, x, valid, pos, cols, ex_cols, ex_ok = _copy_batch(trained, 6)

    def loss_and_grad(fwd, bf16):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = T.diffusion_loss(fwd, x, valid, pos, cols, model.config.mask_token_id, 1e-3,
                                    torch.Generator().manual_seed(1), "masked-mean", 1.0, ex_cols, ex_ok)
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    ref, g_ref = loss_and_grad(model, False)
    compiled = torch.compile(model, dynamic=True)
    got, g = loss_and_grad(compiled, False)
    assert got == pytest.approx(ref, rel=1e-5) and torch.allclose(g, g_ref, atol=1e-5)
    got, g = loss_and_grad(compiled, True)
    assert got == pytest.approx(ref, rel=2e-2)
    assert torch.nn.functional.cosine_similarity(g, g_ref, dim=0) > 0.99
    # and a compiled bf16 run trains and exports
    folder = T.train(T.TrainConfig(out=str(tmp_path / "c"), **{**TINY, "steps": 3, "copy_warmup_steps": 0,
                                                                  "compile": True}), progress=False)
    assert (folder / "model.safetensors").is_file()


@pytest.mark.parametrize("loss", ["masked-mean", "llada"])
def test_lm_head_on_the_masked_columns_only_gives_the_full_loss_and_gradients(trained, loss):
    """diffusion_loss(head=...) runs the LM head on the masked columns alone; the loss and every
    gradient equal those of the full (B, G', V) logits."""
    model, x, valid, pos, cols, ex_cols, ex_ok = _copy_batch(trained, 5)

    def loss_and_grad(fwd, head):
        model.zero_grad()
        value = T.diffusion_loss(fwd, x, valid, pos, cols, model.config.mask_token_id, 1e-3,
                                 torch.Generator().manual_seed(3), loss, 1.0, ex_cols, ex_ok, head=head)
        value.backward()
        return value.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    ref, g_ref = loss_and_grad(model, None)
    got, g = loss_and_grad(model.hidden_at, model.head_logits)
    assert got == pytest.approx(ref, rel=1e-6) and torch.allclose(g, g_ref, atol=1e-6)
    assert model.head_logits(model.hidden_at(x, cols, position_ids=pos, key_valid=valid)).shape == \
        model(x, cols, position_ids=pos, key_valid=valid).shape


def test_whole_names_tokenizer_gives_each_full_name_one_token():
    recs = T.training_records(T.TrainConfig(tasks="waiting_line/insert_index,puzzle/latin_square_n4",
                                            samples_per_task=300, names="lists", pseudo_share=0.0))
    texts = [T.render_prompt(t, r) + T.answer_text(r) for t, rs in recs.items() for r in rs]
    tok = T.build_tokenizer(texts, 8192, whole_names=True)
    plain = T.build_tokenizer(texts, 8192)

    def pieces(t, text):
        return [t.decode([i]) for i in t(text, add_special_tokens=False)["input_ids"]]

    for r in recs["waiting_line/insert_index"][:20]:
        answer = r["answer"]
        names = json.loads(answer)
        toks = pieces(tok, answer)
        assert [p for p in toks if " " in p.strip()] == names                 # one token per person
        assert len(pieces(plain, answer)) > len(toks)
        word = r["input"]["word"]                                              # "... person \"Ann Lee\" is ..."
        prompt_ids = tok(T.render_prompt("waiting_line/insert_index", r), add_special_tokens=False)["input_ids"]
        assert tok.convert_tokens_to_ids(word.replace(" ", "Ġ")) in prompt_ids
    # digits stay one per token, other text splits as before, and unseen names fall back to pieces
    assert pieces(tok, "1342\n4213") == ["1", "3", "4", "2", "\n", "4", "2", "1", "3"]
    for text in ('["Zyx Qwv", "Ann Lee"]', "Generate a Latin square of size 4 with the symbols [A, K, 7, B].",
                 "Hello World, 12 apples"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert "Zyx Qwv" not in pieces(tok, '["Zyx Qwv"]')


def _init_model(cfg, tok):
    from dllm.models.llada import LLaDAModel

    torch.manual_seed(cfg.seed)                 # as train() builds it
    model = LLaDAModel(T.model_config(cfg, tok), attention="eager")
    T.init_weights(model, cfg)
    return model


def test_frozen_and_lazy_embedding_updates(tmp_path):
    """embed_update="frozen" keeps the embedding at its init; "lazy" changes only the rows of
    tokens that occur in some batch (a name never seen in training keeps its init row), and resumes
    to the same weights; "dense" (the default) moves every row."""
    from transformers import PreTrainedTokenizerFast

    opts = {**TINY, "copy_warmup_steps": 0, "pair_warmup_steps": 0, "whole_names": True, "vocab_size": 4096}
    rows = {}
    for mode in ("frozen", "lazy", "dense"):
        cfg = T.TrainConfig(out=str(tmp_path / mode), **{**opts, "embed_update": mode})
        folder = T.train(cfg, progress=False)
        tok = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / mode / "tokenizer"))
        init = _init_model(cfg, tok).embed.weight
        saved = load_file(str(folder / "model.safetensors"))["model.transformer.wte.weight"]
        rows[mode] = (saved != init).any(1)
        assert not torch.equal(load_file(str(folder / "model.safetensors"))["model.transformer.blocks.0.ff_proj.weight"],
                               _init_model(cfg, tok).state_dict()["layers.0.mlp.gate.weight"])
    assert not rows["frozen"].any()
    assert rows["dense"].all()
    # 7 batches of 4 rows touch a few hundred of the ~1500 tokens; the mask token is always among them
    assert 0 < rows["lazy"].sum() < 0.5 * len(rows["lazy"]) and rows["lazy"][tok.convert_tokens_to_ids(T.MASK)]
    cfg = T.TrainConfig(out=str(tmp_path / "resumed"), **{**opts, "embed_update": "lazy"})
    assert T.train(cfg, progress=False, stop_after=4) is None
    again = load_file(str(T.train(cfg, progress=False) / "model.safetensors"))
    first = load_file(str(tmp_path / "lazy" / "model" / "model.safetensors"))
    assert all(torch.equal(again[k], first[k]) for k in first)
    with pytest.raises(ValueError, match="embed_update 'sparse' is not one of dense, lazy, frozen"):
        T.TrainConfig(**{**TINY, "embed_update": "sparse"})
    with pytest.raises(ValueError, match="whole_names must be true or false"):
        T.TrainConfig(**{**TINY, "whole_names": 1})


def test_task_weights_parse_globs_and_reject_bad_entries():
    tasks = "waiting_line/copy,waiting_line/reverse,puzzle/latin_square_n4,puzzle/sudoku_n4_12"
    assert T.TrainConfig(tasks=tasks, task_weights="").sampling_weights() is None
    # the default weights apply to whichever of their tasks are selected
    assert T.TrainConfig(tasks=tasks).sampling_weights() == {
        "waiting_line/copy": 1.5, "waiting_line/reverse": 1.5, "puzzle/latin_square_n4": 2.5,
        "puzzle/sudoku_n4_12": 2.0}
    assert T.TrainConfig(tasks="puzzle/sudoku_n4_12").sampling_weights() is None
    assert T.TrainConfig(tasks=tasks, task_weights="waiting_line/sort=2").sampling_weights() is None
    assert T.TrainConfig(tasks=tasks, task_weights="waiting_line/*=2, puzzle/*=2").sampling_weights() is None
    w = T.TrainConfig(tasks=tasks, task_weights="puzzle/*=3,waiting_line/copy=0.5,puzzle/sudoku_n4_12=2").sampling_weights()
    assert w == {"waiting_line/copy": 0.5, "waiting_line/reverse": 1.0, "puzzle/latin_square_n4": 3.0,
                 "puzzle/sudoku_n4_12": 2.0}
    for bad, match in [("puzzle/*", "is not PATTERN=WEIGHT"), ("puzzle/*=-1", "is not PATTERN=WEIGHT"),
                       ("puzzle/*=x", "is not PATTERN=WEIGHT"), ("=2", "is not PATTERN=WEIGHT"),
                       ("puzzle/*=inf", "is not PATTERN=WEIGHT"),
                       ("waiting_line/sortt=2", "pattern 'waiting_line/sortt' matches none of the generated tasks"),
                       ("*=0", "gives every task weight 0")]:
        with pytest.raises(ValueError, match=match):
            T.TrainConfig(tasks=tasks, task_weights=bad)


def test_weighted_runs_draw_tasks_by_weight(trained, tmp_path):
    out, _ = trained
    info = json.loads((out / "a" / "train_info.json").read_text())
    assert info["pair_batches"] >= TINY["pair_warmup_steps"]
    assert sum(info["batches_per_task"].values()) + info["pair_batches"] == TINY["steps"] - TINY["copy_warmup_steps"]
    opts = {**TINY, "steps": 8, "copy_warmup_steps": 0, "pair_warmup_steps": 0, "pair_share": 0.0,
            "task_weights": "puzzle/*=0"}
    T.train(T.TrainConfig(out=str(tmp_path / "w"), **opts), progress=False)
    info = json.loads((tmp_path / "w" / "train_info.json").read_text())
    assert info["batches_per_task"] == {"puzzle/sudoku_n4_12": 0, "waiting_line/copy": 8}
    assert info["recipe"]["task_weights"] == "puzzle/*=0" and info["pair_batches"] == 0
    opts.update(steps=3, task_weights="", bind_mask=0.3, hole_mask=0.5, span_mask=0.2)   # hole and span rows
    T.train(T.TrainConfig(out=str(tmp_path / "h"), **opts), progress=False)
    info = json.loads((tmp_path / "h" / "train_info.json").read_text())
    assert info["recipe"]["hole_mask"] == 0.5 and math.isfinite(info["loss_log"][-1]["loss"])


def test_name_sides_mark_first_and_last_name_tokens_of_list_items():
    toks = ['["', 'Betty', 'ĠMorgan', '",', 'Ġ"', 'Z', 'z', 'ĠQ', 'w', '"]', '<|eot_id|>']
    assert T.name_sides(toks) == (0, 1, 2, 0, 0, 1, 1, 2, 2, 0, 0)
    assert T.name_sides(['"', 'Ann', 'ĠLee', '"']) == (0, 1, 2, 0)          # bare quotes open and close
    assert T.name_sides(['1', '4', 'Ċ', '3', ',', 'A']) == (0,) * 6             # grids have no items


def test_bind_rows_mask_the_names_when_they_are_single_tokens():
    """With one token per full name every name is side 1: a bind row masks all of them, never nothing."""
    sides = torch.tensor([[0, 1, 0, 0, 1, 0, 0], [0, 1, 2, 0, 1, 2, 0], [0] * 7])
    for seed in range(20):
        fixed, rows = T.bind_rows(sides, 1.0, torch.Generator().manual_seed(seed))
        assert rows[:, 0].tolist() == [True, True, False]
        assert torch.equal(fixed[0], sides[0] == 1)
        assert torch.equal(fixed[1], sides[1] == 1) or torch.equal(fixed[1], sides[1] == 2)


def test_bind_rows_mask_exactly_one_name_side(trained):
    """bind_mask rows mask every first-name (or every last-name) token of the answer and nothing
    else; the sides come from the real tokenizer's view of a rendered answer."""
    from transformers import PreTrainedTokenizerFast

    out, _ = trained
    tok = PreTrainedTokenizerFast.from_pretrained(str(out / "a" / "tokenizer"))
    recs = T.training_records(T.TrainConfig(tasks="waiting_line/shuffle", samples_per_task=12))
    data, _ = T.encode_records(tok, recs, canvas=128)
    assert len(data) == 12
    for e in data:
        eot = e.response.index(tok.convert_tokens_to_ids(T.EOT))
        names = json.loads(tok.decode(e.response[:eot]))
        firsts = [tok.decode([t]) for t, s in zip(e.response, e.sides) if s == 1]
        lasts = [tok.decode([t]) for t, s in zip(e.response, e.sides) if s == 2]
        assert "".join(firsts) == "".join(n.split()[0] for n in names)
        assert "".join(lasts).split() == [n.split()[1] for n in names]
    x, valid, pos, cols = T.make_batch(data, tok.convert_tokens_to_ids(T.EOS))
    sides = T.response_sides(data)
    rows = torch.tensor([[b % 2 == 0] for b in range(len(data))])
    fixed = sides == 1
    fake = _Uniform(len(tok))
    T.diffusion_loss(fake, x, valid, pos, cols, tok.convert_tokens_to_ids(T.MASK), 1e-3,
                     torch.Generator().manual_seed(0), "masked-mean", 1.0, fixed=fixed, fixed_rows=rows)
    masked = fake.seen[:, cols[0]] == tok.convert_tokens_to_ids(T.MASK)
    assert torch.equal(masked[rows[:, 0]], fixed[rows[:, 0]])
    assert not torch.equal(masked[~rows[:, 0]], fixed[~rows[:, 0]])


def test_hole_rows_mask_whole_names_and_nothing_else():
    """A hole row masks every token of some names (both sides of each, at least one name) and no
    other token; rows already taken or without names are never chosen; share 0 chooses none."""
    sides = torch.tensor([[0, 1, 2, 2, 0, 0, 1, 1, 2, 0, 1, 2, 0, 0],
                          [0] * 14,
                          [0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0],
                          [0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0],       # one token per name
                          [0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    items = [[(1, 4), (6, 9), (10, 12)], [], [(1, 3), (4, 6)], [(1, 2), (3, 4), (5, 6), (7, 8)], [(1, 3)]]
    taken = torch.tensor([[False], [False], [False], [False], [True]])
    seen = set()
    for seed in range(40):
        fixed, rows = T.hole_rows(sides, taken, 1.0, torch.Generator().manual_seed(seed))
        assert rows[:, 0].tolist() == [True, False, True, True, False]
        for b in (0, 2, 3):
            want = torch.zeros(14, dtype=torch.bool)
            hit = [all(fixed[b, i:j]) for i, j in items[b]]
            assert any(hit)
            for (i, j), h in zip(items[b], hit):
                assert bool(fixed[b, i:j].any()) == h                     # a name is masked whole or not at all
                want[i:j] = h
            assert torch.equal(fixed[b], want)
            seen.add((b, tuple(hit)))
    assert len([k for k in seen if k[0] == 3]) > 5                          # the draws vary
    _, rows = T.hole_rows(sides, torch.zeros(5, 1, dtype=torch.bool), 0.0, torch.Generator().manual_seed(0))
    assert not rows.any()
    with pytest.raises(ValueError, match="hole_mask must be in \\[0, 1 - bind_mask = 0.75\\], got 0.8"):
        T.TrainConfig(bind_mask=0.25, hole_mask=0.8)


def test_span_rows_mask_one_contiguous_run_half_of_them_to_the_end():
    """A span row masks one run [a, b) of the response and nothing else; about half the runs reach
    the last column; taken rows are never chosen; the share of chosen rows follows `share`."""
    B, G = 400, 13
    taken = torch.zeros(B, 1, dtype=torch.bool)
    taken[::4] = True
    fixed, rows = T.span_rows(B, G, taken, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(rows, ~taken)
    for row in fixed.tolist():
        cols = [j for j, m in enumerate(row) if m]
        assert cols and cols == list(range(cols[0], cols[-1] + 1))       # one run, never empty
    to_end = fixed[rows[:, 0], -1].float().mean().item()
    by_b = sum(1 / k for k in range(1, G + 1)) / G                   # P(b = G) when b ~ U{a+1 .. G}
    assert abs(to_end - (0.5 + 0.5 * by_b)) < 0.08
    starts = {row.index(True) for row in fixed.tolist()}
    assert starts == set(range(G))                                   # every start column occurs
    _, rows = T.span_rows(B, G, torch.zeros(B, 1, dtype=torch.bool), 0.25, torch.Generator().manual_seed(1))
    assert 0.18 < rows.float().mean().item() < 0.32
    with pytest.raises(ValueError, match="span_mask must be in \\[0, 1 - bind_mask - hole_mask = 0.5\\], got 0.6"):
        T.TrainConfig(bind_mask=0.15, hole_mask=0.35, span_mask=0.6)


def test_probe_binding_examples_keep_pairs_and_the_script_runs(capsys):
    import random

    from transformers import PreTrainedTokenizerFast

    from dllm.models.loading import default_model_path

    pb = load_benchmark("probe_binding")
    tok = PreTrainedTokenizerFast.from_pretrained(str(default_model_path()))
    vocab = T.copy_vocab(tok)
    rng = random.Random(3)
    for order in ("shuffled", "same"):
        for _ in range(20):
            e = T.pair_example(rng, vocab, 7, order)
            body = e.prompt[1:-len(vocab[1])]
            n = len(body) // 2
            assert 3 <= n <= 7 and len(e.response) == 16 and len(set(body)) == 2 * n
            pairs = [tuple(body[2 * i:2 * i + 2]) for i in range(n)]
            answer = [tuple(e.response[2 * i:2 * i + 2]) for i in range(n)]
            assert sorted(answer) == sorted(pairs) and (order == "shuffled" or answer == pairs)
            assert e.response[2 * n] == vocab[3] and set(e.response[2 * n + 1:]) == {vocab[4]}
            assert e.sides == (1, 2) * n + (0,) * (16 - 2 * n)
    pairing = T.global_pairing(vocab[0], 99)
    assert len(set(pairing) | set(pairing.values())) == 2 * len(pairing) >= len(vocab[0]) - 1
    e = T.pair_example(rng, vocab, 7, "shuffled", pairing)
    body = e.prompt[1:-len(vocab[1])]
    assert all(pairing[body[i]] == body[i + 1] for i in range(0, len(body), 2))
    assert pb.main(["--steps", "3", "--every", "2", "--layers", "1", "--no-compile", "--probe-size", "4",
                    "--global-pairs", "0.5",
                    "--threads", str(torch.get_num_threads())]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pairs 3-8, order shuffled, 1 layers") and len(lines) == 3
    assert lines[1].startswith("step 2 loss ") and lines[2].startswith("step 3 loss ")
    # --model probes a trained model: the shipped one binds held-out copies exactly and rarely repeats a name
    assert pb.main(["--model", str(default_model_path()), "--probe-size", "6", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["waiting_line/copy", "waiting_line/shuffle",
                                                     "waiting_line/insert_random", "waiting_line/shuffle"]
    assert lines[0].endswith("binding accuracy 1.000")
    shown, masked = re.match(r".*repeat probability ([\d.]+) \(with that name still masked: ([\d.]+)\)$", lines[3]).groups()
    assert float(shown) < 0.05 and float(shown) <= float(masked)      # it does not write a name twice
    for bad in (["--pairs", "2"], ["--global-pairs", "1.5"], ["--bind-rows", "-0.1"]):
        with pytest.raises(SystemExit):
            pb.main(bad)


def test_lr_schedule_holds_pair_lr_through_the_pair_warmup_then_decays_from_lr():
    plain = T.TrainConfig(steps=1000, warmup=10, lr=1e-3, min_lr=1e-4, pair_warmup_steps=0)
    assert T.lr_at(plain, 0) == pytest.approx(1e-4) and T.lr_at(plain, 10) == pytest.approx(1e-3)
    assert T.lr_at(plain, 505) == pytest.approx(5.5e-4) and T.lr_at(plain, 1000) == pytest.approx(1e-4)
    cfg = T.TrainConfig(steps=1000, warmup=10, lr=1e-3, min_lr=1e-4, pair_warmup_steps=200, pair_lr=2e-3)
    assert T.lr_at(cfg, 4) == pytest.approx(1e-3)                       # warm-up towards pair_lr
    assert all(T.lr_at(cfg, s) == 2e-3 for s in range(10, 200))
    assert T.lr_at(cfg, 200) == pytest.approx(1e-3)                     # the cosine starts at lr
    assert T.lr_at(cfg, 600) == pytest.approx(5.5e-4) and T.lr_at(cfg, 1000) == pytest.approx(1e-4)
    copy_first = T.TrainConfig(steps=1000, warmup=10, copy_warmup_steps=50, pair_warmup_steps=100, pair_lr=2e-3)
    assert T.lr_at(copy_first, 20) == 1e-3 and T.lr_at(copy_first, 50) == T.lr_at(copy_first, 149) == 2e-3
    assert T.lr_at(copy_first, 150) == pytest.approx(1e-3)
    for bad, match in [(dict(steps=10, pair_warmup_steps=10), "pair_warmup_steps must be an integer in \\[0, "
                                                               "steps - copy_warmup_steps = 10\\), got 10"),
                       (dict(steps=10, copy_warmup_steps=4, pair_warmup_steps=6), "= 6\\), got 6"),
                       (dict(pair_lr=0.0), "pair_lr must be in \\(0, 1\\), got 0.0"),
                       (dict(pair_global=1.5), "pair_global must be in \\[0, 1\\], got 1.5"),
                       (dict(pair_share=1.0), "pair_share must be in \\[0, 1\\), got 1.0"),
                       (dict(pair_max=2), "pair_max must be an integer in \\[3, 64\\], got 2")]:
        with pytest.raises(ValueError, match=match):
            T.TrainConfig(**bad)


class _Echo(torch.nn.Module):
    """Predicts, at each asked column, a fixed map of the *true* canvas token (identity = an oracle)."""

    def __init__(self, vocab, truth, shift=0):
        super().__init__()
        self.vocab, self.truth, self.shift, self.seen = vocab, truth, shift, None

    def forward(self, x, logits_at, position_ids=None, key_valid=None):
        self.seen = x.clone()
        tgt = (self.truth.gather(1, logits_at) + self.shift) % self.vocab
        return torch.nn.functional.one_hot(tgt, self.vocab).float()


def test_binding_accuracy_hides_every_second_side_token_and_scores_it():
    import random

    vocab = (list(range(10, 90)), [5], 1, 2, 3)
    rng = random.Random(0)
    items = [T.pair_example(rng, vocab, 5) for _ in range(7)]
    x, valid, pos, cols = T.make_batch(items, 0)
    oracle = _Echo(100, x)
    assert T.binding_accuracy(oracle, 99, 0, items) == 1.0
    sides = T.response_sides(items)
    resp = oracle.seen.gather(1, cols)
    assert torch.equal(resp == 99, sides == 2)                          # exactly the b's are masked
    assert torch.equal(oracle.seen.gather(1, cols)[sides != 2], x.gather(1, cols)[sides != 2])
    assert T.binding_accuracy(_Echo(100, x, shift=1), 99, 0, items) == 0.0
    with pytest.raises(ValueError, match="order 'sorted' is not 'shuffled' or 'same'"):
        T.pair_example(rng, vocab, 5, "sorted")


@pytest.mark.parametrize("via", ["embedding", "bias"])
def test_previous_token_head_attends_to_the_previous_position_at_init(via):
    def head0_attention(prev):
        model = _two_layer_model(d_model=64, n_heads=2, qkv_bias=via == "bias")
        T.init_weights(model, T.TrainConfig(prev_token_head=prev, prev_head_input=via, next_token_head=False))
        x = torch.randint(0, 296, (3, 23), generator=torch.Generator().manual_seed(1))
        return _layer0_attention(model, x)[0], model

    att, model = head0_attention(True)
    p = torch.arange(1, 23)
    assert att[:, p, p - 1].mean() > 0.6 and (att[:, 1:].argmax(-1) == p - 1).float().mean() > 0.95
    plain, plain_model = head0_attention(False)
    assert plain[:, p, p - 1].mean() < 0.2
    # built from biases, the head leaves the embedding (and every other head) as the plain init made it
    same_embedding = torch.equal(model.embed.weight, plain_model.embed.weight)
    assert same_embedding == (via == "bias")
    if via == "bias":
        assert all(lin.bias.abs().sum() == 0 for layer in model.layers[1:]
                   for lin in (layer.attn.q, layer.attn.k, layer.attn.v))
    with pytest.raises(ValueError, match="prev_token_head must be true or false, got 1"):
        T.TrainConfig(prev_token_head=1)
    with pytest.raises(ValueError, match="prev_head_input 'bia' is not one of embedding, bias"):
        T.TrainConfig(prev_head_input="bia")


def test_next_token_head_attends_to_the_next_position_at_init():
    """Head 1 of layer 0, built from biases, attends to p + 1 beside the previous-token head 0."""
    model = _two_layer_model(d_model=64, n_heads=2, qkv_bias=True)
    T.init_weights(model, T.TrainConfig(prev_token_head=True, prev_head_input="bias", next_token_head=True))
    x = torch.randint(0, 296, (3, 41), generator=torch.Generator().manual_seed(2))
    att, n = _layer0_attention(model, x), x.shape[1]
    p = torch.arange(1, n - 1)
    assert att[0][:, p, p - 1].mean() > 0.6                                   # head 0: previous token
    assert att[1][:, p, p + 1].mean() > 0.6 and (att[1][:, :-1].argmax(-1) == torch.arange(1, n)).all()
    assert T.model_config(T.TrainConfig(next_token_head=True), _FakeTok()).qkv_bias
    with pytest.raises(ValueError, match="next_token_head must be true or false, got 'x'"):
        T.TrainConfig(next_token_head="x")
    with pytest.raises(ValueError, match="needs n_heads >= 2, got 1"):
        T.TrainConfig(next_token_head=True, n_heads=1, d_model=32)


def _two_layer_model(d_model: int, n_heads: int, qkv_bias: bool):
    """A two-layer LLaDA model over 300 ids (special ids 296-299), seeded, before init_weights."""
    from dllm.config import ModelConfig
    from dllm.models.llada import LLaDAModel

    mc = ModelConfig(family="llada", vocab_size=300, d_model=d_model, n_layers=2, n_heads=n_heads, n_kv_heads=n_heads,
                     mlp_hidden=96, norm_eps=1e-5, rope_theta=1e4, max_seq_len=64, mask_token_id=299,
                     eos_token_id=298, pad_token_id=298, bos_token_id=297, eot_token_id=296,
                     qkv_bias=qkv_bias, tie_embeddings=True, rope_fp32=True, logit_shift=False)
    torch.manual_seed(0)
    return LLaDAModel(mc)


def _layer0_attention(model, x) -> list[torch.Tensor]:
    """Each head's attention in layer 0 of `model` on tokens `x`, from a plain rotary re-statement:
    dims i and i + D/2 rotate by pos * theta^(-2i/D)."""
    mc = model.config
    D, n = mc.head_dim, x.shape[1]
    with torch.no_grad():
        h = model.layers[0].attn_norm(model.embed(x))
        q, k = model.layers[0].attn.q(h).double(), model.layers[0].attn.k(h).double()
    ang = torch.arange(float(n), dtype=torch.float64)[:, None] * mc.rope_theta ** (-torch.arange(0, D, 2) / D)
    cos, sin = ang.cos(), ang.sin()

    def rot(v):
        a, b = v[..., :D // 2], v[..., D // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    return [(rot(q[..., s]) @ rot(k[..., s]).transpose(1, 2) / D ** 0.5).softmax(-1)
            for s in (slice(i * D, (i + 1) * D) for i in range(mc.n_heads))]


class _FakeTok:
    def __len__(self):
        return 100

    def convert_tokens_to_ids(self, t):
        return {T.MASK: 99, T.EOS: 98, T.BOS: 97, T.EOT: 96}[t]


def test_window_heads_attend_to_their_offsets_at_init():
    """Heads 2.. of layer 0, built from biases, attend to p - 2, p + 2, p - 3, p + 3 whatever the tokens;
    the heads after them keep the mimetic init."""
    model = _two_layer_model(d_model=128, n_heads=8, qkv_bias=True)
    cfg = T.TrainConfig(n_heads=8, window_heads=2)
    assert T.model_config(T.TrainConfig(n_heads=8, window_heads=1, prev_token_head=False, next_token_head=False),
                          _FakeTok()).qkv_bias
    T.init_weights(model, cfg)
    x = torch.randint(0, 296, (3, 37), generator=torch.Generator().manual_seed(3))
    att, n = _layer0_attention(model, x), x.shape[1]
    p = torch.arange(3, n - 3)
    for head, offset in ((0, -1), (1, 1), (2, -2), (3, 2), (4, -3), (5, 3)):
        assert att[head][:, p, p + offset].mean() > 0.5, (head, offset)
        assert (att[head][:, p].argmax(-1) == p + offset).float().mean() > 0.95, (head, offset)
    assert model.layers[0].attn.q.bias[6 * model.config.head_dim:].abs().sum() == 0
    assert att[6][:, p, p - 2].mean() < 0.2
    with pytest.raises(ValueError, match="window_heads must be an integer >= 0, got -1"):
        T.TrainConfig(window_heads=-1)
    with pytest.raises(ValueError, match="window_heads 2 builds heads 2..5 of layer 0 and needs n_heads >= 6, got 4"):
        T.TrainConfig(window_heads=2)


def test_reweighted_keeps_the_order_and_names_unknown_patterns():
    from dllm.train.config import reweighted
    assert reweighted("a/x=1,b/*=0.5,c=2", {"c": "3", "a/x": "4"}) == "a/x=4,b/*=0.5,c=3"
    with pytest.raises(ValueError, match=r"\['d'\] are not in the task weights 'a/x=1'"):
        reweighted("a/x=1", {"d": "2"})


@pytest.mark.parametrize("option,value,message", [
    ("grad_clip", -1.0, "grad_clip must be a number > 0 (the largest gradient norm; inf: no clipping), got -1.0"),
    ("grad_clip", 0, "grad_clip must be a number > 0"),
    ("grad_clip", float("nan"), "grad_clip must be a number > 0"),
    ("weight_decay", -0.1, "weight_decay must be a finite number >= 0, got -0.1"),
    ("warmup", -5, "train option warmup must be an integer >= 0 (steps of linear warm-up), got -5"),
    ("warmup", 2.5, "train option warmup must be an integer >= 0"),
    ("threads", -1, "train option threads must be an integer >= 0 (0 or unset: torch's default), got -1"),
])
def test_optimizer_options_are_checked(option, value, message):
    with pytest.raises(ValueError) as err:
        T.TrainConfig(**{option: value})
    assert message in str(err.value)


@pytest.mark.parametrize("options,message", [
    ({"vocab_size": 100}, "vocab_size must be at least 262 (the 256-byte alphabet and 6 special tokens), got 100"),
    ({"d_model": 12, "n_heads": 4}, "d_model / n_heads = 3 must be even"),
    ({"d_model": 16, "n_heads": 4}, "the built positional heads (prev_token_head, next_token_head, window_heads) "
                                    "need d_model / n_heads >= 6, got 4"),
    ({"bind_mask": 0.5, "hole_mask": 0.5, "span_mask": 1e-13}, "span_mask must be in [0, 1 - bind_mask - hole_mask"),
    ({"bind_mask": 0.7, "hole_mask": 0.3, "span_mask": 1e-13}, "span_mask must be in [0, 1 - bind_mask - hole_mask"),
    ({"rope_theta": float("inf")}, "rope_theta must be a finite number > 0, got inf"),
    ({"seed": 2 ** 64 - 1}, f"seed must be an integer in [-2**63, 2**64 - 1), got {2 ** 64 - 1}"),
    ({"then_seed": (1, 2, 4, 5, 2 ** 64)}, "then_seed[4] must be an integer in [-2**63, 2**64 - 1)"),
    ({"tasks": "words_to_sentence/easy"}, "cannot train on task(s) words_to_sentence/easy; training takes the "
                                          "generated tasks with one answer each: waiting_line/"),
])
def test_model_and_mask_options_that_would_fail_later_are_checked(options, message):
    with pytest.raises(ValueError) as err:
        T.TrainConfig(**options)
    assert message in str(err.value)
    from dllm.train.data import SPECIAL_TOKENS
    assert T.TrainConfig(vocab_size=256 + len(SPECIAL_TOKENS)).vocab_size == 262
    assert T.TrainConfig(seed=-1, tasks="waiting_line_n15/copy,waiting_line/copy").seed == -1   # one answer each
    assert T.TrainConfig(d_model=16, n_heads=4, prev_token_head=False, next_token_head=False).d_model == 16


def test_training_leaves_the_callers_thread_count(tmp_path):
    """`threads` sets torch's thread count for the run only: the caller's count is back afterwards
    (the record keeps the count the run trained with)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = dict(TINY, then_steps=(1,), then_seed=(5,), then_lr=1e-3, then_min_lr=1e-4, then_task_weights="",
                   then_cover_share=0.0)
        T.train(T.TrainConfig(out=str(tmp_path / "t"), **two), progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    info = json.loads((tmp_path / "t" / "train_info.json").read_text())
    assert info["threads"] == 1 and [p["threads"] for p in info["phases"]] == [1, 1]
