"""The loop's invariants, driven by deliberately misbehaving samplers (docs/architecture.md §4)."""
import pytest
import torch

import dllm
from dllm.state import Decision
from dllm.samplers import Sampler

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [64, 3, 12], [250, 11, 11, 19, 100]]


@pytest.fixture(scope="module")
def model():
    return dllm.build_model(dllm.ModelConfig.from_name("llada-tiny"), seed=0, init_std=0.3)


class Lazy(Sampler):
    """Never commits anything."""
    name = "lazy"

    def step(self, state, rows, positions, valid, scores):
        return Decision(commit=torch.zeros_like(valid))


class Greedy(Sampler):
    """Commits everything it sees, and also asks for every column of the canvas, prompt included."""
    name = "greedy-all"

    def score_mask(self, state, rows):
        return torch.ones(rows.shape[0], state.length, dtype=torch.bool, device=state.x.device)

    def step(self, state, rows, positions, valid, scores):
        return Decision(commit=valid.clone(), tokens=torch.full_like(scores.token, 7))


class FillAll(Sampler):
    """Commits one token, then fills every remaining mask at the third step."""
    name = "fill-all"
    uses_blocks = False

    def score_mask(self, state, rows):
        return state.is_mask[rows] & state.in_generation()[None, :]

    def step(self, state, rows, positions, valid, scores):
        commit = torch.zeros_like(valid)
        commit[:, 0] = valid[:, 0]
        fill = torch.full((rows.shape[0],), state.global_step == 2, dtype=torch.bool)
        return Decision(commit=commit, fill_all=fill)


class WideBlock(Sampler):
    """Moves its block end to the end of the generation region at the first step, then commits
    the last masked position of the (now wide) block each step."""
    name = "wide"

    def score_mask(self, state, rows):
        return state.masked_in_block(rows)

    def step(self, state, rows, positions, valid, scores):
        last = valid.sum(1) - 1
        commit = torch.zeros_like(valid)
        commit[torch.arange(valid.shape[0]), last] = True
        return Decision(commit=commit, block_end=torch.full((rows.shape[0],), state.gen_end))


def _prompt_kept(out, rows, pad):
    lp = max(len(r) for r in rows)
    return all(out.sequences[b, lp - len(r):lp].tolist() == r and (out.sequences[b, :lp - len(r)] == pad).all()
               for b, r in enumerate(rows))


def test_progress_rule_forces_one_commit_per_step(model):
    out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=4, sampler=Lazy(), trace=True)
    assert out.forwards == 8 and out.tokens_per_forward == [1.0, 1.0, 1.0]
    # The forced commit is the most confident candidate of the block, with the scored token.
    ref = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=4, steps=8, sampler="low_confidence")
    assert torch.equal(out.sequences, ref.sequences)


def test_commits_outside_the_block_and_on_the_prompt_are_dropped(model):
    out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=4, sampler=Greedy(), trace=True)
    assert _prompt_kept(out, PROMPTS, model.config.pad_token_id)
    # Only the active block's masks were committed per step: two blocks, two forwards.
    assert out.forwards == 2 and (out.generated == 7).all()
    assert out.trace[:, :4].eq(0).all() and out.trace[:, 4:].eq(1).all()


def test_fill_all_commits_every_remaining_mask(model):
    out = dllm.generate(model, None, PROMPTS, gen_length=10, sampler=FillAll(), trace=True)
    assert out.forwards == 3
    assert (out.trace[:, 0] == 0).all() and (out.trace[:, 1] == 1).all() and (out.trace[:, 2:] == 2).all()
    assert not (out.generated == model.config.mask_token_id).any()


def test_block_end_moves_the_block(model):
    out = dllm.generate(model, None, PROMPTS, gen_length=8, block_length=2, sampler=WideBlock(), trace=True)
    # Step 0 commits the last position of the first 2-wide block and widens the block to the whole
    # region; from then on commits go right to left across the old block boundaries.
    assert out.forwards == 8
    assert out.trace[0].tolist() == [7, 0, 6, 5, 4, 3, 2, 1]


@pytest.mark.parametrize("sampler", ["low_confidence", "origin", "entropy"])
def test_cap_flush_writes_the_scored_argmax(model, sampler):
    kw = dict(gen_length=16, block_length=8 if sampler == "low_confidence" else None, steps=16, seed=0)
    out = dllm.generate(model, None, PROMPTS, max_forwards=3, sampler=sampler, trace=True, **kw)
    assert out.forwards == 3 and all(out.hit_cap)
    flushed = out.trace == 2
    # The flushed positions hold the argmax of the logits of the canvas before the flush step.
    canvas = out.sequences.clone()
    gen0 = canvas.shape[1] - 16
    canvas[:, gen0:][flushed] = model.config.mask_token_id
    pad = torch.tensor([max(map(len, PROMPTS)) - len(r) for r in PROMPTS])
    cols = torch.arange(canvas.shape[1])
    logits = model(canvas, key_valid=cols[None] >= pad[:, None], position_ids=(cols[None] - pad[:, None]).clamp(min=0))
    logits[..., model.config.mask_token_id] = float("-inf")
    argmax = logits.argmax(-1)[:, gen0:]
    assert flushed.any() and torch.equal(out.generated[flushed], argmax[flushed])


def test_finished_rows_stop_costing_forwards(model):
    rows = [[1, 2, 3], [4, 5]]
    out = dllm.generate(model, None, rows, gen_length=6, sampler=FillAll(), trace=True)
    assert out.nfe == [3, 3]
    # A row that finishes early is left out of later forwards.
    class FirstRowFast(FillAll):
        name = "first-fast"

        def step(self, state, rows_, positions, valid, scores):
            dec = super().step(state, rows_, positions, valid, scores)
            dec.fill_all = (rows_ == 0) | dec.fill_all
            return dec
    out = dllm.generate(model, None, rows, gen_length=6, sampler=FirstRowFast())
    assert out.nfe == [1, 3] and out.forwards == 3
