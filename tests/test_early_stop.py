"""`eos_early_stop`: a row stops once a block it completes holds an EOS or end-of-turn token; the
answer is the one decoded without it, in fewer forwards."""
import pytest

import dllm

QUESTIONS = ["Copy this list: Anna Bell, Tom Ray", "Reverse: a, b, c, d", "Sort: Zoe Hill, Al Marks, Bo Ng",
             "Copy this list: Eve Stone"]
BLOCK, GEN = 16, 64


@pytest.fixture(scope="module")
def shipped():
    return dllm.load(dtype="float32")


def _first_stop_block(tokens: list[int], stop_ids: list[int]) -> int | None:
    first = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
    return None if first is None else first // BLOCK


@pytest.mark.parametrize("settings", [dict(steps=GEN), dict(sampler="threshold"),
                                      dict(sampler="threshold", cache="dual"), dict(steps=GEN // 2, cache="prefix")],
                         ids=["low_confidence", "threshold", "threshold-dual", "low_confidence-prefix"])
def test_the_answer_is_unchanged_and_later_blocks_cost_nothing(shipped, settings):
    model, tok = shipped
    kw = dict(gen_length=GEN, block_length=BLOCK, **settings)
    plain = dllm.generate(model, tok, QUESTIONS, **kw)
    early = dllm.generate(model, tok, QUESTIONS, eos_early_stop=True, **kw)
    stop_ids = [model.config.eos_token_id, model.config.eot_token_id]
    assert early.texts == plain.texts and early.answer_lengths == plain.answer_lengths
    saved = 0
    for r in range(len(QUESTIONS)):
        tokens = plain.generated[r].tolist()
        b = _first_stop_block(tokens, stop_ids)
        if b is None:
            assert early.generated[r].tolist() == tokens and early.nfe[r] == plain.nfe[r]
            continue
        end = (b + 1) * BLOCK      # the blocks up to the one holding the first stop id decode as without the stop
        assert early.generated[r].tolist() == tokens[:end] + [model.config.eos_token_id] * (GEN - end)
        if "steps" in settings:    # LLaDA's fixed schedule: steps / blocks forwards per block
            assert early.nfe[r] == (b + 1) * settings["steps"] // (GEN // BLOCK)
        assert early.nfe[r] <= plain.nfe[r]
        saved += plain.nfe[r] - early.nfe[r]
    assert saved > 0 and early.forwards < plain.forwards


def test_rows_stop_alone_as_in_a_batch(shipped):
    model, tok = shipped
    kw = dict(gen_length=GEN, block_length=BLOCK, sampler="threshold", eos_early_stop=True)
    batch = dllm.generate(model, tok, QUESTIONS, **kw)
    for r, q in enumerate(QUESTIONS):
        alone = dllm.generate(model, tok, [q], **kw)
        assert alone.generated[0].tolist() == batch.generated[r].tolist() and alone.nfe[0] == batch.nfe[r]


def test_the_trace_commits_the_filled_columns_when_the_row_stops(shipped):
    model, tok = shipped
    out = dllm.generate(model, tok, QUESTIONS[:1], gen_length=GEN, block_length=BLOCK, steps=GEN, trace=True,
                        eos_early_stop=True)
    steps = out.trace[0].tolist()
    assert min(steps) >= 0 and max(steps) == out.nfe[0] - 1 == steps[-1]


def test_a_non_bool_is_refused():
    with pytest.raises(ValueError, match="eos_early_stop must be True or False, got 'yes'"):
        dllm.GenerationConfig(eos_early_stop="yes")


def test_a_sampled_row_alone_keeps_its_answer(shipped):
    """When sampling, a row decoded alone draws the same numbers up to its stop, so its answer stays
    (in a batch the rows share one stream, and a row that stops changes the others' draws)."""
    model, tok = shipped
    for q in QUESTIONS:
        kw = dict(gen_length=GEN, block_length=BLOCK, sampler="threshold", temperature=0.8, seed=0)
        plain = dllm.generate(model, tok, [q], **kw)
        early = dllm.generate(model, tok, [q], eos_early_stop=True, **kw)
        assert early.texts == plain.texts and early.nfe[0] <= plain.nfe[0]
