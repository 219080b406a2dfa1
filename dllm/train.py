"""Masked-diffusion supervised training of a small LLaDA-architecture model on ParallelBench data.

    dllm train --out runs/pb-tiny                   # the shipped default model's recipe (three phases)
    dllm train --out runs/pb-tiny                   # run again: resumes from runs/pb-tiny/checkpoint.pt

Data: prompts and answers of our ParallelBench generators' *train* split (disjoint from the test
split used for evaluation), for the Waiting Line and Puzzle tasks, rendered exactly as the
benchmark renders them (task template, one-shot example turn, chat template), so the model also
runs on the official files. The response is the answer, `<|eot_id|>`, then `<|endoftext|>` up to
the task's canvas length (32 or 64 tokens), as LLaDA's SFT pads answers with EOS, which teaches
the model to fill a fixed-length canvas.

Initialisation: "mimetic" (the default; see `init_weights`). Every task needs the model to copy
from its prompt: find, in the query list, the visible neighbour of a masked token and take the
token next to it. With a plain N(0, 0.02) init, a small bidirectional model trained on these
~220-token sequences sat for thousands of steps predicting only the list punctuation and
prior-likely names (measured: 0/16 held-out copies after 2250 steps). Starting each attention
layer with W_k = W_q and W_o = W_v^T, and a larger embedding, it copies held-out lists exactly after
a few hundred steps.

Copy warm-up (`copy_warmup_steps`, 0 by default): the first batches can be synthetic copy examples
(4-10 distinct random tokens after BOS, repeated on a 12-token canvas). Measured, it teaches
copying at a fixed offset from BOS, which does not carry over to the tasks; kept as an option.

Objective: per sequence draw a mask ratio t in (0, 1], mask each response token with
probability t (the prompt never), and minimise the cross-entropy on the masked tokens.
`--loss llada` is LLaDA's SFT estimator: t ~ U(eps, 1], each sequence's masked cross-entropy
weighted by 1/t and normalised by the response length. `--loss masked-mean` (the default)
draws t = u^t_power (u ~ U(0, 1], clipped at eps), so most sequences have few masks, and averages
the cross-entropy over every masked token of the batch. Both train the same denoiser (predict each
masked token from the visible ones); on this data the second learns to copy from the prompt in a
fraction of the steps: on a pure copy task with 1000 random symbols, a 2-layer model at lr 1e-3
left the unigram plateau after about 900 steps with masked-mean and t = u^2, and not within 1500
with the 1/t-weighted uniform-t loss (nor at lr 3e-3), which leaves a CPU-sized budget learning
nothing but the list punctuation.

In-context answers (`mask_example`, 0.5 by default): in that fraction of rows, the answer of the
prompt's one-shot example is masked as well, with the row's t, and its masked tokens join the
loss. Every task prompt carries a solved example of the same task, so this doubles the supervised
tokens of a forward at no extra cost. At inference the example is always visible; half of the
training rows still show it. Measured at 1000 steps: masked-token accuracy 0.842 against 0.802
without it.

Name binding (`bind_mask`, 0.15 in the shipped recipe, 0.25 in its previous version): in that fraction of the list-task rows, the response
is masked on one side of every name: all first-name tokens (or all last-name tokens) and nothing
else. Under confidence-ordered decoding the model commits one side of the names first and must
then find each name's other half in the prompt by content (the token beside it); under i.i.d.
masking that state is rare, and elimination or position often answer it instead.

Task mix (`task_weights`, `DEFAULT_TASK_WEIGHTS`): each batch holds one task, drawn with these
weights ("PATTERN=W,...", globs over task ids; unmatched tasks weigh 1; an empty string draws
uniformly). `train_info.json` records how many batches each task got.

Content lookup (`prev_token_head`, and the pair curriculum `pair_warmup_steps`, `pair_share`,
`pair_max`, `pair_lr`, `pair_global`; the shipped model builds the head, from biases, and does
not use the pair curriculum):
shuffle, the random insert/replace tasks and sort need a content lookup (given a list item's first
name in the answer, find that name in the prompt and take the token after it). With the mimetic
init alone the recipe learns positional copying within a few hundred steps but never this lookup:
`benchmarks/probe_binding.py` isolates it on random token pairs (prompt `a1 b1 ... an bn`, answer
the pairs shuffled) and finds the binding at chance after 10000 steps, and the shipped model names
the right last name of a shuffle answer about a third of the time. The lookup is a previous-token
head followed by a match on the previous token; the mimetic heads can make the match, and the
previous-token head is what never formed. `prev_token_head` builds it into layer 0 at init
(`previous_token_head`): the probe then binds shuffled pairs at 0.96 after 500 steps. The pair
curriculum starts training with `pair_warmup_steps` batches of synthetic pairs (`pair_example`,
half the rows masked on one side of every pair) at the rate `pair_lr`; afterwards a share
`pair_share` of the batches stay pair batches, and the cosine schedule runs from `lr` over the
steps after the warm-up. `pair_global` draws that share of the pair examples from one fixed global
pairing (b = f(a), a bigram): without the built head, at lr 2e-3 and half global pairs, the
probe's lookup formed after 4000 steps in one run and not within 8000 in a full training run.

Measured, one full run with the head (`--prev-token-head true --pair-warmup-steps 1000 --pair-share
0.1 --steps 20000`, 70 min on 2 threads): the lookup carries over to the real names (one forward
with every last name of a held-out answer hidden: 0.98 right on shuffle, 0.97 on insert_random,
after 1250 steps), and sort at one token per step rises from 7% to 70%, but the decoded answers
repeat names and symbols: shuffle 0%, insert_random 1%, Latin squares 0% (rows of one symbol),
Sudoku 59%, average 57.4 against the shipped 71.2. That model does not rule out what it has
written: on held-out shuffle canvases with the punctuation and the last item's last name shown, it
gives the first item's last name the same name with probability 0.314, and 0.315 with that name
masked too (`probe_binding.py --model`); the shipped model gives 0.003 and 0.374. Read off the
attention, the shipped model's prompt names find their committed copies in the answer through
same-token matches in layer 0 (0.23 and 0.47 of two heads' attention), and the model with the head
has none (at most 0.006 in any head of any layer). On one hand-made canvas it put 0.74 on "Bradley"
for the second item's last name with the third item's "Bradley" shown and its first name masked,
0.009 with that first name shown too. In short runs (`probe_binding.py --model` on checkpoints,
committed name shown / masked), the shipped recipe rules out written names by 1000 steps (0.120 /
0.301); with the head (its shared component at half each embedding's norm in these three runs) it
had not at 1000 steps without the pair curriculum (0.553 / 0.529), nor with 8 heads per layer
(0.411 / 0.413), nor at 3000 steps with it (0.120 / 0.120). The other way round, building the head
into the shipped recipe's 1000-step checkpoint and training on (a one-off run), keeps the
ruling-out (0.019 / 0.458 after 1000 more steps) but the lookup does not form (shuffle binding
0.31, 0.33 and 0.27 after 1000, 2000 and 4500 more steps, 0.30 with 500 pair warm-up steps first).
Lookup and ruling-out have not yet been had together.

`prev_head_input` says what the built head reads. "embedding" (as above) adds the
shared component to every embedding. "bias" (the default) leaves the embedding alone: the model gets q/k/v biases
(LLaDA's `include_qkv_bias`, zero at init), and head 0 of layer 0 gets zero query and key weights
and constant query and key biases (`PREV_HEAD_BIAS` 8 times the same rotary codes), so its scores
depend on positions only; at init it puts 0.85 of its attention on p - 1 in the default shape over
200 random tokens (the embedding variant 0.31 there). Measured, one run (`--prev-token-head true
--prev-head-input bias --steps 9500 --precision fp32`, no pair curriculum), on checkpoints: after
1000 steps (smoothed loss 0.706; the shipped recipe 0.854 there) shuffle binding 0.970,
insert_random 0.960, repeat probability 0.086 / 0.084 (shown / masked: no ruling-out yet); after
2000 steps binding 0.985 and 0.971, repeats 0.112 / 0.126, and decoded at one token per step on the
first 16 held-out samples: shuffle 62, insert_random 44, replace_random 0 (it returns the input
list unchanged). At the end (9500 steps, 5568 s of steps on 2 threads of an Intel Xeon, with four
short probes beside it; final smoothed loss 0.17), on the full held-out split at one token per step
(`benchmarks/eval_model.py --tokens-per-step 1`): copy 100, reverse 100, remove_index 100,
replace_index 97, insert_index 87, remove_random 57, insert_random 45, replace_random 27, shuffle
31, sort 67, Latin square 0, Sudoku 71.3; average 65.2 against the shipped 71.2. Above the shipped
model on sort (67 against 7), insert_random (45 / 35) and shuffle (31 / 21), below it on the grids,
remove_random and replace_random. It still writes names twice, and its Latin squares are not
learned in the steps 90 minutes buy here (Sudoku 0 and Latin 0 on 16 samples at step 4000, 31 and
0 at step 6000). Not shipped.

Whole-name tokens (`whole_names`) and embedding updates (`embed_update`), both off by default (the
shipped model uses neither): with `whole_names` the tokenizer keeps each "First Last" of the
training text as one token (`--vocab-size 24576` on the default data gives 19042 tokens), which
removes the first/last binding from every list task; what is left is copying whole names and ruling
out the ones already written. With 19000 rows, most names occur in few batches, and dense Adam moves
every tied row on every step: in a run with the default dense update the name embeddings collapsed
towards one direction (mean cosine between name rows 0.89 after 4000 steps) and copy was still 0%.
`embed_update="frozen"` keeps the embedding at its init; "lazy" updates only the rows of tokens
present in the batch (and the mask token), with sparse Adam state. Measured, one run each
(`--whole-names true --vocab-size 24576 --precision fp32`, Latin squares at weight 3, 8000 steps,
first 25 held-out samples per task at one token per step): frozen, 77 min on 2 threads of an Intel
Xeon: copy 100, reverse 100, remove_index 100, remove_random 96, replace_index 96, insert_index 36,
insert_random 8, replace_random 24, shuffle 24, sort 0, Latin square 0, Sudoku 0 (answers repeat
names and symbols: it copies but does not rule out). Lazy, 83 min (two probes ran beside it): copy
100, reverse 100, remove_index 100, remove_random 100, replace_index 96, insert_index 60, shuffle
52, replace_random 44, insert_random 40, Sudoku 16, sort 0, Latin square 0 (shuffle above the
shipped model's 21, insert_random near its 35, the others that fall short below it; Latin rows still
repeat symbols; 3.7M parameters, 2.4M of them the embedding). Both runs are far from the grids at
this budget, and so is the shipped recipe (fp32, its 18000-step schedule) at 3000 and 5000 steps:
Sudoku 0 and Latin 0 on 16 samples each at both (shuffle 19 and 31, insert_random 12 and 69). In
that recipe the grids come after step 5000 (47 min of fp32 steps here); 90 minutes here buy about
9500 steps. At batch size 16 the lazy whole-name step runs about twice as fast (3.4-4.2 steps/s
here), so a third run took 17000 steps of 16 rows in 5337 s (`--batch-size 16 --steps 17000`, sort
at weight 1, Latin squares 3, Sudoku 1.5; a short benchmark ran beside it for 9 of those minutes).
On the full held-out split at one token per step: copy 99, reverse 100, remove_index 99,
insert_index 86, replace_index 84, remove_random 87, replace_random 30, insert_random 27, shuffle 18,
sort 0, Latin square 8, Sudoku 3.7, average 53.5 against the shipped 71.2. Its answers repeat names
and grid symbols (one name three times in a shuffle answer, a digit twice in a Sudoku row): the
ruling-out of written tokens that the shipped recipe forms did not form in this run. At lr 1e-3
(not re-tuned per batch size), batch size 32 is the most efficient of 16, 32 and 64 early in
training (the shipped recipe in fp32 here; smoothed loss at about 600 s and about 32000 rows seen):
batch 16 1.335 at 2000 steps (667 s), batch 32 0.854 at 1000 steps (588 s), batch 64 1.280 at 500
steps (635 s). With whole names, batch 16 after 128000 rows (8000 steps) had 0.482 against 0.391
for batch 32 (4000 steps). At batch 32, lr 2e-3 had 1.593 at 1000 steps against 0.854 at 1e-3.

Going on from a model (`init_from`, empty by default): training starts from the weights and the
tokenizer of a LLaDA model folder of the recipe's shape (`vocab_size` and `whole_names` are then
unused), and `train_info.json` records the SHA-256 of its weights. Measured, once: from the shipped
model, 20000 records per task, lr 5e-4 to 5e-5 over 6500 steps, `bind_mask` 0.4, the batches
weighted to the tasks it fails (shuffle 2.5, Latin squares 3, the random insert and replace 2,
sort and remove_random 1, Sudoku and the index tasks 0.5, copy and reverse 0.25); after 2500
steps, on the first 40 held-out samples at one token per step: insert_random 40 (the shipped model
42 on the same samples), replace_random 35 (68), shuffle 40, sort 8, Latin square 48. The run was
stopped at step 3000 for the run above.

Later phases in the same recipe (`then_steps`, 6500,2000 in the shipped recipe, 0 for none; `then_lr`,
`then_min_lr`, `then_seed`, `then_task_weights`, one value per later phase): the first phase trains in
`out/phase1`, then each later phase goes on from the model of the one before (as `init_from` does)
with its own settings, fresh training records from its seed, no warm-up batches, everything else
the same; the last one trains in `out`. One `dllm train` command so makes a model that needs
re-weighted stretches at the end (the grids, say, after the list tasks); `train_info.json`
records the whole recipe and each phase's own record.

Lookup both ways and ruling-out together (`next_token_head`, `hole_mask`, both on in the shipped recipe):
read off the decoding trace (`generate(..., trace=True)`), the models above commit most of a list
item's last name before its first name, so the first name needs the lookup the other way (find
the last name in the prompt, take the token before it). With the previous-token head alone that
reverse lookup stays at chance: one forward with every first name of 40 held-out shuffle answers
hidden and the last names shown gets 0.333 of them right (0.956 the other way round), on the
4000-step checkpoint of a run with `--hole-mask 0.35`. Holes alone (the same run without the
next-token head) brought the ruling-out (repeat probability 0.025 / 0.446 at 4000 steps) but not that lookup.
`next_token_head` builds head 1 of layer 0 from q/k biases as the mirror of the bias-built
previous-token head, attending to p + 1 (0.6 or more of its attention at init). `hole_mask`: in
that share of the list-task rows (drawn among those `bind_mask` leaves), the mask covers whole
names, both sides of each, each name with one probability p ~ U(0, 1) per row, at least one name,
and nothing else (`hole_rows`). With a lookup built in, a masked token with the other side of its
name shown is answered by the lookup, and the i.i.d. mask seldom asks which names are left to write;
a hole asks exactly that. Measured on checkpoints of one run with both (`--prev-token-head true
--prev-head-input bias --next-token-head true --hole-mask 0.35 --bind-mask
0.15 --steps 8500 --precision fp32`): the reverse lookup binds 0.963 after 1000 steps (the forward
one 0.933); the ruling-out forms by 2000 steps (repeat probability 0.050 with the committed name
shown against 0.335 with it masked; 0.015 / 0.295 at 4000); on the first 16 held-out samples at
one token per step, shuffle 81, insert_random 100, replace_random 25 at 2000 steps and shuffle 100,
insert_random 94, replace_random 75, sort 69 at 4000, where the grids were still at 0 (Latin squares
of one repeated symbol). At the end (8500 steps, 4920 s of steps on 2 threads of an Intel Xeon with
short probes beside it, final smoothed loss 0.18), on the full held-out split at one token per
step (`benchmarks/eval_model.py --tokens-per-step 1`): copy 99, reverse 96, remove_index 99,
replace_index 99, insert_index 38, remove_random 100, insert_random 98, replace_random 94, shuffle
97, sort 78, Latin square 2, Sudoku 7.4; average 75.6 against 71.2 for the model shipped then.
The list tasks with many answers are solved; insert_index puts the new name one place off (a valid
insertion at the wrong index), and the grids are not learned within these steps. That run is the
shipped recipe's first phase. Its second phase (`then_steps` 6500, `THEN_TASK_WEIGHTS`, lr 8e-4 to
8e-5, seed 1; 4397 s) brings, on the full split at one token per step: copy 99, reverse 99,
insert_index 100, remove_index 99, replace_index 97, insert_random 99, remove_random 99,
replace_random 90, shuffle 98, sort 69, Latin square 50, Sudoku 82.4; average 90.1. On the first
16 held-out samples the grids were at Latin 12 / Sudoku 56 after 2250 and after 3500 steps of it.
The third phase (`then_steps` 2000, `LAST_TASK_WEIGHTS`: Latin squares 6, Sudoku 1.5, every Waiting
Line task 0.3; lr 5e-4 to 5e-5, seed 2; 1120 s) brings the Latin squares from 50 to 82; sort falls
from 69 to 59, the rest move by 2 points or less: copy 99, reverse 97, insert_index 100, remove_index 100, replace_index 99,
insert_random 100, remove_random 99, replace_random 92, shuffle 97, sort 59, Sudoku 87; average 92.6
(full split, one token per step). That is the shipped model.

The LM head runs on the masked columns only (`hidden_at` then `head_logits`, see `diffusion_loss`),
so a large vocabulary costs little outside the embedding.

Speed (`precision`, `compile`): the step is compiled with `torch.compile`, with plain-math
attention (the `eager` backend, which the compiler fuses). `--precision bf16` runs it under bf16
autocast (the weights and the optimizer stay fp32 and the exported checkpoint is fp32): on a 2-core
CPU with bf16 matrix units that ran the previous shipped model's shape at about 3.8 steps/s against
2.3 for eager fp32 with sdpa. On an Intel Xeon without them bf16 is slower than fp32, so the
shipped recipe is fp32 (about 1.7 steps/s there). `--precision fp32 --compile false` gives the
plain fp32 step.

Tokenizer: a byte-level BPE built with the `tokenizers` library on the rendered training text,
digits kept one per token (Sudoku cells), with LLaDA's special tokens and chat format. The result
is saved in the real LLaDA Hugging Face layout (config.json with LLaDA keys, model.safetensors,
tokenizer files with the chat template, generation_config.json) and loads with `dllm.load`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

BOS, EOS, EOT, MASK = "<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
SPECIAL_TOKENS = [BOS, EOS, HEADER_START, HEADER_END, EOT, MASK]
CHAT_TEMPLATE = (
    "{{- '" + BOS + "' -}}"
    "{%- for message in messages -%}"
    "{{- '" + HEADER_START + "' + message['role'] + '" + HEADER_END + "\\n\\n' + (message['content'] | trim)"
    " + '" + EOT + "' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '" + HEADER_START + "assistant" + HEADER_END + "\\n\\n' -}}"
    "{%- endif -%}"
)

DEFAULT_TASKS = (
    "waiting_line/copy", "waiting_line/reverse", "waiting_line/sort", "waiting_line/shuffle",
    "waiting_line/insert_index", "waiting_line/insert_random", "waiting_line/remove_index",
    "waiting_line/remove_random", "waiting_line/replace_index", "waiting_line/replace_random",
    "puzzle/latin_square_n4", "puzzle/sudoku_n4_12",
)


# Batches per task relative to the others: copy and reverse are learned first and need fewer; the
# tasks with many valid answers (shuffle, *_random), sort and the Latin square need more.
DEFAULT_TASK_WEIGHTS = ("waiting_line/copy=0.5,waiting_line/reverse=0.5,waiting_line/*_random=1.5,"
                        "waiting_line/shuffle=1.5,waiting_line/sort=1.5,puzzle/latin_square_n4=2")

LOSSES = ("masked-mean", "llada")
INITS = ("mimetic", "normal")
PRECISIONS = ("bf16", "fp32")
EMBED_UPDATES = ("dense", "lazy", "frozen")
PREV_HEAD_INPUTS = ("embedding", "bias")

# The later phases of the shipped recipe. Second: the grids and insert_index, the tasks still short
# after the first, weigh most. Third: the Latin squares, still at 50% after the second.
THEN_TASK_WEIGHTS = ("waiting_line/copy=0.25,waiting_line/reverse=0.25,waiting_line/*_index=0.5,"
                     "waiting_line/insert_index=2,waiting_line/*_random=0.75,waiting_line/shuffle=0.75,"
                     "waiting_line/sort=0.75,puzzle/latin_square_n4=5,puzzle/sudoku_n4_12=3")
LAST_TASK_WEIGHTS = "waiting_line/*=0.3,puzzle/latin_square_n4=6,puzzle/sudoku_n4_12=1.5"
# The then_ fields: one value per later phase; on the command line numbers are comma-separated and
# task weights (which hold commas) semicolon-separated.
THEN_FIELDS = {"then_steps": int, "then_lr": float, "then_min_lr": float, "then_seed": int, "then_task_weights": str}
NO_LATER_PHASES = {name: () for name in THEN_FIELDS}   # the then_ fields of a single-phase run


def _then_values(name: str, value, kind: type) -> tuple:
    """A then_ field as a tuple of `kind`, one value per later phase, from a tuple or list, one value,
    or command-line text (numbers comma-separated, task weights semicolon-separated). then_steps 0
    (or nothing) means no later phase."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = value.split(";") if kind is str else [v for v in value.split(",") if v.strip()]
        try:
            values = tuple(v.strip() if kind is str else kind(v.strip()) for v in parts)
        except ValueError:
            raise ValueError(f"{name} must be {kind.__name__} values, comma-separated, one per later phase; "
                             f"got {value!r}") from None
    elif isinstance(value, (list, tuple)):
        values = tuple(value)
    else:
        values = (value,)
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}[kind]
    bad = [v for v in values if not ok(v)]
    if bad:
        raise ValueError(f"{name} must be {kind.__name__} values, one per later phase; got {bad[0]!r} in {value!r}")
    values = tuple(float(v) for v in values) if kind is float else values
    return () if name == "then_steps" and values == (0,) else values


