"""dllm against the peers' own LLaDA and Dream code (NVlabs/Fast-dLLM, ML-GSAI/LLaDA): the same
checkpoint, prompts and settings, in one run.

The peers' code is not part of this repository. Give Fast-dLLM's checkout with `--fastdllm DIR`
(the folder holding `llada/generate.py` and `dream/model/`) and LLaDA's with `--llada DIR` (the
folder holding `generate.py`); `benchmarks/peers/driver.py` imports them from there, in a separate
virtual environment with transformers 4.x (the checkpoints' modeling code is remote code written
for it), built by `benchmarks/peers/setup_env.sh`:

    bash benchmarks/peers/setup_env.sh runs/peers-venv
    git clone https://github.com/NVlabs/Fast-dLLM /tmp/fastdllm     # or, from a bare mirror:
    #   mkdir -p /tmp/fastdllm && git --git-dir=MIRROR archive HEAD llada dream | tar -x -C /tmp/fastdllm
    git clone https://github.com/ML-GSAI/LLaDA /tmp/llada           # for --configs llada
    python benchmarks/bench_peers.py --fastdllm /tmp/fastdllm --out rows.jsonl    # llada-compute (~35 min on 2 cores)
    python benchmarks/bench_peers.py --fastdllm /tmp/fastdllm --quick             # llada-tiny smoke run (seconds)
    python benchmarks/bench_peers.py --fastdllm /tmp/fastdllm --checkpoint dllm/assets/llada-pb-tiny
    python benchmarks/bench_peers.py --fastdllm /tmp/fastdllm --llada /tmp/llada --configs llada,low_confidence
    python benchmarks/bench_peers.py --fastdllm /tmp/fastdllm --preset dream-compute   # Dream's loops

The checkpoint is a random-weight model of a dllm preset (`--preset`, default `llada-compute`:
d 1024, 8 layers, the real 126464-token vocabulary; `dream-compute` and `dream-7b` for Dream;
`dllm.build_model(..., seed)`) written in its family's Hugging Face layout under `--workdir` (reused
when it is there), or any LLaDA or Dream folder given with `--checkpoint`. Both sides read that
folder: dllm with `dllm.models.loading.load_model`, the peers with Fast-dLLM's
`LLaDAModelLM.from_pretrained(..., torch_dtype=...)` (with `--fastdllm`; LLaDA's repository ships no
model code), else with the folder's own remote code, and Dream with Fast-dLLM's `DreamModel`. The
peer's forward is wrapped to count calls and to set the mask token's logit to -inf, as dllm never
proposes the mask token (`benchmarks/peers/driver.py`). The prompts are
`--prompts` rows of `--prompt-length` random token ids below the smallest special id (seeded),
each decoded alone (batch 1: Fast-dLLM's functions build a one-row canvas), at temperature 0;
`--prompt-ids FILE` gives the prompts instead (a JSON list of token-id lists).

Configurations (`--configs`) on a LLaDA checkpoint, peer function <-> dllm request
(`score_dtype="float64"` against Fast-dLLM, which computes confidences with a float64 softmax;
`"logits"` against LLaDA's `generate`, whose softmax is in the logits' dtype):

    threshold       Fast-dLLM generate(threshold=t)              sampler="threshold" tau=t, cache="none"
    prefix          Fast-dLLM generate_with_prefix_cache(...=t)  sampler="threshold" tau=t, cache="prefix"
    dual            Fast-dLLM generate_with_dual_cache(...=t)    sampler="threshold" tau=t, cache="dual"
    low_confidence  Fast-dLLM generate(threshold=None, steps=S)  sampler="low_confidence", steps=S
    llada           LLaDA generate(steps=S, cfg_scale=0)         sampler="low_confidence", steps=S
                    (the last two: LLaDA's fixed per-step counts; not in the default set)

With a threshold Fast-dLLM's `steps` only has to be a multiple of the number of blocks (each step
commits the top-1 masked block position and every other with confidence >= t, until the block
holds no mask); gen_length is passed.

On a Dream checkpoint, Fast-dLLM's `diffusion_generate` (`dream/model`, alg "confidence_threshold",
bound as its `dream/eval.py` binds it) <-> dllm, both with the softmax in the logits' dtype:

    threshold       without a cache, steps=S                     sampler="budget_threshold" threshold=t, steps=S
    prefix          use_cache, block_length                      sampler="threshold" tau=t commit_block_start,
                                                                 cache="prefix"
    dual            use_cache, dual_cache, block_length          the same with cache="dual"
    entropy         alg="entropy", without a cache, steps=E      sampler="entropy", steps=E
    entropy_prefix  alg="entropy", use_cache, block_length       sampler="block_entropy", cache="prefix", steps=E
    entropy_dual    alg="entropy", use_cache, dual_cache         the same with cache="dual"

S and E are `--steps` when given; else S is gen_length / block_length and E gen_length, the
settings of Fast-dLLM's Dream scripts (its threshold runs and its entropy baselines). Each step of
the loop without blocks has a budget of gen_length / S positions; the block loops need steps that
are a multiple of the blocks (the entropy one at least two per block). Each side runs every configuration once untimed
(`--warmup-runs`) and then `--repeats` times; the median is reported. dllm runs first, in this
process; then the driver runs in a subprocess with `--peer-python` (default
`runs/peers-venv/bin/python`); never both at once. `--threads` sets torch's thread count on both
sides (default: torch's own default, the same on both). `--variants` times dllm's side once per
way of running its forwards, each against the same peer timing: `eager` (default), `graphs`
(`model.set_cuda_graphs`, CUDA only), `compile` (`model.set_compile`) or `graphs+compile`; the
untimed runs capture and compile.

Printed per configuration: whether the generated tokens are identical (else the first differing
position of the generated region), forwards on each side, seconds on each side and the ratio
dllm / peer. A full forward of both models on the first canvas is compared too (max |logit
difference| at a few columns), so a token difference can be told apart from an arithmetic one.
`--out FILE` appends one JSON line per configuration with provenance: dllm's versions, the peer's
versions, hardware, timestamp, our git commit and the peer's commit (`--fastdllm-git GITDIR` or
`--llada-git GITDIR`, a bare mirror, or the checkout's own .git; else "unknown") and the sha256 of
the peer files the driver ran.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

import dllm
from dllm.config import ModelConfig
from dllm.models.loading import load_model, read_config
from dllm.train import save_pretrained
from dllm.provenance import hardware, source_commit, timestamp, versions

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "benchmarks" / "peers" / "driver.py"
DEFAULT_PEER_PYTHON = "runs/peers-venv/bin/python"
DEFAULT_WORKDIR = "runs/bench-peers"
DTYPES = ("float32", "bfloat16", "float16")

class PeerConfig(NamedTuple):
    peer: str            # "fastdllm" or "llada": the checkout (--fastdllm / --llada) holding the function
    function: str        # in that checkout's generate.py (LLaDA) or dream/model (Dream)
    sampler: str         # dllm's request
    cache: str
    uses_threshold: bool
    score_dtype: str     # the dtype of the peer's softmax
    sampler_kwargs: dict = {}   # dllm's sampler arguments besides the threshold
    peer_options: dict = {}     # the peer function's arguments besides the shared settings


PEERS = {"fastdllm": ("NVlabs/Fast-dLLM", "Fast-dLLM"), "llada": ("ML-GSAI/LLaDA", "LLaDA")}   # repo, short name
BLOCK_START = {"commit_block_start": True}
CONFIGS = {   # family -> name -> configuration
    "llada": {
        "threshold": PeerConfig("fastdllm", "generate", "threshold", "none", True, "float64"),
        "prefix": PeerConfig("fastdllm", "generate_with_prefix_cache", "threshold", "prefix", True, "float64"),
        "dual": PeerConfig("fastdllm", "generate_with_dual_cache", "threshold", "dual", True, "float64"),
        "low_confidence": PeerConfig("fastdllm", "generate", "low_confidence", "none", False, "float64"),
        "llada": PeerConfig("llada", "generate", "low_confidence", "none", False, "logits"),   # its softmax's dtype
    },
    "dream": {
        "threshold": PeerConfig("fastdllm", "diffusion_generate", "budget_threshold", "none", True, "logits"),
        "prefix": PeerConfig("fastdllm", "diffusion_generate", "threshold", "prefix", True, "logits", BLOCK_START,
                             {"use_cache": True}),
        "dual": PeerConfig("fastdllm", "diffusion_generate", "threshold", "dual", True, "logits", BLOCK_START,
                           {"use_cache": True, "dual_cache": True}),
        "entropy": PeerConfig("fastdllm", "diffusion_generate", "entropy", "none", False, "logits", {},
                              {"alg": "entropy"}),
        "entropy_prefix": PeerConfig("fastdllm", "diffusion_generate", "block_entropy", "prefix", False, "logits", {},
                                     {"alg": "entropy", "use_cache": True}),
        "entropy_dual": PeerConfig("fastdllm", "diffusion_generate", "block_entropy", "dual", False, "logits", {},
                                   {"alg": "entropy", "use_cache": True, "dual_cache": True}),
    },
}
DEFAULT_CONFIGS = "threshold,prefix,dual"
VARIANTS = ("eager", "graphs", "compile", "graphs+compile")
QUICK = dict(preset="llada-tiny", prompt_length=32, gen_length=64, block_length=16)


# -- the checkpoint ------------------------------------------------------------------------------
def write_checkpoint(cfg: ModelConfig, folder: str | Path, *, seed: int = 0, init_std: float = 0.02,
                     dtype: str = "float32", device: str = "cpu") -> Path:
    """A random-weight LLaDA or Dream model of `cfg` (`dllm.build_model(cfg, seed=seed)`, drawn on
    `device` in `dtype`) written in its family's Hugging Face layout: `model.safetensors` with the
    published weight names and a `config.json` with the published key set (no tokenizer: both sides
    take token ids)."""
    model = dllm.build_model(cfg, seed=seed, init_std=init_std, dtype=getattr(torch, dtype), device=device)
    return save_pretrained(model, None, folder)


def preset_checkpoint(preset: str, workdir: Path, seed: int, dtype: str = "float32", device: str = "cpu") -> Path:
    """The checkpoint folder of `preset` under `workdir`, written unless a complete one is there.
    Float32 weights are drawn on the CPU; other dtypes on `device` (a GPU draws a model of the
    published shape in seconds)."""
    device = "cpu" if dtype == "float32" else device
    suffix = "" if dtype == "float32" else f"-{dtype}-{torch.device(device).type}"
    folder = workdir / f"ckpt-{preset}-seed{seed}{suffix}"
    stamp = folder / "dllm_build.json"
    identity = {"preset": preset, "seed": seed, "init_std": 0.02, "dllm": dllm.__version__}
    if suffix:
        identity.update(dtype=dtype, device=torch.device(device).type)
    if stamp.is_file() and json.loads(stamp.read_text()) == identity and (folder / "model.safetensors").is_file():
        return folder
    print(f"writing the {preset} checkpoint (seed {seed}) to {folder}")
    write_checkpoint(ModelConfig.from_name(preset), folder, seed=seed, dtype=dtype, device=device)
    stamp.write_text(json.dumps(identity) + "\n")
    return folder


def make_prompts(cfg: ModelConfig, n: int, length: int, seed: int) -> list[list[int]]:
    """`n` rows of `length` token ids drawn uniformly below the smallest special id."""
    special = [i for i in (cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id,
                           cfg.eot_token_id) if i is not None]
    high = min(min(special), cfg.vocab_size)
    if high < 2:
        raise ValueError(f"no ordinary token ids below the special ids {special}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (n, length), generator=gen).tolist()


def read_prompt_ids(path: str | Path, cfg: ModelConfig) -> list[list[int]]:
    """Prompt token ids from a JSON file holding a non-empty list of non-empty lists of ids in the
    vocabulary, none of them the mask id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--prompt-ids file {path} not found")
    rows = json.loads(path.read_text())
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and r for r in rows):
        raise ValueError(f"--prompt-ids {path} must hold a non-empty JSON list of non-empty lists of token ids")
    for r in rows:
        bad = [t for t in r if not isinstance(t, int) or not 0 <= t < cfg.vocab_size or t == cfg.mask_token_id]
        if bad:
            raise ValueError(f"--prompt-ids {path}: token id(s) {bad[:5]} are not ids in [0, {cfg.vocab_size}) "
                             f"other than the mask id {cfg.mask_token_id}")
    return rows


