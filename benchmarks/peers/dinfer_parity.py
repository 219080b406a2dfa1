"""dInfer's own parallel decoders against dllm's `hierarchy` and `credit` samplers on tiny random LLaDA
models: tokens and forwards, case by case (no timing).

dInfer's `BlockWiseDiffusionLLM` loop (`dinfer/decoding/generate_uniform.py`) drives its decoders
(`parallel_strategy.py`), imported from the checkout given with `--dinfer DIR` (the folder holding
`python/dinfer/decoding/`); they need torch only, so both sides run in this environment. The peer's
model is the same dllm model, each forward over the whole canvas, with the mask token's logit at
-inf (dllm never offers it as a candidate). The pairs compared, batch 1, temperature 0, no KV cache:

    hierarchy   HierarchyDecoder(threshold, low_threshold)     dllm "hierarchy"(tau, low_tau)
    credit      CreditThresholdParallelDecoder(threshold, ...)  dllm "credit"(tau, credit_alpha, ...)
    threshold   ThresholdParallelDecoder(threshold)            dllm "credit"(tau, credit_alpha=0)
    vicinity    the same in VicinityCacheDiffusionLLM          the same with cache "vicinity"
                (prefix_look, after_look, warmup_steps, dual)

For `vicinity` the peer's model is the transformer written out from the same weights in
`tests/reference/cache_ref.py` (`forward_ref`), which takes dInfer's cached K/V and its
`replace_position` window; its forwards differ from dllm's where docs/caches.md §vicinity says
dInfer runs more. dInfer's loop runs with `maximum_unroll=1` (one forward between its checks for a finished block; by
default it may run up to 4, the extra ones committing nothing) and an end-of-text id no token has
(no early stop). dllm scores `hierarchy` in the logits' dtype (`score_dtype="logits"`), as dInfer.

    python benchmarks/peers/dinfer_parity.py --dinfer DINFER [--cases 8] [--seed 0] [--dtype bfloat16]

prints one line per case that differs and a count per model and mode.
"""
from __future__ import annotations

import importlib.util
import random
import sys
import types
from pathlib import Path

from parity import TINY_MODELS, exit_code, parse_in_process, tiny_models

MODES = ("hierarchy", "credit", "threshold", "vicinity")
LOOKS = [(16, 16, 4), (2, 3, 0), (0, 5, 1), (4, 0, 9), (2, 2, 3), (8, 8, 2)]   # prefix_look, after_look, warmup_steps


