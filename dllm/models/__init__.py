"""Native LLaDA and Dream architectures and the Hugging Face checkpoint loader."""
from .dream import DreamModel
from .llada import LLaDAModel
from .loading import build_model, detect_family, load, read_config
from .transformer import DiffusionTransformer

__all__ = ["DiffusionTransformer", "DreamModel", "LLaDAModel", "build_model", "detect_family", "load", "read_config"]
