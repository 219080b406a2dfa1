"""Load LLaDA, LLaDA-MoE, LLaDA2 and Dream checkpoints in the Hugging Face layout, from a folder or a hub id.

The folder holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and the tokenizer files. No remote code runs: the architectures are
native (`llada.py`, `llada_moe.py`, `dream.py`), the family is chosen from the keys present in
config.json (not from `model_type` alone, which LLaDA and LLaDA-MoE share), and the tokenizer is
built by `transformers` from its data files. A family's name map may send checkpoint tensors to
slots `name@j` of one stacked parameter (LLaDA-MoE's experts); the loader stacks them.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from safetensors import SafetensorError, safe_open
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

from ..attention import check_device, get_backend
from ..config import ModelConfig, check_seed, positive_finite
from .config_json import naming_keys
from .dream import DreamModel
from .llada import LLaDAModel
from .llada2 import ARCHITECTURE as LLADA2_ARCHITECTURE
from .llada2 import MODEL_TYPES as LLADA2_MODEL_TYPES
from .llada2 import LLaDA2Model
from .llada_moe import LLaDAMoEModel
from .transformer import DiffusionTransformer

FAMILY_CLASSES: dict[str, type[DiffusionTransformer]] = {"llada": LLaDAModel, "dream": DreamModel,
                                                         "llada-moe": LLaDAMoEModel, "llada2": LLaDA2Model}

_FAMILY_HELP = ("supported families: 'llada' (LLaDA-8B / LLaDA-1.5: OLMo-style keys d_model, n_layers, n_heads, "
                "block_type 'llama'), 'llada-moe' (LLaDA-MoE-7B-A1B: keys hidden_size, num_hidden_layers, "
                "num_experts, expert_intermediate_size), 'llada2' (LLaDA2.0 / 2.1: architecture LLaDA2MoeModelLM) and 'dream' (Dream-v0: Qwen2-style keys hidden_size, "
                "num_hidden_layers, num_attention_heads plus mask_token_id)")

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

_TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json"]
_HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                 *_TOKENIZER_FILES]

# End-of-turn token of each family's chat format, and its id in the published vocabularies
# (recognised by the mask id) for tokenizers that do not register it.
_EOT_TOKENS = {"llada": "<|eot_id|>", "dream": "<|im_end|>", "llada-moe": "<|role_end|>", "llada2": "<|role_end|>"}
_KNOWN_EOT = {("llada", 126336): 126348, ("dream", 151666): 151645}

# Checkpoints shipped inside the package (dllm/assets/<name>/); the first is the default model of
# `dllm.load()`, `dllm generate` and `dllm bench`.
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL = "llada-pb-tiny"


def shipped_models() -> list[str]:
    """Names of the checkpoints shipped in the package (folders of dllm/assets with a config.json)."""
    if not ASSETS_DIR.is_dir():
        return []
    return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "config.json").is_file())


def default_model_path() -> Path:
    """Folder of the shipped default model (`DEFAULT_MODEL`)."""
    folder = ASSETS_DIR / DEFAULT_MODEL
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"the shipped default model is missing from {folder}; reinstall dllm, or pass a "
                                f"checkpoint folder or hub id")
    return folder


def detect_family(d: dict[str, Any]) -> str:
    """'llada2' from a config.json's architectures or model_type, else 'llada', 'llada-moe' or
    'dream' from its keys; anything else is a clear error."""
    if not isinstance(d, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(d).__name__}")
    model_type = str(d.get("model_type", ""))
    archs = [str(a) for a in d.get("architectures") or []]
    if LLADA2_ARCHITECTURE in archs or model_type.lower() in LLADA2_MODEL_TYPES:
        return "llada2"
    if "num_experts" in d or "moe_layer_freq" in d or model_type.lower() == "lladamoe":
        if "expert_intermediate_size" in d or any(a.startswith("LLaDAMoE") for a in archs):
            return "llada-moe"
        raise ValueError(f"mixture-of-experts config (model_type {model_type!r}, architectures {archs}) is not "
                         f"one dllm reads; " + _FAMILY_HELP)
    if all(k in d for k in ("d_model", "n_layers", "n_heads")):
        return "llada"
    if all(k in d for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")):
        if model_type.lower() == "dream" or any("Dream" in a for a in archs) or "mask_token_id" in d:
            return "dream"
        raise ValueError(f"config.json (model_type {model_type!r}) looks like an autoregressive Qwen2/Llama model "
                         f"without a mask token, not a masked-diffusion model; " + _FAMILY_HELP)
    raise ValueError(f"cannot tell the model family of config.json (model_type {model_type!r}, keys "
                     f"{sorted(d)[:12]}...); " + _FAMILY_HELP)


def resolve_dtype(dtype) -> torch.dtype | None:
    """torch.dtype from a name; None or "auto" keeps the checkpoint's dtype."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; choose one of float32, float16, bfloat16")
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"unsupported dtype {dtype!r}; choose one of 'auto', 'float32', 'float16', 'bfloat16'")


