"""A Flax NNX decoder-only transformer of the Qwen2 / Llama family.

Token embedding, RMSNorm, rotary positions (the Hugging Face "rotate half" convention, so that
checkpoints load unchanged; Llama 3 frequency scaling optional), grouped-query attention, SwiGLU MLP,
optionally tied embeddings.

The same call serves training (full sequence, no cache) and sampling (prefill and one-token
decode steps writing into a fixed-size KV cache): callers pass positions and the attention mask,
so left-padded prompts and static shapes are the caller's choice, not the model's.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotrl.config import ModelConfig, RopeScaling
from spotrl.model.sharding import constrain

_MASK_VALUE = -1e30


class LayerCache(NamedTuple):
    """Keys and values of one layer for every cache slot: [batch, slots, kv_heads, head_dim]."""

    k: jax.Array
    v: jax.Array


def init_cache(cfg: ModelConfig, batch: int, slots: int) -> list[LayerCache]:
    shape = (batch, slots, cfg.num_kv_heads, cfg.resolved_head_dim)
    dtype = jnp.dtype(cfg.resolved_compute_dtype)
    return [LayerCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(cfg.num_layers)]


def positions_from_mask(valid: jax.Array) -> jax.Array:
    """Rotary positions of left-padded rows: 0 at the first real token, padding clamped to 0."""
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1, 0)


def causal_mask(query_slots: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[B, T, S] mask: query at slot q may see key slot s when s <= q and s holds a real token.

    query_slots: [T] (or [B, T]) slot index of each query; key_valid: [B, S].
    """
    slots = jnp.arange(key_valid.shape[-1])
    q = jnp.broadcast_to(query_slots, (key_valid.shape[0],) + query_slots.shape[-1:])
    return (slots[None, None, :] <= q[:, :, None]) & key_valid[:, None, :]


