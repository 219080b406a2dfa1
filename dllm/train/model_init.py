"""The model a run trains: its config from the recipe, its initial weights (mimetic init, the built
previous- and next-token heads), the model folder a run can start from, and the export in the LLaDA
Hugging Face layout."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..config import ModelConfig
from ..models.loading import load_model, load_tokenizer
from .config import MAX_SEQ_LEN, PREV_HEAD_INPUTS, PREV_HEAD_PAIRS, TrainConfig
from .data import BOS, EOS, EOT, MASK

# ModelConfig fields a start model (`init_from`) must share with the recipe's model_config.
SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "tie_embeddings",
                "rope_theta", "qkv_bias")


def model_config(cfg: TrainConfig, tokenizer):
    """The LLaDA ModelConfig of the recipe `cfg` with the special ids of `tokenizer`; q/k/v biases
    when a built head needs them."""
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in (("mask", MASK), ("eos", EOS), ("bos", BOS), ("eot", EOT))}
    return ModelConfig(family="llada", vocab_size=len(tokenizer), d_model=cfg.d_model, n_layers=cfg.n_layers,
                       n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads, mlp_hidden=cfg.mlp_hidden, norm_eps=1e-5,
                       rope_theta=cfg.rope_theta, max_seq_len=MAX_SEQ_LEN, mask_token_id=ids["mask"],
                       eos_token_id=ids["eos"], pad_token_id=ids["eos"], bos_token_id=ids["bos"],
                       eot_token_id=ids["eot"],
                       qkv_bias=((cfg.prev_token_head and cfg.prev_head_input == "bias") or cfg.next_token_head
                                 or cfg.window_heads > 0),
                       tie_embeddings=cfg.tie_embeddings, rope_fp32=True, logit_shift=False)


def init_weights(model, cfg: TrainConfig) -> None:
    """Every matrix N(0, 0.02), q/k/v biases zero. With init="mimetic" (after Trockman & Kolter,
    "Mimetic Initialization of Self-Attention Layers"), each attention layer starts with W_k = W_q
    (entries N(0, qk_std)) and W_o = W_v^T (entries N(0, vo_std)), so that W_q W_k^T and W_v W_o
    are near multiples of the identity: from the first step a position attends to positions that
    look like it and adds what it finds; the embedding is N(0, embed_std). This is what lets the
    model learn the copying every task needs (find the neighbour of a masked token in the prompt,
    take the token next to it). With `prev_token_head`, head 0 of the first layer is then built as
    a previous-token head (`previous_token_head`, seeded with `seed + 1`); with `next_token_head`,
    head 1 as a next-token head (`next_token_head`); with `window_heads` w, heads 2 .. 2w + 1 as
    positional heads at offsets -2, +2, -3, +3, ... (`window_heads`)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        for layer in model.layers:
            for lin in (layer.attn.q, layer.attn.k, layer.attn.v):
                if lin.bias is not None:
                    lin.bias.zero_()
        if cfg.init == "mimetic":
            torch.nn.init.normal_(model.embed.weight, std=cfg.embed_std)
            for layer in model.layers:
                attn = layer.attn
                if attn.k.weight.shape != attn.q.weight.shape or attn.o.weight.shape != attn.v.weight.T.shape:
                    raise ValueError("mimetic init needs as many key/value heads as query heads")
                torch.nn.init.normal_(attn.q.weight, std=cfg.qk_std)
                attn.k.weight.copy_(attn.q.weight)
                torch.nn.init.normal_(attn.v.weight, std=cfg.vo_std)
                attn.o.weight.copy_(attn.v.weight.T)
    if cfg.prev_token_head:
        previous_token_head(model, torch.Generator().manual_seed(cfg.seed + 1), cfg.prev_head_input)
    if cfg.next_token_head:
        next_token_head(model)
    if cfg.window_heads:
        window_heads(model, cfg.window_heads)


PREV_HEAD_SCALE, PREV_HEAD_BIAS = 6.0, 8.0


