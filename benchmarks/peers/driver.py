"""Run the peers' own LLaDA and Dream decoding functions on a checkpoint and report tokens,
forwards and seconds: the peer side of `benchmarks/bench_peers.py`.

This script runs INSIDE the peer virtual environment (`benchmarks/peers/setup_env.sh`: torch,
transformers 4.x, einops), not in dllm's: it imports nothing from dllm. The peers' code is
imported at run time from the checkouts given, none of it part of this repository:

    --fastdllm DIR   NVlabs/Fast-dLLM: for LLaDA `DIR/llada/generate.py` (generate,
                     generate_with_prefix_cache, generate_with_dual_cache) and
                     `DIR/llada/model/modeling_llada.py`; for Dream `DIR/dream/model/` (DreamModel and
                     the `diffusion_generate` of `generation_utils.py`, or of `generation_utils_block.py`
                     with `use_cache`, bound to the model as its `dream/eval.py` binds them)
    --llada DIR      ML-GSAI/LLaDA: `DIR/generate.py` (its `generate`, LLaDA's reference loop)

A LLaDA model is Fast-dLLM's `LLaDAModelLM` when `--fastdllm` is given (the checkpoints' remote
modeling code with cache arguments added; without them its forward is the original's), else the
checkpoint folder's own remote code (`AutoModel.from_pretrained(..., trust_remote_code=True)`, as
LLaDA's scripts load it), which needs the folder's `modeling_llada.py`. A Dream model is Fast-dLLM's
`DreamModel` (`from_pretrained(..., torch_dtype=...)` as its `dream/eval.py` loads it).

The model's forward is wrapped to count its calls and to set the mask token's logit to -inf, as
dllm never proposes the mask token (the peers' loops otherwise may, and on random weights its share
moves the confidences); the loops themselves run unchanged.

    python benchmarks/peers/driver.py --fastdllm ~/Fast-dLLM [--llada ~/LLaDA] --checkpoint CKPT \
        --request request.json --out result.json

The request (JSON) holds:

    prompts       list of lists of prompt token ids; each is decoded alone (batch 1, as
                  Fast-dLLM's functions build a one-row canvas)
    gen_length, block_length, steps
    threshold     confidence threshold, or null for LLaDA's fixed per-step counts
    family        "llada" (default) or "dream"
    functions     names to run: for LLaDA Fast-dLLM's generate, generate_with_prefix_cache,
                  generate_with_dual_cache; an entry may also be an object {"name": ...,
                  "function": ..., "peer": "fastdllm" or "llada", "threshold": ..., "steps": ...}
                  overriding the shared settings ("peer" "llada": LLaDA's `generate`, which takes
                  no threshold); for Dream objects with "function": "diffusion_generate",
                  "use_cache" / "dual_cache" (Fast-dLLM's Dream options) and "alg" (default
                  "confidence_threshold", which needs the threshold)
    mask_id       the mask token id (LLaDA: 126336, Dream: 151666)
    temperature   0 (greedy) unless given; remasking "low_confidence" unless given
    repeats       timed runs per function (median reported), default 1
    warmup_runs   untimed runs before them, default 1
    device, dtype "cpu" / "cuda", "float32" / "bfloat16" / "float16"
    threads       torch.set_num_threads on the CPU (null: torch's default)
    max_forwards  forwards per prompt after which a run is an error (default 4 * gen_length + 64)
    logit_positions  canvas columns whose logits of one full forward on the first prompt's
                  canvas (prompt + masks) are written to OUT with suffix .logits.pt, so that the
                  caller can compare the two implementations' arithmetic (Dream's shifted as its
                  loops shift them: column c holds the prediction for column c)

The result (JSON) holds the versions of this environment, the load time, the sha256 of every peer
file used (`peer_files_sha256`, keyed "fastdllm:llada/generate.py", ...), the model's source and
per function: `peer`, `tokens` (the generated region of every prompt), `forwards` (calls of the
model's forward per prompt, counted by wrapping it), `nfe` (the count the function itself returns,
null for LLaDA's), `seconds` (median over repeats of the summed time over prompts), `seconds_all`
and `warmup_seconds`.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import inspect
import io
import json
import platform
import statistics
import sys
import time
import types
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")
FAMILIES = ("llada", "dream")
# (peer, family) -> the peer functions the driver runs
FUNCTIONS = {("fastdllm", "llada"): ("generate", "generate_with_prefix_cache", "generate_with_dual_cache"),
             ("llada", "llada"): ("generate",), ("fastdllm", "dream"): ("diffusion_generate",)}
DREAM_FILES = ("modeling_dream.py", "generation_utils.py", "generation_utils_block.py")


def fail(message: str) -> None:
    print(f"driver: error: {message}", file=sys.stderr)
    sys.exit(2)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def import_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_fastdllm(root: Path):
    """Fast-dLLM's `llada/generate.py` as a module, with `root/llada` on sys.path (its own import
    is `from model.modeling_llada import LLaDAModelLM`), that LLaDAModelLM class, and the files'
    sha256."""
    llada = root / "llada"
    gen_path, model_path = llada / "generate.py", llada / "model" / "modeling_llada.py"
    for p in (gen_path, model_path):
        if not p.is_file():
            fail(f"{p} not found: --fastdllm must be a checkout of https://github.com/NVlabs/Fast-dLLM "
                 f"(the folder holding llada/generate.py)")
    sys.path.insert(0, str(llada))
    module = import_file("fastdllm_llada_generate", gen_path)
    from model.modeling_llada import LLaDAModelLM  # noqa: E402  (the same module generate.py imported)
    files = {"fastdllm:llada/generate.py": sha256(gen_path), "fastdllm:llada/model/modeling_llada.py": sha256(model_path)}
    return module, LLaDAModelLM, files


def import_fastdllm_dream(root: Path):
    """Fast-dLLM's `dream/model` package (`root/dream` on sys.path, as its eval.py runs), as
    {"plain": generation_utils, "block": generation_utils_block}, its DreamModel class and the files'
    sha256."""
    folder = root / "dream" / "model"
    for name in DREAM_FILES:
        if not (folder / name).is_file():
            fail(f"{folder / name} not found: --fastdllm must be a checkout of https://github.com/NVlabs/Fast-dLLM "
                 f"(the folder holding dream/model/{name})")
    sys.path.insert(0, str(root / "dream"))
    import model.generation_utils as plain  # noqa: E402
    import model.generation_utils_block as block  # noqa: E402
    from model.modeling_dream import DreamModel  # noqa: E402
    files = {f"fastdllm:dream/model/{name}": sha256(folder / name) for name in DREAM_FILES}
    return {"plain": plain, "block": block}, DreamModel, files


def dream_function(mixins: dict, use_cache: bool):
    """Fast-dLLM's Dream `diffusion_generate` as its eval.py runs it (the mixin of
    generation_utils_block with use_cache, else of generation_utils, bound to the model), returning
    the sequences; its step count print is dropped. Also the keyword arguments it reads."""
    module = mixins["block" if use_cache else "plain"]
    mixin = module.DreamGenerationMixin

    def diffusion_generate(model, prompt, **kwargs):
        model.diffusion_generate = types.MethodType(mixin.diffusion_generate, model)
        model._sample = types.MethodType(mixin._sample, model)
        with contextlib.redirect_stdout(io.StringIO()):
            return model.diffusion_generate(prompt, **kwargs).sequences

    # diffusion_generate takes **kwargs: the generation config's fields, `_sample`'s parameters
    # and the attention mask are what it reads
    accepted = set(vars(module.DreamGenerationConfig())) | set(inspect.signature(mixin._sample).parameters)
    return diffusion_generate, accepted | {"attention_mask"}


def import_llada(root: Path):
    """ML-GSAI/LLaDA's `generate.py` as a module, and its sha256."""
    gen_path = root / "generate.py"
    if not gen_path.is_file():
        fail(f"{gen_path} not found: --llada must be a checkout of https://github.com/ML-GSAI/LLaDA "
             f"(the folder holding generate.py)")
    return import_file("llada_generate", gen_path), {"llada:generate.py": sha256(gen_path)}