def parse_device(device) -> torch.device:
    """torch.device from a name, whether or not that device exists on this machine; a ValueError
    names a name torch does not read."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu', 'cuda', 'cuda:N' or another torch "
                         f"device") from None


def resolve_device(device, auto=None) -> torch.device:
    """torch.device from a name, checked to exist before any weight is read. "auto" is `auto`
    when given (a multi-process launch's device for this process), else "cuda" when CUDA is
    available, else "cpu"."""
    if device == "auto":
        device = auto if auto is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    dev = parse_device(device)
    if dev.type == "meta":
        raise ValueError(f"device {device!r} holds no weights; use 'auto', 'cpu', 'cuda', 'cuda:N' or another "
                         f"torch device")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available on this machine; use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s)")
    elif dev.type != "cpu":
        try:
            torch.empty(0, device=dev)
        except Exception as err:  # torch raises RuntimeError, AssertionError or ImportError by backend
            why = (str(err).strip().splitlines() or [""])[0][:160]
            raise ValueError(f"device {device!r} is not available on this machine ({type(err).__name__}: {why}); "
                             f"use 'cpu' or a device this torch build supports") from None
    return dev


def resolve_checkpoint(path_or_id: str | os.PathLike | None) -> Path:
    """A local folder as is; the name of a shipped model (`shipped_models()`, None = the default);
    otherwise a hub id fetched (or found in the local cache) with huggingface_hub."""
    if path_or_id is None:
        return default_model_path()
    if not isinstance(path_or_id, (str, os.PathLike)) or str(path_or_id).strip() == "":
        raise ValueError(f"the model must be a checkpoint folder, a shipped model name {shipped_models()} or a hub "
                         f"id 'org/name' (a str or path), or None for the default, got {path_or_id!r:.80} "
                         f"({type(path_or_id).__name__})")
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    name = str(path_or_id)
    if name in shipped_models():
        return ASSETS_DIR / name
    if path.exists():
        raise ValueError(f"{name!r} is a file; pass the checkpoint folder that holds config.json")
    parts = name.split("/")
    if len(parts) != 2 or not all(parts) or name.startswith((".", "~")):
        raise FileNotFoundError(f"no checkpoint folder at {name!r}, and it is neither a shipped model "
                                f"{shipped_models()} nor a hub id of the form 'org/name'")
    try:
        return Path(snapshot_download(name, allow_patterns=_HUB_PATTERNS))
    except Exception as err:  # offline, unknown repo, gated, ...
        try:  # an earlier download may sit in the local cache
            return Path(snapshot_download(name, allow_patterns=_HUB_PATTERNS, local_files_only=True))
        except Exception:
            pass
        reason = " ".join(str(err).split())[:200]
        raise FileNotFoundError(
            f"could not fetch {name!r} from the Hugging Face hub ({type(err).__name__}: {reason}). "
            f"If this machine is offline, download the checkpoint elsewhere (e.g. `hf download "
            f"{name} --local-dir ./{parts[1]}`), copy the folder here and pass its path: "
            f"dllm.load('./{parts[1]}') or `dllm generate --model ./{parts[1]} ...`") from None


def read_config(folder: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """ModelConfig and the raw config.json of a checkpoint folder."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"missing config.json in checkpoint folder {folder}")
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"corrupt config.json in {folder}: {err}") from None
    cls = FAMILY_CLASSES[detect_family(raw)]
    try:
        if cls.config_reads_tokens:   # its config.json names no mask id: the tokenizer's <|mask|> is it
            return cls.config_from_hf(raw, added_tokens(folder)), raw
        return cls.config_from_hf(raw), raw
    except ValueError as err:        # a check of the built config names its fields: add their keys
        raise ValueError(naming_keys(str(err), cls.config_keys)) from None


