"""DUS, the dilated unmasking scheduler (arXiv:2506.19037; omerlux/DUS `generate_scheduled` with the
`dilated` scheduler).

Semi-autoregressive blocks; each block is split, before any forward, into groups of positions that
lie far apart, and each step commits one whole group with the candidate tokens (the argmax, or the
Gumbel-max sample at temperature > 0): no confidence decides anything, so a block of K positions
takes about log_base(K) forwards.

The groups of a block of K positions (offsets 0..K-1 from the block start): the stride starts at
K // base**base_skip and is divided by `base` (integer division) after each group; a group is every
offset not yet taken that is a multiple of the stride. Offsets left when the stride reaches 0 form
one more group, and a last group smaller than the one before it joins that one. With base 2:
K = 8 gives {0, 4}, {2, 6}, {1, 3, 5, 7}; K = 32 gives groups of 2, 2, 4, 8 and 16. base 1 makes
the whole block one group.

The reference's optional re-masking of low-confidence tokens after each group (they are never
decoded again and stay masked in its output) is off in its evaluation harness and not offered here;
neither is its early stop on stop tokens. `steps` is not used. Requirement, as in the reference:
gen_length % block_length == 0.
Published defaults: base 2, base_skip 1, block_length 32 (README; the paper uses 8 to 64),
temperature 0.
"""
from __future__ import annotations

import torch

from .base import Sampler, check_number
from dllm.state import Decision


def dilated_groups(block_length: int, base: int = 2, base_skip: int = 1) -> list[list[int]]:
    """The groups of offsets of a block of `block_length` positions, in decoding order (module docstring)."""
    if base == 1:
        return [list(range(block_length))]
    taken = [False] * block_length
    groups = []
    stride = block_length
    for _ in range(base_skip):         # block_length // base ** base_skip, without the power
        stride //= base
        if not stride:
            break
    while stride >= 1:
        group = [o for o in range(0, block_length, stride) if not taken[o]]
        for o in group:
            taken[o] = True
        if group:
            groups.append(group)
        stride //= base
    rest = [o for o in range(block_length) if not taken[o]]
    if rest:
        groups.append(rest)
    if len(groups) >= 2 and len(groups[-1]) < len(groups[-2]):
        groups[-2:] = [groups[-2] + groups[-1]]
    return groups


class Dilated(Sampler):
    """DUS: each step commits the next precomputed group of far-apart positions of the block."""

    name = "dus"
    uses_steps = False
    uses_blocks = True
    fixed_schedule = True
    whole_blocks = True
    row_state = ()

    def __init__(self, *, base: int = 2, base_skip: int = 1):
        check_number("base", base, low=1, integer=True, sampler=self.name)
        check_number("base_skip", base_skip, low=1, integer=True, sampler=self.name)
        self.base, self.base_skip = base, base_skip
        self._args = dict(base=base, base_skip=base_skip)

    def setup(self, state) -> None:
        G, K = state.gen_length, state.block_length
        if G % K:
            raise ValueError(f"sampler {self.name!r}: gen_length {G} must be a multiple of block_length {K}")
        groups = dilated_groups(K, self.base, self.base_skip)
        group_of = torch.empty(K, dtype=torch.long)
        for i, group in enumerate(groups):
            group_of[group] = i
        state.extra["dus_groups"] = [len(g) for g in groups]
        state.extra["dus_group_of"] = group_of.to(state.x.device)

    def planned_widths(self, state) -> list[int]:
        """Each block opens with its K masks and commits one group per step."""
        sizes, K = state.extra["dus_groups"], state.block_length
        left = [K - sum(sizes[:j]) for j in range(len(sizes))]
        return left * (state.gen_length // K)

    def step(self, state, rows, positions, valid, scores):
        offset = (positions - state.block_start[rows, None]).clamp(0, state.block_length - 1)
        group = state.extra["dus_group_of"][offset]                                  # (B', Q)
        return Decision(commit=valid & (group == state.step_in_block[rows, None]))
