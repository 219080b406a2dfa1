"""dParallel's own entropy-threshold loops against dllm's `dparallel` and `dream_dparallel` samplers on
tiny random models: tokens and forwards, case by case (no timing).

dParallel's `LLaDA/generate.py` (`generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`
with a threshold) and `Dream/model/generation_utils_semiar.py` (`_sample`, alg "entropy_threshold")
are imported from the checkout given with `--dparallel DIR`; they need torch and transformers' config
classes only, so both sides run in this environment. The peer's model is the same dllm model, its
mask token's logit at -inf (dllm never offers it as a candidate). The pairs compared, batch 1,
temperature 0:

    none    generate                        dllm "dparallel", no cache, score_dtype float64
    prefix  generate_with_prefix_cache      the same with cache "prefix"
    dual    generate_with_dual_cache        the same with cache "dual"
    dream   _sample of the Dream loop       dllm "dream_dparallel", on random Dream models

For `prefix` and `dual` the peer's model is the transformer written out from the same weights in
`tests/reference/cache_ref.py` (`forward_ref`), which takes the K/V of the peer's full forward and its
cached calls. Those loops (Fast-dLLM's) run one more forward after a block that their first forward
completed, which commits nothing; dllm does not, and the tally counts the peer's forwards without it.

    python benchmarks/peers/dparallel_parity.py --dparallel DPARALLEL [--cases 8] [--seed 0] [--dtype bfloat16]

prints one line per case that differs and a count per model and mode.
"""
from __future__ import annotations

import importlib.util
import random
import sys
import types
from pathlib import Path

from parity import TINY_MODELS, exit_code, parse_in_process, tiny_models

MODES = ("none", "prefix", "dual", "dream")


def import_dparallel(root: Path) -> types.SimpleNamespace:
    """dParallel's LLaDA `generate` module (its model import stubbed: the model is passed in) and its
    Dream `DreamGenerationMixin`."""
    llada, dream = root / "LLaDA" / "generate.py", root / "Dream" / "model" / "generation_utils_semiar.py"
    if not (llada.is_file() and dream.is_file()):
        raise SystemExit(f"--dparallel {root}: no LLaDA/generate.py and Dream/model/generation_utils_semiar.py "
                         f"there; give a checkout of https://github.com/czg1225/dParallel")
    stub = types.ModuleType("model.modeling_llada")
    stub.LLaDAModelLM = None
    sys.modules.setdefault("model", types.ModuleType("model"))
    sys.modules["model.modeling_llada"] = stub
    modules = {}
    for name, path in (("dparallel_llada", llada), ("dparallel_dream", dream)):
        spec = importlib.util.spec_from_file_location(name, path)
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    return types.SimpleNamespace(llada=modules["dparallel_llada"], dream=modules["dparallel_dream"].DreamGenerationMixin)


def make_cases(count: int, seed: int, modes: list[str]) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for model in TINY_MODELS:
        for mode in modes:
            for _ in range(count):
                gen, block = rng.choice([(16, 4), (16, 8), (24, 8), (32, 16), (16, 16), (32, 8)])
                cases.append(dict(model=model, mode=mode, prompt=[rng.randrange(300) for _ in range(rng.randint(3, 12))],
                                  gen_length=gen, block_length=block,
                                  threshold=rng.choice([0.0, 0.5, 1.0, 2.0, 4.0, 6.0])))
    return cases


def dllm_side(model, case: dict) -> dict:
    import dllm
    name = "dream_dparallel" if case["mode"] == "dream" else "dparallel"
    cache = case["mode"] if case["mode"] in ("prefix", "dual") else "none"
    out = dllm.generate(model, None, [case["prompt"]], gen_length=case["gen_length"], block_length=case["block_length"],
                        sampler=name, sampler_kwargs=dict(threshold=case["threshold"]), score_dtype="float64",
                        cache=cache)
    return dict(tokens=out.generated[0].tolist(), forwards=out.forwards)


