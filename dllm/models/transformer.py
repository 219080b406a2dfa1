"""The transformer shared by every family (LLaDA, LLaDA-MoE, LLaDA2, Dream), written bottom-up:
RMSNorm -> rotary embedding -> Attention -> MLP (or the MoE MLP, `moe.py`) -> Block ->
DiffusionTransformer.

All are pre-norm SwiGLU transformers with rotary embeddings and non-causal (LLaDA2: block-causal)
attention; their differences (q/k/v biases, QK norm, partial rotation and its precision, Dream's
one-position logit shift, experts, weight names) are fields of `ModelConfig` and the per-family
files `llada.py`, `llada_moe.py`, `llada2.py` and `dream.py`.

Forward contract (docs/architecture.md §7): the canvas `x` never moves. A forward recomputes the positions
a plan names, writes their keys (after RoPE) and values at their absolute canvas columns in a
`KVCache` when one is given, lets those queries attend over every valid key, and returns logits
only at the columns asked for, aligned so that row i predicts token i.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..attention import available_backends, get_backend, takes_query_masks
from ..config import ModelConfig
from ..kernels.rope_write import rope_write_impl, rope_write_triton
from ..state import cover_columns
from .graphs import ForwardGraphs
from .moe import MoE


# On CPU, float32 products with a few rows (a cached step's block, a block's masked columns at the
# LM head) and a large weight are computed as W @ x^T instead of x @ W^T, because BLAS takes a slow
# path when the output has few rows (timings: docs/kernels.md §Small-row products and §Measurements).
# The order of a dot product's additions can differ between the two paths, so results agree to
# float32 rounding, not bit for bit. `benchmarks/bench_linear.py` measures both on the machine at hand.
SMALL_ROWS = (2, 48)            # rows (all leading dimensions together) that take W @ x^T on CPU
SMALL_ROWS_MIN_WEIGHT = 1 << 20  # entries of the smallest weight that does


def takes_transposed_product(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` computes (weight @ x^T)^T: CPU float32 inputs of SMALL_ROWS
    rows and weights of at least SMALL_ROWS_MIN_WEIGHT entries."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or not x.shape[-1]:
        return False
    return SMALL_ROWS[0] <= x.numel() // x.shape[-1] <= SMALL_ROWS[1] and weight.numel() >= SMALL_ROWS_MIN_WEIGHT


def padded_rows(rows: int) -> int:
    """The row count the W @ x^T product runs at: fewer than 4 rows go up to 4, more than 8 up to a
    multiple of 8; BLAS runs those counts about twice as fast as the ones between (measured:
    docs/kernels.md §Small-row products). The padding rows are zeros and are dropped."""
    if rows < 4:
        return 4
    return rows if rows <= 8 else -(-rows // 8) * 8


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias); (weight @ x^T)^T where `takes_transposed_product` says so."""
    if not takes_transposed_product(x, weight):
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    extra = padded_rows(rows) - rows
    if extra:
        flat = torch.cat([flat, flat.new_zeros(extra, flat.shape[1])])
    out = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())
    if extra:
        out = out[:, :rows]
    return out.t().contiguous().view(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """nn.Linear (same parameters and checkpoint names) whose product is `linear`."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised in fp32 and cast back before the
    weight multiply, as both reference implementations do."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float):
    """cos/sin of the NeoX (rotate-half) layout for integer positions, in fp32, over `head_dim`
    rotated dims (the config's `rotary`). position_ids: (B, P) -> cos, sin: (B, 1, P, D)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device,
                                             dtype=torch.int64).float() / head_dim))  # (D/2,)
    angles = position_ids.float()[..., None] * inv_freq  # (B, P, D/2)
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, P, D)
    return angles.cos(), angles.sin()


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp32: bool) -> torch.Tensor:
    """Rotate x (B, H, P, D) by cos/sin (B, 1, P, R): the first R dims (all when R = D; the rest
    pass unchanged). fp32=True rotates in fp32 (LLaDA's `rope_full_precision`); otherwise cos/sin
    are cast to x's dtype first (Dream/Qwen2, LLaDA-MoE)."""
    R = cos.shape[-1]
    if R < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :R], cos, sin, fp32), x[..., R:]), dim=-1)
    if fp32:
        xf = x.float()
        return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
        self.q = Linear(d, d, bias=cfg.qkv_bias)
        self.k = Linear(d, kv, bias=cfg.qkv_bias)
        self.v = Linear(d, kv, bias=cfg.qkv_bias)
        self.o = Linear(d, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def _project(self, hq: torch.Tensor, h: torch.Tensor):
        """q (B, Q, H, D) of the query columns `hq`, k and v (B, P, H_kv, D) of every column `h`,
        after the QK norm and the clamp when the config has them."""
        cfg = self.cfg
        q = self.q(hq).view(*hq.shape[:2], cfg.n_heads, cfg.head_dim)
        k = self.k(h).view(*h.shape[:2], cfg.n_kv_heads, cfg.head_dim)
        v = self.v(h).view(*h.shape[:2], cfg.n_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.clip_qkv is not None:
            q, k, v = (t.clamp(-cfg.clip_qkv, cfg.clip_qkv) for t in (q, k, v))
        return q, k, v

    def forward(self, h, ctx: "_ForwardContext", layer: int, keep: torch.Tensor | None = None):
        """Attention of the columns `h` (B, P, d); with `keep` (B, Q), only the queries of those
        rows of h (every column's keys and values are still computed and stored): (B, Q, d)."""
        cfg = self.cfg
        B, P, _ = h.shape
        hq, cos, sin = (h, ctx.cos, ctx.sin) if keep is None else (take_rows(h, keep), *ctx.rope_at(keep))
        Q = hq.shape[1]
        q, k, v = self._project(hq, h)                                # (B, Q, H, D), (B, P, H_kv, D) x 2
        if ctx.fused_rope_write:   # rotate q and k, write k and v into the cache: one kernel
            q = rope_write_triton(q, k, v, cos, sin, ctx.cos, ctx.sin, *ctx.cache.buffers(layer), ctx.rows,
                                  ctx.positions, cfg.rope_fp32)          # (B, H, Q, D)
            k, v = ctx.cache.attended(layer, ctx.rows, ctx.layout[1])
        else:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))          # (B, H, Q, D), (B, H_kv, P, D) x 2
            q = apply_rope(q, cos, sin, cfg.rope_fp32)
            k = apply_rope(k, ctx.cos, ctx.sin, cfg.rope_fp32)
            if ctx.cache is not None:
                k, v = ctx.cache.update(layer, ctx.rows, ctx.positions, k, v, ctx.layout, ctx.write_index)
        out = ctx.attn(q, k, v, ctx.keys_for(keep), 1.0 / math.sqrt(cfg.head_dim))  # (B, H, Q, D)
        return self.o(out.transpose(1, 2).reshape(B, Q, cfg.d_model))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(h)) * up(h))."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate = Linear(d_model, hidden, bias=False)
        self.up = Linear(d_model, hidden, bias=False)
        self.down = Linear(hidden, d_model, bias=False)

    def forward(self, h):
        return self.down(F.silu(self.gate(h)) * self.up(h))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MoE(cfg, MLP) if cfg.is_moe_layer(layer) else MLP(cfg.d_model, cfg.mlp_hidden)

    def forward(self, x, ctx, layer, keep: torch.Tensor | None = None):
        """x (B, P, d) -> (B, P, d); with `keep` (B, Q) only those rows go on: (B, Q, d)."""
        attended = self.attn(self.attn_norm(x), ctx, layer, keep)
        x = (x if keep is None else take_rows(x, keep)) + attended
        return x + self.mlp(self.mlp_norm(x))


