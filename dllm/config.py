"""Configuration dataclasses: the model shape (`ModelConfig`) and one generation request
(`GenerationConfig`), plus named presets, tiny ones included, that build without a download."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from . import samplers
from .cache import CachePolicy, policy_class
from .dpad import SuffixDropout
from .state import MAX_INTEGER_ARGUMENT, plain_number


def check_fields(cls, options, what: str) -> None:
    """A ValueError naming the keys of `options` that are not fields of dataclass `cls`."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown {what} option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")


def positive_finite(value) -> bool:
    """Whether `value` is a finite real number > 0 (an int or float, not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


def check_seed(seed, allow_none: bool = True) -> None:
    """A ValueError unless `seed` is an integer torch.Generator takes (or None with `allow_none`)."""
    if seed is None and allow_none:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not -2 ** 63 <= seed < 2 ** 64:
        raise ValueError(f"seed must be an integer in [-2**63, 2**64) (what torch.Generator takes)"
                         f"{' or None' if allow_none else ''}, got {seed!r}")


FAMILIES = ("llada", "dream", "llada-moe", "llada2")
ROUTER_SCORES = ("softmax", "sigmoid")


@dataclass(frozen=True)
class MoEConfig:
    """The mixture-of-experts MLP of a model whose layers (from `first_dense` on) route each token
    to `experts_per_token` of `n_experts` SwiGLU experts (docs/architecture.md §11).

    The router scores the experts (`score`: softmax or sigmoid of the gate's logits, in fp32),
    optionally keeps only the best `topk_groups` of `n_groups` expert groups, picks the top
    `experts_per_token` (ranked with the `expert_bias` buffer added when there is one; the weights
    stay unbiased), divides the picked weights by their sum when `norm_topk`, and multiplies them by
    `routed_scale`. `router_fp32`: the gate's product runs on fp32 inputs and weights (else in the
    model dtype). `sum_fp32`: the weighted expert outputs are summed in fp32 and cast back (else the
    weights are cast to the model dtype first). A shared SwiGLU expert of `shared_hidden` (0: none)
    adds its output to every token's.
    """

    n_experts: int
    experts_per_token: int
    expert_hidden: int
    score: str = "softmax"
    norm_topk: bool = False
    n_groups: int = 1
    topk_groups: int = 1
    routed_scale: float = 1.0
    expert_bias: bool = False
    router_fp32: bool = False
    sum_fp32: bool = False
    shared_hidden: int = 0
    first_dense: int = 0

    def __post_init__(self):
        for name in ("n_experts", "experts_per_token", "expert_hidden", "n_groups", "topk_groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"MoEConfig.{name} must be a positive integer, got {value!r}")
        for name in ("shared_hidden", "first_dense"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"MoEConfig.{name} must be an integer >= 0, got {value!r}")
        if self.score not in ROUTER_SCORES:
            raise ValueError(f"MoEConfig.score {self.score!r} is not a router score; valid: {', '.join(ROUTER_SCORES)}")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"MoEConfig.experts_per_token {self.experts_per_token} exceeds n_experts {self.n_experts}")
        if self.n_experts % self.n_groups:
            raise ValueError(f"MoEConfig.n_experts {self.n_experts} is not divisible by n_groups {self.n_groups}")
        if self.topk_groups > self.n_groups:
            raise ValueError(f"MoEConfig.topk_groups {self.topk_groups} exceeds n_groups {self.n_groups}")
        per_group = self.n_experts // self.n_groups
        if self.n_groups > 1 and (per_group < 2 or self.topk_groups * per_group < self.experts_per_token):
            raise ValueError(f"MoEConfig: {self.topk_groups} of {self.n_groups} groups of {per_group} experts cannot "
                             f"hold experts_per_token {self.experts_per_token} (groups are scored by their top 2)")


@dataclass
class ModelConfig:
    """Shape and special ids of one masked-diffusion transformer.

    Every family is a pre-norm SwiGLU transformer with RoPE (LLaDA-MoE and LLaDA2: mixture-of-experts
    MLPs; LLaDA2: block-causal attention, the rest bidirectional); the differences that matter at run
    time are explicit fields rather than family checks.
    """

    family: str                      # "llada" | "dream" | "llada-moe" | "llada2"
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
    qk_norm: bool = False             # RMSNorm of each head's q and k (over head_dim) before the rotation
    rotary_dim: int | None = None     # dims of each head that rotate (the first ones); None: all
    clip_qkv: float | None = None     # q, k and v clamped to [-clip, clip] after the QK norm
    moe: MoEConfig | None = None      # mixture-of-experts MLP (LLaDA-MoE, LLaDA2); None: dense SwiGLU
    # Block-causal attention (LLaDA2): column c attends to the columns before the end of its block,
    # blocks of `attention_block` columns aligned from column 0; None: every column attends to all.
    attention_block: int | None = None

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; supported: {', '.join(FAMILIES)}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even for rotary embeddings")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not positive_finite(value):
                raise ValueError(f"ModelConfig.{name} must be a finite positive number, got {value!r}")
        for name in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id", "eot_token_id"):
            value = getattr(self, name)
            if value is None and name in ("bos_token_id", "eot_token_id"):
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"ModelConfig.{name} must be an integer token id, got {value!r}")
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.{name} = {value} lies outside the vocabulary [0, {self.vocab_size})")
        for name in ("pad_token_id", "eos_token_id", "eot_token_id"):
            if getattr(self, name) == self.mask_token_id:
                raise ValueError(f"{name} must differ from mask_token_id (both {self.mask_token_id})")
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"ModelConfig.rotary_dim must be an even number in (0, {self.head_dim}], "
                             f"got {self.rotary_dim!r}")
        if self.clip_qkv is not None and not positive_finite(self.clip_qkv):
            raise ValueError(f"ModelConfig.clip_qkv must be None or a finite number > 0, got {self.clip_qkv!r}")
        if self.attention_block is not None and (isinstance(self.attention_block, bool)
                                                 or not isinstance(self.attention_block, int)
                                                 or self.attention_block < 1):
            raise ValueError(f"ModelConfig.attention_block must be None or an integer >= 1, got {self.attention_block!r}")
        if isinstance(self.moe, dict):
            self.moe = MoEConfig(**self.moe)
        if self.moe is not None and self.moe.first_dense > self.n_layers:
            raise ValueError(f"MoEConfig.first_dense {self.moe.first_dense} exceeds n_layers {self.n_layers}")

    @property
    def rotary(self) -> int:
        """The dims of each head that rotate."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.first_dense

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_params(self) -> int:
        d, h = self.d_model, self.mlp_hidden
        kv = self.n_kv_heads * self.head_dim
        attn = d * d * 2 + 2 * d * kv + (d + 2 * kv if self.qkv_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)
        mlps = sum(self._moe_params() if self.is_moe_layer(i) else 3 * d * h for i in range(self.n_layers))
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.n_layers * (attn + 2 * d) + mlps + d + head

    def _moe_params(self) -> int:
        m, d = self.moe, self.d_model
        return (m.n_experts * 3 * d * m.expert_hidden + m.n_experts * d + 3 * d * m.shared_hidden
                + (m.n_experts if m.expert_bias else 0))

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

