"""`dllm.state`: the step's shared tables (`DecodeState.derived`), `add_at` and `select_positions`,
against plain statements of what they compute."""
import pytest
import torch

from dllm.state import DecodeState, SpecialIds, add_at, select_positions
from samplers.threshold import top1

IDS = SpecialIds(mask=9, eos=8, pad=8)


def _state(batch=3, prompt=4, gen=10, block=4) -> DecodeState:
    x = torch.full((batch, prompt + gen), IDS.mask, dtype=torch.long)
    x[:, :prompt] = 1
    return DecodeState(x=x, gen_start=prompt, gen_length=gen, block_length=block,
                       pad_len=torch.zeros(batch, dtype=torch.long), ids=IDS)


def _in_block(state, rows):
    cols = torch.arange(state.length)
    return torch.stack([(cols >= state.block_start[r]) & (cols < state.block_end[r]) for r in rows.tolist()])


def test_a_table_is_made_once_while_its_sources_are_unchanged():
    state, rows = _state(), torch.arange(3)
    first = state.in_block(rows)
    assert state.in_block(rows) is first and state.masked_in_block(rows) is state.masked_in_block(rows)
    assert torch.equal(first, _in_block(state, rows))


@pytest.mark.parametrize("change", ["write in place", "write through a view", "replace the tensor", "other rows"])
def test_a_table_follows_every_change_of_its_sources(change):
    state, rows = _state(), torch.arange(3)
    before, masked = state.in_block(rows), state.masked_in_block(rows)
    if change == "write in place":
        state.block_end[torch.tensor([1])] = state.block_end[1] + 2
    elif change == "write through a view":
        state.block_start[:2] += 1
    elif change == "replace the tensor":
        state.block_end = state.block_end - 1
    else:
        rows = torch.tensor([2, 0])
    assert torch.equal(state.in_block(rows), _in_block(state, rows))
    assert not torch.equal(state.in_block(rows), before)
    assert torch.equal(state.masked_in_block(rows), (state.x[rows] == IDS.mask) & _in_block(state, rows))
    assert state.masked_in_block(rows) is not masked


def test_a_committed_token_changes_the_mask_tables():
    state, rows = _state(), torch.arange(3)
    masks = state.is_mask
    state.x[1, 5] = 3
    assert state.is_mask is not masks and not bool(state.is_mask[1, 5]) and bool(masks[1, 5])
    assert not bool(state.masked_in_block(rows)[1, 5])


def test_tables_of_inference_tensors_are_made_at_every_call():
    with torch.inference_mode():
        state = _state()
        rows = torch.arange(3)
        first = state.in_block(rows)
        state.block_end[0] += 3
        assert state.in_block(rows) is not first
        assert torch.equal(state.in_block(rows), _in_block(state, rows))


def test_reach_and_writable_columns_end_at_each_rows_end():
    state, rows = _state(), torch.tensor([0, 2])
    state.row_end[2] = 9
    cols = torch.arange(state.length)
    assert torch.equal(state.in_reach(rows), torch.stack([cols < 14, cols < 9]))
    assert torch.equal(state.writable(rows), torch.stack([(cols >= 4) & (cols < 14), (cols >= 4) & (cols < 9)]))


@pytest.mark.parametrize("dtype", [torch.long, torch.float32])
def test_add_at_adds_like_indexed_addition(dtype):
    torch.manual_seed(0)
    t = torch.randint(0, 9, (7,)).to(dtype)
    rows = torch.tensor([5, 0, 3])
    for value in (1, torch.tensor([2, -1, 4]).to(dtype), torch.tensor(3).to(dtype)):
        want = t.clone()
        want[rows] += value
        add_at(t, rows, value)
        assert torch.equal(t, want)


@pytest.mark.parametrize("shape", [(1, 1), (1, 13), (4, 7), (5, 33)])
@pytest.mark.parametrize("given_most", [False, True])
def test_select_positions_lists_the_marked_columns_in_order(shape, given_most):
    torch.manual_seed(shape[1])
    mask = torch.rand(shape) < 0.4
    mask[0] = False                                   # a row that marks nothing
    most = int(mask.sum(1).max())
    positions, valid = select_positions(mask, most if given_most else None)
    assert positions.shape == valid.shape == (shape[0], max(most, 1))
    for b in range(shape[0]):
        cols = mask[b].nonzero().flatten().tolist()
        n = len(cols)
        assert positions[b, :n].tolist() == cols and valid[b, :n].all()
        assert not valid[b, n:].any() and (positions[b, n:] == 0).all()


def test_top1_picks_the_first_of_equal_maxima_among_valid_entries():
    conf = torch.tensor([[0.2, 0.7, 0.7, 0.1], [0.9, 0.3, 0.9, 0.3], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    valid = torch.tensor([[True, True, True, True], [False, True, True, True], [False, False, False, False]])
    want = torch.zeros_like(valid)
    want[0, 1] = want[1, 2] = True                    # row 2 has no valid entry: nothing
    assert torch.equal(top1(conf, valid), want)


def test_attention_blocks_are_counted_from_each_rows_first_real_token():
    """`to_attention_blocks` against the blocks listed one by one: [pad + k size, pad + (k + 1) size)."""
    gen, size = 24, 4
    x = torch.full((4, 8 + gen), IDS.mask, dtype=torch.long)
    state = DecodeState(x=x, gen_start=8, gen_length=gen, block_length=8,
                        pad_len=torch.tensor([0, 1, 3, 6]), ids=IDS)
    for first in range(8, 8 + gen):
        for end in range(first + 1, 8 + gen + 1):
            starts, ends = state.to_attention_blocks(torch.full((4,), first), torch.full((4,), end), size)
            for r, pad in enumerate(state.pad_len.tolist()):
                blocks = [(b, b + size) for b in range(pad, 8 + gen + size, size)]
                want_start = next(b for b, e in blocks if b <= first < e)
                want_end = next(e for b, e in blocks if b <= end - 1 < e)
                assert (starts[r].item(), ends[r].item()) == (want_start, want_end), (first, end, pad)
