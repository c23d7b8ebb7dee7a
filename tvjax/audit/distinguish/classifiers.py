"""The distinguishers, Flax NNX modules mapping (tokens int32 [B, n], lengths int32 [B]) to a logit
[B] for "this row came from pi":

* `NgramClassifier` ("ngram"): logistic regression on hashed counts of k-grams, k = 1..order, both
  position-free and tagged with their position, plus the row's length. Rows start with `order - 1`
  begin markers, so every real position ends one k-gram of each order; positions at or after a
  row's length are masked. On an order-c Markov table (tvjax.core.instances' tabular pairs) positional
  (c+1)-grams make the log-likelihood ratio itself a linear function of the features.
* `TransformerClassifier` ("transformer"): token and position embeddings, pre-norm attention blocks
  whose keys are masked past each row's length, a mean over the real positions plus a length
  embedding, and a linear logit.
"""

import jax
import jax.numpy as jnp
from flax import nnx

_FNV_PRIME, _FNV_OFFSET = jnp.uint32(0x01000193), 0x811C9DC5
_LENGTH_KIND = 0  # feature kinds: 0 the length, 2k - 1 position-free k-grams, 2k positional ones


def _mix(h, value):
    return (h ^ value.astype(jnp.uint32)) * _FNV_PRIME


def _finalize(h):
    """murmur3's fmix32: every input bit reaches every bucket bit."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def ngram_features(tokens, lengths, vocab_size, order, buckets):
    """(bucket ids int32 [B, F], mask float32 [B, F]), F = 2 order n + 1: the hashed features of
    every row; `buckets` a power of two."""
    num, n = tokens.shape
    begin = jnp.full((num, order - 1), vocab_size, tokens.dtype)  # an id no token has
    padded = jnp.concatenate([begin, tokens], axis=1)
    positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.uint32), (num, n))
    real = (jnp.arange(n)[None, :] < lengths[:, None]).astype(jnp.float32)
    start_hash = lambda kind, width: _mix(jnp.full((num, width), _FNV_OFFSET, jnp.uint32), jnp.full((num, width), kind))
    ids = [_finalize(_mix(start_hash(_LENGTH_KIND, 1), lengths[:, None]))]
    masks = [jnp.ones((num, 1), jnp.float32)]
    for k in range(1, order + 1):
        h = start_hash(2 * k - 1, n)
        for offset in range(k):  # the k-gram ending at position i: padded[i + order - k + offset]
            start = order - k + offset
            h = _mix(h, padded[:, start : start + n])
        ids += [_finalize(h), _finalize(_mix(_mix(h, jnp.full((num, n), 2 * k, jnp.uint32)), positions))]
        masks += [real, real]
    return (jnp.concatenate(ids, axis=1) & jnp.uint32(buckets - 1)).astype(jnp.int32), jnp.concatenate(masks, axis=1)


class NgramClassifier(nnx.Module):
    """Logistic regression on hashed k-gram counts (k = 1..order, position-free and positional) and
    the length: logit = b + sum of the weights of a row's features."""

    def __init__(self, vocab_size, n, *, order=3, buckets=2**16, rngs):
        del n, rngs  # every row's features come from its tokens alone; weights start at 0
        if buckets < 2 or buckets & (buckets - 1):
            raise ValueError(f"buckets must be a power of two >= 2, got {buckets}")
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        self.vocab_size, self.order, self.buckets = vocab_size, order, buckets
        self.weights = nnx.Param(jnp.zeros((buckets,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((), jnp.float32))

    def __call__(self, tokens, lengths):
        ids, mask = ngram_features(tokens, lengths, self.vocab_size, self.order, self.buckets)
        return self.bias[...] + jnp.sum(self.weights[...][ids] * mask, axis=1)


class _Block(nnx.Module):
    def __init__(self, width, heads, rngs):
        self.attention_norm = nnx.LayerNorm(width, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(heads, width, decode=False, rngs=rngs)
        self.mlp_norm = nnx.LayerNorm(width, rngs=rngs)
        self.mlp_in = nnx.Linear(width, 4 * width, rngs=rngs)
        self.mlp_out = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x, key_mask):
        x = x + self.attention(self.attention_norm(x), mask=key_mask)
        return x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.mlp_norm(x))))


class TransformerClassifier(nnx.Module):
    """A small bidirectional transformer over token ids with a padding mask from the lengths."""

    def __init__(self, vocab_size, n, *, width=32, heads=2, blocks=1, rngs):
        if width % heads:
            raise ValueError(f"width={width} must be a multiple of heads={heads}")
        self.tokens = nnx.Embed(vocab_size, width, rngs=rngs)
        self.positions = nnx.Embed(n, width, rngs=rngs)
        self.lengths = nnx.Embed(n + 1, width, rngs=rngs)
        self.blocks = nnx.List([_Block(width, heads, rngs) for _ in range(blocks)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, tokens, lengths):
        n = tokens.shape[1]
        real = jnp.arange(n)[None, :] < lengths[:, None]  # [B, n]
        x = self.tokens(tokens) + self.positions(jnp.arange(n))[None]
        key_mask = (real | (lengths[:, None] == 0))[:, None, None, :]  # an empty row attends to its pads
        for block in self.blocks:
            x = block(x, key_mask)
        weights = real.astype(x.dtype)
        pooled = jnp.sum(self.norm(x) * weights[..., None], axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)[:, None]
        return self.head(pooled + self.lengths(lengths))[:, 0]


CLASSIFIERS = {"ngram": NgramClassifier, "transformer": TransformerClassifier}
