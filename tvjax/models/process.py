"""A language model as a tvjax process: length-n continuations of a fixed prompt.

The prompt's KV cache and its last logits are computed once (per compute dtype) and read by every
row; `sample` is a jitted KV-cache decode loop, `path_logprobs` / `next_token_logprobs` one
teacher-forced pass over the batch. Both use the same sampling distribution: EOS ids suppressed
(logit -inf, as in the paper: continuations have exactly n tokens), then temperature, tie-inclusive
top-k and top-p, renormalized; -inf outside the support.

Variants (`LanguageModel.variant`) change the compute dtype or the sampling settings and share
the weights: a pair of variants is a pair of processes over one copy of the model.
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from tvjax.models.transformer import Segment, forward

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Floats of logits a chunk of rows may hold ([rows, n, V] in float32): bounds the default max_chunk_rows.
CHUNK_LOGITS = 2**26
MAX_CHUNK_ROWS = 256


class Sampling(NamedTuple):
    temperature: float = 1.0
    top_k: Optional[int] = None  # tie-inclusive: every token whose logit is >= the k-th largest
    top_p: float = 1.0  # the smallest set of most likely tokens with mass >= top_p, ties included


def check_sampling(sampling, vocab_size):
    """The Sampling, or a ValueError naming the bad setting."""
    t, k, p = sampling
    if not (isinstance(t, (int, float)) and t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a positive finite number, got {t!r}")
    if k is not None and not (isinstance(k, int) and 1 <= k <= vocab_size):
        raise ValueError(f"top_k must be None or an integer in [1, {vocab_size}], got {k!r}")
    if not (isinstance(p, (int, float)) and 0 < p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")
    return Sampling(float(t), k, float(p))


def sampling_logprobs(logits, sampling, eos_ids=()):
    """float32 [..., V] log-probabilities of the sampling distribution of raw logits [..., V]:
    EOS suppressed, / temperature, tie-inclusive top-k, tie-inclusive top-p, renormalized."""
    x = logits.astype(jnp.float32) / sampling.temperature
    if eos_ids:
        x = x.at[..., jnp.asarray(eos_ids)].set(-jnp.inf)
    if sampling.top_k is not None and sampling.top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, sampling.top_k)[0][..., -1:]
        x = jnp.where(x >= kth, x, -jnp.inf)
    if sampling.top_p < 1.0:
        ordered = -jnp.sort(-x, axis=-1)
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ahead in the order
        kept = jnp.sum(before < sampling.top_p, axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(ordered, kept - 1, axis=-1)
        x = jnp.where(x >= threshold, x, -jnp.inf)
    return jax.nn.log_softmax(x, axis=-1)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _prefill(graphdef, state, tokens, dtype):
    return forward(graphdef, state, tokens, jnp.arange(tokens.shape[1]), (), DTYPES[dtype])


def prefill(graphdef, state, prompt, dtype):
    """(last logits float32 [V], keys, values [layers, 1, P, kv_heads, head_dim]) of a prompt."""
    logits, (keys, values) = _prefill(graphdef, state, jnp.asarray(prompt, jnp.int32)[None], dtype)
    return logits[0, -1], keys, values


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """Continuations x [n] of `prompt` under a transformer, as a process (see the module doc)."""

    state: Any  # the weights (nnx.State), shared by variants
    first_logits: jax.Array  # float32 [V]: raw logits after the prompt
    prompt_keys: jax.Array  # [layers, 1, P, kv_heads, head_dim], compute dtype
    prompt_values: jax.Array
    graphdef: Any
    config: Any  # ModelConfig
    prompt: tuple  # token ids
    n: int
    vocab_size: int
    max_support: int
    sampling: Sampling
    eos_ids: tuple
    dtype: str
    max_chunk_rows: int  # tvjax.streaming.memory_chunk never puts more rows in one chunk
    vocab_id: Optional[str]  # the tokenizer's vocabulary hash (None without a tokenizer)

    def _logits(self, tokens):
        """Raw float32 logits [num, n, V] at every prefix of tokens [num, n] (teacher forcing)."""
        num = tokens.shape[0]
        first = jnp.broadcast_to(self.first_logits, (num, 1, self.vocab_size))
        if self.n == 1:
            return first
        P = len(self.prompt)
        shared = Segment(self.prompt_keys, self.prompt_values, jnp.ones((1, P), bool))
        rest, _ = forward(self.graphdef, self.state, tokens[:, :-1], P + jnp.arange(self.n - 1), (shared,),
                          DTYPES[self.dtype])
        return jnp.concatenate([first, rest], axis=1)

    def next_token_logprobs(self, tokens):
        return _next_token_logprobs(self, jnp.asarray(tokens, jnp.int32))

    def path_logprobs(self, tokens):
        tokens = jnp.asarray(tokens, jnp.int32)
        return jnp.take_along_axis(_next_token_logprobs(self, tokens), tokens[..., None], axis=-1)[..., 0]

    def sample(self, key, num):
        return _sample(self, key, num)

    def variant(self, **changes):
        """The same weights and prompt with other settings: temperature, top_k, top_p, dtype
        ("float32" / "bfloat16"), max_chunk_rows. A new dtype recomputes the prompt cache."""
        allowed = {"temperature", "top_k", "top_p", "dtype", "max_chunk_rows"}
        if set(changes) - allowed:
            raise TypeError(f"variant() takes {sorted(allowed)}, got {sorted(set(changes) - allowed)}")
        sampling = check_sampling(self.sampling._replace(**{k: v for k, v in changes.items() if k in Sampling._fields}),
                                  self.vocab_size)
        out = dataclasses.replace(self, sampling=sampling, max_support=_max_support(sampling, self.vocab_size,
                                                                                    self.eos_ids))
        if "max_chunk_rows" in changes:
            out = dataclasses.replace(out, max_chunk_rows=_positive_int("max_chunk_rows", changes["max_chunk_rows"]))
        if changes.get("dtype", self.dtype) != self.dtype:
            first, keys, values = prefill(self.graphdef, self.state, self.prompt, _check_dtype(changes["dtype"]))
            out = dataclasses.replace(out, dtype=changes["dtype"], first_logits=first, prompt_keys=keys,
                                      prompt_values=values)
        return out


jax.tree_util.register_dataclass(
    LanguageModel,
    data_fields=["state", "first_logits", "prompt_keys", "prompt_values"],
    meta_fields=["graphdef", "config", "prompt", "n", "vocab_size", "max_support", "sampling", "eos_ids", "dtype",
                 "max_chunk_rows", "vocab_id"],
)


@jax.jit
def _next_token_logprobs(lm, tokens):
    return sampling_logprobs(lm._logits(tokens), lm.sampling, lm.eos_ids)


@functools.partial(jax.jit, static_argnums=2)
def _sample(lm, key, num):
    """The decode loop: step t feeds x_t at position P + t, reading the prompt cache and the row's
    cache of x_<t, writes x_t's keys and values into slot t, and draws x_{t+1}."""
    P, n = len(lm.prompt), lm.n
    dtype = DTYPES[lm.dtype]
    keys = jax.random.split(key, n)
    draw = lambda k, logits: jax.random.categorical(k, sampling_logprobs(logits, lm.sampling, lm.eos_ids), axis=-1)
    first = draw(keys[0], jnp.broadcast_to(lm.first_logits, (num, lm.vocab_size)))
    layers, _, _, kv_heads, head_dim = lm.prompt_keys.shape
    cache = jnp.zeros((layers, num, n, kv_heads, head_dim), lm.prompt_keys.dtype)
    shared = Segment(lm.prompt_keys, lm.prompt_values, jnp.ones((1, P), bool))

    def step(carry, t):
        cache_k, cache_v, token = carry
        own = Segment(cache_k, cache_v, (jnp.arange(n) < t)[None, :])
        logits, (k, v) = forward(lm.graphdef, lm.state, token[:, None], (P + t)[None], (shared, own), dtype)
        cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, k, t, axis=2)
        cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, v, t, axis=2)
        token = draw(keys[t + 1], logits[:, 0])
        return (cache_k, cache_v, token), token

    _, rest = jax.lax.scan(step, (cache, cache, first), jnp.arange(n - 1))
    return jnp.concatenate([first[:, None], rest.T], axis=1).astype(jnp.int32)