def import_dinfer(root: Path):
    """dInfer's `decoding` modules (utils, parallel_strategy, generate_uniform) as a package of their
    own, without its `__init__` (which imports the rest of dInfer)."""
    folder = root / "python" / "dinfer" / "decoding"
    if not (folder / "parallel_strategy.py").is_file():
        raise SystemExit(f"--dinfer {root}: no python/dinfer/decoding/parallel_strategy.py there; give a checkout of "
                         f"https://github.com/inclusionAI/dInfer")
    package = types.ModuleType("dinfer_decoding")
    package.__path__ = [str(folder)]
    sys.modules["dinfer_decoding"] = package
    for name in ("utils", "parallel_strategy", "generate_uniform"):
        spec = importlib.util.spec_from_file_location(f"dinfer_decoding.{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        setattr(package, name, module)
    return package


def make_cases(count: int, seed: int, modes: list[str]) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for model in TINY_MODELS:
        for mode in modes:
            for _ in range(count):
                gen, block = rng.choice([(16, 4), (16, 8), (24, 8), (32, 16), (20, 8), (16, 16)])
                case = dict(model=model, mode=mode, prompt=[rng.randrange(300) for _ in range(rng.randint(3, 12))],
                            gen_length=gen, block_length=block, tau=rng.choice([0.3, 0.5, 0.7, 0.9, 1.0]))
                if mode == "hierarchy":
                    case.update(tau=rng.choice([None, 0.5, 0.9]), low_tau=rng.choice([None, 0.0, 0.1, 0.3, 0.6]))
                if mode == "credit":
                    case.update(alpha=rng.choice([0.7, 2.0, 5.0]), gamma=rng.choice([0.2, 1.0]),
                                beta=rng.choice([0.8, 0.5, 1.0]))
                if mode == "vicinity":
                    case.update(looks=rng.choice(LOOKS))
                cases.append(case)
    return cases


def dllm_side(model, case: dict) -> dict:
    import dllm
    if case["mode"] == "hierarchy":
        name, args = "hierarchy", dict(tau=case["tau"], low_tau=case["low_tau"])
    elif case["mode"] == "credit":
        name, args = "credit", dict(tau=case["tau"], credit_alpha=case["alpha"], boost_gamma=case["gamma"],
                                    decay_beta=case["beta"])
    else:
        name, args = "credit", dict(tau=case["tau"], credit_alpha=0.0)
    cache = dict(cache="vicinity", cache_kwargs=dict(zip(("prefix_look", "after_look", "warmup_steps"), case["looks"]))
                 ) if case["mode"] == "vicinity" else {}
    out = dllm.generate(model, None, [case["prompt"]], gen_length=case["gen_length"], block_length=case["block_length"],
                        sampler=name, sampler_kwargs=args, score_dtype="logits", **cache)
    return dict(tokens=out.generated[0].tolist(), forwards=out.forwards)


class CountingModel:
    """What dInfer's loop calls: model(x).logits over the whole canvas, the mask token's logit at -inf."""

    def __init__(self, model, mask_id: int):
        self.model, self.mask_id, self.calls = model, mask_id, 0
        self.device = next(model.parameters()).device

    def __call__(self, x, **kwargs):
        import torch
        self.calls += 1
        with torch.no_grad():
            logits = self.model(x)
        logits[..., self.mask_id] = float("-inf")
        return types.SimpleNamespace(logits=logits)


class CachedModel(CountingModel):
    """What dInfer's cached loops call: model(x, past_key_values=..., use_cache=..., replace_position=...),
    run by the written-out transformer `forward_ref`; a full forward returns every layer's K/V (as
    dInfer's `KVCache` takes them), a windowed one replaces the window's K/V in a copy of the cache."""

    def __call__(self, x, past_key_values=None, use_cache=False, replace_position=None, **kwargs):
        import torch
        from tests.reference.cache_ref import forward_ref
        self.calls += 1
        with torch.no_grad():
            if past_key_values is None:
                logits, kv = forward_ref(self.model, x, 0, None, "full")
                kv = [t for layer in kv for t in layer]
            else:
                stored = past_key_values._data                     # (layers, 2, B, H, L, D)
                past = [[stored[i][0].clone(), stored[i][1].clone()] for i in range(stored.shape[0])]
                logits, kv = forward_ref(self.model, x, replace_position[0], past, "dual")
        logits[..., self.mask_id] = float("-inf")
        return types.SimpleNamespace(logits=logits, past_key_values=kv)


def dinfer_side(dinfer, model, case: dict, mask_id: int) -> dict:
    import torch
    strategy, uniform = dinfer.parallel_strategy, dinfer.generate_uniform
    common = dict(temperature=0, mask_id=mask_id, eos_id=-1)
    if case["mode"] == "hierarchy":
        decoder = strategy.HierarchyDecoder(threshold=case["tau"], low_threshold=case["low_tau"], **common)
    elif case["mode"] == "credit":
        decoder = strategy.CreditThresholdParallelDecoder(threshold=case["tau"], credit_alpha=case["alpha"],
                                                          boost_gamma=case["gamma"], decay_beta=case["beta"], **common)
    else:
        decoder = strategy.ThresholdParallelDecoder(threshold=case["tau"], **common)
    if case["mode"] == "vicinity":
        counted = CachedModel(model, mask_id)
        looks = dict(zip(("prefix_look", "after_look", "warmup_steps"), case["looks"]))
        loop = uniform.VicinityCacheDiffusionLLM(counted, decoder, dinfer.utils.BlockIteratorFactory(),
                                                 dinfer.utils.KVCacheFactory("dual"), maximum_unroll=1,
                                                 early_stop=False, **looks)
    else:
        counted = CountingModel(model, mask_id)
        loop = uniform.BlockWiseDiffusionLLM(counted, decoder, dinfer.utils.BlockIteratorFactory(), early_stop=False,
                                             maximum_unroll=1)
    canvas = loop.generate(torch.tensor([case["prompt"]]), gen_length=case["gen_length"],
                           block_length=case["block_length"])
    return dict(tokens=canvas[0, len(case["prompt"]):].tolist(), forwards=counted.calls)


def main(argv=None) -> int:
    args, modes = parse_in_process(argv, __doc__.split("\n\n")[0], "dinfer",
                                   "dInfer checkout (holds python/dinfer/decoding/)", MODES, float32_modes=("vicinity",))
    dinfer = import_dinfer(args.dinfer.resolve())
    import torch
    torch._dynamo.config.disable = True      # dInfer compiles two of its rules; both sides run eagerly
    cases = make_cases(args.cases, args.seed, modes)
    models = tiny_models(("llada",), args.dtype)
    ours, theirs = [], []
    for case in cases:
        model = models[case["model"], "llada"]
        ours.append(dllm_side(model, case))
        theirs.append(dinfer_side(dinfer, model, case, model.config.mask_token_id))
    return exit_code(cases, ours, theirs, peer="dInfer")


if __name__ == "__main__":
    sys.exit(main())