def take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t (B, P, d), index (B, Q) -> (B, Q, d): the rows `index` of each batch entry."""
    return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))


def _check_key_valid(key_valid, B: int, L: int, cache, attention_block) -> None:
    """key_valid is a bool (B, L), or (B, L, L) in a forward without a cache of a bidirectional model."""
    if key_valid is None:
        return
    if not isinstance(key_valid, torch.Tensor) or key_valid.dtype != torch.bool:
        got = key_valid.dtype if isinstance(key_valid, torch.Tensor) else type(key_valid).__name__
        raise ValueError(f"key_valid must be a bool tensor (True: a key to attend to), got {got}; an attention "
                         f"mask of 0/1 numbers converts with mask.bool()")
    if tuple(key_valid.shape) == (B, L):
        return
    if tuple(key_valid.shape) != (B, L, L):
        raise ValueError(f"key_valid must have the canvas shape {(B, L)} of x (or {(B, L, L)}, one key mask per "
                         f"query), got {tuple(key_valid.shape)}")
    if cache is not None or attention_block is not None:
        raise ValueError("a per-query key_valid (B, L, L) needs a forward without a cache of a bidirectional model "
                         f"(cache {'given' if cache is not None else 'None'}, attention_block {attention_block})")


class _ForwardContext:
    """What every layer of one forward shares."""

    def rope_at(self, keep: torch.Tensor):
        """cos, sin (B, 1, Q, D) of the columns `keep` (B, Q) of this forward."""
        index = keep[:, None, :, None].expand(-1, 1, -1, self.cos.shape[-1])
        return self.cos.gather(2, index), self.sin.gather(2, index)

    def keys_for(self, keep: torch.Tensor | None):
        """The key mask of the queries: key_valid (B, L), or with block-causal attention or a
        key_valid of one mask per query the (B, Q, L) mask of the recomputed columns (of the rows
        `keep` when given)."""
        if self.block_keys is None:
            return self.key_valid
        return self.block_keys if keep is None else take_rows(self.block_keys, keep)

    def __init__(self, attn, cos, sin, key_valid, cache, rows, positions, layout, attention_block=None, pos=None):
        self.attn, self.cos, self.sin = attn, cos, sin
        self.key_valid, self.cache, self.rows, self.positions = key_valid, cache, rows, positions
        self.block_keys = None
        if key_valid is not None and key_valid.dim() == 3:   # one key mask per query column (B, L, L)
            self.block_keys, self.key_valid = key_valid, None
        elif attention_block is not None:
            # Blocks count rotary positions (a left-padded row's from its first real token): a query
            # at position p sees the keys before position (p // n + 1) * n, i.e. the columns before
            # that end shifted by the row's padding (column - position).
            pos = positions if pos is None else pos
            L = cache.length if cache is not None else positions.shape[1]
            ends = positions - pos + (pos // attention_block + 1) * attention_block          # (B, P) columns
            self.block_keys = torch.arange(L, device=positions.device) < ends[..., None]     # (B, P, L)
            if key_valid is not None:   # a padding query sees the row's valid keys (never none: no NaN)
                padding_query = ~key_valid.gather(1, positions)
                self.block_keys = (self.block_keys | padding_query[..., None]) & key_valid[:, None, :]
        self.layout = layout                    # KVCache.layout of (rows, positions), or None
        self.write_index = None                 # KVCache.write_index of a partial write, built once
        self.fused_rope_write = False           # set by the forward: rotary + K/V write in one kernel
        if cache is not None and layout is not None and not layout[0]:
            self.write_index = cache.write_index(rows, positions)


def _union(positions: torch.Tensor, src: torch.Tensor, L: int):
    """Columns to recompute: the plan (B, P) and the logit sources (B, Q), each once, in increasing
    order; a row with fewer repeats its first column. Returns (columns (B, P'), index (B, Q) of
    every source column in them). Reads the width P' from the device."""
    B = positions.shape[0]
    need = torch.zeros(B, L, dtype=torch.bool, device=positions.device)
    need.scatter_(1, positions, True).scatter_(1, src, True)
    return cover_columns(need, src, int(need.sum(1).max()))


def hidden_source(logits_at: torch.Tensor, logit_shift: bool) -> torch.Tensor:
    """Column whose hidden state predicts each requested column: itself, or with the family's
    one-position logit shift (Dream) its left neighbour (column 0 predicts itself)."""
    return (logits_at - 1).clamp(min=0) if logit_shift else logits_at


def source_columns(wanted: torch.Tensor, logit_shift: bool) -> torch.Tensor:
    """(B, L) bool -> (B, L) bool: the columns whose hidden states give the logits of the marked
    ones (`hidden_source` as a mask)."""
    if not logit_shift:
        return wanted
    out = torch.zeros_like(wanted)
    out[:, :-1] = wanted[:, 1:]
    out[:, 0] |= wanted[:, 0]
    return out


def _drop_graphs(model, incompatible_keys) -> None:
    if model._graphs is not None:
        model._graphs.clear()


class DiffusionTransformer(nn.Module):
    """A masked-diffusion LM: `forward(x, logits_at, ...)` -> logits (B, Q, V).

    Subclasses (LLaDA, Dream) only add the family's checkpoint name map and config reader.
    """

    family = "generic"
    config_reads_tokens = False     # config_from_hf(d, tokens) takes the tokenizer's added tokens (LLaDA-MoE, LLaDA2)
    config_keys: dict[str, str] = {}   # internal config field -> its config.json key, for error messages

    def __init__(self, cfg: ModelConfig, attention: str = "auto"):
        super().__init__()
        self.config = cfg
        self._graphs: ForwardGraphs | None = None
        self._compiled_run = None
        self.register_load_state_dict_post_hook(_drop_graphs)   # assign=True gives the weights new storage
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.set_attention(attention)

    @staticmethod
    def adapt_weights(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loaded tensors (internal names) turned into the model's parameters: as they are,
        unless the family stores them otherwise (LLaDA2's fused q/k/v)."""
        return tensors

    # -- configuration -------------------------------------------------------------------
    def set_attention(self, name: str) -> None:
        """Select the attention backend by registered name (see `dllm.attention`). A block-causal
        model (LLaDA2) needs one that takes a key mask per query."""
        attn = get_backend(name)
        if self.config.attention_block is not None and not takes_query_masks(name):
            usable = [n for n in available_backends() if takes_query_masks(n)]
            raise ValueError(f"attention backend {name!r} takes no key mask per query, which this block-causal "
                             f"model ({self.config.family}) needs; use one of {', '.join(usable)}")
        self._attn = attn
        self.attention = name
        if self._graphs is not None:
            self._graphs.clear()

    def set_cuda_graphs(self, enabled: bool = True, max_graphs: int = 64, capture_after: int = 2) -> None:
        """Replay inference forwards (no autograd, logits at given columns) as CUDA graphs, one per
        input layout, keeping the `max_graphs` most recently used (see `dllm.models.graphs`). A
        layout runs eagerly until its `capture_after`-th forward, which is captured; later ones
        replay it. Off by default; the model must be on a CUDA device, a mixture-of-experts model
        in bfloat16 (in another dtype its experts read their token counts on the host)."""
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be True or False, got {enabled!r}")
        if enabled and self.config.moe is not None and self.dtype != torch.bfloat16:
            raise ValueError(f"CUDA graphs of a mixture-of-experts model need it in bfloat16 (its experts in "
                             f"{self.dtype} read their token counts on the host, which a graph cannot capture)")
        if enabled and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device; it is on {self.device}")
        self._graphs = ForwardGraphs(max_graphs, capture_after) if enabled else None

    def set_compile(self, enabled: bool = True, max_layouts: int = 64) -> None:
        """Run the transformer body of inference forwards (no autograd) through `torch.compile`
        (inductor, static shapes): one compiled graph per input layout (canvas width, recomputed
        columns, batch rows, how the cache is written), up to torch._dynamo's recompile limit,
        which `max_layouts` raises and never lowers (the limit is the process's, shared by every
        compiled model); later layouts run eagerly. The LM head and the choice of
        scored columns stay eager, so the number of scored columns never recompiles. A layout's
        first forward compiles it. Combines with `set_cuda_graphs`: a captured forward replays the
        compiled kernels. Training forwards stay eager."""
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be True or False, got {enabled!r}")
        if isinstance(max_layouts, bool) or not isinstance(max_layouts, int) or max_layouts < 1:
            raise ValueError(f"max_layouts must be an integer >= 1, got {max_layouts!r}")
        self._compiled_run = None
        if enabled:
            import torch._dynamo
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, max_layouts)
            # the unbound body, called with the model: a copy of this model runs its own weights
            self._compiled_run = torch.compile(type(self)._run, dynamic=False)
        if self._graphs is not None:
            self._graphs.clear()

    @property
    def compiled(self) -> bool:
        """Whether inference forwards run through `torch.compile` (`set_compile`)."""
        return self._compiled_run is not None

    def __getstate__(self):
        """Pickled (`torch.save(model)`) with whether it is compiled, not the compiled body; captured
        graphs are left behind (a loaded model captures its own)."""
        state = dict(self.__dict__)
        state["_compiled_run"] = self._compiled_run is not None
        graphs = self._graphs
        state["_graphs"] = None if graphs is None else ForwardGraphs(graphs.max_graphs, graphs.capture_after)
        return state

    def __setstate__(self, state):
        compiled = state.pop("_compiled_run")
        super().__setstate__({**state, "_compiled_run": None})
        if compiled:
            self.set_compile(True)

    @property
    def cuda_graphs(self) -> ForwardGraphs | None:
        """The captured graphs (count, `captures`, `replays`), or None when graphs are off."""
        return self._graphs

    def _apply(self, fn, *args, **kwargs):
        # .to(), .cuda(), .half() ... may give the tensors new storage, and captured graphs point at the
        # old one: they are dropped when any tensor moved (a .to() of the same device and dtype keeps them).
        storage = [t.data_ptr() for t in (*self.parameters(), *self.buffers())]
        out = super()._apply(fn, *args, **kwargs)
        if getattr(self, "_graphs", None) is not None and \
                storage != [t.data_ptr() for t in (*self.parameters(), *self.buffers())]:
            self._graphs.clear()
        return out

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    # -- forward ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, logits_at: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                key_valid: torch.Tensor | None = None, cache=None, rows: torch.Tensor | None = None,
                logits_from: torch.Tensor | None = None, hidden_only: bool = False):
        """Logits at the requested canvas columns.

        x:            (B, L) token ids of the whole canvas.
        logits_at:    (B, Q) columns whose logits are wanted; None = every column (B, L, V).
                      Row q of the result predicts token x[:, logits_at[:, q]] for both families
                      (Dream's shift is applied here).
        positions:    (B, P) columns to recompute; None = all. With a subset, `cache` must hold
                      the K/V of every other column; the columns whose hidden state gives the
                      requested logits (Dream: the left neighbours) are added, each column is
                      recomputed once however often it is named.
        position_ids: (B, L) rotary position of every column (left padding recounts from the
                      first real token); None = 0..L-1.
        key_valid:    (B, L) bool, False for padding keys; None = all valid. Without a cache also
                      (B, L, L): row i the keys column i attends to (a per-query mask, as WINO's
                      shadow block needs; not for block-causal models; eager and sdpa attention).
        cache:        a `dllm.cache.KVCache`; the recomputed K/V are written into it.
        rows:         (B,) cache rows of this batch, distinct and increasing (None: 0..B-1).
        logits_from:  (B, Q) with a subset `positions` only: the index in `positions` of the column
                      whose hidden state gives each requested logit (`hidden_source`), when the
                      caller built the plan to hold those columns (`dllm.state.cover_columns`) and
                      it is not every column of every row. The forward then reads nothing from the
                      device; without it, it unites the plan and the sources itself, reading the
                      width of the union.
        hidden_only:  return the final normed hidden states (B, Q, d) at the requested columns
                      instead of their logits (`head_weight()` turns them into logits), for a
                      caller that scores them with the LM head fused in (`dllm.kernels.head_scores`).
        Returns (B, Q, V) logits in the model dtype.
        """
        B, L = x.shape
        if positions is not None and cache is None:
            raise ValueError("recomputing a subset of positions needs a KVCache holding the other columns' K/V; "
                             "pass cache=... or positions=None")
        if logits_from is not None and (positions is None or logits_at is None
                                        or tuple(logits_from.shape) != tuple(logits_at.shape)):
            raise ValueError("logits_from indexes the requested logits' sources in a recompute plan: give it with "
                             "positions=PLAN and logits_at of its shape (B, Q)")
        if position_ids is not None and tuple(position_ids.shape) != (B, L):
            raise ValueError(f"position_ids must have the canvas shape {(B, L)} of x, got {tuple(position_ids.shape)}")
        _check_key_valid(key_valid, B, L, cache, self.config.attention_block)
        graphs = self._graphs if self._graphs is not None and not torch.is_grad_enabled() else None
        if graphs is not None and x.device.type != "cuda":
            raise ValueError(f"CUDA graphs are on but the input is on {x.device}; move the model and its inputs to "
                             f"a CUDA device or call set_cuda_graphs(False)")
        rows_given = rows is not None
        layout = None
        if cache is None:
            compiled = self._compiled_run is not None and not torch.is_grad_enabled()
            if (graphs is None and not compiled) or logits_at is None:
                normed = self.hidden_at(x, logits_at, position_ids=position_ids, key_valid=key_valid)
                return normed if hidden_only else self.head_logits(normed)
            positions = torch.arange(L, device=x.device).expand(B, L)
            at = self.hidden_source(logits_at)
            tokens = x
        else:
            tokens, positions, rows, at, layout = self._cached_inputs(x, logits_at, positions, cache, rows,
                                                                      logits_from)
        pos = positions if position_ids is None else position_ids.gather(1, positions)
        inputs = dict(tokens=tokens, positions=positions, pos=pos, key_valid=key_valid, rows=rows, at=at)
        if graphs is None:
            return self._logits(**inputs, cache=cache, layout=layout, hidden_only=hidden_only)
        # A replay reads every tensor the capture did at its address: the cache's buffers and index.
        buffers = None if cache is None else (tuple(cache.k[0].shape), tuple(cache.k[0].stride()), cache.k[0].dtype,
                                              tuple(t.data_ptr() for t in cache.k + cache.v),
                                              cache.head_index.data_ptr())
        autocast = torch.is_autocast_enabled(x.device.type) and torch.get_autocast_dtype(x.device.type)
        key = (x.device, L, rows_given, layout, buffers,
               tuple(None if t is None else (tuple(t.shape), t.dtype) for t in inputs.values()),
               autocast, hidden_only,
               torch.is_inference_mode_enabled())    # inference tensors cannot be written outside inference mode
        return graphs.run(self._logits, key, inputs, cache=cache, layout=layout, hidden_only=hidden_only)

    def _cached_inputs(self, x, logits_at, positions, cache, rows, logits_from):
        """A forward through `cache`: (tokens, recomputed columns, cache rows, index of the logit
        sources among the columns, `KVCache.layout`)."""
        B, L = x.shape
        every_row = None
        if rows is None:
            rows = torch.arange(B, device=x.device)
            every_row = B == cache.shape[0]
        full = positions is None
        if full:
            positions = torch.arange(L, device=x.device).expand(B, L)
        if logits_at is None:
            logits_at = torch.arange(L, device=x.device).expand(B, L)
        src = self.hidden_source(logits_at)
        if full:
            at = src
            every_column = True if L == cache.length else None
        elif logits_from is not None:
            at, every_column = logits_from, False
        else:  # recompute the plan and the logit sources once each
            positions, at = _union(positions, src, L)
            every_column = None
        layout = cache.layout(rows, positions, every_column=every_column, every_row=every_row)
        tokens = x if full else x.gather(1, positions)
        return tokens, positions, rows, at, layout

    def _logits(self, tokens, positions, pos, key_valid, rows, at, cache, layout, hidden_only=False):
        """Logits (B, Q, V) at the hidden columns `at`, an index into the recomputed `positions`
        (with `hidden_only`, the normed hidden states (B, Q, d) there)."""
        if self._compiled_run is None or torch.is_grad_enabled():
            hidden = self._run(tokens, positions, pos, key_valid, cache, rows, layout, keep=at)  # (B, Q, d)
        else:  # the compiled body returns every row, so the number of logits never recompiles it
            hidden = take_rows(self._compiled_run(self, tokens, positions, pos, key_valid, cache, rows, layout), at)
        normed = self.norm(hidden)
        return normed if hidden_only else self.head_logits(normed)

    def hidden_at(self, x: torch.Tensor, at: torch.Tensor | None, *, position_ids: torch.Tensor | None = None,
                  key_valid: torch.Tensor | None = None) -> torch.Tensor:
        """A full forward's final hidden states, after the norm, at the columns `at` (B, Q) (None:
        every column): (B, Q, d). `head_logits` of a row gives that column's logits, so a caller
        that needs logits at only some of them (training: the masked ones) runs the LM head on
        those alone."""
        B, L = x.shape
        positions = torch.arange(L, device=x.device).expand(B, L)
        pos = positions if position_ids is None else position_ids
        if at is not None:
            hidden = self._run(x, positions, pos, key_valid, None, None, keep=self.hidden_source(at))  # (B, Q, d)
            return self.norm(hidden)
        hidden = self._run(x, positions, pos, key_valid, None, None)  # (B, L, d)
        if self.config.logit_shift:
            hidden = torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)
        return self.norm(hidden)

    def head_weight(self) -> torch.Tensor:
        """The LM head's (V, d) weight (the embedding when tied)."""
        return self.head.weight if self.head is not None else self.embed.weight

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states returned by `hidden_at` (any leading shape)."""
        return self.head(normed) if self.head is not None else linear(normed, self.embed.weight)

    def hidden_source(self, logits_at: torch.Tensor) -> torch.Tensor:
        """Column whose hidden state predicts each requested column (Dream: the left neighbour)."""
        return hidden_source(logits_at, self.config.logit_shift)

    def _fuses_rope_write(self, ctx: _ForwardContext, device: torch.device) -> bool:
        """Whether the layers rotate and write their K/V with the fused kernel
        (`dllm.kernels.rope_write`, chosen with DLLM_ROPE_WRITE): a partial write into a cache
        (a cached step), full rotary, not while torch.compile traces (it fuses these itself), not
        where autograd records (the kernel has no backward)."""
        return (ctx.write_index is not None and self.config.rotary == self.config.head_dim
                and not torch.compiler.is_compiling() and not torch.is_grad_enabled()
                and rope_write_impl(None, device, ctx.cache.buffers(0)[0].dtype) == "triton")

    def _run(self, tokens, positions, pos, key_valid, cache, rows, layout=None, keep=None):
        # tokens: (B, P) ids at `positions`, `pos` their rotary positions; returns final hidden
        # states (B, P, d) before the norm, or with `keep` (B, Q) those rows only (B, Q, d): the
        # last layer then runs its queries, attention output and MLP on those rows alone.
        cos, sin = rope_cos_sin(pos, self.config.rotary, self.config.rope_theta)
        ctx = _ForwardContext(self._attn, cos, sin, key_valid, cache, rows, positions, layout,
                              self.config.attention_block, pos)
        ctx.fused_rope_write = self._fuses_rope_write(ctx, tokens.device)
        h = self.embed(tokens)  # (B, P, d)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            h = layer(h, ctx, i, keep if i == last else None)
        return h
