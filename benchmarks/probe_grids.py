"""How far a trained model is from solving the grids, before its decoded scores leave zero.

A model partway to the grids decodes no valid Latin square or Sudoku yet; this probe measures the
two abilities a decode needs, in single forwards on held-out generated prompts (the test split),
so that checkpoints can be compared while their decoded scores are still 0:

* **one cell**: the answer on the canvas with one cell masked, everything else shown (the EOT and
  the padding too). The hidden cell is then fixed by its row, so the score is the share of cells
  predicted exactly. For Sudoku it is reported for the puzzle's blanks and its givens apart.
* **next cell**: the answer shown up to a cell and masked from it on, the state of a decode that
  writes from the left. A Latin-square prediction counts when it is one of the prompt's symbols
  and not yet in its row or in its column; a Sudoku one when it is the solution's digit (the
  puzzle's solution is unique), again for blanks and givens apart.

    python benchmarks/probe_grids.py --model runs/pb-tiny/model --canvas 64 --limit 24

Every cell of a record is probed twice, alone and with its next cell (32 probe rows per record of 16 cells).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LATIN, SUDOKU = "puzzle/latin_square_n4", "puzzle/sudoku_n4_12"


def cell_columns(tokenizer, answer: str) -> list[int]:
    """Response columns of a grid answer's cells (every token but the separators ',' and newline);
    raises when a cell is not a single token."""
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    cells = [j for j, t in enumerate(tokenizer.convert_ids_to_tokens(ids)) if t not in (",", "Ċ", "\n")]
    if len(cells) != 16:
        raise ValueError(f"a 4x4 grid answer tokenizes into {len(cells)} cells, not 16: {answer!r}")
    return cells


def latin_valid(symbol: str, symbols: list[str], grid: list[list[str]], cell: int) -> bool:
    """Whether writing `symbol` at `cell` (row-major) keeps the cells before it a partial Latin square."""
    r, c = divmod(cell, 4)
    return symbol in symbols and symbol not in grid[r][:c] and symbol not in [grid[i][c] for i in range(r)]


def probe_task(model, tokenizer, task: str, records: list[dict], canvas: int) -> dict[str, float]:
    """The one-cell and next-cell scores of `model` on `records` of one grid task."""
    from dllm.train.data import encode_records, make_batch

    items, dropped = encode_records(tokenizer, {task: records}, canvas)
    if dropped:
        raise ValueError(f"{sum(dropped.values())} {task} answers do not fit a canvas of {canvas}")
    mask_id = model.config.mask_token_id
    hits = {}
    for item, rec in zip(items, records):
        grid_text = rec["answer"]["example"] if task == LATIN else rec["answer"]
        cells = cell_columns(tokenizer, grid_text)
        x, valid, pos, cols = make_batch([item] * 32, model.config.pad_token_id)
        resp = x.gather(1, cols)
        for k, col in enumerate(cells):
            x[k, cols[k, col]] = mask_id                              # one cell
            x[16 + k, cols[16 + k, col:]] = mask_id                   # this cell and all after it
        query = torch.tensor(cells * 2)[:, None]
        with torch.no_grad():
            logits = model(x, cols.gather(1, query), position_ids=pos, key_valid=valid)
        pred = logits[:, 0].argmax(-1)
        truth = resp.gather(1, query)[:, 0]
        _score_rows(hits, task, rec, tokenizer, pred, truth)
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}


def _score_rows(hits: dict, task: str, rec: dict, tokenizer, pred: torch.Tensor, truth: torch.Tensor) -> None:
    """Adds the 32 probe rows of one record (16 one-cell, 16 next-cell) to `hits`."""
    if task == LATIN:
        symbols = rec["answer"]["symbols"]
        grid = [row.split(",") for row in rec["answer"]["example"].split("\n")]
        for k in range(16):
            hits.setdefault("one cell", []).append(bool(pred[k] == truth[k]))
            symbol = tokenizer.decode([int(pred[16 + k])]).strip()
            hits.setdefault("next cell valid", []).append(latin_valid(symbol, symbols, grid, k))
        return
    puzzle = rec["input"]["sudoku"].replace("\n", "")
    for k in range(16):
        kind = "blanks" if puzzle[k] == "0" else "givens"
        hits.setdefault(f"one cell {kind}", []).append(bool(pred[k] == truth[k]))
        hits.setdefault(f"next cell {kind}", []).append(bool(pred[16 + k] == truth[16 + k]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a trained model folder")
    ap.add_argument("--canvas", type=int, default=0,
                    help="response canvas in tokens (0: each task's max_tokens; "
                         "64 for a model trained with --canvas 64)")
    ap.add_argument("--limit", type=int, default=24, help="held-out records per task")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if args.limit < 1:
        ap.error(f"--limit must be >= 1, got {args.limit}")
    if args.canvas < 0:
        ap.error(f"--canvas must be >= 0 (0: each task's max_tokens), got {args.canvas}")
    import dllm
    from dllm.eval import generators

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        try:
            model, tokenizer = dllm.load(args.model, dtype="float32")
        except (ValueError, FileNotFoundError) as err:   # no model there
            ap.error(str(err))
        model.eval()
        for task in (LATIN, SUDOKU):
            records = generators.make_records(task, split="test", num_samples=args.limit)
            scores = probe_task(model, tokenizer, task, records, args.canvas)
            print(task + ": " + "; ".join(f"{k} {v:.3f}" for k, v in scores.items()), flush=True)
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
