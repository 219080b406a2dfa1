"""Export a training checkpoint to a LLaDA model folder, to evaluate a run before it ends.

    python benchmarks/export_checkpoint.py runs/pb-tiny/checkpoint.pt /tmp/pb-tiny-step

Takes the recipe recorded in the checkpoint (fields added since at their defaults), the run's
tokenizer (`tokenizer/` beside the checkpoint) and the weights as they stood; prints the step."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from dllm.config import ModelConfig
from dllm.models.llada import LLaDAModel
from dllm.train import TrainConfig, complete_recipe, generation_defaults, model_config, save_pretrained


def export_checkpoint(checkpoint: Path, out: Path) -> int:
    """Write the model of `checkpoint` to `out`; returns the step it was saved at."""
    if not checkpoint.is_file():
        raise SystemExit(f"checkpoint {checkpoint} is not a file")
    tokenizer_dir = checkpoint.parent / "tokenizer"
    if not tokenizer_dir.is_dir():
        raise SystemExit(f"no tokenizer folder {tokenizer_dir} beside the checkpoint")
    state = torch.load(checkpoint, weights_only=False, map_location="cpu")
    cfg = TrainConfig(**complete_recipe(dict(state["recipe"])))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    if "model_config" in state:      # the model as built, a start model's rows and numerics included
        model = LLaDAModel(ModelConfig(**state["model_config"]))
    else:
        rows = state["model"]["embed.weight"].shape[0]      # a padded start model's rows, not the tokenizer's
        model = LLaDAModel(dataclasses.replace(model_config(cfg, tokenizer), vocab_size=rows))
    model.load_state_dict(state["model"])
    save_pretrained(model.eval(), tokenizer, out, generation_defaults(cfg))
    return state["step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a run's checkpoint.pt")
    parser.add_argument("out", type=Path, help="the model folder to write")
    args = parser.parse_args()
    print(f"step {export_checkpoint(args.checkpoint, args.out)} -> {args.out}")


if __name__ == "__main__":
    main()