def _check_dtype(dtype):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype


def _positive_int(name, value):
    if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _max_support(sampling, vocab_size, eos_ids):
    """Largest next-token support: top_k (ties can exceed it) or the vocabulary less the EOS ids."""
    allowed = vocab_size - len(set(eos_ids))
    return allowed if sampling.top_k is None else min(sampling.top_k, allowed)


def language_model(model, prompt, n, *, temperature=1.0, top_k=None, top_p=1.0, dtype="float32", eos_ids=None,
                   max_chunk_rows=None):
    """A LanguageModel over `model` (a LoadedModel): continuations of n tokens of `prompt` (a
    string or chat messages, with the model's tokenizer, or token ids). `eos_ids` defaults to the
    tokenizer's (none without one); `max_chunk_rows` to what CHUNK_LOGITS allows, at most 256."""
    config = model.config
    n = _positive_int("n", n)
    if isinstance(prompt, str) or any(isinstance(m, dict) for m in prompt):
        if model.tokenizer is None:
            raise ValueError("a text or chat prompt needs a tokenizer; this model has none: pass token ids")
        ids = model.tokenizer.prompt_ids(prompt)
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt is empty: the first token's distribution needs at least one prompt token")
    if min(ids) < 0 or max(ids) >= config.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {config.vocab_size}), got {min(ids)}..{max(ids)}")
    if len(ids) + n > config.max_positions:
        raise ValueError(f"prompt ({len(ids)} tokens) + n ({n}) = {len(ids) + n} exceeds the model's "
                         f"{config.max_positions} positions")
    if eos_ids is None:
        eos_ids = model.tokenizer.eos_ids if model.tokenizer is not None else ()
    eos_ids = tuple(sorted({int(e) for e in eos_ids}))
    if any(not 0 <= e < config.vocab_size for e in eos_ids) or len(eos_ids) >= config.vocab_size:
        raise ValueError(f"eos_ids {eos_ids} must be distinct ids in [0, {config.vocab_size}) leaving some token")
    sampling = check_sampling(Sampling(temperature, top_k, top_p), config.vocab_size)
    if max_chunk_rows is None:
        max_chunk_rows = max(1, min(MAX_CHUNK_ROWS, CHUNK_LOGITS // (n * config.vocab_size)))
    first, keys, values = prefill(model.graphdef, model.state, ids, _check_dtype(dtype))
    vocab_id = None if model.tokenizer is None else model.tokenizer.vocab_id
    return LanguageModel(model.state, first, keys, values, model.graphdef, config, tuple(ids), n, config.vocab_size,
                         _max_support(sampling, config.vocab_size, eos_ids), sampling, eos_ids, dtype,
                         _positive_int("max_chunk_rows", max_chunk_rows), vocab_id)


def check_lm_pair(pi, mu):
    """Two language models whose continuations can be compared: the same length and the same
    vocabulary (size and tokenizer). Raises ValueError saying which differs."""
    if pi.n != mu.n:
        raise ValueError(f"the two sides continue for different lengths: n={pi.n} vs n={mu.n}")
    if pi.vocab_size != mu.vocab_size:
        raise ValueError(f"the two sides have different vocabularies: {pi.vocab_size} vs {mu.vocab_size} tokens")
    if pi.vocab_id != mu.vocab_id:
        raise ValueError("the two sides have different tokenizers (vocabulary hashes differ): "
                         "their token ids do not name the same strings")
    return pi, mu