# -- argument checks -------------------------------------------------------------------------------
# peer -> (its repository URL, how to export it from a bare mirror)
CHECKOUTS = {
    "fastdllm": ("https://github.com/NVlabs/Fast-dLLM",
                 "mkdir -p DIR && git --git-dir=MIRROR archive HEAD llada dream | tar -x -C DIR"),
    "llada": ("https://github.com/ML-GSAI/LLaDA",
              "mkdir -p DIR && git --git-dir=MIRROR archive HEAD generate.py | tar -x -C DIR"),
}
# (peer, family) -> the files its checkout must hold
CHECKOUT_FILES = {
    ("fastdllm", "llada"): ("llada/generate.py", "llada/model/modeling_llada.py"),
    ("fastdllm", "dream"): ("dream/model/modeling_dream.py", "dream/model/generation_utils.py",
                            "dream/model/generation_utils_block.py"),
    ("llada", "llada"): ("generate.py",),
}


def check_checkout(peer: str, folder: str | None, family: str = "llada") -> Path:
    """The checkout of `peer` ("fastdllm" or "llada") given with --fastdllm / --llada, checked for
    the files `family`'s configurations run."""
    (url, export), files = CHECKOUTS[peer], CHECKOUT_FILES.get((peer, family), CHECKOUT_FILES[peer, "llada"])
    name = PEERS[peer][1]
    if not folder:
        raise FileNotFoundError(f"no {name} checkout given: pass --{peer} DIR, the folder of a checkout of {url} "
                                f"(git clone {url} DIR, or from a bare mirror: {export})")
    root = Path(folder).expanduser()
    for rel in files:
        if not (root / rel).is_file():
            raise FileNotFoundError(f"{name} checkout {root} has no {rel}: --{peer} must name the folder that "
                                    f"holds {files[0]} (git clone {url} {root})")
    return root.resolve()


