"""Fast-dLLM's own Dream decoding loops against dllm on tiny random Dream checkpoints: tokens and
forwards, case by case (no timing).

Fast-dLLM's `dream/model` (DreamModel and the `diffusion_generate` mixins of `generation_utils.py`
and `generation_utils_block.py`) is imported from the checkout given
with `--fastdllm DIR` by the peer side, which runs in the peer environment
(`benchmarks/peers/setup_env.sh`; it imports nothing from dllm). The pairs compared:

    none    Fast-dLLM without a cache            dllm sampler "budget_threshold"
    prefix  Fast-dLLM use_cache                  dllm "threshold" commit_block_start, cache "prefix"
    dual    Fast-dLLM use_cache + dual_cache     dllm "threshold" commit_block_start, cache "dual"

and with `--modes` the same three loops with alg "entropy" (its scripts' baseline runs), and
KLASS's Dream loop (shkim0116/KLASS `src/model/dream_klass.py`, from the checkout given with
`--klass DIR`, bound to the same DreamModel):

    entropy         without a cache              dllm sampler "entropy"
    entropy-prefix  use_cache                    dllm "block_entropy", cache "prefix"
    entropy-dual    use_cache + dual_cache       dllm "block_entropy", cache "dual"
    klass           KLASS alg "klass"            dllm "dream_klass"

dllm never offers the mask token as a candidate; on random weights that moves confidences, so the
peer side sets the mask token's logit to -inf too (a trained model gives it no mass). The peer
side runs through `benchmarks/peers/driver.py` (the peer side of `bench_peers.py`). Both sides
score in the models' dtype (`--dtype`, float32 or bfloat16).

    python benchmarks/peers/dream_parity.py --fastdllm /tmp/fastdllm --work runs/dream-parity \\
        [--peer-python runs/peers-venv/bin/python] [--cases 8] [--seed 0] [--dtype bfloat16] \\
        [--modes none,prefix,dual,entropy,entropy-prefix,entropy-dual]

writes the checkpoints and cases under --work, runs both sides, prints one line per case that
differs and a count per checkpoint and mode.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from parity import compare

CHECKPOINTS = {"l2": {}, "l2-std1": {"init_std": 1.0}, "l4": {"num_hidden_layers": 4, "init_std": 1.0},
               "l1": {"num_hidden_layers": 1}}
MODES = ("none", "prefix", "dual", "entropy", "entropy-prefix", "entropy-dual", "klass")
DEFAULT_MODES = "none,prefix,dual"
CACHE = {"prefix": "prefix", "dual": "dual", "entropy-prefix": "prefix", "entropy-dual": "dual"}   # else "none"


def make_cases(work: Path, count: int, seed: int, modes: list[str]) -> list[dict]:
    """Random prompts and settings per checkpoint and mode (lengths that both sides accept)."""
    rng = random.Random(seed)
    cases = []
    for name in CHECKPOINTS:
        for mode in modes:
            for _ in range(count):
                prompt = [rng.randrange(300) for _ in range(rng.randint(3, 12))]
                extra = {}
                if mode == "none":
                    (gen, steps), block = rng.choice([(16, 4), (16, 8), (32, 8), (24, 6), (32, 32)]), None
                elif mode == "entropy":
                    (gen, steps), block = rng.choice([(16, 16), (16, 8), (32, 16), (24, 12), (32, 32)]), None
                elif mode == "klass":        # steps = gen_length, as KLASS's Dream scripts; threshold: conf's
                    gen = rng.choice([8, 16, 24, 32])
                    steps, block, extra = gen, None, {"kl_threshold": rng.choice([0.001, 0.01, 0.1, 1.0, 100.0])}
                else:
                    gen, block = rng.choice([(16, 4), (16, 8), (32, 8), (32, 16), (24, 8)])
                    steps = gen // block * (rng.choice([2, 3, 4, 8]) if mode.startswith("entropy") else 1)
                cases.append(dict(checkpoint=str(work / name), mode=mode, prompt=prompt, gen_length=gen,
                                  steps=steps, block_length=block,
                                  threshold=rng.choice([0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.9]), **extra))
    return cases


def run_dllm(cases: list[dict], dtype: str) -> list[dict]:
    import dllm
    models = {}
    out = []
    for case in cases:
        if case["checkpoint"] not in models:
            models[case["checkpoint"]] = dllm.load(case["checkpoint"], dtype=dtype)[0]
        model = models[case["checkpoint"]]
        mode = case["mode"]
        kw = dict(gen_length=case["gen_length"], score_dtype="logits", cache=CACHE.get(mode, "none"))
        if mode == "none":
            kw.update(steps=case["steps"], sampler="budget_threshold", sampler_kwargs={"threshold": case["threshold"]})
        elif mode == "entropy":
            kw.update(steps=case["steps"], sampler="entropy")
        elif mode == "klass":
            kw.update(sampler="dream_klass",
                      sampler_kwargs={"conf_threshold": case["threshold"], "kl_threshold": case["kl_threshold"]})
        elif mode.startswith("entropy"):
            kw.update(steps=case["steps"], block_length=case["block_length"], sampler="block_entropy")
        else:
            kw.update(block_length=case["block_length"], sampler="threshold",
                      sampler_kwargs={"tau": case["threshold"], "commit_block_start": True})
        result = dllm.generate(model, None, [case["prompt"]], **kw)
        out.append(dict(tokens=result.generated[0].tolist(), forwards=result.forwards))
    return out


def klass_generate(klass_model, model, prompt, case: dict, mask_id: int):
    """KLASS's Dream `diffusion_generate` (its `dream_klass.py` mixin bound to the model, alg
    "klass", unmask strategy "all", history 2, temperature 0), returning the sequences."""
    import contextlib
    import io
    import types
    mixin = klass_model.DreamGenerationMixin
    model.diffusion_generate = types.MethodType(mixin.diffusion_generate, model)
    model._sample = types.MethodType(mixin._sample, model)
    config = klass_model.DreamGenerationConfig(
        max_new_tokens=case["gen_length"], steps=case["steps"], temperature=0.0, top_p=None, top_k=None, alg="klass",
        unmask_strategy="all", alg_temp=0.0, conf_threshold=case["threshold"], kl_threshold=case["kl_threshold"],
        kl_history_length=2, mask_token_id=mask_id, return_dict_in_generate=True, output_history=False,
        save_steps=False)
    with contextlib.redirect_stdout(io.StringIO()):
        return model.diffusion_generate(prompt, generation_config=config, attention_mask=None).sequences


def run_peer(cases: list[dict], fastdllm: Path, mask_id: int, dtype: str, klass: Path | None) -> list[dict]:
    """Fast-dLLM's side (peer environment), through the driver of `benchmarks/bench_peers.py`:
    DreamModel with its mixins bound as its eval.py binds them, forwards counted, the mask token's
    logit set to -inf; KLASS's Dream loop bound to the same DreamModel."""
    import importlib.util

    import torch
    spec = importlib.util.spec_from_file_location("peer_driver", Path(__file__).with_name("driver.py"))
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    mixins, DreamModel, _ = driver.import_fastdllm_dream(fastdllm)
    klass_model = driver.import_file("dream_klass", klass / "src" / "model" / "dream_klass.py") if klass else None
    models, out = {}, []
    for case in cases:
        if case["checkpoint"] not in models:
            m = DreamModel.from_pretrained(case["checkpoint"], torch_dtype=getattr(torch, dtype)).eval()
            models[case["checkpoint"]] = (m, driver.ForwardCounter(m, 4 * case["gen_length"] + 64, mask_id))
        m, counter = models[case["checkpoint"]]
        request = dict(gen_length=case["gen_length"], steps=case["steps"], block_length=case["block_length"],
                       threshold=case["threshold"], mask_id=mask_id, temperature=0.0)
        mode = case["mode"]
        entry = dict(name=mode, use_cache=mode in CACHE, dual_cache=CACHE.get(mode) == "dual",
                     alg="entropy" if mode.startswith("entropy") else "confidence_threshold")
        counter.calls = 0
        with torch.no_grad():
            if mode == "klass":
                sequences = klass_generate(klass_model, m, torch.tensor([case["prompt"]]), case, mask_id)
            else:
                generate, kw = driver.dream_call(entry, request, mixins)
                sequences = generate(m, torch.tensor([case["prompt"]]), **kw)
        out.append(dict(tokens=sequences[0, len(case["prompt"]):].tolist(), forwards=counter.calls))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fastdllm", type=Path, required=True, help="Fast-dLLM checkout (holds dream/model/)")
    p.add_argument("--klass", type=Path, help="KLASS checkout (holds src/model/dream_klass.py), for --modes klass")
    p.add_argument("--work", type=Path, default=Path("runs/dream-parity"))
    p.add_argument("--peer-python", default="runs/peers-venv/bin/python")
    p.add_argument("--cases", type=int, default=8, help="cases per checkpoint and mode")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma list of {', '.join(MODES)} (default "
                                                          f"{DEFAULT_MODES}; the cases drawn depend on it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both models' dtype")
    p.add_argument("--side", choices=("both", "peer"), default="both", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    work = args.work.resolve()
    if args.side == "peer":          # inside the peer environment
        request = json.loads((work / "cases.json").read_text())
        result = run_peer(request["cases"], args.fastdllm.resolve(), request["mask_id"], args.dtype,
                          args.klass.resolve() if args.klass else None)
        (work / "peer.json").write_text(json.dumps(result))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.fixtures.checkpoints import write_dream_checkpoint
    work.mkdir(parents=True, exist_ok=True)
    for name, overrides in CHECKPOINTS.items():
        write_dream_checkpoint(work / name, seed=1, **overrides)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--modes {args.modes!r}: give a comma list of {', '.join(MODES)}")
    if "klass" in modes and not (args.klass and (args.klass / "src" / "model" / "dream_klass.py").is_file()):
        p.error(f"--modes klass runs KLASS's Dream loop: pass --klass DIR, a checkout of "
                f"https://github.com/shkim0116/KLASS holding src/model/dream_klass.py (got {args.klass})")
    cases = make_cases(work, args.cases, args.seed, modes)
    mask_id = json.loads((work / "l2" / "config.json").read_text())["mask_token_id"]
    (work / "cases.json").write_text(json.dumps({"cases": cases, "mask_id": mask_id}))
    subprocess.run([args.peer_python, __file__, "--side", "peer", "--fastdllm", str(args.fastdllm),
                    "--work", str(work), "--dtype", args.dtype, *(["--klass", str(args.klass)] if args.klass else [])],
                   check=True)
    counts = compare(cases, run_dllm(cases, args.dtype), json.loads((work / "peer.json").read_text()),
                     lambda case: f"{Path(case['checkpoint']).name} {case['mode']}")
    return 0 if all(n == same == forwards for n, same, forwards in counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