class PeerModel:
    """What dParallel's loops call: model(x).logits over the whole canvas (the Dream loop passes its
    attention mask and positions, unused at batch 1), or with `past_key_values` a cached call run by
    the written-out transformer; the mask token's logit at -inf. Counts the forwards that find a mask
    in the block (the first `block_length` columns of a cached call)."""

    def __init__(self, model, mask_id: int, block_length: int):
        self.model, self.mask_id, self.block_length, self.calls = model, mask_id, block_length, 0
        self.device = next(model.parameters()).device
        self.shifted = model.config.logit_shift

    def __call__(self, x, *args, past_key_values=None, use_cache=False, replace_position=None):
        import torch
        from tests.reference.cache_ref import forward_ref
        with torch.no_grad():
            if use_cache and past_key_values is None:
                logits, kv = forward_ref(self.model, x, 0, None, "full")
            elif past_key_values is not None:
                if replace_position is None:      # prefix: the K/V of the columns before x
                    logits, kv = forward_ref(self.model, x, past_key_values[0][0].shape[2], past_key_values, "prefix")
                else:
                    start = int(replace_position[0].nonzero()[0])
                    logits, kv = forward_ref(self.model, x, start, past_key_values, "dual")
            else:
                logits, kv = self.model(x), None
                if self.shifted:      # Dream's raw output, which the Dream loop shifts: dllm returns it shifted
                    logits = torch.cat([logits[:, 1:], logits[:, -1:]], dim=1)
        in_block = x if past_key_values is None else x[:, :self.block_length]
        self.calls += bool((in_block == self.mask_id).any())
        logits[..., self.mask_id] = float("-inf")
        return types.SimpleNamespace(logits=logits, past_key_values=kv)


def dream_config(case: dict, mask_id: int) -> types.SimpleNamespace:
    """The fields of a DreamGenerationConfig that the Dream loop reads."""
    return types.SimpleNamespace(output_history=False, return_dict_in_generate=False, mask_token_id=mask_id,
                                 max_length=len(case["prompt"]) + case["gen_length"], temperature=0.0,
                                 steps=case["gen_length"], alg="entropy_threshold", eps=1e-3)


def peer_side(peer, model, case: dict, mask_id: int) -> dict:
    import torch
    counted = PeerModel(model, mask_id, case["block_length"])
    prompt = torch.tensor([case["prompt"]])
    if case["mode"] == "dream":
        counted.device = prompt.device
        canvas, _ = peer.dream._sample(counted, prompt, None, dream_config(case, mask_id),
                                       threshold=case["threshold"], block_length=case["block_length"])
    else:
        loop = {"none": peer.llada.generate, "prefix": peer.llada.generate_with_prefix_cache,
                "dual": peer.llada.generate_with_dual_cache}[case["mode"]]
        canvas, _ = loop(counted, prompt, steps=case["gen_length"], gen_length=case["gen_length"],
                         block_length=case["block_length"], temperature=0.0, mask_id=mask_id,
                         threshold=case["threshold"])
    return dict(tokens=canvas[0, len(case["prompt"]):].tolist(), forwards=counted.calls)


def main(argv=None) -> int:
    args, modes = parse_in_process(argv, __doc__.split("\n\n")[0], "dparallel",
                                   "dParallel checkout (holds LLaDA/ and Dream/)", MODES, float32_modes=("prefix", "dual"))
    peer = import_dparallel(args.dparallel.resolve())
    cases = make_cases(args.cases, args.seed, modes)
    models = tiny_models(("llada", "dream"), args.dtype)
    ours, theirs = [], []
    for case in cases:
        model = models[case["model"], "dream" if case["mode"] == "dream" else "llada"]
        ours.append(dllm_side(model, case))
        theirs.append(peer_side(peer, model, case, model.config.mask_token_id))
    return exit_code(cases, ours, theirs, peer="dParallel")


if __name__ == "__main__":
    sys.exit(main())