def added_tokens(folder: Path) -> dict[str, int]:
    """{content: id} of the added tokens in the folder's tokenizer.json (empty without one)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ValueError(f"corrupt tokenizer.json in {folder}: {err}") from None
    return {e["content"]: int(e["id"]) for e in entries if isinstance(e, dict) and "content" in e and "id" in e}


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"corrupt shard index {index}: {err!r}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError(f"corrupt shard index {index}: 'weight_map' must map weight names to file names")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(f"missing weight shard(s) {', '.join(missing)} listed in {index}")
        return [folder / f for f in files]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
        raise ValueError(f"{folder} holds PyTorch pickle weights only; dllm reads safetensors "
                         f"(model.safetensors or shards with model.safetensors.index.json)")
    raise FileNotFoundError(f"no weights in {folder}: expected model.safetensors or model.safetensors.index.json")


def load_weights(folder: Path, names: dict[str, str], dtype: torch.dtype | None, device,
                 ignorable: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Read every safetensors file, check the key set against `names` and rename to internal names.
    Tensors the model does not use are skipped, as Hugging Face skips them: `ignorable` (a tied LM
    head's stored copy) and rotary `inv_freq` buffers, which are recomputed."""
    out: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    unexpected: list[str] = []
    for file in _weight_files(folder):
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    if key in seen:
                        raise ValueError(f"weight {key!r} appears in more than one shard (again in {file.name})")
                    seen.add(key)
                    if key in ignorable or key.endswith("rotary_emb.inv_freq"):
                        continue
                    if key not in names:
                        unexpected.append(key)
                        continue
                    out[names[key]] = tensor = f.get_tensor(key)
                    if not tensor.is_floating_point():
                        raise ValueError(f"weight {key!r} in {file} is {tensor.dtype}; weights must be "
                                         f"floating point (float32, bfloat16, float16)")
        except (SafetensorError, OSError, RuntimeError) as err:
            raise ValueError(f"corrupt or unreadable weight file {file}: {err}") from None
        for key in list(out):  # moved outside the reading guard: a device error is not a corrupt file
            t = out[key]
            if t.device != torch.device(device) or (dtype is not None and t.dtype != dtype):
                out[key] = t.to(device=device, dtype=dtype or t.dtype)
    missing = sorted(set(names) - seen)
    if missing or unexpected:
        raise ValueError(f"checkpoint weights in {folder} do not match the architecture: "
                         f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                         f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}")
    return stack_slots(out, folder, {ours: hf for hf, ours in names.items()})


def checkpoint_name(source: dict[str, str], ours: str) -> str:
    """The checkpoint name of internal tensor `ours` (`source`: internal -> checkpoint name); a
    stacked tensor is named by its slot 0."""
    if ours in source:
        return source[ours]
    if f"{ours}@0" in source:
        return f"{source[ours + '@0']} and the tensors stacked with it"
    return ours