def check_peers(configs: list[str], fastdllm: str | None, llada: str | None,
                peer_python: str, family: str = "llada") -> tuple[dict[str, Path], Path]:
    """The checkouts `family`'s configurations need (and any other given), {peer: folder}, and the
    peer interpreter, checked before any model is built."""
    needed = {CONFIGS[family][c].peer for c in configs}
    roots = {peer: check_checkout(peer, folder, family) for peer, folder in (("fastdllm", fastdllm), ("llada", llada))
             if peer in needed or folder}
    python = Path(peer_python).expanduser()
    if not python.is_file() or not os.access(python, os.X_OK):
        venv = python.parent.parent if python.parent.name == "bin" else Path("runs/peers-venv")
        raise FileNotFoundError(f"no peer Python at {python}: build the peer environment with "
                                f"`bash benchmarks/peers/setup_env.sh {venv}`, or pass --peer-python PATH")
    return roots, python


def check_peer_model(roots: dict[str, Path], checkpoint: str | None) -> None:
    """The peer side loads the model with Fast-dLLM's class, else with the checkpoint's own remote
    code: without --fastdllm, --checkpoint must hold a modeling_*.py."""
    if "fastdllm" in roots:
        return
    if not checkpoint or not any(Path(checkpoint).expanduser().glob("modeling_*.py")):
        raise FileNotFoundError(f"the peer side needs model code: pass --fastdllm DIR (its LLaDAModelLM loads the "
                                f"checkpoint; LLaDA's repository ships none), or a --checkpoint folder holding its "
                                f"remote modeling_llada.py (got {checkpoint or 'a random preset'})")


