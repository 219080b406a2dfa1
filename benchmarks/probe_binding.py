"""Can the training recipe learn to bind pairs by content? A synthetic diagnostic for `dllm train`.

Shuffle, the random insert/replace tasks and sort need a content lookup: given the first name of a
list item, find that name in the prompt and take the token after it. This script isolates that
lookup on random tokens, with the shipped model's architecture and `dllm.train`'s loss, init (with
`--prev-token-head`, the built previous-token head), AdamW settings and gradient
clip (the learning rate warms up over 100 steps and then stays constant, without the cosine decay):

* prompt:   BOS a1 b1 a2 b2 ... an bn NEWLINE   (2n distinct random regular tokens, n in [3, pairs])
* response: the n pairs in a random order (`--order shuffled`) or in the prompt's order
            (`--order same`, the positional control), then EOT and EOS padding
* training: `dllm.train.diffusion_loss` (masked-mean, t = u^2); in half of the rows the mask covers
            one side of every pair (all a's or all b's), `dllm.train.bind_rows` as `bind_mask` uses it
* curriculum (`--global-pairs F`): a share F of the training examples draw their pairs from one
            fixed global pairing (b = f(a)), a bigram that a previous-token head alone can
            predict; the random-pair binding is then built on that head
* probe:    every `--every` steps, on fresh examples with every b masked and every a shown, the
            share of b's predicted exactly (chance is about 1 / n)

    python benchmarks/probe_binding.py                          # 2000 steps, 3-8 pairs, shuffled
    python benchmarks/probe_binding.py --prev-token-head        # with the built previous-token head
    python benchmarks/probe_binding.py --order same             # the positional control
    python benchmarks/probe_binding.py --layers 2 --steps 8000 --global-pairs 0.5
    python benchmarks/probe_binding.py --model dllm/assets/llada-pb-tiny --probe-size 40

Measured on a 2-core CPU (binding accuracy; chance about 0.18):
* `--prev-token-head` (a previous-token head built in at init, `dllm.train.previous_token_head`):
  0.34 after 250 steps, 0.96 after 500.
* defaults (the mimetic init alone), shuffled: 0.22 after 2000 steps, 0.19 after
  10000; 2 layers: 0.18 after 15000. `--order same`: 0.93 after 400 steps, 1.00 after 2000:
  positional copying is learned, content lookup is not.
* `--layers 2 --steps 8000 --global-pairs 0.5`: at chance until 3000 steps,
  then 0.39 at 4000 and 0.51 at 8000: the global bigrams grow a previous-token head first and
  the lookup follows.
* 6 layers, `--lr 2e-3`: `--global-pairs 0.5` 0.46 at 4000, 0.65 at 8000;
  `--global-pairs 0.3` 0.32 at 8000; `--global-pairs 0.8` and no global pairs at chance (0.17,
  0.20) after 8000; `--global-pairs 0.5` at lr 1e-3 0.22 after 8000.

`--model FOLDER` probes a trained model instead, on held-out generated prompts: the binding
accuracy on copy, shuffle and insert_random (every last name hidden, the first names shown), and
the repeat probability on shuffle (`repeat_probability`), once with the committed name shown and
once with it masked. docs/training.md gives what it measured on the models of the training
recipes.

The tokens are drawn from the shipped model's tokenizer (its regular, non-special tokens), so the
vocabulary is the real runs'. The examples and the probe are `dllm.train.pair_example` and
`dllm.train.binding_accuracy`, which `dllm train` uses for its pair curriculum (`pair_warmup_steps`).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dllm.eval.names import DEFAULT_SOURCE, NAME_SOURCES  # noqa: E402
from dllm.models.llada import LLaDAModel  # noqa: E402
from dllm.models.loading import default_model_path  # noqa: E402
from dllm.train import (INITS, TrainConfig, bind_rows, binding_accuracy, copy_vocab, diffusion_loss,  # noqa: E402
                        encode_records, global_pairing, init_weights, make_batch, model_config, pair_example,
                        response_sides)


def repeat_probability(model, tokenizer, records: list[dict], canvas: int = 0) -> tuple[float, float]:
    """On shuffle prompts: the mean probability a model gives to repeating a committed last name.
    The answer is the input list in its own order; the canvas shows its punctuation and the last
    token of the last item's last name, everything else masked; the score is the probability of
    that same token at the end of the first item's last name (a valid answer never repeats it).
    Returns (shown, masked): the second masks that last name too, the same probability with
    nothing committed, so the pair says whether the model rules out a name it has already written."""
    task = "waiting_line/shuffle"
    in_order = [{**r, "answer": {**r["answer"], "example": json.dumps(r["answer"]["input"])}} for r in records]
    items, _ = encode_records(tokenizer, {task: in_order}, canvas)
    x, valid, pos, cols = make_batch(items, model.config.pad_token_id)
    sides = response_sides(items)
    last = (sides == 2) & (torch.nn.functional.pad(sides[:, 1:], (0, 1)) != 2)   # last token of each last name
    idx = torch.arange(sides.shape[1]).expand_as(sides)
    first_end = torch.where(last, idx, sides.shape[1]).min(1).values             # the first item's
    last_at = torch.where(last, idx, -1).max(1).values                            # the last item's
    resp = x.gather(1, cols)
    target = resp.gather(1, last_at[:, None])
    out = []
    for keep in ((sides == 0) | (idx == last_at[:, None]), sides == 0):
        canvas = x.scatter(1, cols, torch.where(keep, resp, torch.full_like(resp, model.config.mask_token_id)))
        with torch.no_grad():
            logits = model(canvas, cols.gather(1, first_end[:, None]), position_ids=pos, key_valid=valid)
        out.append(logits.float().softmax(-1).gather(2, target[..., None]).mean().item())
    return out[0], out[1]


def probe_model(path: str, n: int, names: str = DEFAULT_SOURCE) -> None:
    """Binding accuracy on held-out generated prompts (every last name hidden, first names shown;
    people from `names`) and the repeat probability, for a trained model folder, on its canvas."""
    import dllm
    from dllm.decode import checkpoint_gen_length
    from dllm.eval import generators

    model, tokenizer = dllm.load(path, dtype="float32")
    model.eval()
    cfg, canvas = model.config, checkpoint_gen_length(model) or 0
    for task in ("waiting_line/copy", "waiting_line/shuffle", "waiting_line/insert_random"):
        records = generators.make_records(task, split="test", num_samples=n, names=names)
        items, _ = encode_records(tokenizer, {task: records}, canvas)
        print(f"{task}: binding accuracy {binding_accuracy(model, cfg.mask_token_id, cfg.pad_token_id, items):.3f}")
    records = generators.make_records("waiting_line/shuffle", split="test", num_samples=n, names=names)
    shown, masked = repeat_probability(model, tokenizer, records, canvas)
    print(f"waiting_line/shuffle: repeat probability {shown:.3f} (with that name still masked: {masked:.3f})",
          flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=8, help="most pairs per example (at least 3)")
    ap.add_argument("--order", choices=("shuffled", "same"), default="shuffled")
    ap.add_argument("--layers", type=int, default=TrainConfig.n_layers)
    ap.add_argument("--d-model", type=int, default=TrainConfig.d_model)
    ap.add_argument("--heads", type=int, default=TrainConfig.n_heads)
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--init", choices=INITS, default=TrainConfig.init)
    ap.add_argument("--prev-token-head", action=argparse.BooleanOptionalAction, default=False,
                    help="build a previous-token head into layer 0 at init (dllm.train.previous_token_head)")
    ap.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    ap.add_argument("--bind-rows", type=float, default=0.5, help="share of rows masked on one side of every pair")
    ap.add_argument("--global-pairs", type=float, default=0.0,
                    help="share of training examples whose pairs follow one fixed global pairing (b = f(a), "
                         "a bigram a single previous-token head can use); the probe always uses random pairs")
    ap.add_argument("--every", type=int, default=100, help="probe every this many steps")
    ap.add_argument("--probe-size", type=int, default=64)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None,
                    help="probe this trained model folder on held-out generated prompts instead of training")
    ap.add_argument("--names", default=DEFAULT_SOURCE, choices=NAME_SOURCES, help="the probe prompts' people (--model)")
    args = ap.parse_args(argv)
    for name in ("steps", "every", "probe_size", "batch_size", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.pairs < 3:
        ap.error(f"--pairs must be >= 3, got {args.pairs}")
    for name in ("bind_rows", "global_pairs"):
        if not 0 <= getattr(args, name) <= 1:
            ap.error(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}")

    torch.set_num_threads(args.threads)
    if args.model is not None:
        probe_model(args.model, args.probe_size, args.names)
        return 0
    cfg = TrainConfig(out="unused", d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, lr=args.lr,
                      init=args.init, prev_token_head=args.prev_token_head, seed=args.seed,
                      prev_head_input="embedding", next_token_head=False)   # the probe's own head options
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(default_model_path()))
    mcfg = model_config(cfg, tokenizer)
    torch.manual_seed(args.seed)
    model = LLaDAModel(mcfg, attention="eager")
    init_weights(model, cfg)
    forward = torch.compile(model, dynamic=True) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    vocab = copy_vocab(tokenizer)
    rng, probe_rng = random.Random(args.seed), random.Random(args.seed + 1)
    gen = torch.Generator().manual_seed(args.seed)
    pairing = global_pairing(vocab[0], seed=99)
    probe = [pair_example(probe_rng, vocab, args.pairs, args.order) for _ in range(args.probe_size)]
    print(f"pairs 3-{args.pairs}, order {args.order}, {args.layers} layers, d_model {args.d_model}, "
          f"{args.heads} heads, lr {args.lr}, init {args.init}, previous-token head {args.prev_token_head}, global pairs {args.global_pairs}, "
          f"{mcfg.n_params:,} parameters; "
          f"chance about {2 / (3 + args.pairs):.2f}", flush=True)
    t0, losses = time.perf_counter(), []
    for step in range(1, args.steps + 1):
        for g in opt.param_groups:
            g["lr"] = args.lr * min(1.0, step / 100)
        items = [pair_example(rng, vocab, args.pairs, args.order,
                              pairing if args.global_pairs and rng.random() < args.global_pairs else None)
                 for _ in range(args.batch_size)]
        x, valid, pos, cols = make_batch(items, mcfg.pad_token_id)
        fixed, rows = bind_rows(response_sides(items), args.bind_rows, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = diffusion_loss(forward, x, valid, pos, cols, mcfg.mask_token_id, cfg.eps, gen, "masked-mean",
                                  cfg.t_power, fixed=fixed, fixed_rows=rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss.item())
        if step % args.every == 0 or step == args.steps:
            acc = binding_accuracy(model, mcfg.mask_token_id, mcfg.pad_token_id, probe)
            recent = losses[-args.every:]
            print(f"step {step} loss {sum(recent) / len(recent):.3f} binding accuracy {acc:.2f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