def previous_token_head(model, generator: torch.Generator, via: str = "embedding") -> None:
    """Make head 0 of the first layer attend to the previous position, whatever the tokens.

    via="embedding": every token embedding gets a shared component, a random unit direction u times
    the embedding's own norm. The head's query and key read only u, into the `PREV_HEAD_PAIRS`
    fastest rotary frequency pairs, scaled by `PREV_HEAD_SCALE`, with the query rotated back by one
    position per pair, so that after RoPE the score q_p . k_j is a sum of cos(theta_i (j - p + 1)):
    largest at j = p - 1. via="bias": the embedding is left alone; the head gets zero query and key
    weights and constant query and key biases (`PREV_HEAD_BIAS` times the same codes), so its scores
    depend on positions only. docs/training.md gives how much attention each puts on p - 1.

    Content lookup (given a_i in the answer, find a_i in the prompt and take the token after it)
    is a previous-token head followed by a match on the previous token, which the mimetic heads
    of the later layers can already make (their W_q = W_k match positions whose states look alike);
    this builds the first half in."""
    cfg = model.config
    d, D = cfg.d_model, cfg.head_dim
    if D // 2 < PREV_HEAD_PAIRS:
        raise ValueError(f"a previous-token head needs head_dim >= {2 * PREV_HEAD_PAIRS}, got {D}")
    if via not in PREV_HEAD_INPUTS:
        raise ValueError(f"previous-token head input {via!r} is not one of {', '.join(PREV_HEAD_INPUTS)}")
    attn = model.layers[0].attn
    if via == "bias" and (attn.q.bias is None or attn.k.bias is None):
        raise ValueError("a previous-token head built from biases needs a model with q/k/v biases (qkv_bias)")
    with torch.no_grad():
        if via == "bias":
            _bias_head(attn, cfg, head=0, offset=1)
            return
        u = torch.randn(d, generator=generator)
        u /= u.norm()
        emb = model.embed.weight
        emb += emb.norm(dim=1, keepdim=True) * u
        cq, ck = _positional_codes(cfg)
        attn.q.weight[:D] = PREV_HEAD_SCALE * torch.outer(cq, u) / math.sqrt(d)
        attn.k.weight[:D] = PREV_HEAD_SCALE * torch.outer(ck, u) / math.sqrt(d)


def next_token_head(model) -> None:
    """Make head 1 of the first layer attend to the next position, whatever the tokens: zero query
    and key weights and constant query and key biases (`PREV_HEAD_BIAS` times `_positional_codes`
    with offset -1), so that its score is a sum of cos(theta_i (j - p - 1)), largest at j = p + 1.

    The mirror of the bias-built previous-token head, for the lookup the other way: given a last
    name in the answer, find it in the prompt and take the token before it. Under confidence-ordered
    decoding the models trained here commit most last names before their first names."""
    cfg = model.config
    D = cfg.head_dim
    attn = model.layers[0].attn
    if cfg.n_heads < 2 or D // 2 < PREV_HEAD_PAIRS:
        raise ValueError(f"a next-token head needs n_heads >= 2 and head_dim >= {2 * PREV_HEAD_PAIRS}, got "
                         f"{cfg.n_heads} heads of {D}")
    if attn.q.bias is None or attn.k.bias is None:
        raise ValueError("a next-token head is built from biases and needs a model with q/k/v biases (qkv_bias)")
    with torch.no_grad():
        _bias_head(attn, cfg, head=1, offset=-1)


def window_heads(model, pairs: int) -> None:
    """Build heads 2 .. 2 * pairs + 1 of the first layer from q/k biases as positional heads, in
    pairs at offsets -2 and +2, -3 and +3, ...: head 2 + 2i attends to p - (i + 2) and head 3 + 2i to
    p + (i + 2), whatever the tokens.

    With the previous- and next-token heads these put a window of neighbours into every position's
    state, so that a later layer can match a masked answer position to the prompt position whose
    neighbours look like its own: a name split into several tokens is copied by its context on
    both sides, including its first piece after the two-token list separator."""
    cfg = model.config
    attn = model.layers[0].attn
    if cfg.n_heads < 2 + 2 * pairs or cfg.head_dim // 2 < PREV_HEAD_PAIRS:
        raise ValueError(f"{pairs} window head pairs need n_heads >= {2 + 2 * pairs} and head_dim >= "
                         f"{2 * PREV_HEAD_PAIRS}, got {cfg.n_heads} heads of {cfg.head_dim}")
    if attn.q.bias is None or attn.k.bias is None:
        raise ValueError("window heads are built from biases and need a model with q/k/v biases (qkv_bias)")
    with torch.no_grad():
        for i in range(pairs):
            _bias_head(attn, cfg, head=2 + 2 * i, offset=i + 2)
            _bias_head(attn, cfg, head=3 + 2 * i, offset=-(i + 2))


def _bias_head(attn, cfg, head: int, offset: int) -> None:
    """Give `head` of `attn` zero query and key weights and constant query and key biases
    (`PREV_HEAD_BIAS` times `_positional_codes(cfg, offset)`): its scores depend on positions only."""
    D = cfg.head_dim
    rows = slice(head * D, (head + 1) * D)
    cq, ck = _positional_codes(cfg, offset)
    attn.q.weight[rows] = 0
    attn.k.weight[rows] = 0
    attn.q.bias[rows] = PREV_HEAD_BIAS * cq
    attn.k.bias[rows] = PREV_HEAD_BIAS * ck