_LLADA_MOE_IDS = dict(mask_token_id=156895, eos_token_id=156892, pad_token_id=156892)
_LLADA_MOE = dict(family="llada-moe", norm_eps=1e-5, rope_theta=50000.0, rope_fp32=False, logit_shift=False,
                  qk_norm=True)
_LLADA_MOE_EXPERTS = dict(n_experts=64, experts_per_token=8, expert_hidden=1024)

_LLADA2 = dict(family="llada2", norm_eps=1e-6, rope_theta=600000.0, rope_fp32=False, logit_shift=False, qk_norm=True,
               attention_block=32)
_LLADA2_ROUTING = dict(score="sigmoid", norm_topk=True, routed_scale=2.5, expert_bias=True, router_fp32=True,
                       sum_fp32=True, first_dense=1)

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
    # LLaDA-MoE: tiny; the published layer shape at 4 of its 16 layers (CPU); LLaDA-MoE-7B-A1B.
    "llada-moe-tiny": dict(_LLADA_MOE, vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=96,
                           max_seq_len=512, mask_token_id=304, eos_token_id=301, pad_token_id=301, bos_token_id=300,
                           eot_token_id=308, moe=dict(n_experts=8, experts_per_token=2, expert_hidden=32)),
    "llada-moe-compute": dict(_LLADA_MOE, **_LLADA_MOE_IDS, vocab_size=157184, d_model=2048, n_layers=4, n_heads=16,
                              n_kv_heads=16, mlp_hidden=8192, max_seq_len=8192, moe=_LLADA_MOE_EXPERTS),
    "llada-moe-7b": dict(_LLADA_MOE, **_LLADA_MOE_IDS, vocab_size=157184, d_model=2048, n_layers=16, n_heads=16,
                         n_kv_heads=16, mlp_hidden=8192, max_seq_len=8192, moe=_LLADA_MOE_EXPERTS),
    # LLaDA2: tiny; the LLaDA2.0-mini layer shape at 4 of its 20 layers (CPU); LLaDA2.0-mini (16 B parameters).
    "llada2-tiny": dict(_LLADA2, vocab_size=320, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, mlp_hidden=96,
                        max_seq_len=512, mask_token_id=304, eos_token_id=301, pad_token_id=301, eot_token_id=308,
                        rotary_dim=8, moe=dict(_LLADA2_ROUTING, n_experts=16, experts_per_token=4, expert_hidden=32,
                                               n_groups=4, topk_groups=2, shared_hidden=32)),
    "llada2-compute": dict(_LLADA2, **_LLADA_MOE_IDS, vocab_size=157184, d_model=2048, n_layers=4, n_heads=16,
                           n_kv_heads=4, mlp_hidden=5120, max_seq_len=32768, rotary_dim=64,
                           moe=dict(_LLADA2_ROUTING, n_experts=256, experts_per_token=8, expert_hidden=512, n_groups=8,
                                    topk_groups=4, shared_hidden=512)),
    "llada2-mini": dict(_LLADA2, **_LLADA_MOE_IDS, vocab_size=157184, d_model=2048, n_layers=20, n_heads=16,
                        n_kv_heads=4, mlp_hidden=5120, max_seq_len=32768, rotary_dim=64,
                        moe=dict(_LLADA2_ROUTING, n_experts=256, experts_per_token=8, expert_hidden=512, n_groups=8,
                                 topk_groups=4, shared_hidden=512)),
}


