"""A decoder-only transformer in Flax NNX: Llama (SmolLM2), Qwen2, Qwen3.

Parameters keep Hugging Face's names and layouts (a Linear's weight is [out, in]); the layers are
stacked on a leading axis and run by `jax.lax.scan`, so compile time does not grow with depth.
Attention reads keys and values from `Segment`s: a prompt's cache shared by every row (batch 1),
a row's own decode cache, and always the new tokens themselves (causal).

Serving variants live here as static settings: a Linear's weight may be stored quantized (int8,
int4 or GGUF blocks, `tvjax.models.quantize`) and is then dequantized on the fly in the compute
dtype; the KV cache may be stored in another dtype or in int8 (`kv_cache`: every key and value,
the new tokens' own included, is read back through the cache's rounding, so a teacher-forced pass
and the decode loop see the same numbers); attention may reduce over the keys in chunks with an
online softmax (`attention_chunk`).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from tvjax.models.config import check_config
from tvjax.models.quantize import dequantize_gguf, dequantize_int4, dequantize_int8, quantize_int8

KV_CACHE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "int8": jnp.int8}


class Segment(NamedTuple):
    """Cached keys and values [layers, B or 1, S, kv_heads, head_dim] and which the queries may
    read: mask bool broadcastable to [T, S] (T new tokens). With an int8 KV cache keys and values
    are each a pair (q int8 [layers, B|1, S, kv_heads, head_dim], scale float32 [..., kv_heads])."""

    keys: jax.Array
    values: jax.Array
    mask: jax.Array


def _normal(rngs, shape, std):
    return std * jax.random.normal(rngs.params(), shape, jnp.float32)


class Linear(nnx.Module):
    """x W^T + b, W [out, in] as Hugging Face stores it; `stack` prepends the layer axis.

    `format` says how W is stored: "full" (`weight`, a float array), "int8" / "int4" (`weight_q`
    and `weight_scale` of `quantize_int8` / `quantize_int4`), or a GGUF block format "Q4_0",
    "Q4_1", "Q8_0" (`weight_q`, `weight_scale` = d, and `weight_offset` = m for Q4_1). The bias is
    never quantized. See `set_quantized`."""

    def __init__(self, d_in, d_out, bias, rngs, stack=()):
        self.weight = nnx.Param(_normal(rngs, (*stack, d_out, d_in), d_in**-0.5))
        self.bias = nnx.Param(_normal(rngs, (*stack, d_out), 0.1)) if bias else None
        self.format = "full"

    def set_quantized(self, format, q, scale, offset=None):
        """Store W quantized instead of in full (the module is changed in place)."""
        del self.weight
        self.format = format
        self.weight_q = nnx.Param(q)
        self.weight_scale = nnx.Param(scale)
        if offset is not None:
            self.weight_offset = nnx.Param(offset)

    def kernel(self, dtype):
        """W [..., out, in] in `dtype`, dequantized here when it is stored quantized."""
        if self.format == "full":
            return self.weight[...].astype(dtype)
        q, scale = self.weight_q[...], self.weight_scale[...]
        if self.format == "int8":
            return dequantize_int8(q, scale, dtype)
        if self.format == "int4":
            return dequantize_int4(q, scale, dtype)
        offset = self.weight_offset[...] if self.format == "Q4_1" else None
        return dequantize_gguf(self.format, q, scale, offset, dtype)

    def __call__(self, x):
        y = jnp.einsum("...i,oi->...o", x, self.kernel(x.dtype))
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


def store_kv(x, kv_cache):
    """Keys or values [..., head_dim] as the cache holds them: unchanged (kv_cache None), cast to a
    float dtype, or int8 with one absmax scale per token and head: (q int8, scale float32 [...])."""
    if kv_cache is None:
        return x
    if kv_cache == "int8":
        return quantize_int8(x)
    return x.astype(KV_CACHE_DTYPES[kv_cache])


def load_kv(stored, dtype):
    """What attention reads from the cache `stored` (of `store_kv`), in the compute dtype."""
    if isinstance(stored, tuple):
        return dequantize_int8(*stored, dtype)
    return stored.astype(dtype)


def _attend_chunked(q, segments, scale, chunk):
    """Online softmax over the keys, `chunk` keys at a time, segment after segment: running max m,
    normalizer l and output sum acc in float32 (the order in which flash-attention kernels reduce)."""
    B, T, kv_heads, g, D = q.shape
    m = jnp.full((B, kv_heads, g, T), -jnp.inf, jnp.float32)
    l = jnp.zeros((B, kv_heads, g, T), jnp.float32)
    acc = jnp.zeros((B, T, kv_heads, g, D), jnp.float32)
    to_out = lambda a: jnp.moveaxis(a, -1, 1)[..., None]  # [B, kv, g, T] -> [B, T, kv, g, 1]

    def body(carry, xs):
        m, l, acc = carry
        k, v, mask = xs
        s = jnp.where(mask, (_scores(q, k) * scale).astype(jnp.float32), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - shift[..., None])
        correction = jnp.exp(m - shift)
        l = l * correction + jnp.sum(p, axis=-1)
        acc = acc * to_out(correction) + _mix(p.astype(q.dtype), v).astype(jnp.float32)
        return (m_new, l, acc), None

    for keys, values, mask in segments:
        S = keys.shape[1]
        mask = jnp.broadcast_to(mask, (T, S))
        pad = -S % chunk
        if pad:
            widths = ((0, 0), (0, pad), (0, 0), (0, 0))
            keys, values, mask = jnp.pad(keys, widths), jnp.pad(values, widths), jnp.pad(mask, ((0, 0), (0, pad)))
        count = (S + pad) // chunk
        keys, values = (jnp.moveaxis(a.reshape(a.shape[0], count, chunk, *a.shape[2:]), 1, 0) for a in (keys, values))
        masks = jnp.moveaxis(mask.reshape(T, count, chunk), 1, 0)
        (m, l, acc), _ = jax.lax.scan(body, (m, l, acc), (keys, values, masks))
    return (acc / to_out(l)).astype(q.dtype)


def attend(q, segments, scale, chunk=None):
    """Grouped-query attention of q [B, T, heads, D] over the (keys [B|1, S, kv, D], values, mask)
    triples of `segments`: one softmax (in float32) over all of their keys, or (chunk an int) an
    online softmax over `chunk` keys at a time."""
    B, T, heads, D = q.shape
    kv_heads = segments[0][0].shape[2]
    q = q.reshape(B, T, kv_heads, heads // kv_heads, D)
    if chunk is not None:
        return _attend_chunked(q, segments, scale, chunk).reshape(B, T, heads, D)
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

    def __call__(self, x, cos, sin, segments, kv_cache=None, attention_chunk=None):
        heads, kv_heads, D = self.shape
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, heads, D)
        k = self.k_proj(x).reshape(B, T, kv_heads, D)
        v = self.v_proj(x).reshape(B, T, kv_heads, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        stored = (store_kv(k, kv_cache), store_kv(v, kv_cache))
        own = (load_kv(stored[0], x.dtype), load_kv(stored[1], x.dtype), jnp.tril(jnp.ones((T, T), bool)))
        out = attend(q, (*segments, own), D**-0.5, attention_chunk)
        return self.o_proj(out.reshape(B, T, heads * D)), stored


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

    def __call__(self, h, cos, sin, segments, kv_cache=None, attention_chunk=None):
        a, kv = self.self_attn(self.input_layernorm(h), cos, sin, segments, kv_cache, attention_chunk)
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

    def __call__(self, tokens, positions, segments=(), kv_cache=None, attention_chunk=None):
        """Logits float32 [B, T, V] of tokens [B, T] at positions [T] after the cached `segments`,
        and the new tokens' (keys, values), each [layers, B, T, kv_heads, head_dim] as the cache
        stores them (`store_kv`)."""
        c = self.config
        embed = self.embed_tokens.weight[...]
        h = embed[tokens]
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        graph, params = nnx.split(self.layers)
        masks = [s.mask for s in segments]

        def layer(h, xs):
            layer_params, cached = xs
            layer_segments = tuple((load_kv(k, h.dtype), load_kv(v, h.dtype), m) for (k, v), m in zip(cached, masks))
            return nnx.merge(graph, layer_params)(h, cos, sin, layer_segments, kv_cache, attention_chunk)

        h, kv = jax.lax.scan(layer, h, (params, tuple((s.keys, s.values) for s in segments)))
        h = self.norm(h)
        logits = jnp.einsum("bth,vh->btv", h, embed) if self.lm_head is None else self.lm_head(h)
        return logits.astype(jnp.float32), kv


def random_transformer(config, key):
    """A Transformer with random weights (for tests and toy instances): N(0, 1/fan_in) weights,
    N(0, 1/hidden) embeddings (logits of order 1), norms 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    return Transformer(config, nnx.Rngs(params=key))


def forward(graphdef, state, tokens, positions, segments=(), dtype=jnp.float32, kv_cache=None,
            attention_chunk=None):
    """The split model run in `dtype` (float weights and scales cast per call, so variants share
    one copy; integer weights stay integers until a Linear dequantizes them), with the KV cache
    held as `kv_cache` (None: the compute dtype; a name of KV_CACHE_DTYPES) and attention over
    `attention_chunk` keys at a time (None: one softmax)."""
    cast = jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, state)
    return nnx.merge(graphdef, cast)(tokens, positions, segments, kv_cache, attention_chunk)
