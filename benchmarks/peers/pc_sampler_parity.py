"""PC-Sampler's own loops against dllm's `pc_sampler` on tiny random LLaDA models: tokens and forwards,
case by case (no timing).

PC-Sampler's `generate_with_pc_sampler` (`src/generate.py`; mode `linear`: its linear-position
baseline `generate_with_linear_position`, against `weighting="linear"`) is imported from the checkout given with
`--pc-sampler DIR`; it needs torch and numpy only, so both sides run in this environment. Its model is
the same dllm model, the mask token's logit at -inf (dllm never offers it as a candidate). Each case
writes a random frequency table in the layout PC-Sampler's corpus files use, which both sides load
(the peer through its own loader). Batch 1, temperature 0, dllm with `score_dtype="logits"` (the
peer's softmax is in the logits' dtype). The peer picks its k positions with `torch.topk`, whose order
among equal scores is its own: with `lambd` 0 and clipped scores, ties are common (dllm: lowest
position first), so those cases are tallied apart (mode `lambd0`); `--stable-ties` gives the peer a
`torch.topk` that breaks ties as dllm does (a stable sort), which shows whether ties are all that
differs.

    python benchmarks/peers/pc_sampler_parity.py --pc-sampler PC_SAMPLER [--cases 8] [--seed 0] [--dtype bfloat16]
        [--stable-ties]

prints one line per case that differs and a count per model and mode.
"""
from __future__ import annotations

import importlib.util
import json
import random
import sys
import tempfile
import types
from pathlib import Path

from parity import TINY_MODELS, exit_code, parse_in_process, tiny_models

MODES = ("lambd", "lambd0", "linear")


def import_pc_sampler(root: Path) -> types.ModuleType:
    """PC-Sampler's `src/generate.py` (it puts the checkout on sys.path for its corpus loader)."""
    path = root / "src" / "generate.py"
    if not path.is_file() or not (root / "utils" / "load_json_or_jsonl.py").is_file():
        raise SystemExit(f"--pc-sampler {root}: no src/generate.py and utils/load_json_or_jsonl.py there; give a "
                         f"checkout of https://github.com/NEUIR/PC-Sampler")
    spec = importlib.util.spec_from_file_location("pc_sampler_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TorchWithStableTopk:
    """torch, but `topk` returns the k largest entries with ties to the lowest index (a stable sort)."""

    def __getattr__(self, name):
        import torch
        return getattr(torch, name)

    @staticmethod
    def topk(values, k):
        import torch
        order = torch.sort(values, descending=True, stable=True).indices[:k]
        return values[order], order


def make_cases(count: int, seed: int, modes: list[str], vocab: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for model in TINY_MODELS:
        for mode in modes:
            for _ in range(count):
                gen, block = rng.choice([(16, 16), (16, 8), (24, 8), (32, 16), (32, 32), (12, 4)])
                steps = rng.choice([gen, gen // 2]) if (gen // 2) % (gen // block) == 0 else gen
                counts = {str(i): int(10 ** (4 * rng.random())) for i in rng.sample(range(vocab), 2 * vocab // 3)}
                cases.append(dict(model=model, mode=mode, prompt=[rng.randrange(300) for _ in range(rng.randint(3, 12))],
                                  gen_length=gen, block_length=block, steps=steps,
                                  lambd=0.0 if mode == "lambd0" else rng.choice([0.1, 0.25, 0.5, 1.0]),
                                  alpha=rng.choice([1.0, 3.0, 10.0]),
                                  table=dict(num_token=sum(counts.values()) + rng.randrange(1, 50),
                                             p_baseline_dict=counts)))
    return cases


def write_table(case: dict, folder: Path, index: int) -> Path:
    path = folder / f"table{index}.json"
    path.write_text(json.dumps(case["table"]))
    return path


def dllm_side(model, case: dict, table: Path) -> dict:
    import dllm
    weighting = "linear" if case["mode"] == "linear" else "exponential"
    out = dllm.generate(model, None, [case["prompt"]], gen_length=case["gen_length"], block_length=case["block_length"],
                        steps=case["steps"], sampler="pc_sampler", score_dtype="logits",
                        sampler_kwargs=dict(lambd=case["lambd"], alpha=case["alpha"], frequencies=str(table),
                                            weighting=weighting))
    return dict(tokens=out.generated[0].tolist(), forwards=out.forwards)


class PeerModel:
    """What PC-Sampler's loop calls: model(x).logits over the whole canvas, the mask token's logit at
    -inf; counts the forwards."""

    def __init__(self, model, mask_id: int):
        self.model, self.mask_id, self.calls = model, mask_id, 0
        self.device = next(model.parameters()).device

    def __call__(self, x):
        import torch
        with torch.no_grad():
            logits = self.model(x)
        self.calls += 1
        logits[..., self.mask_id] = float("-inf")
        return types.SimpleNamespace(logits=logits)


def peer_side(peer, model, case: dict, table: Path) -> dict:
    import torch
    counted = PeerModel(model, model.config.mask_token_id)
    peer.BASE_LINE = None                      # the loop loads its table once per process: load this case's
    loop = peer.generate_with_linear_position if case["mode"] == "linear" else peer.generate_with_pc_sampler
    canvas = loop(counted, torch.tensor([case["prompt"]]), steps=case["steps"], gen_length=case["gen_length"],
                  block_length=case["block_length"], lambd=case["lambd"], alpha=case["alpha"],
                  baseline_name=str(table), temperature=0.0, mask_id=model.config.mask_token_id)
    return dict(tokens=canvas[0, len(case["prompt"]):].tolist(), forwards=counted.calls)


def main(argv=None) -> int:
    args, modes = parse_in_process(argv, __doc__.split("\n\n")[0], "pc-sampler",
                                   "PC-Sampler checkout (holds src/generate.py)", MODES,
                                   add_options=lambda p: p.add_argument(
                                       "--stable-ties", action="store_true",
                                       help="the peer's torch.topk breaks ties to the lowest position"))
    peer = import_pc_sampler(args.pc_sampler.resolve())
    if args.stable_ties:
        peer.torch = TorchWithStableTopk()
    models = tiny_models(("llada",), args.dtype)
    vocab = next(iter(models.values())).config.vocab_size
    cases = make_cases(args.cases, args.seed, modes, vocab)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as folder:
        for i, case in enumerate(cases):
            model, table = models[case["model"], "llada"], write_table(case, Path(folder), i)
            ours.append(dllm_side(model, case, table))
            theirs.append(peer_side(peer, model, case, table))
    for case in cases:
        del case["table"]                      # the differing cases print without their tables
    return exit_code(cases, ours, theirs, peer="PC-Sampler")


if __name__ == "__main__":
    sys.exit(main())