def load_peer_model(model_cls, checkpoint: Path, dtype, family: str):
    """Fast-dLLM's class when given, else the checkpoint's own remote code; (model, source)."""
    if model_cls is not None:
        # from_pretrained(torch_dtype=...) as in Fast-dLLM's own scripts (transformers 4.57 prints a
        # deprecation note for the name; it still honours it).
        source = f"fastdllm:{family}/model/modeling_{family}.py"
        return model_cls.from_pretrained(str(checkpoint), torch_dtype=dtype), source
    if not any(checkpoint.glob("modeling_*.py")):
        fail(f"checkpoint {checkpoint} holds no remote modeling code (modeling_llada.py): pass --fastdllm DIR "
             f"to run its LLaDAModelLM, or a checkpoint folder downloaded with its code")
    from transformers import AutoModel
    model = AutoModel.from_pretrained(str(checkpoint), trust_remote_code=True, torch_dtype=dtype)
    return model, f"checkpoint:{sorted(p.name for p in checkpoint.glob('modeling_*.py'))[0]}"


def check_signature(fn, kwargs: dict, accepted=None) -> None:
    """Every keyword we pass must be a parameter of the peer's function (read from its code), or
    one of `accepted` for a function that takes **kwargs."""
    params = set(inspect.signature(fn).parameters) if accepted is None else set(accepted)
    unknown = sorted(set(kwargs) - params)
    if unknown:
        fail(f"{fn.__name__} takes no argument(s) {', '.join(unknown)} (it takes {', '.join(sorted(params))}); "
             f"this checkout differs from the one the driver was written for")


