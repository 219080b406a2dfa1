"""Sampler registry: names resolve to lazy import paths, so adding a sampler adds one file and one
line here."""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from dllm.state import plain_number

_SAMPLERS: dict[str, str] = {
    "low_confidence": "dllm.samplers.llada:LowConfidence",
    "random": "dllm.samplers.llada:RandomRemasking",
    "origin": "dllm.samplers.dream:Origin",
    "maskgit_plus": "dllm.samplers.dream:MaskGitPlus",
    "topk_margin": "dllm.samplers.dream:TopKMargin",
    "entropy": "dllm.samplers.dream:Entropy",
    "block_entropy": "dllm.samplers.dream:BlockEntropy",
    "threshold": "dllm.samplers.threshold:Threshold",
    "budget_threshold": "dllm.samplers.budget_threshold:BudgetThreshold",
    "factor": "dllm.samplers.factor:Factor",
    "adablock": "dllm.samplers.adablock:AdaBlock",
    "localleap": "dllm.samplers.localleap:LocalLeap",
    "prophet": "dllm.samplers.prophet:Prophet",
    "eb": "dllm.samplers.eb:EntropyBound",
    "learn2pd": "dllm.samplers.learn2pd:Learn2PD",
    "llada2": "dllm.samplers.llada2:LLaDA2Block",
    "llada21": "dllm.samplers.llada2:LLaDA21Edit",
    "margin_topk": "dllm.samplers.topk:MarginTopK",
    "entropy_topk": "dllm.samplers.topk:EntropyTopK",
    "left_to_right": "dllm.samplers.topk:LeftToRight",
    "dus": "dllm.samplers.dus:Dilated",
    "klass": "dllm.samplers.klass:KLASS",
    "dream_klass": "dllm.samplers.klass:DreamKLASS",
    "slowfast": "dllm.samplers.slowfast:SlowFast",
    "wino": "dllm.samplers.wino:WINO",
    "remdm": "dllm.samplers.remdm:ReMDM",
    "rcr": "dllm.samplers.rcr:RCR",
    "hierarchy": "dllm.samplers.dinfer:Hierarchy",
    "credit": "dllm.samplers.dinfer:Credit",
    "dparallel": "dllm.samplers.dparallel:DParallel",
    "dream_dparallel": "dllm.samplers.dparallel:DreamDParallel",
    "freedave": "dllm.samplers.freedave:FreeDave",
    "pc_sampler": "dllm.samplers.pc_sampler:PCSampler",
    "certainty_prior": "dllm.samplers.certainty_prior:CertaintyPrior",
}


def register(name: str, path: str) -> None:
    """Register a sampler class under `name` from a `"module:Class"` path."""
    _SAMPLERS[name] = path


def available() -> list[str]:
    return sorted(_SAMPLERS)


def sampler_class(name: str):
    if not isinstance(name, str) or name not in _SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; valid options: {', '.join(available())}")
    module, attr = _SAMPLERS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def get(name: str, /, **kwargs: Any):
    """Build the sampler registered as `name` with keyword arguments.

    >>> get("low_confidence")
    Unknown names and unknown or out-of-range arguments raise ValueError naming what is allowed.
    """
    cls = sampler_class(name)
    allowed = list(signature(name))
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"sampler {name!r} has no argument(s) {', '.join(map(repr, unknown))}; "
                         f"its arguments: {', '.join(allowed) or '(none)'}")
    return cls(**{key: plain_number(value) for key, value in kwargs.items()})


def signature(name: str) -> dict[str, Any]:
    """Argument name -> default of a registered sampler."""
    params = inspect.signature(sampler_class(name).__init__).parameters
    return {p: v.default for p, v in params.items() if p != "self"}