def peer_commit(root: Path, git_dir: str | None) -> str:
    """A peer checkout's commit: `git --git-dir GIT_DIR rev-parse HEAD`, else the checkout's own, else
    that of an exported tree's `COMMIT` file (benchmarks/gpu/fetch_peers.sh writes one), else "unknown"."""
    cmd = (["git", "--git-dir", git_dir, "rev-parse", "HEAD"] if git_dir
           else ["git", "-C", str(root), "rev-parse", "HEAD"] if (root / ".git").exists() else None)
    if cmd is None:
        exported = root / "COMMIT"
        return exported.read_text().strip() if exported.is_file() else "unknown"
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# -- dllm's side -----------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def config_steps(name: str, args) -> int:
    """The steps configuration `name` runs: `--steps` when given, else the number of blocks for
    Dream's threshold loops (as Fast-dLLM's Dream scripts set them) and gen_length otherwise (LLaDA's
    threshold loops ignore it)."""
    config = CONFIGS[args.family][name]
    if args.family == "llada" and config.uses_threshold:
        return args.gen_length
    if args.steps is not None:
        return args.steps
    return args.gen_length // args.block_length if config.uses_threshold else args.gen_length


def dllm_request(name: str, args) -> dict:
    """dllm's `generate` arguments of configuration `name` on the run's family."""
    config = CONFIGS[args.family][name]
    req = dict(gen_length=args.gen_length, sampler=config.sampler, cache=config.cache,
               score_dtype=config.score_dtype, temperature=0.0)
    if dllm.samplers.sampler_class(config.sampler).uses_blocks:
        req["block_length"] = args.block_length
    if config.uses_threshold:
        key = "threshold" if config.sampler == "budget_threshold" else "tau"
        req["sampler_kwargs"] = {key: args.threshold, **config.sampler_kwargs}
    if config.sampler == "budget_threshold" or not config.uses_threshold:
        req["steps"] = config_steps(name, args)
    return req