@dataclass
class TrainConfig:
    """The recipe. Every field is a `dllm train` flag; the defaults make the shipped model."""

    out: str = "runs/pb-tiny"
    seed: int = 0
    tasks: tuple = DEFAULT_TASKS
    samples_per_task: int = 13000
    vocab_size: int = 2048
    whole_names: bool = False
    embed_update: str = "dense"
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    mlp_hidden: int = 384
    tie_embeddings: bool = True
    init_from: str = ""
    steps: int = 8500
    copy_warmup_steps: int = 0
    pair_warmup_steps: int = 0
    pair_lr: float = 1e-3
    pair_global: float = 0.0
    pair_share: float = 0.0
    pair_max: int = 8
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eps: float = 1e-3
    rope_theta: float = 10000.0
    init: str = "mimetic"
    prev_token_head: bool = True
    prev_head_input: str = "bias"
    next_token_head: bool = True
    embed_std: float = 0.1
    qk_std: float = 0.06
    vo_std: float = 0.05
    loss: str = "masked-mean"
    t_power: float = 2.0
    mask_example: float = 0.5
    bind_mask: float = 0.15
    hole_mask: float = 0.35
    task_weights: str = DEFAULT_TASK_WEIGHTS
    then_steps: tuple = (6500, 2000)
    then_lr: tuple = (8e-4, 5e-4)
    then_min_lr: tuple = (8e-5, 5e-5)
    then_seed: tuple = (1, 2)
    then_task_weights: tuple = (THEN_TASK_WEIGHTS, LAST_TASK_WEIGHTS)
    precision: str = "fp32"
    compile: bool = True
    save_every: int = 250
    threads: int | None = None
    name: str = "pb-tiny"

    def __post_init__(self):
        ints = ("samples_per_task", "vocab_size", "d_model", "n_layers", "n_heads", "mlp_hidden", "steps",
                "batch_size", "save_every")
        for k in ints:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"train option {k} must be a positive integer, got {v!r}")
        w = self.copy_warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < self.steps:
            raise ValueError(f"copy_warmup_steps must be an integer in [0, steps={self.steps}), got {w!r}")
        p = self.pair_warmup_steps
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self.steps - w:
            raise ValueError(f"pair_warmup_steps must be an integer in [0, steps - copy_warmup_steps = "
                             f"{self.steps - w}), got {p!r}")
        if not 0 < self.pair_lr < 1:
            raise ValueError(f"pair_lr must be in (0, 1), got {self.pair_lr}")
        if not 0 <= self.pair_global <= 1:
            raise ValueError(f"pair_global must be in [0, 1], got {self.pair_global}")
        if not 0 <= self.pair_share < 1:
            raise ValueError(f"pair_share must be in [0, 1), got {self.pair_share}")
        if isinstance(self.pair_max, bool) or not isinstance(self.pair_max, int) or not 3 <= self.pair_max <= 64:
            raise ValueError(f"pair_max must be an integer in [3, 64], got {self.pair_max!r}")
        if self.embed_update not in EMBED_UPDATES:
            raise ValueError(f"embed_update {self.embed_update!r} is not one of {', '.join(EMBED_UPDATES)}")
        if not isinstance(self.whole_names, bool):
            raise ValueError(f"whole_names must be true or false, got {self.whole_names!r}")
        if not isinstance(self.prev_token_head, bool):
            raise ValueError(f"prev_token_head must be true or false, got {self.prev_token_head!r}")
        if not isinstance(self.next_token_head, bool):
            raise ValueError(f"next_token_head must be true or false, got {self.next_token_head!r}")
        if self.next_token_head and self.n_heads < 2:
            raise ValueError(f"next_token_head builds head 1 of layer 0 and needs n_heads >= 2, got {self.n_heads}")
        if self.prev_head_input not in PREV_HEAD_INPUTS:
            raise ValueError(f"prev_head_input {self.prev_head_input!r} is not one of {', '.join(PREV_HEAD_INPUTS)}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if not 0 < self.lr < 1 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"need 0 < lr < 1 and 0 <= min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if self.init not in INITS:
            raise ValueError(f"init {self.init!r} is not one of {', '.join(INITS)}")
        for k in ("embed_std", "qk_std", "vo_std"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise ValueError(f"{k} must be in (0, 1], got {v}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not one of {', '.join(LOSSES)}")
        if not 0 < self.t_power <= 10:
            raise ValueError(f"t_power must be in (0, 10], got {self.t_power}")
        if not 0 <= self.mask_example <= 1:
            raise ValueError(f"mask_example must be in [0, 1], got {self.mask_example}")
        if not 0 <= self.bind_mask <= 1:
            raise ValueError(f"bind_mask must be in [0, 1], got {self.bind_mask}")
        if not 0 <= self.hole_mask <= 1 - self.bind_mask:
            raise ValueError(f"hole_mask must be in [0, 1 - bind_mask = {1 - self.bind_mask:g}], got {self.hole_mask}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be true or false, got {self.compile!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if isinstance(self.tasks, str):
            self.tasks = tuple(t.strip() for t in self.tasks.split(",") if t.strip())
        from .eval import generators

        bad = [t for t in self.tasks if t not in generators.generator_tasks()]
        if bad or not self.tasks:
            raise ValueError(f"cannot train on task(s) {', '.join(bad) or '(none)'}; generated tasks: "
                             f"{', '.join(generators.generator_tasks())}")
        self.sampling_weights()
        for name, kind in THEN_FIELDS.items():
            setattr(self, name, _then_values(name, getattr(self, name), kind))
        if self.then_steps:
            n = len(self.then_steps)
            if any(t < 1 for t in self.then_steps):
                raise ValueError(f"then_steps must be integers >= 1, one per later phase (none: no later "
                                 f"phase), got {list(self.then_steps)}")
            for name in THEN_FIELDS:
                have = getattr(self, name)
                if len(have) == 1 and n > 1:
                    setattr(self, name, have * n)
                elif len(have) != n:
                    raise ValueError(f"{name} has {len(have)} value(s) {list(have)} for {n} later phase(s) "
                                     f"(then_steps {list(self.then_steps)}); give one per phase or one for all")
            for lr, min_lr in zip(self.then_lr, self.then_min_lr):
                if not 0 < lr < 1 or not 0 <= min_lr <= lr:
                    raise ValueError(f"need 0 < then_lr < 1 and 0 <= then_min_lr <= then_lr in each later "
                                     f"phase, got then_lr={lr}, then_min_lr={min_lr}")
            for i in range(n):
                self.then_phase(i, "")

    def then_phase(self, i: int, start: str) -> "TrainConfig":
        """Later phase `i` (0: the second phase) of the recipe: a run going on from the model folder
        `start` of the phase before, with its own step count, learning rates, seed (so fresh training
        records) and task weights (empty: the first phase's), no copy or pair warm-up and no later
        phases of its own; everything else as in the first phase."""
        return dataclasses.replace(
            self, init_from=start, steps=self.then_steps[i], lr=self.then_lr[i], min_lr=self.then_min_lr[i],
            copy_warmup_steps=0, pair_warmup_steps=0, seed=self.then_seed[i],
            task_weights=self.then_task_weights[i] or self.task_weights, **NO_LATER_PHASES)

    def sampling_weights(self) -> dict[str, float] | None:
        """How often each task's batches are drawn, from `task_weights` ("PATTERN=W,...", glob
        patterns over task ids, the last match wins, unmatched tasks weigh 1; a pattern must name
        some generated task, and one naming only tasks outside `tasks` is ignored so the default
        weights work with any task subset); None when every task weighs the same (uniform draws)."""
        from fnmatch import fnmatchcase

        from .eval import generators

        generated = generators.generator_tasks()
        weights = {t: 1.0 for t in self.tasks}
        for item in (i.strip() for i in self.task_weights.split(",")):
            if not item:
                continue
            pattern, sep, value = item.rpartition("=")
            try:
                w = float(value)
            except ValueError:
                w = float("nan")
            if not sep or not pattern or not (w >= 0 and math.isfinite(w)):
                raise ValueError(f"task_weights entry {item!r} is not PATTERN=WEIGHT with a weight >= 0")
            known = [t for t in generated if fnmatchcase(t, pattern.strip())]
            if not known:
                raise ValueError(f"task_weights pattern {pattern.strip()!r} matches none of the generated "
                                 f"tasks {', '.join(generated)}")
            hits = [t for t in self.tasks if t in known]  # patterns for tasks not trained on are ignored
            weights.update(dict.fromkeys(hits, w))
        if not any(weights.values()):
            raise ValueError(f"task_weights {self.task_weights!r} gives every task weight 0")
        return None if len(set(weights.values())) == 1 else weights


# -- data -----------------------------------------------------------------------------------------
def training_records(cfg: TrainConfig) -> dict[str, list[dict]]:
    """Records of the generators' train split, `samples_per_task` per task (shard = seed)."""
    from .eval import generators

    return {t: generators.make_records(t, split="train", num_samples=cfg.samples_per_task, shard=cfg.seed % 1000)
            for t in cfg.tasks}


def answer_text(record: dict) -> str:
    ans = record["answer"]
    return ans if isinstance(ans, str) else ans["example"]


@functools.lru_cache(maxsize=1)
def _chat_template():
    from jinja2 import Template
    return Template(CHAT_TEMPLATE)


def render_prompt(task_id: str, record: dict) -> str:
    """The chat-formatted prompt text (generation prompt included), as the tokenizer's chat
    template renders it."""
    from .eval.tasks import messages

    return _chat_template().render(messages=messages(task_id, record), add_generation_prompt=True)


# A person's "First Last" name, kept as one pre-token when `whole_names` is on; otherwise text is
# split as GPT-2's byte-level BPE splits it (the alternatives after the first).
WHOLE_NAME = r"[A-Z][a-z]+ [A-Z][a-z]+"
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def build_tokenizer(texts, vocab_size: int, whole_names: bool = False):
    """A byte-level BPE (`tokenizers`) with digits split one per token and LLaDA's special tokens;
    returned as a transformers PreTrainedTokenizerFast carrying the chat template.

    whole_names: a capitalised word, one space and another capitalised word ("Ann Lee") stay one
    pre-token, so the BPE can learn one token per full name of the training text; other text is
    split as GPT-2 splits it. Names the training text never held fall back to smaller pieces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    steps = [pre_tokenizers.Digits(individual_digits=True)]
    if whole_names:
        steps.append(pre_tokenizers.Split(Regex(WHOLE_NAME + "|" + GPT2_SPLIT), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not whole_names))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                   mask_token=MASK, additional_special_tokens=[HEADER_START, HEADER_END, EOT],
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


@dataclass
class Encoded:
    task: str
    prompt: list[int]
    response: list[int]      # answer + EOT + EOS padding, exactly the task's canvas length
    examples: tuple = ()     # (start, stop) of each in-context example's answer inside `prompt`
    sides: tuple = ()        # per response token: 1 first name, 2 last name of a list item, 0 other


def name_sides(tokens: list[str]) -> tuple:
    """Per token of a rendered answer: 1 for the first-name tokens of a quoted list item, 2 for its
    last-name tokens (from the first token that starts with a space), 0 for everything else. An
    item opens at a token ending in a quote outside an item ('["', ' "') and closes at a token
    starting with one ('",', '"]'). Tokens are the tokenizer's own strings ('Ġ' marks a space)."""
    sides, inside = [], 0
    for t in tokens:
        if inside and t.startswith('"'):
            inside = 0
            sides.append(0)
        elif inside:
            if inside == 1 and t.startswith("Ġ"):
                inside = 2
            sides.append(inside)
        else:
            sides.append(0)
            inside = 1 if t.endswith('"') else 0
    return tuple(sides)


def _find(seq: list[int], sub: list[int], start: int) -> int:
    """First index >= start where `sub` occurs in `seq`, or -1."""
    n = len(sub)
    for i in range(start, len(seq) - n + 1):
        if seq[i:i + n] == sub:
            return i
    return -1


def example_spans(tokenizer, prompt: list[int], turns: list[dict]) -> tuple:
    """Where the answers of the in-context examples sit in a prompt's ids: one (start, stop) per
    assistant turn, searched in order after the end of the turn before it (a copy example's
    question holds the same list as its answer)."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    spans, at = [], 0
    for turn in turns:
        if turn["role"] == "user":
            at = prompt.index(eot, at) + 1
            continue
        ids = tokenizer(turn["content"].strip(), add_special_tokens=False)["input_ids"]
        i = _find(prompt, ids, at)
        if i < 0 or not ids:
            raise ValueError(f"an in-context answer ({turn['content'][:40]!r}) does not tokenize the same inside "
                             f"the prompt")
        spans.append((i, i + len(ids)))
        at = prompt.index(eot, i + len(ids)) + 1
    return tuple(spans)


def encode_records(tokenizer, records: dict[str, list[dict]]) -> tuple[list[Encoded], dict[str, int]]:
    """Token ids of every record; records whose answer does not fit the canvas are counted, not kept."""
    from .eval.tasks import get_task, messages

    eos, eot = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(EOT)
    out, dropped = [], {}
    for task_id, recs in records.items():
        canvas = get_task(task_id).max_tokens
        prompts = tokenizer([render_prompt(task_id, r) for r in recs], add_special_tokens=False)["input_ids"]
        answers = tokenizer([answer_text(r) for r in recs], add_special_tokens=False)["input_ids"]
        for r, p, a in zip(recs, prompts, answers):
            if len(a) + 1 > canvas:
                dropped[task_id] = dropped.get(task_id, 0) + 1
                continue
            spans = example_spans(tokenizer, p, messages(task_id, r))
            response = a + [eot] + [eos] * (canvas - len(a) - 1)
            sides = name_sides(tokenizer.convert_ids_to_tokens(a)) + (0,) * (canvas - len(a))
            out.append(Encoded(task_id, p, response, spans, sides))
    return out, dropped


COPY_WARMUP_LENGTHS = (4, 10)     # symbols per synthetic copy example; the canvas is 12


def copy_example(tokenizer, rng: random.Random) -> Encoded:
    """One synthetic copy example of the warm-up: `n` distinct random non-special tokens; the
    prompt is BOS, the tokens and a newline, the response the same tokens, EOT and EOS padding."""
    regular, newline, bos, eot, eos = _copy_vocab(tokenizer)
    ids = rng.sample(regular, rng.randint(*COPY_WARMUP_LENGTHS))
    canvas = COPY_WARMUP_LENGTHS[1] + 2
    return Encoded("copy-warmup", [bos] + ids + newline, ids + [eot] + [eos] * (canvas - len(ids) - 1))


@functools.lru_cache(maxsize=4)
def _copy_vocab(tokenizer):
    special = set(tokenizer.all_special_ids)
    regular = [i for i in range(len(tokenizer)) if i not in special]
    ids = tokenizer.convert_tokens_to_ids
    return regular, tokenizer("\n", add_special_tokens=False)["input_ids"], ids(BOS), ids(EOT), ids(EOS)


PAIR_BIND_ROWS = 0.5               # share of pair-curriculum rows masked on one side of every pair


def global_pairing(regular: list[int], seed: int) -> dict[int, int]:
    """A fixed pairing of the regular tokens: half of them (in a seeded random order) each mapped to
    a distinct token of the other half."""
    order = list(regular)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return dict(zip(order[:half], order[half:2 * half]))


def pair_example(rng: random.Random, vocab, pairs: int, order: str = "shuffled",
                 pairing: dict[int, int] | None = None) -> Encoded:
    """One synthetic pair-binding example: the prompt is BOS, n pairs `a1 b1 ... an bn` (n drawn
    in [3, pairs]) and a newline; the response is the n pairs in a random order (`order="shuffled"`)
    or in the prompt's order (`"same"`), then EOT and EOS padding on a 2 * pairs + 2 canvas. With
    `pairing`, every b is pairing[a] (a global bigram), else the 2n tokens are distinct random
    regular tokens. `vocab` is `_copy_vocab(tokenizer)`; sides mark a's 1 and b's 2."""
    if order not in ("shuffled", "same"):
        raise ValueError(f"order {order!r} is not 'shuffled' or 'same'")
    regular, newline, bos, eot, eos = vocab
    n = rng.randint(3, pairs)
    if pairing is None:
        toks = rng.sample(regular, 2 * n)
        items = [(toks[2 * i], toks[2 * i + 1]) for i in range(n)]
    else:
        items = [(a, pairing[a]) for a in rng.sample(sorted(pairing), n)]
    out = items[:]
    if order == "shuffled":
        rng.shuffle(out)
    canvas = 2 * pairs + 2
    response = [t for item in out for t in item]
    sides = (1, 2) * n + (0,) * (canvas - 2 * n)
    prompt = [bos] + [t for item in items for t in item] + newline
    return Encoded("pair-binding", prompt, response + [eot] + [eos] * (canvas - 2 * n - 1), (), sides)


def binding_accuracy(model, mask_id: int, pad_id: int, examples: list[Encoded]) -> float:
    """Content lookup: the share of second-side tokens (last names, b's) predicted exactly in one
    forward with every one of them masked and everything else shown."""
    x, valid, pos, cols = make_batch(examples, pad_id)
    sides = response_sides(examples)
    target = x.gather(1, cols)
    hide = sides == 2
    noisy = x.clone()
    noisy.scatter_(1, cols, torch.where(hide, torch.full_like(target, mask_id), target))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(noisy, cols, position_ids=pos, key_valid=valid)
    model.train(was_training)
    return float(((logits.argmax(-1) == target) & hide).sum() / hide.sum().clamp(min=1))


def make_batch(items: list[Encoded], pad_id: int):
    """Left-padded (B, L) ids, key validity, recounted positions and the response columns (B, G)."""
    lp = max(len(e.prompt) for e in items)
    g = len(items[0].response)
    B, L = len(items), lp + g
    x = torch.full((B, L), pad_id, dtype=torch.long)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, e in enumerate(items):
        x[b, lp - len(e.prompt):lp] = torch.tensor(e.prompt)
        x[b, lp:] = torch.tensor(e.response)
        valid[b, lp - len(e.prompt):] = True
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    cols = torch.arange(lp, L).expand(B, g)
    return x, valid, pos, cols


def response_sides(items: list[Encoded]) -> torch.Tensor:
    """(B, G) name sides of the response tokens of a batch (see `name_sides`)."""
    g = len(items[0].response)
    return torch.tensor([list(e.sides) or [0] * g for e in items], dtype=torch.long)


def bind_rows(sides: torch.Tensor, share: float, generator: torch.Generator):
    """The name-binding masks of a batch: (fixed (B, G) bool, rows (B, 1) bool) for
    `diffusion_loss`. A row with names is chosen with probability `share`; its mask covers one side
    of every name (first or last, a fair draw per row) and nothing else."""
    B = sides.shape[0]
    rows = (torch.rand(B, 1, generator=generator) < share) & (sides > 0).any(1, keepdim=True)
    side = 1 + ((torch.rand(B, 1, generator=generator) < 0.5) & (sides == 2).any(1, keepdim=True)).long()
    fixed = sides == side
    return fixed, rows


def hole_rows(sides: torch.Tensor, taken: torch.Tensor, share: float, generator: torch.Generator):
    """The whole-name masks of a batch: (fixed (B, G) bool, rows (B, 1) bool) for `diffusion_loss`.
    Among the rows with names not in `taken` (B, 1), one is chosen with probability `share`; its
    mask covers every token of each name (both sides, a list item's run of `sides` > 0) with one
    probability p ~ U(0, 1) per row, at least one name, and nothing else."""
    B, G = sides.shape
    named = sides > 0
    start = named & ~torch.cat([torch.zeros(B, 1, dtype=torch.bool), named[:, :-1]], dim=1)
    item = start.long().cumsum(1) - 1                             # item index of each name token
    n_items = start.sum(1)                                        # (B,)
    rows = (torch.rand(B, 1, generator=generator) < share) & (n_items > 0)[:, None] & ~taken
    p = torch.rand(B, 1, generator=generator)
    k = max(1, int(n_items.max()))
    hit = torch.rand(B, k, generator=generator) < p               # (B, items)
    forced = (torch.rand(B, generator=generator) * n_items.clamp(min=1)).long().clamp(max=k - 1)
    none = ~(hit & (torch.arange(k) < n_items[:, None])).any(1)
    hit[none, forced[none]] = True
    fixed = named & hit.gather(1, item.clamp(min=0))
    return fixed, rows


def example_columns(items: list[Encoded], L: int):
    """Canvas columns of the in-context answers of a batch made by `make_batch` (prompts end at
    column L - G): (B, E) columns and (B, E) validity. Rows with fewer are padded with column 0,
    which is never masked (a prompt starts with BOS; a shorter row's column 0 is padding)."""
    g = len(items[0].response)
    lp = L - g
    per_row = [[lp - len(e.prompt) + j for a, b in e.examples for j in range(a, b)] for e in items]
    E = max(1, max(len(c) for c in per_row))
    cols = torch.zeros(len(items), E, dtype=torch.long)
    ok = torch.zeros(len(items), E, dtype=torch.bool)
    for b, c in enumerate(per_row):
        if c:
            cols[b, :len(c)] = torch.tensor(c)
            ok[b, :len(c)] = True
    return cols, ok


def diffusion_loss(model, x, valid, pos, cols, mask_id: int, eps: float, generator: torch.Generator,
                   loss: str = "llada", t_power: float = 1.0, extra_cols: torch.Tensor | None = None,
                   extra_ok: torch.Tensor | None = None, fixed: torch.Tensor | None = None,
                   fixed_rows: torch.Tensor | None = None, head=None):
    """Masked-diffusion loss on one batch: response tokens masked w.p. t, cross-entropy on them.

    loss="llada": t ~ U(eps, 1] (`t_power` ignored), per sequence sum(CE on masked) / t / G, the
    batch mean (LLaDA SFT; an unbiased estimate of the ELBO bound, E = log V for uniform logits).
    loss="masked-mean": t = max(u^t_power, eps), the mean CE over all masked tokens of the batch.

    extra_cols (B, E) with extra_ok (B, E): prompt columns (the in-context answers of the rows
    chosen for it) that are masked with the same t as their row's response and join the loss;
    extra_ok False entries are left alone.

    fixed (B, G) bool with fixed_rows (B, 1) bool: in those rows the response mask is `fixed`
    instead of the random draw (the draws are made for every row all the same).

    head: None when `model(noisy, cols, position_ids=, key_valid=)` returns logits (B, G', V); else
    `model` returns hidden states (B, G', d) (`hidden_at`) and `head` (`head_logits`) maps only the
    masked ones to logits. Same loss; with a large vocabulary most of the LM head's work and the
    (B, G', V) float logits are skipped (on average two thirds of the columns are unmasked)."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r} is not one of {', '.join(LOSSES)}")
    B, G = cols.shape
    u = torch.rand(B, 1, generator=generator)
    t = eps + (1 - eps) * u if loss == "llada" else u.pow(t_power).clamp(min=eps)
    masked = torch.rand(B, G, generator=generator) < t
    if fixed is not None:
        masked = torch.where(fixed_rows, fixed, masked)
    if extra_cols is not None:
        ex_masked = (torch.rand(extra_cols.shape, generator=generator) < t) & extra_ok
        cols = torch.cat([extra_cols, cols], dim=1)
        masked = torch.cat([ex_masked, masked], dim=1)
    target = x.gather(1, cols)
    noisy = x.clone()
    noisy.scatter_(1, cols, torch.where(masked, torch.full_like(target, mask_id), target))
    out = model(noisy, cols, position_ids=pos, key_valid=valid)          # (B, G', V) or (B, G', d)
    if head is None:
        ce = F.cross_entropy(out.float().transpose(1, 2), target, reduction="none")   # (B, G')
    else:
        picked = F.cross_entropy(head(out[masked]).float(), target[masked], reduction="none")   # (N,)
        ce = torch.zeros(masked.shape, dtype=picked.dtype, device=picked.device).masked_scatter(masked, picked)
    if loss == "llada":
        return ((ce * masked / t).sum(1) / G).mean()
    return (ce * masked).sum() / masked.sum().clamp(min=1)


# -- the model ------------------------------------------------------------------------------------
def model_config(cfg: TrainConfig, tokenizer):
    from .config import ModelConfig

    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in (("mask", MASK), ("eos", EOS), ("bos", BOS), ("eot", EOT))}
    return ModelConfig(family="llada", vocab_size=len(tokenizer), d_model=cfg.d_model, n_layers=cfg.n_layers,
                       n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads, mlp_hidden=cfg.mlp_hidden, norm_eps=1e-5,
                       rope_theta=cfg.rope_theta, max_seq_len=1024, mask_token_id=ids["mask"], eos_token_id=ids["eos"],
                       pad_token_id=ids["eos"], bos_token_id=ids["bos"], eot_token_id=ids["eot"],
                       qkv_bias=(cfg.prev_token_head and cfg.prev_head_input == "bias") or cfg.next_token_head,
                       tie_embeddings=cfg.tie_embeddings, rope_fp32=True, logit_shift=False)


def init_weights(model, cfg: TrainConfig) -> None:
    """Every matrix N(0, 0.02). With init="mimetic" (after Trockman & Kolter, "Mimetic
    Initialization of Self-Attention Layers", 2023), each attention layer starts with W_k = W_q
    (entries N(0, qk_std)) and W_o = W_v^T (entries N(0, vo_std)), so that W_q W_k^T and W_v W_o
    are near multiples of the identity: from the first step a position attends to positions that
    look like it and adds what it finds; the embedding is N(0, embed_std). The copying every task
    needs (find the neighbour of a masked token in the prompt, take the token next to it) then
    forms within a few hundred steps instead of not at all within a CPU budget. With
    `prev_token_head` (on in the shipped recipe), head 0 of the first layer is then built as a previous-token
    head (`previous_token_head`), the first half of the content lookup."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        for layer in model.layers:
            for lin in (layer.attn.q, layer.attn.k, layer.attn.v):
                if lin.bias is not None:
                    lin.bias.zero_()
        if cfg.init == "mimetic":
            torch.nn.init.normal_(model.embed.weight, std=cfg.embed_std)
            for layer in model.layers:
                attn = layer.attn
                if attn.k.weight.shape != attn.q.weight.shape or attn.o.weight.shape != attn.v.weight.T.shape:
                    raise ValueError("mimetic init needs as many key/value heads as query heads")
                torch.nn.init.normal_(attn.q.weight, std=cfg.qk_std)
                attn.k.weight.copy_(attn.q.weight)
                torch.nn.init.normal_(attn.v.weight, std=cfg.vo_std)
                attn.o.weight.copy_(attn.v.weight.T)
    if cfg.prev_token_head:
        previous_token_head(model, torch.Generator().manual_seed(cfg.seed + 1), cfg.prev_head_input)
    if cfg.next_token_head:
        next_token_head(model)


PREV_HEAD_PAIRS, PREV_HEAD_SCALE, PREV_HEAD_BIAS = 3, 6.0, 8.0


def previous_token_head(model, generator: torch.Generator, via: str = "embedding") -> None:
    """Make head 0 of the first layer attend to the previous position, whatever the tokens.

    Every token embedding gets a shared component: a random unit direction u times the embedding's
    own norm. The head's query and key read only u, into the `PREV_HEAD_PAIRS` fastest rotary
    frequency pairs, with the query rotated back by one position per pair, so that after RoPE the
    score q_p . k_j is a sum of cos(theta_i (j - p + 1)): largest at j = p - 1. With
    `PREV_HEAD_SCALE` 6 it puts 0.31 of the head's attention on p - 1 at init (measured on 200
    random tokens with the default model shape; more on shorter sequences, above 0.6 on the
    23-token test); the bias variant (`via="bias"`, `PREV_HEAD_BIAS` 8) puts 0.85 there.

    Content lookup (given a_i in the answer, find a_i in the prompt and take the token after it)
    is a previous-token head followed by a match on the previous token, which the mimetic heads
    of the later layers can already make (their W_q = W_k match positions whose states look alike).
    Left to form by itself the previous-token head never did within a CPU budget; built in,
    `benchmarks/probe_binding.py --prev-token-head` binds shuffled random pairs at 0.96 after 500 steps."""
    cfg = model.config
    d, D = cfg.d_model, cfg.head_dim
    if D // 2 < PREV_HEAD_PAIRS:
        raise ValueError(f"a previous-token head needs head_dim >= {2 * PREV_HEAD_PAIRS}, got {D}")
    if via not in PREV_HEAD_INPUTS:
        raise ValueError(f"previous-token head input {via!r} is not one of {', '.join(PREV_HEAD_INPUTS)}")
    attn = model.layers[0].attn
    if via == "bias" and (attn.q.bias is None or attn.k.bias is None):
        raise ValueError("a previous-token head built from biases needs a model with q/k/v biases (qkv_bias)")
    with torch.no_grad():
        if via == "bias":
            _bias_head(attn, cfg, head=0, offset=1)
            return
        u = torch.randn(d, generator=generator)
        u /= u.norm()
        emb = model.embed.weight
        emb += emb.norm(dim=1, keepdim=True) * u
        cq, ck = _prev_head_codes(cfg)
        attn.q.weight[:D] = PREV_HEAD_SCALE * torch.outer(cq, u) / math.sqrt(d)
        attn.k.weight[:D] = PREV_HEAD_SCALE * torch.outer(ck, u) / math.sqrt(d)


def next_token_head(model) -> None:
    """Make head 1 of the first layer attend to the next position, whatever the tokens: zero query
    and key weights and constant query and key biases (`PREV_HEAD_BIAS` times `_prev_head_codes`
    with offset -1), so that its score is a sum of cos(theta_i (j - p - 1)), largest at j = p + 1.

    The mirror of the bias-built previous-token head, for the lookup the other way: given a last
    name in the answer, find it in the prompt and take the token before it. Under confidence-ordered
    decoding the models trained here commit most last names before their first names."""
    cfg = model.config
    D = cfg.head_dim
    attn = model.layers[0].attn
    if cfg.n_heads < 2 or D // 2 < PREV_HEAD_PAIRS:
        raise ValueError(f"a next-token head needs n_heads >= 2 and head_dim >= {2 * PREV_HEAD_PAIRS}, got "
                         f"{cfg.n_heads} heads of {D}")
    if attn.q.bias is None or attn.k.bias is None:
        raise ValueError("a next-token head is built from biases and needs a model with q/k/v biases (qkv_bias)")
    with torch.no_grad():
        _bias_head(attn, cfg, head=1, offset=-1)


def _bias_head(attn, cfg, head: int, offset: int) -> None:
    """Give `head` of `attn` zero query and key weights and constant query and key biases
    (`PREV_HEAD_BIAS` times `_prev_head_codes(cfg, offset)`): its scores depend on positions only."""
    D = cfg.head_dim
    rows = slice(head * D, (head + 1) * D)
    cq, ck = _prev_head_codes(cfg, offset)
    attn.q.weight[rows] = 0
    attn.k.weight[rows] = 0
    attn.q.bias[rows] = PREV_HEAD_BIAS * cq
    attn.k.bias[rows] = PREV_HEAD_BIAS * ck


def _prev_head_codes(cfg, offset: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key directions of a positional head: the key on the `PREV_HEAD_PAIRS` fastest
    rotary pairs, the query the same rotated back by `offset` positions, so that q_p . k_j after
    RoPE is a sum of cos(theta_i (j - p + offset)), largest at j = p - offset (1: the previous
    token, -1: the next one)."""
    D = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2).double() / D))
    ck, cq = torch.zeros(D), torch.zeros(D)
    for i in range(PREV_HEAD_PAIRS):           # NeoX layout: dims i and i + D/2 rotate together
        ck[i] = 1.0
        cq[i], cq[i + D // 2] = math.cos(offset * inv_freq[i]), -math.sin(offset * inv_freq[i])
    return cq, ck


def save_pretrained(model, tokenizer, folder: str | Path, generation_defaults: dict | None = None) -> Path:
    """Write `model` and `tokenizer` in the LLaDA Hugging Face layout."""
    from safetensors.torch import save_file

    from .models.llada import config_to_hf, hf_names

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    state = model.state_dict()
    tensors = {hf: state[internal].detach().to("cpu").contiguous() for hf, internal in hf_names(cfg).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    dtype = str(next(iter(tensors.values())).dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(config_to_hf(cfg, torch_dtype=dtype), indent=2) + "\n")
    tokenizer.save_pretrained(str(folder))
    gen = {"_from_model_config": True, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
           "pad_token_id": cfg.pad_token_id, **(generation_defaults or {})}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return folder


def _lr(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over `warmup` steps to the peak (`pair_lr` in the pair warm-up, `lr` otherwise),
    constant `pair_lr` through the pair warm-up, then a cosine from `lr` to `min_lr` over the steps after
    it (steps before it, a copy warm-up, run at `lr`)."""
    pair_end = cfg.copy_warmup_steps + cfg.pair_warmup_steps
    in_pairs = cfg.copy_warmup_steps <= step < pair_end
    if step < cfg.warmup:
        return (cfg.pair_lr if in_pairs else cfg.lr) * (step + 1) / cfg.warmup
    if in_pairs:
        return cfg.pair_lr
    start = max(cfg.warmup, pair_end) if cfg.pair_warmup_steps else cfg.warmup
    p = (step - start) / max(1, cfg.steps - start)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(max(p, 0.0), 1.0)))


_NOT_RECIPE = ("out", "threads", "save_every", "name")
_SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "tie_embeddings",
                 "rope_theta", "qkv_bias")


def _start_model(cfg: TrainConfig):
    """(model, tokenizer, sha256 of its weights) of the LLaDA folder `cfg.init_from`: training goes on
    from those weights with that tokenizer (`_check_start_shape` then compares it with the recipe)."""
    import hashlib

    from .models.loading import load_model, load_tokenizer

    folder = Path(cfg.init_from)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"init_from {cfg.init_from!r} is not a model folder (no config.json there)")
    model = load_model(folder, dtype=torch.float32)
    if model.config.family != "llada":
        raise ValueError(f"init_from {cfg.init_from!r} holds a {model.config.family} model; "
                         f"training starts from LLaDA only")
    weights = folder / "model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else None
    return model, load_tokenizer(folder, "llada"), digest


def _check_start_shape(init_from: str, have, want) -> None:
    """The start model's config `have` against the recipe's `model_config` `want`, field by field."""
    bad = [f"{k} {getattr(have, k)} (recipe {getattr(want, k)})" for k in _SHAPE_FIELDS
           if getattr(have, k) != getattr(want, k)]
    if bad:
        raise ValueError(f"init_from {init_from!r} has another shape than the recipe: {', '.join(bad)}")


def train(cfg: TrainConfig, progress: bool = True, stop_after: int | None = None) -> Path | None:
    """Train (or resume from the checkpoints under `out`) and export the model to `<out>/model`;
    returns that folder, or None when `stop_after` optimizer steps (all phases counted) stopped
    the run first, checkpointed as an interruption would leave it."""
    if cfg.then_steps:
        return _train_phases(cfg, progress, stop_after)
    return _train_phase(cfg, progress, stop_after)


def _recipe(cfg: TrainConfig) -> dict:
    """The recipe fields of `cfg` as recorded in checkpoints and train_info.json."""
    recipe = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_RECIPE}
    for k in ("tasks", *THEN_FIELDS):
        recipe[k] = list(recipe[k])
    return recipe


def phase_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """The runs a recipe makes, in order: the first phase (all of cfg but the then_ fields), then one
    per later phase (`TrainConfig.then_phase`), each going on from the model of the one before. All
    but the last run in `out/phase<k>` (k from 1); the last in `out`."""
    n = len(cfg.then_steps) + 1
    outs = [str(Path(cfg.out) / f"phase{k}") for k in range(1, n)] + [cfg.out]
    runs = [dataclasses.replace(cfg, out=outs[0], **NO_LATER_PHASES)]
    for i in range(n - 1):
        runs.append(dataclasses.replace(cfg.then_phase(i, str(Path(outs[i]) / "model")), out=outs[i + 1]))
    return runs


def _train_phases(cfg: TrainConfig, progress: bool, stop_after: int | None) -> Path | None:
    """Each phase of `phase_configs` in turn, each resuming from its own checkpoint. `out/train_info.json`
    then holds the whole recipe, the totals and every phase's record. `stop_after` counts the
    steps of all phases together."""
    runs = phase_configs(cfg)
    done = 0
    for run in runs:
        left = None if stop_after is None else stop_after - done
        if left is not None and left <= 0:
            return None
        folder = _train_phase(run, progress, left)
        if folder is None:
            return None
        done += run.steps
    phases = [json.loads((Path(c.out) / "train_info.json").read_text()) for c in runs]
    info = {"recipe": _recipe(cfg), "steps": sum(p["steps"] for p in phases),
            "train_seconds": round(sum(p["train_seconds"] for p in phases), 1),
            "parameters": phases[-1]["parameters"],
            "batches_per_task": {t: sum(p["batches_per_task"].get(t, 0) for p in phases)
                                 for t in phases[-1]["batches_per_task"]},
            "init_from_sha256": phases[0]["init_from_sha256"],
            "torch": torch.__version__, "threads": torch.get_num_threads(), "phases": phases}
    (Path(cfg.out) / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return folder


def _train_phase(cfg: TrainConfig, progress: bool = True, stop_after: int | None = None) -> Path | None:
    """Train (or resume from `<out>/checkpoint.pt`) and export the model to `<out>/model`;
    returns that folder. `stop_after` stops (checkpointed, not exported) after that many
    optimizer steps in total, as an interruption would."""
    from .models.llada import LLaDAModel

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    recipe = _recipe(cfg)
    ckpt_path = out / "checkpoint.pt"
    tok_dir = out / "tokenizer"
    records = training_records(cfg)
    start = _start_model(cfg) if cfg.init_from else None
    if (tok_dir / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    elif start is not None:
        tokenizer = start[1]
        tokenizer.save_pretrained(str(tok_dir))
    else:
        texts = [render_prompt(t, r) + answer_text(r) for t, recs in records.items() for r in recs]
        tokenizer = build_tokenizer(texts, cfg.vocab_size, cfg.whole_names)
        tokenizer.save_pretrained(str(tok_dir))
    data, dropped = encode_records(tokenizer, records)
    by_task: dict[str, list[Encoded]] = {}
    for e in data:
        by_task.setdefault(e.task, []).append(e)
    tasks = sorted(by_task)
    weights = cfg.sampling_weights()
    if weights is not None:
        weights = [weights[t] for t in tasks]

    torch.manual_seed(cfg.seed)
    mcfg = model_config(cfg, tokenizer)
    # eager attention: plain matmuls and softmax, which torch.compile fuses and bf16 autocast runs
    # on the CPU's bf16 matrix units; sdpa's CPU backward in bf16 is several times slower.
    model = LLaDAModel(mcfg, attention="eager" if cfg.precision == "bf16" or cfg.compile else "sdpa")
    init_weights(model, cfg)
    if start is not None:
        _check_start_shape(cfg.init_from, start[0].config, mcfg)
        model.load_state_dict(start[0].state_dict())
    forward = torch.compile(model.hidden_at, dynamic=True) if cfg.compile else model.hidden_at
    emb = model.embed.weight
    if cfg.embed_update == "frozen":
        emb.requires_grad_(False)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and not (
        cfg.embed_update == "lazy" and p is emb)]
    decay = [p for n, p in params if p.dim() == 2 and "embed" not in n]
    no_decay = [p for n, p in params if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    emb_opt = torch.optim.SparseAdam([emb], lr=cfg.lr, betas=(0.9, 0.95)) if cfg.embed_update == "lazy" else None
    gen = torch.Generator().manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    step, seconds, log = 0, 0.0, []
    drawn = dict.fromkeys(tasks, 0)                 # batches drawn per task
    pair_batches = 0
    vocab = _copy_vocab(tokenizer)
    pairing = global_pairing(vocab[0], cfg.seed)
    if ckpt_path.is_file():
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["recipe"] != recipe:
            diff = sorted(k for k in recipe if recipe[k] != ck["recipe"].get(k))
            raise ValueError(f"{ckpt_path} was made with other settings ({', '.join(diff)}); use another --out "
                             f"or the same settings")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        if emb_opt is not None:
            emb_opt.load_state_dict(ck["embed_optimizer"])
        gen.set_state(ck["generator"])
        rng.setstate(ck["rng"])
        step, seconds, log = ck["step"], ck["seconds"], ck["log"]
        drawn = ck.get("drawn", drawn)
        pair_batches = ck.get("pair_batches", 0)
    model.train()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=cfg.steps, initial=step, desc="train", unit="step", file=sys.stderr)
    tokens_seen, t0, loss_avg = 0, time.perf_counter(), None
    while step < cfg.steps:
        pair_batch = False
        if step < cfg.copy_warmup_steps:
            items = [copy_example(tokenizer, rng) for _ in range(cfg.batch_size)]
        elif step < cfg.copy_warmup_steps + cfg.pair_warmup_steps or (cfg.pair_share and rng.random() < cfg.pair_share):
            pair_batch = True
            pair_batches += 1
            items = [pair_example(rng, vocab, cfg.pair_max, "shuffled",
                                  pairing if rng.random() < cfg.pair_global else None) for _ in range(cfg.batch_size)]
        else:
            task = tasks[rng.randrange(len(tasks))] if weights is None else rng.choices(tasks, weights)[0]
            pool = by_task[task]
            drawn[task] += 1
            items = [pool[rng.randrange(len(pool))] for _ in range(cfg.batch_size)]
        x, valid, pos, cols = make_batch(items, mcfg.pad_token_id)
        extra_cols = extra_ok = None
        if cfg.mask_example > 0:
            extra_cols, extra_ok = example_columns(items, x.shape[1])
            extra_ok &= torch.rand(len(items), 1, generator=gen) < cfg.mask_example
        fixed = fixed_rows = None
        holes = cfg.hole_mask > 0 and not pair_batch
        if cfg.bind_mask > 0 or pair_batch or holes:
            sides = response_sides(items)
            fixed, fixed_rows = bind_rows(sides, PAIR_BIND_ROWS if pair_batch else cfg.bind_mask, gen)
        if holes:                     # hole_mask > 0 implies bind_mask < 1
            hole, hole_in = hole_rows(sides, fixed_rows, cfg.hole_mask / (1 - cfg.bind_mask), gen)
            fixed = torch.where(hole_in, hole, fixed)
            fixed_rows = fixed_rows | hole_in
        for g in opt.param_groups + (emb_opt.param_groups if emb_opt is not None else []):
            g["lr"] = _lr(cfg, step)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            loss = diffusion_loss(forward, x, valid, pos, cols, mcfg.mask_token_id, cfg.eps, gen, cfg.loss,
                                  cfg.t_power, extra_cols, extra_ok, fixed, fixed_rows, head=model.head_logits)
        opt.zero_grad(set_to_none=True)
        emb.grad = None
        loss.backward()
        if emb_opt is not None:       # rows of tokens absent from the batch get no gradient at all
            present = torch.unique(torch.cat([x.flatten(), x.new_tensor([mcfg.mask_token_id])]))
            keep = torch.zeros(emb.shape[0], 1, dtype=emb.grad.dtype)
            keep[present] = 1
            emb.grad.mul_(keep)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if emb_opt is not None:
            emb.grad = torch.sparse_coo_tensor(present[None], emb.grad[present], emb.shape, check_invariants=False)
            emb_opt.step()
        step += 1
        tokens_seen += int(valid.sum())
        value = loss.item()
        loss_avg = value if loss_avg is None else 0.98 * loss_avg + 0.02 * value
        elapsed = time.perf_counter() - t0
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_avg:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}")
        stopping = stop_after is not None and step >= stop_after
        if step % cfg.save_every == 0 or step == cfg.steps or stopping:
            log.append({"step": step, "loss": loss_avg, "seconds": seconds + elapsed})
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save({"recipe": recipe, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "embed_optimizer": emb_opt.state_dict() if emb_opt is not None else None,
                        "generator": gen.get_state(), "rng": rng.getstate(), "step": step,
                        "seconds": seconds + elapsed, "log": log, "drawn": drawn,
                        "pair_batches": pair_batches}, tmp)
            tmp.replace(ckpt_path)
        if stopping:
            break
    if bar is not None:
        bar.close()
    if step < cfg.steps:
        return None
    total = seconds + (time.perf_counter() - t0)
    model.eval()
    folder = save_pretrained(model, tokenizer, out / "model")
    info = {"recipe": recipe, "steps": step, "train_seconds": round(total, 1), "parameters": mcfg.n_params,
            "records_per_task": {t: len(v) for t, v in by_task.items()}, "batches_per_task": drawn,
            "pair_batches": pair_batches,
            "init_from_sha256": start[2] if start is not None else None,
            "dropped_too_long": dropped,
            "loss_log": log, "torch": torch.__version__, "threads": torch.get_num_threads()}
    (out / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return folder


TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def _parse_bool(text: str) -> bool:
    import argparse

    low = text.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_train_arguments(parser) -> None:
    """One `--flag` per TrainConfig field, typed and defaulted from the dataclass."""
    defaults = TrainConfig.__dataclass_fields__
    for f in dataclasses.fields(TrainConfig):
        default = defaults[f.name].default
        flag = "--" + f.name.replace("_", "-")
        if f.name == "tasks":
            parser.add_argument(flag, default=None, help=f"comma-separated task ids (default: {','.join(default)})")
        elif f.name == "then_task_weights":
            parser.add_argument(flag, default=None, help="task weights of each later phase, semicolon-separated "
                                f"(default: {';'.join(default)})")
        elif f.name in THEN_FIELDS:
            none = "; 0: no later phase" if f.name == "then_steps" else ""
            parser.add_argument(flag, default=None, help="one value per later phase, comma-separated (default: "
                                f"{','.join(map(str, default))}{none})")
        elif isinstance(default, bool):
            parser.add_argument(flag, type=_parse_bool, default=None, help=f"true or false (default {default})")
        elif f.name == "threads":
            parser.add_argument(flag, type=int, default=None, help="torch threads (default: torch's choice)")
        else:
            parser.add_argument(flag, type=type(default), default=None, help=f"default {default}")


def config_from_args(args: dict) -> TrainConfig:
    from .config import check_fields

    check_fields(TrainConfig, args, "train")
    return TrainConfig(**args)


__all__ = ["TrainConfig", "train", "build_tokenizer", "save_pretrained", "diffusion_loss", "CHAT_TEMPLATE"]
