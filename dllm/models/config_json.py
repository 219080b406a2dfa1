"""Reading a checkpoint's `config.json`: values of the type the model needs, or a ValueError that
names the family, the key, its value and what is allowed. A key that is absent or null takes the
default."""
from __future__ import annotations

import re
from typing import Any

# Internal config fields -> the config.json keys of the Qwen2-layout families (Dream, LLaDA-MoE, LLaDA2).
QWEN2_KEYS = {"d_model": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
              "n_kv_heads": "num_key_value_heads", "vocab_size": "vocab_size", "mlp_hidden": "intermediate_size",
              "max_seq_len": "max_position_embeddings", "rotary_dim": "partial_rotary_factor",
              "n_experts": "num_experts", "experts_per_token": "num_experts_per_tok", "n_groups": "n_group",
              "topk_groups": "topk_group", "first_dense": "first_k_dense_replace",
              "routed_scale": "routed_scaling_factor"}


def first_of(d: dict, *keys: str, default: Any = None) -> Any:
    """The value of the first of `keys` that `d` holds and is not null, else `default`."""
    for key in keys:
        if d.get(key) is not None:
            return d[key]
    return default


def check_required(d: dict, required: dict, family: str) -> None:
    """A ValueError naming the first key of `d` whose value `required` does not allow (an absent
    key, null, or for a False/None requirement false or {}, is allowed)."""
    for key, want in required.items():
        value = d.get(key)
        if value is None or value == want or (want in (None, False) and value in (False, {})):
            continue
        raise ValueError(f"{family} config key {key!r} = {value!r} is not supported (supported: {want!r})")


def check_stated(d: dict, keys: tuple[str, ...], required: dict, family: str) -> None:
    """A ValueError naming the `keys` absent from `d`: keys whose default in the family's config
    class is a value `required` does not allow, so a config.json must state them."""
    absent = [key for key in keys if key not in d]
    if absent:
        raise ValueError(f"{family} config.json lacks {', '.join(absent)}: their defaults in {family}'s config class "
                         f"are not supported; supported: " + ", ".join(f"{k}={required[k]!r}" for k in absent))


def flag(d: dict, key: str, default: bool, family: str) -> bool:
    """`d[key]` as a JSON boolean."""
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{family} config key {key!r} = {value!r} must be true or false")
    return value


def number(d: dict, key: str, default: float, family: str) -> float:
    """`d[key]` as a positive JSON number."""
    value = d.get(key)
    if value is None:
        return float(default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{family} config key {key!r} = {value!r} must be a positive number")
    return float(value)


def integer(d: dict, key: str, default: int | None, family: str, low: int = 1) -> int | None:
    """`d[key]` as a JSON integer >= `low`; absent or null: `default`."""
    value = d.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{family} config key {key!r} = {value!r} must be an integer >= {low}")
    return value


def token_id(value: Any) -> Any:
    """A special-token id as configs write it: an id, or a list whose first entry is the id (None
    when empty or absent)."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def id_of(d: dict, key: str, family: str, default: int | None = None) -> int | None:
    """`d[key]` as a special-token id (`token_id`), an integer >= 0; absent, null, [] or negative
    (Hugging Face configs write -1 for "none"): `default`."""
    value = token_id(d.get(key))
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value < 0):
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{family} config key {key!r} = {d[key]!r} must be an integer token id >= 0")
    return value


def check_sizes(d: dict, keys: tuple[str, ...], family: str) -> None:
    """The size keys `keys` of `d`: present, and positive JSON integers; a ValueError names the
    missing keys or the first bad value."""
    missing = [k for k in keys if d.get(k) is None]
    if missing:
        raise ValueError(f"{family} config.json lacks required keys: {', '.join(missing)}")
    for key in keys:
        value = d[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{family} config key {key!r} = {value!r} must be a positive integer")


def naming_keys(message: str, keys: dict[str, str]) -> str:
    """`message`, an error of a config built from config.json that names internal fields, with the
    config.json key of each field it names (`keys`: field -> key) added; a message that already
    speaks of config.json's keys is left as it is."""
    if "config key" in message or "config.json" in message:
        return message
    words = set(re.findall(r"\w+", message))
    named = [f"{field} is config.json's {key!r}" for field, key in keys.items() if field in words and field != key]
    return f"{message} ({'; '.join(named)})" if named else message


# ModelConfig fields that no LLaDA or Dream config.json can express, at the value it implies
DENSE_LAYOUT = {"qk_norm": False, "rotary_dim": None, "clip_qkv": None, "moe": None, "attention_block": None}


def check_dense_layout(cfg, family: str) -> None:
    """A ValueError naming every field of `cfg` that a `family` config.json (LLaDA's, Dream's)
    cannot express, so that no written checkpoint reloads as another model."""
    bad = [f"{k} {getattr(cfg, k)!r}" for k, v in DENSE_LAYOUT.items() if getattr(cfg, k) != v]
    if bad:
        raise ValueError(f"a {family} config.json cannot describe {', '.join(bad)} (it holds "
                         f"{', '.join(f'{k} {v!r}' for k, v in DENSE_LAYOUT.items())})")