def read_request(path: Path) -> dict:
    req = json.loads(path.read_text())
    for key in ("prompts", "gen_length", "block_length", "steps", "functions", "mask_id"):
        if key not in req:
            fail(f"request {path} lacks {key!r}")
    if req.get("dtype", "float32") not in DTYPES:
        fail(f"dtype {req['dtype']!r} is not one of {', '.join(DTYPES)}")
    if req.get("family", "llada") not in FAMILIES:
        fail(f"family {req['family']!r} is not one of {', '.join(FAMILIES)}")
    return req


class ForwardCounter:
    """Counts the model's forwards and sets the mask token's logit to -inf in their output: an
    instance attribute shadows the class's forward, and nn.Module.__call__ looks the name up on the
    instance. More than `cap` forwards for one prompt raise (a loop that does not finish)."""

    def __init__(self, model, cap: int, mask_id: int):
        self.calls, self.cap, self.mask_id, self._inner = 0, cap, mask_id, model.forward
        model.forward = self._forward

    def _forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.cap:
            raise RuntimeError(f"more than {self.cap} forwards for one prompt; the decoding loop does not finish")
        output = self._inner(*args, **kwargs)
        output.logits[..., self.mask_id] = float("-inf")
        return output


def peer_call(entry, req: dict, modules: dict) -> tuple[str, str, str, object, dict]:
    """(name, peer, function name, function, keyword arguments) of one entry of the request."""
    entry = {"name": entry, "function": entry} if isinstance(entry, str) else dict(entry)
    fname, peer = entry.get("function", entry["name"]), entry.get("peer", "fastdllm")
    family = req.get("family", "llada")
    if fname not in FUNCTIONS.get((peer, family), ()):
        fail(f"unknown function {peer}:{fname} for {family}; valid: "
             + ", ".join(f"{p}:{f}" for (p, fam), names in FUNCTIONS.items() if fam == family for f in names))
    if peer not in modules:
        fail(f"{entry['name']} runs {peer}'s {fname}: pass --{peer} DIR")
    if family == "dream":
        return entry["name"], peer, fname, *dream_call(entry, req, modules[peer])
    fn = getattr(modules[peer], fname)
    kwargs = dict(steps=int(entry.get("steps", req["steps"])), gen_length=int(req["gen_length"]),
                  block_length=int(entry.get("block_length", req["block_length"])),
                  temperature=float(req.get("temperature", 0.0)),
                  remasking=req.get("remasking", "low_confidence"), mask_id=int(req["mask_id"]))
    if peer == "llada":
        kwargs["cfg_scale"] = 0.0
    else:
        kwargs["threshold"] = entry.get("threshold", req.get("threshold"))
    check_signature(fn, kwargs)
    return entry["name"], peer, fname, fn, kwargs


def dream_call(entry: dict, req: dict, mixins: dict) -> tuple[object, dict]:
    """Fast-dLLM's Dream `diffusion_generate` and its keyword arguments for one entry: the entry's
    alg ("confidence_threshold" unless given; it then needs a threshold), top_k and top_p None
    (else transformers 4.x takes the checkpoint generation config's top_k), no attention mask (the
    prompt is attended whole)."""
    use_cache, dual_cache = bool(entry.get("use_cache")), bool(entry.get("dual_cache"))
    if dual_cache and not use_cache:
        fail(f"{entry['name']}: dual_cache needs use_cache (Fast-dLLM's dream/eval.py)")
    alg = entry.get("alg", "confidence_threshold")
    threshold = entry.get("threshold", req.get("threshold"))
    if alg == "confidence_threshold" and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
        fail(f"{entry['name']}: Fast-dLLM's Dream loops run alg confidence_threshold and need a threshold, "
             f"got {threshold!r}")
    fn, accepted = dream_function(mixins, use_cache)
    kwargs = dict(attention_mask=None, max_new_tokens=int(req["gen_length"]),
                  steps=int(entry.get("steps", req["steps"])), temperature=float(req.get("temperature", 0.0)),
                  top_p=None, top_k=None, alg=alg, mask_token_id=int(req["mask_id"]),
                  output_history=False, return_dict_in_generate=True)
    if alg == "confidence_threshold":
        kwargs["threshold"] = float(threshold)
    if use_cache:
        kwargs.update(block_length=int(entry.get("block_length", req["block_length"])), dual_cache=dual_cache)
    check_signature(fn, kwargs, accepted)
    return fn, kwargs