def llama3_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """Llama 3 scaled rotary inverse frequencies [head_dim // 2] (float32), as Hugging Face computes them."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(0, half, dtype=np.float64) / half))
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope(x: jax.Array, positions: jax.Array, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """Rotary embedding of x [B, T, heads, D] at integer positions [B, T] (Llama 3 scaling optional)."""
    half = x.shape[-1] // 2
    if scaling is None:
        inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) / half))
    else:
        inv_freq = jnp.asarray(llama3_inv_freq(x.shape[-1], theta, scaling))
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, half]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def _dtypes(cfg: ModelConfig) -> tuple[jnp.dtype, jnp.dtype]:
    """(parameter dtype, compute dtype): nnx.Linear and nnx.Embed cast their weights to the compute
    dtype inside the call, so gradients reach the parameters in their own dtype (mixed precision)."""
    return jnp.dtype(cfg.dtype), jnp.dtype(cfg.resolved_compute_dtype)


class Dense(nnx.Linear):
    """nnx.Linear applied to a [rows, in] view of its input. XLA:CPU runs the matmuls of a [B, T, in]
    contraction and of its gradients ~1.3x slower than the same work on [B*T, in] (a train step of
    the tiny preset: 159 -> 121 ms); on accelerators the reshapes are free. Same parameters,
    same paths as nnx.Linear; XLA:CPU blocks the 2-D matmul differently, so float sums round
    differently (the default run's digest moved with it)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return super().__call__(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        # the weight in the activations' dtype: a float32 master weight must not promote bf16 compute
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.resolved_head_dim
        dtype, compute = _dtypes(cfg)

        def dense(i, o, bias):
            return Dense(i, o, use_bias=bias, param_dtype=dtype, dtype=compute, rngs=rngs)

        self.q_proj = dense(d, cfg.num_heads * hd, cfg.qkv_bias)
        self.k_proj = dense(d, cfg.num_kv_heads * hd, cfg.qkv_bias)
        self.v_proj = dense(d, cfg.num_kv_heads * hd, cfg.qkv_bias)
        self.o_proj = dense(cfg.num_heads * hd, d, False)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
        self.rope_theta = cfg.rope_theta
        self.rope_scaling = cfg.rope_scaling

    def __call__(self, x, positions, mask, cache: LayerCache | None, cache_index):
        b, t, _ = x.shape
        q = constrain(
            self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim), ("act_batch", "act_length", "act_heads", None)
        )
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        q = rope(q, positions, self.rope_theta, self.rope_scaling)
        k = rope(k, positions, self.rope_theta, self.rope_scaling)
        if cache is not None:
            k = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (0, cache_index, 0, 0))
            v = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (0, cache_index, 0, 0))
            cache = LayerCache(k, v)
        groups = self.num_heads // self.num_kv_heads
        q = q.reshape(b, t, self.num_kv_heads, groups, self.head_dim)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32) * self.head_dim**-0.5
        scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, self.num_heads * self.head_dim)
        return self.o_proj(out), cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dtype, compute = _dtypes(cfg)

        def dense(i, o):
            return Dense(i, o, use_bias=False, param_dtype=dtype, dtype=compute, rngs=rngs)

        self.gate_proj = dense(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = dense(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = dense(cfg.intermediate_size, cfg.hidden_size)

    def __call__(self, x):
        hidden = constrain(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x), ("act_batch", "act_length", "act_mlp"))
        return self.down_proj(hidden)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dtype = jnp.dtype(cfg.dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, mask, cache, cache_index):
        attn, cache = self.self_attn(self.input_layernorm(x), positions, mask, cache, cache_index)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dtype, compute = _dtypes(cfg)
        self.config = cfg
        self.embed_tokens = nnx.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=dtype, dtype=compute, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = (
            None
            if cfg.tie_embeddings
            else Dense(cfg.hidden_size, cfg.vocab_size, use_bias=False, param_dtype=dtype, dtype=compute, rngs=rngs)
        )

    def trunk(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: list[LayerCache] | None = None,
        cache_index: jax.Array | int = 0,
    ) -> tuple[jax.Array, list[LayerCache] | None]:
        """Final normed hidden states [B, T, hidden] and the updated cache (value heads read these)."""
        residual = ("act_batch", "act_length", "act_embed")
        x = constrain(self.embed_tokens(tokens), residual)
        new_cache = [] if cache is not None else None
        for i, layer in enumerate(self.layers):
            if cache is None and self.config.remat:  # training: keep only each layer's input for the backward pass
                x, layer_cache = nnx.remat(_layer_without_cache)(layer, x, positions, mask), None
                continue
            x, layer_cache = layer(x, positions, mask, None if cache is None else cache[i], cache_index)
            x = constrain(x, residual)
            if new_cache is not None:
                new_cache.append(layer_cache)
        return self.norm(x), new_cache

    def head(self, x: jax.Array) -> jax.Array:
        logits = self.embed_tokens.attend(x) if self.lm_head is None else self.lm_head(x)
        return constrain(logits.astype(jnp.float32), ("act_batch", "act_length", "act_vocab"))

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: list[LayerCache] | None = None,
        cache_index: jax.Array | int = 0,
    ) -> tuple[jax.Array, list[LayerCache] | None]:
        """Logits [B, T, vocab] (float32) and the updated cache (None when no cache was given).

        tokens, positions: [B, T]; mask: [B, T, S] where S is T without a cache, else the cache's
        slot count; cache_index: the slot that tokens[:, 0] is written to.
        """
        x, new_cache = self.trunk(tokens, positions, mask, cache, cache_index)
        return self.head(x), new_cache


def _layer_without_cache(layer: DecoderLayer, x, positions, mask):
    return layer(x, positions, mask, None, 0)[0]


def forward(model: Transformer, tokens: jax.Array, valid: jax.Array) -> jax.Array:
    """Full-sequence logits of left-padded rows (training and scoring; no cache)."""
    return model.head(forward_hidden(model, tokens, valid))


def forward_hidden(model: Transformer, tokens: jax.Array, valid: jax.Array) -> jax.Array:
    """Full-sequence final hidden states [B, T, hidden] of left-padded rows."""
    t = tokens.shape[1]
    hidden, _ = model.trunk(tokens, positions_from_mask(valid), causal_mask(jnp.arange(t), valid))
    return hidden
