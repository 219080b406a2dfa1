"""dllm: a runtime for masked-diffusion language models (LLaDA, Dream).

    import dllm
    model, tokenizer = dllm.load("GSAI-ML/LLaDA-8B-Instruct", dtype="bfloat16", device="cuda")
    out = dllm.generate(model, tokenizer, "What is 7 * 8?", gen_length=64, block_length=32)
    print(out.texts[0], out.nfe, out.mean_tokens_per_forward)
"""
__version__ = "0.1.0"

from .config import GenerationConfig, ModelConfig
from .decode import GenerationOutput, generate
from .models import build_model, load

__all__ = ["GenerationConfig", "GenerationOutput", "ModelConfig", "build_model", "generate", "load", "__version__"]