DEFAULT_GEN_LENGTH = 128
# The largest temperature and guidance scale a request takes: a chosen cap, far past any useful
# value, below where Dream's draws (logits / temperature) and the guided logits overflow.
LARGEST_SCALE = 1e4


@dataclass
class GenerationConfig:
    """One generation request: lengths, schedule, sampler, cache policy and sampling settings.

    gen_length: tokens to generate per row (the masked canvas after the prompt). None: the
        checkpoint's `max_new_tokens` (generation_config.json) when it names one, else the
        caller's default: `DEFAULT_GEN_LENGTH` (128) in `dllm.generate` and `dllm serve`, each
        task's `max_tokens` in `dllm bench` and `dllm sweep`.
    block_length: semi-autoregressive block size for block samplers (default: the sampler's own
        when it has one and it divides gen_length, `Sampler.block_length_for`, e.g. a Learn2PD
        filter's; else gen_length, one block; a block-causal model's attention blocks); samplers
        without blocks (Dream's) ignore it.
    steps: denoising steps for fixed-schedule samplers (default: gen_length, one token per step).
    tokens_per_step: k, the other way to give the step count: steps = gen_length / k (k must
        divide gen_length); exclusive with `steps`.
    temperature: 0 = greedy; > 0 = sampling: Gumbel-max in float64 for LLaDA-style samplers (as
        LLaDA's reference), Dream's samplers draw from softmax(logits / temperature) as Dream's.
        At most `LARGEST_SCALE` (1e4), as is `cfg_scale`.
    cfg_scale: unsupervised classifier-free guidance (LLaDA): each step also runs the canvas with
        the prompt masked and uses uncond + (cfg_scale + 1) * (cond - uncond); 0 = off. Not
        allowed with a cache policy that stores K/V.
    sampler: registered sampler name (`dllm.samplers.available()`), or a sampler instance; None
        takes the `alg` of the checkpoint's generation_config.json when it names one (Dream
        Instruct: `origin`), else the family's reference rule (LLaDA and LLaDA-MoE
        `low_confidence`, Dream `entropy`, LLaDA2 `llada2`).
    sampler_kwargs: keyword arguments for the sampler when it is given by name.
    cache: cache policy name (`dllm.cache.available_policies()`: none, prefix, dual, dkv-decode,
        dkv-greedy, vicinity, and block for block-causal models) or a `dllm.cache.CachePolicy` instance.
    cache_kwargs: keyword arguments for the policy when it is given by name, e.g.
        cache="dkv-decode", cache_kwargs={"refresh": 4}.
    seed: seeds the one `torch.Generator` every random draw of the request uses.
    max_forwards: hard cap on the steps a row takes part in (a step is one forward of the row; a
        ragged batch may run a step as several model calls, one per width group); when hit,
        every remaining mask is filled with the current prediction and the output says so.
        Default: max(steps, gen_length) (steps only for samplers that use them), plus the columns
        a block-causal model decodes past the answer to the end of its attention block, plus what
        a sampler adds (`Sampler.forward_allowance`: `llada21`'s max_post_steps per block,
        `remdm`'s and `wino`'s extra forwards).
    chat: apply the tokenizer's chat template to string prompts (None: when it has one).
    score_dtype: precision of the softmax behind the LLaDA-style confidences: "logits" (the model
        dtype, as current LLaDA `generate.py`; in bf16 confident positions tie often and ties go to
        the lower position), "float32", or "float64" (Fast-dLLM, older LLaDA). Dream's samplers
        always follow Dream's `sample_tokens` in the logits dtype.
    trace: record the step at which every generated position was committed.
    suffix_dropout: DPad's suffix dropout (`dllm.dpad`): a dict of its settings, e.g.
        {"window": 256, "sigma": 4, "scale": 2}; each forward then keeps the canvas up to the end of
        the active block and a random few of the masks after it. None (default): off. Stored with
        every setting filled in (`SuffixDropout.arguments`).
    eos_early_stop: a row stops once a block it completes holds an EOS or end-of-turn token: its
        later masked columns become EOS (committed at that step, so counted in tokens per forward)
        and it takes no more forwards. Greedy, the answer, cut at its first EOS/EOT, is the one
        decoded without it, unless the sampler re-masks columns of earlier blocks (`rcr`); when
        sampling, a batch shares one random stream, so a row that stops early changes the draws of
        the others (a single row keeps its answer). False (default): every block is decoded.

    Argument dicts are `*_kwargs` here; outputs and result rows record the resolved arguments as
    `sampler_args` / `cache_args`.
    """

    gen_length: int | None = None
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
    tokens_per_step: int | None = None
    cache: Any = "none"
    cache_kwargs: dict[str, Any] = field(default_factory=dict)
    suffix_dropout: dict[str, Any] | None = None
    eos_early_stop: bool = False

    def __post_init__(self):
        self._plain_numbers()
        for name in ("gen_length", "block_length", "steps", "tokens_per_step", "max_forwards"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 < value <= MAX_INTEGER_ARGUMENT):
                raise ValueError(f"GenerationConfig.{name} must be a positive integer (at most "
                                 f"{MAX_INTEGER_ARGUMENT}), got {value!r}")
        if self.steps is not None and self.tokens_per_step is not None:
            raise ValueError(f"give steps ({self.steps}) or tokens_per_step ({self.tokens_per_step}), not both")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 <= self.temperature <= LARGEST_SCALE:
            raise ValueError(f"temperature must be a finite number >= 0 (at most {LARGEST_SCALE:g}), got "
                             f"{self.temperature!r}")
        if self.chat is not None and not isinstance(self.chat, bool):
            raise ValueError(f"chat must be True, False or None (the model's default), got {self.chat!r}")
        for name in ("trace", "eos_early_stop"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.cfg_scale, bool) or not isinstance(self.cfg_scale, (int, float)) \
                or not 0 <= self.cfg_scale <= LARGEST_SCALE:
            raise ValueError(f"cfg_scale must be a finite number >= 0 (at most {LARGEST_SCALE:g}), got "
                             f"{self.cfg_scale!r}")
        if self.score_dtype not in ("logits", "float32", "float64"):
            raise ValueError(f"score_dtype must be 'logits', 'float32' or 'float64', got {self.score_dtype!r}")
        check_seed(self.seed)
        if isinstance(self.sampler, str):
            samplers.sampler_class(self.sampler)  # an unknown name raises, naming the registered ones
        elif self.sampler is not None and not isinstance(self.sampler, samplers.Sampler):
            raise ValueError(f"sampler must be a registered name or a Sampler instance, got {self.sampler!r:.80} "
                             f"({type(self.sampler).__name__})")
        for name in ("sampler_kwargs", "cache_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name} must be a dict, got {type(getattr(self, name)).__name__}")
            key = next((k for k in getattr(self, name) if not isinstance(k, str)), None)
            if key is not None:
                raise ValueError(f"{name} keys must be argument names (strings), got {key!r} "
                                 f"({type(key).__name__})")
        self._check_guidance()
        if self.suffix_dropout is not None:
            self.suffix_dropout = SuffixDropout.from_value(self.suffix_dropout).arguments()


    def _plain_numbers(self) -> None:
        """numpy (or other registered) integers and reals as Python ints and floats (`plain_number`),
        the sampler's and cache policy's argument values too."""
        for name in ("gen_length", "block_length", "steps", "tokens_per_step", "max_forwards", "seed"):
            value = getattr(self, name)
            if isinstance(value, numbers.Integral):
                setattr(self, name, plain_number(value))
        for name in ("temperature", "cfg_scale"):
            setattr(self, name, plain_number(getattr(self, name)))
        for name in ("sampler_kwargs", "cache_kwargs"):
            arguments = getattr(self, name)
            if isinstance(arguments, dict):
                setattr(self, name, {key: plain_number(value) for key, value in arguments.items()})

    def _check_guidance(self) -> None:
        """The one refusal of guidance with a storing cache: the guided batch doubles every row,
        which a cache of one entry per row cannot hold."""
        if isinstance(self.cache, CachePolicy):
            policy = self.cache
        elif isinstance(self.cache, str):
            policy = policy_class(self.cache)
        else:
            raise ValueError(f"cache must be a registered policy name or a CachePolicy instance, got "
                             f"{type(self.cache).__name__}")
        if self.cfg_scale > 0 and policy.needs_storage:
            raise ValueError(f"cfg_scale {self.cfg_scale} > 0 is not supported with cache policy {policy.name!r}, "
                             f"which stores K/V between steps (the guided batch doubles every row); use "
                             f"cache='none' or cfg_scale=0")

    def replace(self, **changes: Any) -> "GenerationConfig":
        """A copy with `changes` applied; unknown field names are an error naming them."""
        check_fields(GenerationConfig, changes, "generation")
        return dataclasses.replace(self, **changes)

    def for_length(self, gen_length: int | None = None) -> "GenerationConfig":
        """This request with its generation length fixed (`gen_length`, default
        `DEFAULT_GEN_LENGTH`, where the config left it None) and checked against the block length
        and tokens per step (unless the sampler is known to ignore them). `dllm.generate` runs this
        first; a grid of lengths can hold combinations that only fail here."""
        cfg = self
        if cfg.gen_length is None:
            cfg = cfg.replace(gen_length=DEFAULT_GEN_LENGTH if gen_length is None else gen_length)
        if cfg.block_length is not None and cfg.block_length > cfg.gen_length and cfg.sampler_may_use("uses_blocks"):
            raise ValueError(f"block_length {cfg.block_length} exceeds gen_length {cfg.gen_length}")
        uneven = cfg.tokens_per_step is not None and cfg.gen_length % cfg.tokens_per_step
        if uneven and cfg.sampler_may_use("uses_steps"):
            raise ValueError(f"tokens_per_step {cfg.tokens_per_step} does not divide gen_length {cfg.gen_length}")
        return cfg

    def sampler_may_use(self, attribute: str, unknown: bool = False) -> bool:
        """Whether the sampler has the class attribute `attribute` true (`uses_blocks`: False for
        one that decodes the whole generation region at once, ignoring block_length; `uses_steps`);
        `unknown` for a sampler the model chooses (None: `dllm.decode.resolve_request` checks
        again once it is chosen)."""
        sampler = self.sampler
        if sampler is None:
            return unknown
        if isinstance(sampler, str) and sampler in samplers.available():
            return getattr(samplers.sampler_class(sampler), attribute)
        return getattr(sampler, attribute, True)

    @property
    def resolved_block_length(self) -> int:
        return self.block_length or self.resolved_gen_length

    @property
    def resolved_steps(self) -> int:
        if self.tokens_per_step is not None:
            return self.resolved_gen_length // self.tokens_per_step
        return self.steps or self.resolved_gen_length

    @property
    def resolved_max_forwards(self) -> int:
        return self.max_forwards or max(self.resolved_steps, self.resolved_gen_length)

    @property
    def resolved_gen_length(self) -> int:
        return DEFAULT_GEN_LENGTH if self.gen_length is None else self.gen_length