def run_dllm(model, prompts, request: dict, device, warmup_runs: int, repeats: int) -> dict:
    """Every prompt alone (batch 1), `warmup_runs` untimed times, then `repeats` timed times."""
    def run_all():
        tokens, forwards = [], []
        gc.collect()
        sync(device)
        start = time.perf_counter()
        for p in prompts:
            out = dllm.generate(model, None, [p], **request)
            tokens.append(out.generated[0].tolist())
            forwards.append(out.forwards)
        sync(device)
        return time.perf_counter() - start, tokens, forwards

    warmup = [run_all()[0] for _ in range(warmup_runs)]
    seconds, tokens = [], None
    for _ in range(repeats):
        s, again, forwards = run_all()
        seconds.append(s)
        if tokens is not None and again != tokens:
            raise RuntimeError("dllm gave different tokens on a repeat; the comparison needs deterministic runs")
        tokens = again
    return {"tokens": tokens, "forwards": forwards, "seconds": statistics.median(seconds), "seconds_all": seconds,
            "warmup_seconds": warmup}


def first_difference(a: list[list[int]], b: list[list[int]]) -> tuple[int | None, int | None, int]:
    """(prompt index, position in the generated region) of the first differing token, and the
    number of differing tokens over all prompts."""
    first, count = (None, None), 0
    for i, (ra, rb) in enumerate(zip(a, b)):
        diff = [j for j, (x, y) in enumerate(zip(ra, rb)) if x != y] + list(range(min(len(ra), len(rb)),
                                                                                max(len(ra), len(rb))))
        count += len(diff)
        if diff and first == (None, None):
            first = (i, diff[0])
    return first[0], first[1], count


