"""Configuration dataclasses: the model shape (`ModelConfig`) and one generation request
(`GenerationConfig`), plus named presets, tiny ones included, that build without a download."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def check_fields(cls, options, what: str) -> None:
    """A ValueError naming the keys of `options` that are not fields of dataclass `cls`."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown {what} option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")

FAMILIES = ("llada", "dream")


@dataclass
class ModelConfig:
    """Shape and special ids of one masked-diffusion transformer.

    Both families are pre-norm SwiGLU transformers with RoPE and bidirectional attention; the
    differences that matter at run time are explicit fields rather than family checks.
    """

    family: str                      # "llada" | "dream"
    vocab_size: int                  # logit width (LLaDA: `embedding_size`, which may exceed the tokenizer vocab)
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_hidden: int
    norm_eps: float
    rope_theta: float
    max_seq_len: int
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    bos_token_id: int | None = None
    eot_token_id: int | None = None   # end of turn: LLaDA <|eot_id|>, Dream <|im_end|>; filled from the tokenizer
    qkv_bias: bool = False            # Dream has q/k/v biases, LLaDA none
    tie_embeddings: bool = False
    # LLaDA rotates q/k in fp32 (`rope_full_precision`); Dream casts cos/sin to the activation dtype first.
    rope_fp32: bool = True
    # Dream keeps the autoregressive alignment: hidden state i-1 predicts token i.
    logit_shift: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; supported: {', '.join(FAMILIES)}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even for rotary embeddings")
        for name in ("mask_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.{name} = {value} lies outside the vocabulary [0, {self.vocab_size})")
        if self.pad_token_id == self.mask_token_id:
            raise ValueError(f"pad_token_id must differ from mask_token_id (both {self.mask_token_id})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_params(self) -> int:
        d, h = self.d_model, self.mlp_hidden
        kv = self.n_kv_heads * self.head_dim
        attn = d * d * 2 + 2 * d * kv + (d + 2 * kv if self.qkv_bias else 0)
        layer = attn + 3 * d * h + 2 * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layers * layer + d + head

    @classmethod
    def from_name(cls, name: str) -> "ModelConfig":
        """A preset by exact name (see `PRESETS`); a typo is an error, never another model."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; available: {', '.join(sorted(PRESETS))}")
        return cls(**PRESETS[name])

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


_LLADA_IDS = dict(mask_token_id=126336, eos_token_id=126081, pad_token_id=126081, bos_token_id=126080,
                  eot_token_id=126348)
_DREAM_IDS = dict(mask_token_id=151666, eos_token_id=151643, pad_token_id=151643, bos_token_id=151643,
                  eot_token_id=151645)
_LLADA = dict(family="llada", norm_eps=1e-5, rope_theta=500000.0, rope_fp32=True, logit_shift=False)
_DREAM = dict(family="dream", norm_eps=1e-6, rope_theta=1000000.0, rope_fp32=False, logit_shift=True,
              qkv_bias=True)

PRESETS: dict[str, dict[str, Any]] = {
    # Random-init presets that build in milliseconds (tests, benchmarks, demos).
    "llada-tiny": dict(_LLADA, vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=96,
                       max_seq_len=512, mask_token_id=310, eos_token_id=301, pad_token_id=301, bos_token_id=300,
                       eot_token_id=313),
    "dream-tiny": dict(_DREAM, vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=96,
                       max_seq_len=512, mask_token_id=304, eos_token_id=300, pad_token_id=300, bos_token_id=300,
                       eot_token_id=302),
    # The real vocabulary with a small body: the LM head and scoring dominate a step, as they do
    # outside the transformer blocks of the 8B model.
    "llada-vocab": dict(_LLADA, **_LLADA_IDS, vocab_size=126464, d_model=256, n_layers=2, n_heads=4, n_kv_heads=4,
                        mlp_hidden=768, max_seq_len=4096),
    # Compute-bound: a body big enough that the transformer blocks dominate.
    "llada-compute": dict(_LLADA, **_LLADA_IDS, vocab_size=126464, d_model=1024, n_layers=8, n_heads=8,
                          n_kv_heads=8, mlp_hidden=2816, max_seq_len=4096),
    "dream-compute": dict(_DREAM, **_DREAM_IDS, vocab_size=152064, d_model=896, n_layers=8, n_heads=14,
                          n_kv_heads=2, mlp_hidden=2432, max_seq_len=4096),
    # The published shapes (weights come from the checkpoint).
    "llada-8b": dict(_LLADA, **_LLADA_IDS, vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                     mlp_hidden=12288, max_seq_len=4096),
    "dream-7b": dict(_DREAM, **_DREAM_IDS, vocab_size=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                     mlp_hidden=18944, max_seq_len=131072),
}


@dataclass
class GenerationConfig:
    """One generation request.

    gen_length: tokens to generate per row (the masked canvas after the prompt).
    block_length: semi-autoregressive block size for block samplers (default: gen_length, i.e.
        one block); samplers without blocks (Dream's) ignore it.
    steps: denoising steps for fixed-schedule samplers (default: gen_length, one token per step).
    temperature: 0 = greedy; > 0 = sampling: Gumbel-max in float64 for LLaDA-style samplers (as
        LLaDA's reference), Dream's samplers draw from softmax(logits / temperature) as Dream's.
    cfg_scale: unsupervised classifier-free guidance (LLaDA): each step also runs the canvas with
        the prompt masked and uses uncond + (cfg_scale + 1) * (cond - uncond); 0 = off.
    sampler: registered sampler name (`dllm.samplers.available()`), or a sampler instance; None
        takes the `alg` of the checkpoint's generation_config.json when it names one (Dream
        Instruct: `origin`), else the family's reference rule (LLaDA `low_confidence`, Dream
        `entropy`).
    sampler_kwargs: keyword arguments for the sampler when it is given by name.
    seed: seeds the one `torch.Generator` every random draw of the request uses.
    max_forwards: hard cap on model forwards; when hit, every remaining mask is filled with the
        current prediction and the output says so. Default: max(steps, gen_length).
    chat: apply the tokenizer's chat template to string prompts (None: when it has one).
    score_dtype: precision of the softmax behind the LLaDA-style confidences: "logits" (the model
        dtype, as current LLaDA `generate.py`; in bf16 confident positions tie often and ties go to
        the lower position), "float32", or "float64" (Fast-dLLM, older LLaDA). Dream's samplers
        always follow Dream's `sample_tokens` in the logits dtype.
    trace: record the step at which every generated position was committed.
    """

    gen_length: int = 128
    block_length: int | None = None
    steps: int | None = None
    temperature: float = 0.0
    cfg_scale: float = 0.0
    sampler: Any = None
    sampler_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    max_forwards: int | None = None
    chat: bool | None = None
    score_dtype: str = "logits"
    trace: bool = False

    def __post_init__(self):
        def positive_int(name):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GenerationConfig.{name} must be a positive integer, got {value!r}")

        positive_int("gen_length")
        for name in ("block_length", "steps", "max_forwards"):
            if getattr(self, name) is not None:
                positive_int(name)
        if self.block_length is not None and self.block_length > self.gen_length:
            raise ValueError(f"block_length {self.block_length} exceeds gen_length {self.gen_length}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.cfg_scale, bool) or not isinstance(self.cfg_scale, (int, float)) \
                or not 0 <= self.cfg_scale < float("inf"):
            raise ValueError(f"cfg_scale must be a finite number >= 0, got {self.cfg_scale!r}")
        if self.score_dtype not in ("logits", "float32", "float64"):
            raise ValueError(f"score_dtype must be 'logits', 'float32' or 'float64', got {self.score_dtype!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.sampler_kwargs, dict):
            raise ValueError(f"sampler_kwargs must be a dict, got {type(self.sampler_kwargs).__name__}")

    @property
    def resolved_block_length(self) -> int:
        return self.block_length or self.gen_length

    @property
    def resolved_steps(self) -> int:
        return self.steps or self.gen_length

    @property
    def resolved_max_forwards(self) -> int:
        return self.max_forwards or max(self.resolved_steps, self.gen_length)