def stack_slots(tensors: dict[str, torch.Tensor], folder: Path | str = "",
                source: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Tensors named `name@j` stacked along a new first dim into `name`, slots 0..n-1 in order;
    shapes must agree (an error names them by `source`, internal -> checkpoint name)."""
    slots: dict[str, dict[int, torch.Tensor]] = {}
    out = {}
    for key, t in tensors.items():
        if "@" not in key:
            out[key] = t
            continue
        base, j = key.rsplit("@", 1)
        slots.setdefault(base, {})[int(j)] = t
    for base, parts in slots.items():
        shapes = {tuple(t.shape): j for j, t in sorted(parts.items(), reverse=True)}   # shape -> first slot
        if len(shapes) != 1:
            named = [f"{(source or {}).get(f'{base}@{j}', f'{base}@{j}')} {shape}" for shape, j in
                     sorted(shapes.items(), key=lambda item: item[1])]
            raise ValueError(f"the tensors stacked into one parameter in {folder} differ in shape: "
                             + ", ".join(named))
        out[base] = torch.stack([parts[j] for j in range(len(parts))])
    return out


def build_model(cfg: ModelConfig, attention: str = "auto", *, dtype=torch.float32, device="cpu",
                seed: int | None = None, init_std: float = 0.02) -> DiffusionTransformer:
    """A randomly initialised model of `cfg` (tests, benchmarks, training from scratch).

    On the CPU the weights are drawn in fp32 from a CPU generator and then cast. On an accelerator
    they are drawn there, in `dtype`, from a generator of that device, so that a model of the
    published size builds in seconds: the same distribution, a different stream from the CPU's.
    Buffers (LLaDA2's `expert_bias`) start at zero. `dtype` None or "auto" is float32; a torch
    dtype may be any of `COMPUTE_DTYPES`."""
    if not isinstance(cfg, ModelConfig):
        raise ValueError(f"build_model takes a ModelConfig (ModelConfig.from_name(...) for a preset), got {cfg!r}")
    check_seed(seed)
    if not positive_finite(init_std):
        raise ValueError(f"init_std must be a finite number > 0, got {init_std!r}")
    dtype = dtype if dtype in COMPUTE_DTYPES else (resolve_dtype(dtype) or torch.float32)
    device = resolve_device(device)
    get_backend(attention)
    check_device(attention, device)
    seed = 0 if seed is None else seed
    if device.type == "cpu":
        model = FAMILY_CLASSES[cfg.family](cfg, attention=attention)
        gen = torch.Generator().manual_seed(seed)
    else:
        with torch.device("meta"):
            model = FAMILY_CLASSES[cfg.family](cfg, attention=attention)
        model = model.to(dtype=dtype).to_empty(device=device)
        gen = torch.Generator(device=device).manual_seed(seed)
    init_weights(model, gen, init_std)
    return model.to(device=device, dtype=dtype).eval()


def init_weights(model: torch.nn.Module, generator: torch.Generator, init_std: float) -> None:
    """In place: norm weights 1, every other parameter N(0, init_std) from `generator`, buffers 0."""
    with torch.no_grad():
        for buffer in model.buffers():
            buffer.zero_()
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, init_std, generator=generator)


def load_model(folder: Path, *, dtype=None, device="cpu", attention: str = "auto") -> DiffusionTransformer:
    cfg, _ = read_config(folder)
    cls = FAMILY_CLASSES[cfg.family]
    with torch.device("meta"):
        model = cls(cfg, attention=attention)   # refuses a backend this model cannot use, before any read
    names = cls.hf_names(cfg)
    # a tied head read from the embedding: a copy of it stored under the head's name is not used
    tied_head = frozenset(cls.hf_names(dataclasses.replace(cfg, tie_embeddings=False))) - set(names) \
        if cfg.tie_embeddings else frozenset()
    tensors = cls.adapt_weights(cfg, load_weights(folder, names, resolve_dtype(dtype), device, tied_head))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    source = {ours: hf for hf, ours in names.items()}
    bad = [f"{checkpoint_name(source, ours)}: checkpoint {tuple(t.shape)} vs config {expected[ours]}"
           for ours, t in sorted(tensors.items()) if tuple(t.shape) != expected[ours]]
    if bad:
        raise ValueError(f"weight shapes in {folder} do not match its config.json: " + "; ".join(bad[:6]))
    if resolve_dtype(dtype) is None:
        one_parameter_dtype(tensors, {name for name, _ in model.named_parameters()})
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval()


COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def one_parameter_dtype(tensors: dict[str, torch.Tensor], parameters: set[str]) -> None:
    """Cast, in place, the floating tensors stored in another dtype than most of the parameters'
    entries to that one, as Hugging Face's dtype "auto" loads a model: a checkpoint keeping e.g.
    its norms or LLaDA2's `expert_bias` buffer in float32 beside bfloat16 weights runs in bfloat16."""
    counts: dict[torch.dtype, int] = {}
    for name in parameters:
        t = tensors[name]
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    if not counts:
        return
    common = max(counts, key=counts.get)
    if common not in COMPUTE_DTYPES:
        raise ValueError(f"the checkpoint's weights are {common}, which dllm does not compute in; pass dtype "
                         f"(--dtype) float32, bfloat16 or float16 to load them converted")
    for name, t in tensors.items():
        if t.is_floating_point() and t.dtype != common:
            tensors[name] = t.to(common)


def _generation_defaults(folder: Path) -> dict[str, Any]:
    path = folder / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        defaults = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"corrupt generation_config.json in {folder}: {err}") from None
    if not isinstance(defaults, dict):
        raise ValueError(f"corrupt generation_config.json in {folder}: expected a JSON object, got {defaults!r:.80}")
    return defaults


def load_tokenizer(folder: Path, family: str):
    """The checkpoint's tokenizer through transformers, never with remote code.

    Dream ships a remote `DreamTokenizer` class that is a copy of Qwen2's BPE; its vocab.json,
    merges.txt and added tokens load as transformers' own Qwen2 tokenizer.
    """
    if not any((folder / f).is_file() for f in ("tokenizer.json", "vocab.json")):
        raise FileNotFoundError(f"no tokenizer in {folder}: expected tokenizer.json, or vocab.json and merges.txt")
    if (folder / "vocab.json").is_file() and not (folder / "merges.txt").is_file() \
            and not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"missing merges.txt beside vocab.json in {folder}")
    cls = Qwen2Tokenizer if family == "dream" or not (folder / "tokenizer.json").is_file() else PreTrainedTokenizerFast
    try:
        return cls.from_pretrained(str(folder))
    except Exception as err:
        raise ValueError(f"cannot load the tokenizer in {folder}: {type(err).__name__}: {err}") from None