def time_function(fn, fname: str, model, counter: ForwardCounter, prompts, kwargs: dict, req: dict, device) -> dict:
    """`fn` on every prompt alone, `warmup_runs` untimed times, then `repeats` timed times."""
    import torch

    G = int(req["gen_length"])

    def run_all():
        tokens, forwards, nfes = [], [], []
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for prompt in prompts:
            counter.calls = 0
            out = fn(model, prompt, **kwargs)
            x, nfe = out if isinstance(out, tuple) else (out, None)
            forwards.append(counter.calls)
            nfes.append(None if nfe is None else int(nfe))
            tokens.append(x[0, prompt.shape[1]:prompt.shape[1] + G].tolist())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start, tokens, forwards, nfes

    warmup = [run_all()[0] for _ in range(int(req.get("warmup_runs", 1)))]
    seconds, tokens = [], None
    for _ in range(max(1, int(req.get("repeats", 1)))):
        s, again, forwards, nfes = run_all()
        seconds.append(s)
        if tokens is not None and again != tokens:
            fail(f"{fname} gave different tokens on a repeat; the comparison needs deterministic runs")
        tokens = again
    return {"tokens": tokens, "forwards": forwards, "nfe": nfes, "warmup_seconds": warmup,
            "seconds": statistics.median(seconds), "seconds_all": seconds}


def save_first_canvas_logits(model, prompt, req: dict, path: str) -> None:
    """The logits of a full forward of the first prompt's starting canvas at the request's
    `logit_positions` (fp32, CPU; Dream's shifted as its loops shift them), saved for the comparison
    with dllm's."""
    import torch

    positions = req.get("logit_positions") or []
    if not positions:
        return
    canvas = torch.full((1, prompt.shape[1] + int(req["gen_length"])), int(req["mask_id"]), dtype=torch.long,
                        device=prompt.device)
    canvas[:, :prompt.shape[1]] = prompt
    with torch.no_grad():
        logits = model(canvas).logits
    if req.get("family") == "dream":
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    logits = logits[0, positions].float().cpu()
    torch.save({"positions": positions, "logits": logits}, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fastdllm", type=Path, help="Fast-dLLM checkout (holds llada/generate.py, dream/model/)")
    ap.add_argument("--llada", type=Path, help="LLaDA checkout (holds generate.py)")
    ap.add_argument("--checkpoint", required=True, type=Path, help="LLaDA or Dream checkpoint folder (HF layout)")
    ap.add_argument("--request", required=True, type=Path, help="request JSON (see the module docstring)")
    ap.add_argument("--out", required=True, type=Path, help="result JSON")
    args = ap.parse_args(argv)

    if args.fastdllm is None and args.llada is None:
        fail("no peer checkout given: pass --fastdllm DIR, --llada DIR or both")
    if not (args.checkpoint / "config.json").is_file():
        fail(f"no config.json in checkpoint folder {args.checkpoint}")
    req = read_request(args.request)

    import torch  # after the argument checks: the peer environment's torch

    family = req.get("family", "llada")
    modules, files, model_cls = {}, {}, None
    if family == "dream" and args.fastdllm is None:
        fail("a Dream request runs Fast-dLLM's Dream code: pass --fastdllm DIR")
    if args.fastdllm is not None:
        load = import_fastdllm_dream if family == "dream" else import_fastdllm
        modules["fastdllm"], model_cls, found = load(args.fastdllm.resolve())
        files.update(found)
    if args.llada is not None:
        modules["llada"], found = import_llada(args.llada.resolve())
        files.update(found)
    import transformers

    if req.get("threads"):
        torch.set_num_threads(int(req["threads"]))
    device = torch.device(req.get("device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("device 'cuda' asked for, but this environment's torch has no CUDA")
    dtype = getattr(torch, req.get("dtype", "float32"))

    t0 = time.perf_counter()
    model, model_source = load_peer_model(model_cls, args.checkpoint, dtype, family)
    model = model.to(device).eval()
    load_seconds = time.perf_counter() - t0
    cap = int(req.get("max_forwards") or 4 * int(req["gen_length"]) + 64)
    counter = ForwardCounter(model, cap, int(req["mask_id"]))

    prompts = [torch.tensor([p], dtype=torch.long, device=device) for p in req["prompts"]]
    results = []
    for entry in req["functions"]:
        name, peer, fname, fn, kwargs = peer_call(entry, req, modules)
        timed = time_function(fn, fname, model, counter, prompts, kwargs, req, device)
        results.append({"name": name, "peer": peer, "function": fname, "kwargs": kwargs, **timed})
        print(f"driver: {name}: forwards {timed['forwards']}, {timed['seconds']:.2f} s", file=sys.stderr)
    save_first_canvas_logits(model, prompts[0], req, str(args.out) + ".logits.pt")

    info = {
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "threads": torch.get_num_threads(), "device": str(device), "dtype": req.get("dtype", "float32"),
        "family": family,
        "peer_files_sha256": files, "model_source": model_source, "load_seconds": load_seconds, "results": results,
    }
    args.out.write_text(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
