"""A decoder-only transformer in Flax NNX: Llama (SmolLM2), Qwen2, Qwen3.

Parameters keep Hugging Face's names and layouts (a Linear's weight is [out, in]); the layers are
stacked on a leading axis and run by `jax.lax.scan`, so compile time does not grow with depth.
Attention reads keys and values from `Segment`s: a prompt's cache shared by every row (batch 1),
a row's own decode cache, and always the new tokens themselves (causal).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from tvjax.models.config import check_config


class Segment(NamedTuple):
    """Cached keys and values [layers, B or 1, S, kv_heads, head_dim] and which the queries may
    read: mask bool broadcastable to [T, S] (T new tokens)."""

    keys: jax.Array
    values: jax.Array
    mask: jax.Array


def _normal(rngs, shape, std):
    return std * jax.random.normal(rngs.params(), shape, jnp.float32)


class Linear(nnx.Module):
    """x W^T + b, W [out, in] as Hugging Face stores it; `stack` prepends the layer axis."""

    def __init__(self, d_in, d_out, bias, rngs, stack=()):
        self.weight = nnx.Param(_normal(rngs, (*stack, d_out, d_in), d_in**-0.5))
        self.bias = nnx.Param(_normal(rngs, (*stack, d_out), 0.1)) if bias else None

    def __call__(self, x):
        y = jnp.einsum("...i,oi->...o", x, self.weight[...])
        return y if self.bias is None else y + self.bias[...]


class RMSNorm(nnx.Module):
    """x / rms(x) in float32, cast back, times the weight (Hugging Face's order of operations)."""

    def __init__(self, dim, eps, rngs, stack=()):
        self.weight = nnx.Param(1.0 + _normal(rngs, (*stack, dim), 0.1))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...] * normed.astype(x.dtype)


class Embedding(nnx.Module):
    def __init__(self, vocab_size, dim, rngs):
        self.weight = nnx.Param(_normal(rngs, (vocab_size, dim), dim**-0.5))


def rope_tables(positions, head_dim, theta):
    """(cos, sin) float32 [T, head_dim] of the default (non-interleaved) rotary embedding."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """x [B, T, heads, D] rotated by position: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :].astype(x.dtype) + rotated * sin[None, :, None, :].astype(x.dtype)


def _scores(q, keys):
    # A batch-1 segment (the shared prompt) is read by every row without being broadcast.
    if keys.shape[0] == 1 and q.shape[0] != 1:
        return jnp.einsum("btkgd,skd->bkgts", q, keys[0])
    return jnp.einsum("btkgd,bskd->bkgts", q, keys)


def _mix(weights, values):
    if values.shape[0] == 1 and weights.shape[0] != 1:
        return jnp.einsum("bkgts,skd->btkgd", weights, values[0])
    return jnp.einsum("bkgts,bskd->btkgd", weights, values)


def attend(q, segments, scale):
    """Grouped-query attention of q [B, T, heads, D] over the (keys [B|1, S, kv, D], values, mask)
    triples of `segments`: one softmax (in float32) over all of their keys."""
    B, T, heads, D = q.shape
    kv_heads = segments[0][0].shape[2]
    q = q.reshape(B, T, kv_heads, heads // kv_heads, D)
    scores = [jnp.where(mask, (_scores(q, k) * scale).astype(jnp.float32), -jnp.inf) for k, _, mask in segments]
    weights = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(q.dtype)
    bounds = [0]
    for s in scores:
        bounds.append(bounds[-1] + s.shape[-1])
    out = sum(_mix(weights[..., a:b], v) for (_, v, _), a, b in zip(segments, bounds, bounds[1:]))
    return out.reshape(B, T, heads, D)


class Attention(nnx.Module):
    def __init__(self, config, rngs, stack=()):
        c = config
        self.q_proj = Linear(c.hidden_size, c.num_heads * c.head_dim, c.qkv_bias, rngs, stack)
        self.k_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias, rngs, stack)
        self.v_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias, rngs, stack)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, c.o_bias, rngs, stack)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps, rngs, stack) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps, rngs, stack) if c.qk_norm else None
        self.shape = (c.num_heads, c.num_kv_heads, c.head_dim)

    def __call__(self, x, cos, sin, segments):
        heads, kv_heads, D = self.shape
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, heads, D)
        k = self.k_proj(x).reshape(B, T, kv_heads, D)
        v = self.v_proj(x).reshape(B, T, kv_heads, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        own = (k, v, jnp.tril(jnp.ones((T, T), bool)))
        out = attend(q, (*segments, own), D**-0.5)
        return self.o_proj(out.reshape(B, T, heads * D)), (k, v)


class MLP(nnx.Module):
    def __init__(self, config, rngs, stack=()):
        c = config
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, False, rngs, stack)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, False, rngs, stack)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, False, rngs, stack)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    """One pre-norm layer; built with stack=(num_layers,) it holds every layer's parameters."""

    def __init__(self, config, rngs, stack=()):
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_eps, rngs, stack)
        self.self_attn = Attention(config, rngs, stack)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_eps, rngs, stack)
        self.mlp = MLP(config, rngs, stack)

    def __call__(self, h, cos, sin, segments):
        a, kv = self.self_attn(self.input_layernorm(h), cos, sin, segments)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class Transformer(nnx.Module):
    def __init__(self, config, rngs):
        c = check_config(config)
        self.config = c
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, rngs)
        self.layers = Block(c, rngs, stack=(c.num_layers,))
        self.norm = RMSNorm(c.hidden_size, c.rms_eps, rngs)
        self.lm_head = None if c.tie_embeddings else Linear(c.hidden_size, c.vocab_size, False, rngs)

    def __call__(self, tokens, positions, segments=()):
        """Logits float32 [B, T, V] of tokens [B, T] at positions [T] after the cached `segments`,
        and the new tokens' (keys, values), each [layers, B, T, kv_heads, head_dim]."""
        c = self.config
        embed = self.embed_tokens.weight[...]
        h = embed[tokens]
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        graph, params = nnx.split(self.layers)
        masks = [s.mask for s in segments]

        def layer(h, xs):
            layer_params, cached = xs
            layer_segments = tuple((k, v, m) for (k, v), m in zip(cached, masks))
            return nnx.merge(graph, layer_params)(h, cos, sin, layer_segments)

        h, kv = jax.lax.scan(layer, h, (params, tuple((s.keys, s.values) for s in segments)))
        h = self.norm(h)
        logits = jnp.einsum("bth,vh->btv", h, embed) if self.lm_head is None else self.lm_head(h)
        return logits.astype(jnp.float32), kv


def random_transformer(config, key):
    """A Transformer with random weights (for tests and toy instances): N(0, 1/fan_in) weights,
    N(0, 1/hidden) embeddings (logits of order 1), norms 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    return Transformer(config, nnx.Rngs(params=key))


def forward(graphdef, state, tokens, positions, segments=(), dtype=jnp.float32):
    """The split model run in `dtype` (weights cast per call, so variants share one copy)."""
    cast = jax.tree.map(lambda a: a.astype(dtype), state)
    return nnx.merge(graphdef, cast)(tokens, positions, segments)