def _positional_codes(cfg, offset: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key directions of a positional head: the key on the `PREV_HEAD_PAIRS` fastest
    rotary pairs, the query the same rotated back by `offset` positions, so that q_p . k_j after
    RoPE is a sum of cos(theta_i (j - p + offset)), largest at j = p - offset (1: the previous
    token, -1: the next one)."""
    D = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2).double() / D))
    ck, cq = torch.zeros(D), torch.zeros(D)
    for i in range(PREV_HEAD_PAIRS):           # NeoX layout: dims i and i + D/2 rotate together
        ck[i] = 1.0
        cq[i], cq[i + D // 2] = math.cos(offset * inv_freq[i]), -math.sin(offset * inv_freq[i])
    return cq, ck


# -- the start and the export ---------------------------------------------------------------------
def start_model(cfg: TrainConfig):
    """(model, tokenizer, sha256 of its weights) of the LLaDA folder `cfg.init_from`: training goes on
    from those weights with that tokenizer (`check_start_shape` then compares it with the recipe)."""
    folder = Path(cfg.init_from)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"init_from {cfg.init_from!r} is not a model folder (no config.json there)")
    model = load_model(folder, dtype=torch.float32)
    if model.config.family != "llada":
        raise ValueError(f"init_from {cfg.init_from!r} holds a {model.config.family} model; "
                         f"training starts from LLaDA only")
    return model, load_tokenizer(folder, "llada"), weights_sha256(folder)


def weights_sha256(folder: Path) -> str | None:
    """The SHA-256 of a model folder's weights: of `model.safetensors`, or of the shards its
    `model.safetensors.index.json` names, read one after another in name order; None without them."""
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        return None
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()


def start_config(init_from: str, have, want):
    """The recipe's `model_config` `want` for the start model of config `have`: with its embedding
    rows, which may pass the tokenizer's size (LLaDA pads its embedding) but not fall short of it,
    and its numerics (`norm_eps`, `rope_fp32`), which the recipe does not set; the other shape
    fields are checked by `check_start_shape`."""
    if have.vocab_size < want.vocab_size:
        raise ValueError(f"init_from {init_from!r} has {have.vocab_size} embedding rows, fewer than the "
                         f"{want.vocab_size} tokens of its tokenizer")
    want = dataclasses.replace(want, vocab_size=have.vocab_size, norm_eps=have.norm_eps, rope_fp32=have.rope_fp32)
    check_start_shape(init_from, have, want)
    return want


def check_start_shape(init_from: str, have, want) -> None:
    """The start model's config `have` against the recipe's `model_config` `want`, field by field
    (`SHAPE_FIELDS`); a ValueError names every field that differs."""
    bad = [f"{k} {getattr(have, k)} (recipe {getattr(want, k)})" for k in SHAPE_FIELDS
           if getattr(have, k) != getattr(want, k)]
    if bad:
        raise ValueError(f"init_from {init_from!r} has another shape than the recipe: {', '.join(bad)}")


def generation_defaults(cfg: TrainConfig) -> dict:
    """The generation_config.json entries of a model trained with `cfg`: `max_new_tokens`, the
    canvas every answer was laid on, when the recipe has one (`canvas` > 0). Decoding uses it as
    the generation length when a request gives none (`dllm.decode.checkpoint_gen_length`)."""
    return {"max_new_tokens": cfg.canvas} if cfg.canvas else {}


# Keys transformers 5 writes that earlier releases do not read, or read as another type.
NEWER_TOKENIZER_KEYS = ("backend", "is_local", "local_files_only")


def published_tokenizer_config(path: Path) -> None:
    """Rewrite a saved tokenizer_config.json in the published checkpoints' layout, which every
    transformers release loads: the `PreTrainedTokenizerFast` class (transformers 5 names its
    `TokenizersBackend`, which 4.x does not know), its extra special tokens as
    `additional_special_tokens`, and none of `NEWER_TOKENIZER_KEYS`."""
    config = json.loads(path.read_text())
    for key in NEWER_TOKENIZER_KEYS:
        config.pop(key, None)
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list) and extra:
        config["additional_special_tokens"] = extra
    elif extra:
        config["extra_special_tokens"] = extra
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def save_pretrained(model, tokenizer, folder: str | Path, generation_defaults: dict | None = None) -> Path:
    """Write `model` (LLaDA or Dream) and `tokenizer` (None: weights and configs only) in its
    family's Hugging Face layout: the published weight names and config.json keys."""
    cfg = model.config
    to_hf = getattr(type(model), "config_to_hf", None)
    if to_hf is None:
        raise ValueError(f"save_pretrained writes LLaDA and Dream models; got a {cfg.family} model "
                         f"({type(model).__name__})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    names = type(model).hf_names(cfg)
    tensors = {hf: state[internal].detach().to("cpu").contiguous() for hf, internal in names.items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    dtype = str(next(iter(tensors.values())).dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(to_hf(cfg, torch_dtype=dtype), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
        published_tokenizer_config(folder / "tokenizer_config.json")
    gen = {"_from_model_config": True, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
           "pad_token_id": cfg.pad_token_id, **(generation_defaults or {})}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return folder
