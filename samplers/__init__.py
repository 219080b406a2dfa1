"""Unmasking samplers, one file each, resolved by name (installed as `dllm.samplers`)."""
from .base import Sampler, top_k_mask
from .registry import available, get, register, sampler_class, signature

__all__ = ["Sampler", "available", "get", "register", "sampler_class", "signature", "top_k_mask"]