# -- the run ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fastdllm", help="Fast-dLLM checkout (the folder holding llada/generate.py and dream/model/)")
    ap.add_argument("--fastdllm-git", help="git dir of that checkout (e.g. a bare mirror), for its commit")
    ap.add_argument("--llada", help="LLaDA checkout (the folder holding generate.py), for --configs llada")
    ap.add_argument("--llada-git", help="git dir of that checkout (e.g. a bare mirror), for its commit")
    ap.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON,
                    help=f"python of the peer environment (default {DEFAULT_PEER_PYTHON}; "
                         f"built by benchmarks/peers/setup_env.sh)")
    ap.add_argument("--preset", default=None, help="dllm ModelConfig preset of the random checkpoint "
                                                   "(default llada-compute; llada-tiny with --quick)")
    ap.add_argument("--checkpoint", help="a LLaDA or Dream checkpoint folder instead of a random preset")
    ap.add_argument("--seed", type=int, default=0, help="weights and prompts seed")
    ap.add_argument("--prompts", type=int, default=1, help="prompts, each decoded alone (batch 1)")
    ap.add_argument("--prompt-ids", help="JSON file with a list of prompt token-id lists, used instead of random "
                                         "prompts (e.g. task prompts for a trained --checkpoint)")
    ap.add_argument("--prompt-length", type=int, default=None, help="default 256 (32 with --quick)")
    ap.add_argument("--gen-length", type=int, default=None, help="default 256 (64 with --quick)")
    ap.add_argument("--block-length", type=int, default=None, help="default 32 (16 with --quick)")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=None,
                    help="steps of the low_confidence and llada configurations (default gen_length); on Dream "
                         "the steps of every configuration (default gen_length / block_length)")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help=f"comma list of {', '.join(CONFIGS['llada'])} (LLaDA) or {', '.join(CONFIGS['dream'])} "
                         f"(Dream)")
    ap.add_argument("--variants", default="eager",
                    help=f"comma list of how dllm runs its forwards: {', '.join(VARIANTS)} (default eager)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per side and configuration (median)")
    ap.add_argument("--warmup-runs", type=int, default=1, help="untimed runs before them")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--threads", type=int, default=None, help="torch threads on both sides (default torch's)")
    ap.add_argument("--workdir", default=DEFAULT_WORKDIR, help=f"checkpoint, request and peer result "
                                                               f"(default {DEFAULT_WORKDIR})")
    ap.add_argument("--out", help="append one JSON row per configuration to this file")
    ap.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(f"{k} {v}" for k, v in QUICK.items()))
    args = ap.parse_args(argv)

    base = QUICK if args.quick else dict(preset="llada-compute", prompt_length=256, gen_length=256, block_length=32)
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.family = family_of(args)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in args.configs if c not in CONFIGS[args.family]]
    if bad or not args.configs:
        raise ValueError(f"unknown configuration(s) {', '.join(bad) or '(none given)'} for a {args.family} "
                         f"checkpoint; valid: {', '.join(CONFIGS[args.family])}")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        raise ValueError(f"unknown variant(s) {', '.join(bad) or '(none given)'}; valid: {', '.join(VARIANTS)}")
    for name in ("prompts", "prompt_length", "gen_length", "block_length", "repeats"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.warmup_runs < 0:
        raise ValueError(f"--warmup-runs must be >= 0, got {args.warmup_runs}")
    if args.gen_length % args.block_length:
        raise ValueError(f"--block-length {args.block_length} does not divide --gen-length {args.gen_length} "
                         f"(the peers assert it)")
    check_steps(args)
    if not 0 <= args.threshold <= 1:
        raise ValueError(f"--threshold must lie in [0, 1], got {args.threshold}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device} asked for, but CUDA is not available here; use cpu")
    if not args.device.startswith("cuda") and any("graphs" in v for v in args.variants):
        raise ValueError(f"--variants {','.join(args.variants)}: CUDA graphs need --device cuda, got {args.device}")
    return args


def family_of(args) -> str:
    """The model family of the run's checkpoint: the preset's, or that of --checkpoint's config.json;
    the peers' code runs LLaDA and Dream."""
    if args.checkpoint:
        ckpt = Path(args.checkpoint).expanduser()
        if not (ckpt / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in --checkpoint {ckpt}; pass a LLaDA or Dream checkpoint folder")
        family = read_config(ckpt)[0].family
    else:
        family = ModelConfig.from_name(args.preset).family
    if family not in CONFIGS:
        raise ValueError(f"{args.checkpoint or args.preset} is a {family} model; the peers' code runs "
                         f"{' and '.join(CONFIGS)} models")
    return family


def check_steps(args) -> None:
    """Each chosen configuration's steps (`config_steps`) against what its peer function asserts:
    block loops a multiple of the blocks (Fast-dLLM's block-wise Dream loop at least two per block,
    else it leaves masks), Fast-dLLM's Dream threshold loop without blocks a divisor of gen_length."""
    blocks, configs = args.gen_length // args.block_length, CONFIGS[args.family]
    if args.steps is not None and args.steps <= 0:
        raise ValueError(f"--steps must be a positive integer, got {args.steps}")
    for name in args.configs:
        config, steps = configs[name], config_steps(name, args)
        blockwise = (not config.uses_threshold and args.family == "llada") or config.cache != "none"
        if blockwise and steps % blocks:
            raise ValueError(f"--steps {steps} is not a multiple of the {blocks} blocks ({name}: the peers assert it)")
        if config.sampler == "block_entropy" and steps < 2 * blocks:
            raise ValueError(f"--steps {steps} gives fewer than 2 per block over the {blocks} blocks ({name}: "
                             f"Fast-dLLM's loop then leaves masks)")
        if config.sampler == "budget_threshold" and args.gen_length % steps:
            raise ValueError(f"--steps {steps} does not divide --gen-length {args.gen_length} ({name}: Fast-dLLM's "
                             f"Dream loop asserts it)")


def run_prompts(args, cfg: ModelConfig) -> list[list[int]]:
    """The prompts of the run: `--prompt-ids` (which then sets `args.prompts` and
    `args.prompt_length`) or seeded random ones."""
    if not args.prompt_ids:
        return make_prompts(cfg, args.prompts, args.prompt_length, args.seed)
    prompts = read_prompt_ids(args.prompt_ids, cfg)
    args.prompts, args.prompt_length = len(prompts), len(prompts[0])
    return prompts


def checkpoint_of(args, workdir: Path) -> tuple[Path, str]:
    """The checkpoint folder both sides read, and its label in the rows."""
    if not args.checkpoint:
        return preset_checkpoint(args.preset, workdir, args.seed, args.dtype, args.device), args.preset
    return Path(args.checkpoint).expanduser(), str(args.checkpoint)


def first_canvas_logits(model, prompt: list[int], gen_length: int, device) -> tuple[list[int], torch.Tensor]:
    """The columns compared on both sides and dllm's logits there, from a full forward of the first
    prompt's starting canvas (fp32, on the CPU)."""
    Lp, mask = len(prompt), model.config.mask_token_id
    columns = sorted({Lp - 1, Lp, Lp + 1, Lp + gen_length // 2, Lp + gen_length - 1})
    canvas = torch.full((1, Lp + gen_length), mask, dtype=torch.long, device=device)
    canvas[0, :Lp] = torch.tensor(prompt, device=device)
    with torch.no_grad():
        return columns, model(canvas)[0, columns].float().cpu()


def time_ours(model, prompts, args, device) -> dict:
    """dllm's timings per (configuration, variant)."""
    ours = {}
    for variant in args.variants:
        model.set_cuda_graphs("graphs" in variant, capture_after=1)
        model.set_compile("compile" in variant)
        for name in args.configs:
            ours[name, variant] = run_dllm(model, prompts, dllm_request(name, args), device, args.warmup_runs,
                                           args.repeats)
            print(f"dllm {name} ({variant}): forwards {ours[name, variant]['forwards']}, "
                  f"{ours[name, variant]['seconds']:.2f} s", flush=True)
    return ours


def run_peer(roots: dict[str, Path], python: Path, ckpt: Path, prompts, logit_columns, args, workdir: Path,
             mask_id: int) -> tuple[dict, torch.Tensor]:
    """The peer driver's result and its logits on the first canvas, from a subprocess in the peers'
    environment."""
    configs = CONFIGS[args.family]
    request = {"family": args.family, "prompts": prompts, "gen_length": args.gen_length,
               "block_length": args.block_length, "steps": args.gen_length,
               "threshold": args.threshold, "mask_id": mask_id, "temperature": 0.0,
               "remasking": "low_confidence", "repeats": args.repeats, "warmup_runs": args.warmup_runs,
               "device": args.device, "dtype": args.dtype, "threads": args.threads,
               "logit_positions": logit_columns,
               "functions": [{"name": n, "peer": configs[n].peer, "function": configs[n].function,
                              **configs[n].peer_options, "steps": config_steps(n, args),
                              **({} if configs[n].uses_threshold else {"threshold": None})}
                             for n in args.configs]}
    req_path, res_path = workdir / "request.json", workdir / "peer_result.json"
    req_path.write_text(json.dumps(request) + "\n")
    res_path.unlink(missing_ok=True)
    cmd = [str(python), str(DRIVER), *(a for peer, root in roots.items() for a in (f"--{peer}", str(root))),
           "--checkpoint", str(ckpt.resolve()), "--request", str(req_path), "--out", str(res_path)]
    print("running the peer:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0 or not res_path.is_file():
        raise RuntimeError(f"the peer driver failed (exit status {done.returncode}); its messages are above")
    peer_logits = torch.load(str(res_path) + ".logits.pt", weights_only=True)["logits"]
    return json.loads(res_path.read_text()), peer_logits


def shared_fields(args, cfg, label: str, prompts, peer: dict, load_avg: list[float], logits: dict) -> dict:
    """The fields every row of the run carries: provenance on both sides and the settings."""
    head, dirty = source_commit()
    return {"timestamp": timestamp(), "versions": versions(), "peer_versions": peer["versions"],
            "hardware": hardware(device=args.device), "git_commit": head, "git_dirty": dirty,
            "peer_files_sha256": peer["peer_files_sha256"], "peer_model_source": peer["model_source"],
            "load_avg_1m": load_avg, "checkpoint": label, "n_params": cfg.n_params,
            "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "seed": args.seed,
            "batch": 1, "prompts": args.prompts, "prompt_length": len(prompts[0]),
            "prompt_lengths": [len(p) for p in prompts], "family": args.family,
            "prompt_source": args.prompt_ids or f"random (seed {args.seed})", "gen_length": args.gen_length,
            "block_length": args.block_length, "threshold": args.threshold, "dtype": args.dtype,
            "device": args.device, "threads": torch.get_num_threads(), "peer_threads": peer["threads"],
            "repeats": args.repeats, "warmup_runs": args.warmup_runs, **logits}


def compared_rows(ours: dict, peer: dict, commits: dict, shared: dict, args) -> list[dict]:
    """One row per (peer configuration, dllm variant), printed as a table line too."""
    rows = []
    print(f"{'config':<30} {'peer function':<38} {'identical':<12} {'forwards':>15} "
          f"{'dllm s':>9} {'peer s':>9} {'dllm/peer':>9}")
    for entry, variant in ((e, v) for e in peer["results"] for v in args.variants):
        name, peer_name = entry["name"], entry["peer"]
        options = CONFIGS[args.family][name].peer_options
        mine = ours[name, variant]
        row_i, pos, count = first_difference(mine["tokens"], entry["tokens"])
        ratio = mine["seconds"] / entry["seconds"] if entry["seconds"] > 0 else float("inf")
        rows.append({**shared, "config": name, "dllm_variant": variant, "peer": PEERS[peer_name][0],
                     "peer_commit": commits[peer_name], "peer_function": entry["function"],
                     "peer_options": options, "peer_kwargs": entry["kwargs"], "dllm_request": dllm_request(name, args),
                     "tokens_identical": count == 0, "first_diff_prompt": row_i, "first_diff_position": pos,
                     "mismatched_tokens": count, "dllm_forwards": mine["forwards"],
                     "peer_forwards": entry["forwards"], "peer_nfe": entry["nfe"],
                     "dllm_seconds": mine["seconds"], "peer_seconds": entry["seconds"],
                     "dllm_seconds_all": mine["seconds_all"], "peer_seconds_all": entry["seconds_all"],
                     "dllm_warmup_seconds": mine["warmup_seconds"], "peer_warmup_seconds": entry["warmup_seconds"],
                     "ratio": ratio})
        ident = "yes" if count == 0 else f"no @{pos}" + (f" (p{row_i})" if args.prompts > 1 else "")
        fw = f"{sum(mine['forwards'])} / {sum(entry['forwards'])}"
        function = " ".join([PEERS[peer_name][1], entry["function"],
                             *(k if on is True else f"{k}={on}" for k, on in options.items() if on)])
        print(f"{name + ' (' + variant + ')':<30} {function:<38} {ident:<12} {fw:>15} {mine['seconds']:>9.2f} "
              f"{entry['seconds']:>9.2f} {ratio:>9.3f}")
    return rows


def append_rows(path: str, rows: list[dict]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    print(f"appended {len(rows)} row(s) to {out}")


def main(argv=None) -> int:
    args = parse_args(argv)
    roots, python = check_peers(args.configs, args.fastdllm, args.llada, args.peer_python, args.family)
    check_peer_model(roots, args.checkpoint)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, label = checkpoint_of(args, workdir)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    # dllm's side, in this process.
    model = load_model(ckpt, dtype=args.dtype, device=device)
    cfg = model.config
    prompts = run_prompts(args, cfg)
    logit_columns, our_logits = first_canvas_logits(model, prompts[0], args.gen_length, device)
    load_before = os.getloadavg()[0]
    ours = time_ours(model, prompts, args, device)
    del model
    gc.collect()

    # The peer's side, in its own environment.
    peer, peer_logits = run_peer(roots, python, ckpt, prompts, logit_columns, args, workdir, cfg.mask_token_id)
    load_after = os.getloadavg()[0]
    # the peer's mask-token logit is -inf (benchmarks/peers/driver.py); the other columns are compared
    others = torch.arange(our_logits.shape[1]) != cfg.mask_token_id
    logit_diff = float((our_logits - peer_logits)[:, others].abs().max())
    logit_scale = float(our_logits[:, others].abs().max())

    commits = {name: peer_commit(root, args.fastdllm_git if name == "fastdllm" else args.llada_git)
               for name, root in roots.items()}
    shared = shared_fields(args, cfg, label, prompts, peer, [load_before, load_after],
                           {"logit_positions": logit_columns, "logits_max_abs_diff": logit_diff,
                            "logits_max_abs": logit_scale})
    lengths = sorted({len(p) for p in prompts})
    shown = lengths[0] if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
    print(f"\n{label}: prompt {shown}, gen {args.gen_length}, block {args.block_length}, threshold {args.threshold}, "
          f"{args.dtype}, {args.device}, batch 1, {args.prompts} prompt(s); "
          + ", ".join(f"{PEERS[p][1]} {c[:12]}" for p, c in commits.items()))
    print(f"full forward on the first canvas: max |logit difference| {logit_diff:.3g} "
          f"(max |logit| {logit_scale:.3g})")
    rows = compared_rows(ours, peer, commits, shared, args)
    if args.out:
        append_rows(args.out, rows)
    return 0


def run_from_the_command_line(argv=None) -> int:
    """`main`, with a bad option or a missing checkout printed as an error (exit 2), not a traceback."""
    try:
        return main(argv)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run_from_the_command_line())