def _token_id(tokenizer, token: str) -> int | None:
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tokenizer.unk_token_id is not None and tid == tokenizer.unk_token_id
                       and token != tokenizer.unk_token):
        return None
    return int(tid)


def load(path_or_id: str | os.PathLike | None = None, dtype="auto", device="cpu", attention: str = "auto",
         cuda_graphs: bool = False, compile: bool = False):
    """Load a LLaDA, LLaDA-MoE, LLaDA2 or Dream checkpoint: returns (model, tokenizer).

    path_or_id: a folder in the Hugging Face layout, the name of a shipped model
        (`shipped_models()`; None = the default, "llada-pb-tiny"), or a hub id such as
        "GSAI-ML/LLaDA-8B-Instruct" (fetched with huggingface_hub when the hub is reachable).
    dtype: "auto" (as stored; tensors stored in another dtype than most weights take theirs),
           "float32", "float16", "bfloat16" or a torch.dtype.
    device: where the weights go ("cpu", "cuda", "cuda:1", ...; "auto": CUDA when available).
    attention: attention backend name (`dllm.attention.available_backends()`); "auto" = the backend measured
        fastest, sdpa on CPU and CUDA; "triton" = the Triton kernel (forward-only: use "sdpa" to train).
    cuda_graphs: replay inference forwards as CUDA graphs (`DiffusionTransformer.set_cuda_graphs`);
        needs a CUDA device.
    compile: run inference forwards through torch.compile, one graph per input layout
        (`DiffusionTransformer.set_compile`); each layout's first forward compiles it.

    Example::

        model, tok = dllm.load("GSAI-ML/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda")
        out = dllm.generate(model, tok, "What is 7 * 8?", gen_length=64, block_length=32)
    """
    # Validate everything cheap before touching the disk or the network.
    resolve_dtype(dtype)
    device = resolve_device(device)
    get_backend(attention)
    check_device(attention, device)
    if not isinstance(cuda_graphs, bool):
        raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
    if cuda_graphs and torch.device(device).type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA device, got device {str(device)!r}")
    if not isinstance(compile, bool):
        raise ValueError(f"compile must be True or False, got {compile!r}")
    folder = resolve_checkpoint(path_or_id)
    model = load_model(folder, dtype=dtype, device=device, attention=attention)
    tokenizer = load_tokenizer(folder, model.config.family)
    cfg = model.config
    gen_defaults = _generation_defaults(folder)
    eot = _token_id(tokenizer, _EOT_TOKENS[cfg.family])
    if eot is None and (cfg.family, cfg.mask_token_id) in _KNOWN_EOT:
        # LLaDA-8B-Base's tokenizer does not register <|eot_id|>; its id is fixed by the model family.
        eot = _KNOWN_EOT[(cfg.family, cfg.mask_token_id)]
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else gen_defaults.get("bos_token_id")
    if bos is None:
        bos = tokenizer.bos_token_id
    model.config = cfg.replace(eot_token_id=eot, bos_token_id=bos)
    for module in model.modules():  # the layers hold the same config object
        if hasattr(module, "cfg"):
            module.cfg = model.config
    model.generation_defaults = gen_defaults
    model.name_or_path = str(path_or_id) if path_or_id is not None else DEFAULT_MODEL
    model.checkpoint_dir = str(folder)   # the local folder (shipped files such as a Learn2PD filter)
    if cuda_graphs:
        model.set_cuda_graphs(True)
    if compile:
        model.set_compile(True)
    return model, tokenizer
