"""Native LLaDA, LLaDA-MoE and Dream architectures and the Hugging Face checkpoint loader."""
from .dream import DreamModel
from .llada import LLaDAModel
from .llada_moe import LLaDAMoEModel
from .loading import build_model, detect_family, load, read_config
from .transformer import DiffusionTransformer

__all__ = ["DiffusionTransformer", "DreamModel", "LLaDAMoEModel", "LLaDAModel", "build_model", "detect_family", "load",
           "read_config"]
