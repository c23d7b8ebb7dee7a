"""A language model as a tvjax process: length-n continuations of a fixed prompt.

The prompt's KV cache and its last logits are computed once (per compute dtype) and read by every
row; `sample` is a jitted KV-cache decode loop, `path_logprobs` / `next_token_logprobs` one
teacher-forced pass over the batch. Both use the same sampling distribution: EOS ids suppressed
(logit -inf, as in the paper: continuations have exactly n tokens; eos="stop" keeps them and pads
a row after its first EOS), then temperature, tie-inclusive top-k and top-p, renormalized; -inf
outside the support.

Variants (`LanguageModel.variant`) change the sampling settings or how the model is served
(`Serving`: compute dtype, weight format, KV-cache dtype, attention chunking) and share the loaded
weights: a pair of variants is a pair of processes over one copy of the model, plus whatever
quantized copy a variant computes (once, in `variant`; variants of that variant share it).
Sampling and scoring of a variant run the same arithmetic (the same quantized weights, the same
KV-cache rounding, the same attention reduction), so a variant is one process, not two.

The prompt's token ids are data (`prompt_ids`, an int32 array [P]), not a static field: only their
number P is compiled in, so language models of one loaded model on different prompts of the same
length (`prompt_processes`) share every compiled sampling and scoring program; prefill compiles
once per distinct length.
"""

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.models.quantize import DEFAULT_GROUP_SIZE, check_group_size
from tvjax.models.transformer import KV_CACHE_DTYPES, Segment, forward
from tvjax.models.weights import WEIGHT_FORMATS, check_int4, serving_weights

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Floats of logits a chunk of rows may hold ([rows, n, V] in float32): bounds the default max_chunk_rows.
CHUNK_LOGITS = 2**26
MAX_CHUNK_ROWS = 256
# The decode loop's blocks (decode_blocks): more blocks read less of the empty cache, but each one
# compiles its own copy of the step.
MAX_DECODE_BLOCKS = 4
MIN_DECODE_BLOCK = 24


class Sampling(NamedTuple):
    temperature: float = 1.0
    top_k: Optional[int] = None  # tie-inclusive: every token whose logit is >= the k-th largest
    top_p: float = 1.0  # the smallest set of most likely tokens with mass >= top_p, ties included


class Serving(NamedTuple):
    """How a model is served (static: each setting is compiled in).

    dtype: compute dtype of activations and (dequantized) weights: "float32", "bfloat16", "float16".
    weights: "full" (as loaded), "int8" (per output channel, symmetric absmax), "int4" (symmetric
      absmax per group of `group_size` inputs), "gguf" (the GGUF file's own blocks, Q4_0 / Q4_1 /
      Q8_0, as stored); quantized weights are dequantized on the fly in `dtype`. Only Linear layers
      are quantized; embeddings (and a tied LM head), norms and biases stay full precision.
    kv_cache_dtype: None (the compute dtype), "float32", "bfloat16", "float16", or "int8" (absmax per
      token and kv head); the compute dtype is unchanged, keys and values are read back through it.
    attention_chunk: None (one softmax over all keys) or an online softmax over this many keys at a time.
    group_size: the int4 group along the input axis (ignored by the other formats).
    """

    dtype: str = "float32"
    weights: str = "full"
    kv_cache_dtype: Optional[str] = None
    attention_chunk: Optional[int] = None
    group_size: int = DEFAULT_GROUP_SIZE


def check_serving(serving, config, source=None):
    """The Serving, or a ValueError naming the bad setting (an int4 group size must divide every
    Linear's input dimension; "gguf" needs the GGUF file the model was loaded from)."""
    dtype, weights, kv, chunk, group = serving
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights must be one of {list(WEIGHT_FORMATS)}, got {weights!r}")
    if kv is not None and kv not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be None or one of {list(KV_CACHE_DTYPES)}, got {kv!r}")
    if chunk is not None and not (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1):
        raise ValueError(f"attention_chunk must be None or a positive integer, got {chunk!r}")
    check_group_size(group)
    if weights == "int4":
        check_int4(config, group)
    if weights == "gguf" and source is None:
        raise ValueError('weights="gguf" needs a model loaded from a GGUF file (load_gguf, load_smollm2); '
                         "this one was not")
    return serving


def _weights_key(serving):
    return serving.weights, serving.group_size if serving.weights == "int4" else None


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


GROUP = 64  # vocabulary entries per group in `top_k`, `at_least_kth_largest` and `draw_token`


def _group_size(vocab, k):
    """Entries per group for the two-level top-k of k over `vocab`, or None where it does not pay:
    k traced (a runtime value), the vocabulary not a multiple of GROUP, or the k groups it keeps
    more than a quarter of the vocabulary."""
    return GROUP if isinstance(k, int) and vocab % GROUP == 0 and 4 * k * GROUP <= vocab else None


def _candidates(x, k):
    """(candidates [..., k * GROUP], kept [..., k]): the entries of the k groups of GROUP whose
    maxima are largest, in index order, which hold the k largest entries (a group holding one of
    them and left out would mean k kept groups whose maxima are at least as large)."""
    groups = x.reshape(*x.shape[:-1], -1, GROUP)
    kept = jnp.sort(jax.lax.top_k(jnp.max(groups, axis=-1), k)[1], axis=-1)
    candidates = jnp.take_along_axis(groups, kept[..., None], axis=-2)
    return candidates.reshape(*x.shape[:-1], k * GROUP), kept


def _top_k_grouped(x, k):
    """jax.lax.top_k(x, k) over `_candidates` (ties in its order, lower index first, except that
    -0.0 and +0.0 count as one value)."""
    candidates, kept = _candidates(x, k)
    values, at = jax.lax.top_k(candidates, k)
    return values, jnp.take_along_axis(kept, at // GROUP, axis=-1) * GROUP + at % GROUP


def top_k(x, k):
    """(values, int32 indices) of the k largest entries along the last axis, as jax.lax.top_k
    gives them; on a vocabulary of groups through `_top_k_grouped`, since XLA's CPU top-k (a
    sort) over a whole 50k vocabulary costs tens of times more."""
    if _group_size(x.shape[-1], k) is None:
        values, index = jax.lax.top_k(x, k)
    else:
        values, index = _top_k_grouped(x, k)
    return values, index.astype(jnp.int32)


def _order_keys(x):
    """int32 keys of float32 x in the same order as the floats (sign-magnitude bits made monotonic;
    -0.0 first made +0.0, since the two compare equal)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, jnp.float32(0), x), jnp.int32)
    return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def _kth_largest_key(x, k):
    """The order key of the k-th largest entry: bisection over the 2^32 keys, 32 count passes (k
    may be traced)."""
    keys = _order_keys(x)
    count = lambda t: jnp.sum(keys >= t[..., None], axis=-1)

    def halve(_, bounds):
        # Invariant: count(lo) >= k and the answer lies in [lo, hi]; mid rounds up (no overflow).
        lo, hi = bounds
        mid = (lo >> 1) + (hi >> 1) + ((lo | hi) & 1)
        enough = count(mid) >= k
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid - 1)

    shape = x.shape[:-1]
    start = (jnp.full(shape, jnp.iinfo(jnp.int32).min, jnp.int32), jnp.full(shape, jnp.iinfo(jnp.int32).max, jnp.int32))
    return jax.lax.fori_loop(0, 32, halve, start)[0]


def at_least_kth_largest(x, k):
    """bool [..., V]: x >= its k-th largest value along the last axis (ties included, as the
    engines' top-k does; -0.0 == +0.0): a bisection for the k-th value over `_candidates` where
    the vocabulary is in groups, else over all of x (which also takes a traced k)."""
    if _group_size(x.shape[-1], k) is None:
        return _order_keys(x) >= _kth_largest_key(x, k)[..., None]
    # The bisection over the candidates only; its key back to their value, for a float compare
    # (the int32 keys of all V entries cost more than the rest).
    candidates, _ = _candidates(x, k)
    above = _order_keys(candidates) >= _kth_largest_key(candidates, k)[..., None]
    return x >= jnp.min(jnp.where(above, candidates, jnp.inf), axis=-1, keepdims=True)


def _pick(weights, u):
    """int32 [...]: index i of weights [..., m] >= 0 with probability weights_i / their sum, for u
    uniform on [0, 1) [...]: the first i whose running sum exceeds u times the total. A zero weight
    is never picked (its running sum equals its predecessor's); rounding that puts u times the
    total at the total picks the last positive weight."""
    running = jnp.cumsum(weights, axis=-1)
    i = jnp.sum(running <= (u * running[..., -1])[..., None], axis=-1)
    m = weights.shape[-1]
    last_positive = m - 1 - jnp.argmax(jnp.flip(weights > 0, axis=-1), axis=-1)
    return jnp.minimum(i, last_positive).astype(jnp.int32)


def draw_token(key, logprobs):
    """int32 [...]: one token per row of log-probabilities [..., V] (normalized or not), by
    inversion in two levels: a group of GROUP tokens by the groups' masses, then a token within
    it, from two uniforms per row. Exact up to float32 rounding of the sums, with V / 2 times fewer
    random numbers than the Gumbel trick of jax.random.categorical (whose V draws per row were a
    tenth of a CPU decode step at batch 128). Tokens of probability 0 are never drawn."""
    V = logprobs.shape[-1]
    u = jax.random.uniform(key, (*logprobs.shape[:-1], 2))
    p = jnp.exp(logprobs - jnp.max(logprobs, axis=-1, keepdims=True))
    if V % GROUP or V < 4 * GROUP:
        return _pick(p, u[..., 0])
    groups = p.reshape(*p.shape[:-1], V // GROUP, GROUP)
    group = _pick(jnp.sum(groups, axis=-1), u[..., 0])
    inside = jnp.take_along_axis(groups, group[..., None, None], axis=-2)[..., 0, :]
    return group * GROUP + _pick(inside, u[..., 1])


def sampling_logprobs(logits, sampling, eos_ids=()):
    """float32 [..., V] log-probabilities of the sampling distribution of raw logits [..., V]:
    EOS suppressed, / temperature, tie-inclusive top-k, tie-inclusive top-p, renormalized."""
    return jax.nn.log_softmax(sampling_logits(logits, sampling, eos_ids), axis=-1)


def realized_logprobs(logits, tokens, sampling, eos_ids=()):
    """float32 [...]: sampling_logprobs(logits, ...) at tokens [...], in the same operations as
    jax.nn.log_softmax, without the [..., V] log-probabilities (XLA fuses the shift into the
    reduction and the gather, so scoring holds one array of logits, not three)."""
    x = sampling_logits(logits, sampling, eos_ids)
    shift = jnp.max(x, axis=-1)
    realized = jnp.take_along_axis(x, tokens[..., None], axis=-1)[..., 0] - shift
    return realized - jnp.log(jnp.sum(jnp.exp(x - shift[..., None]), axis=-1))


def sampling_logits(logits, sampling, eos_ids=()):
    """float32 [..., V]: raw logits [..., V] as the sampling distribution weighs them, unnormalized:
    EOS ids and what top-k and top-p cut set to -inf, the rest / temperature."""
    x = logits.astype(jnp.float32) / sampling.temperature
    if eos_ids:
        x = x.at[..., jnp.asarray(eos_ids)].set(-jnp.inf)
    if sampling.top_k is not None and sampling.top_k < x.shape[-1]:
        x = jnp.where(at_least_kth_largest(x, sampling.top_k), x, -jnp.inf)
    if sampling.top_p < 1.0:
        ordered = -jnp.sort(-x, axis=-1)
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ahead in the order
        kept = jnp.sum(before < sampling.top_p, axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(ordered, kept - 1, axis=-1)
        x = jnp.where(x >= threshold, x, -jnp.inf)
    return x


def _forward(graphdef, state, serving, tokens, positions, segments=()):
    return forward(graphdef, state, tokens, positions, segments, DTYPES[serving.dtype], serving.kv_cache_dtype,
                   serving.attention_chunk)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _prefill(graphdef, state, tokens, serving):
    return _forward(graphdef, state, serving, tokens, jnp.arange(tokens.shape[1]))


def prefill(graphdef, state, prompt, serving):
    """(last logits float32 [V], keys, values [layers, 1, P, kv_heads, head_dim], as the cache
    stores them) of a prompt; `serving` a Serving or a dtype name."""
    serving = Serving(dtype=serving) if isinstance(serving, str) else serving
    logits, (keys, values) = _prefill(graphdef, state, jnp.asarray(prompt, jnp.int32)[None], serving)
    return logits[0, -1], keys, values


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """Continuations x [n] of `prompt` under a transformer, as a process (see the module doc)."""

    state: Any  # the weights (nnx.State) as served (quantized ones for a quantized variant)
    base_state: Any  # the loaded weights, shared by every variant (state is base_state for "full")
    first_logits: jax.Array  # float32 [V]: raw logits after the prompt
    prompt_keys: Any  # [layers, 1, P, kv_heads, head_dim] as the KV cache stores them
    prompt_values: Any
    prompt_ids: jax.Array  # int32 [P]: the prompt's token ids (data: only P is static; see `prompt`)
    graphdef: Any  # of `state`
    base_graphdef: Any  # of `base_state`
    config: Any  # ModelConfig
    n: int
    vocab_size: int
    max_support: int
    sampling: Sampling
    eos_ids: tuple
    serving: Serving
    max_chunk_rows: int  # tvjax.core.streaming.memory_chunk never puts more rows in one chunk
    vocab_id: Optional[str]  # the tokenizer's vocabulary hash (None without a tokenizer)
    source: Optional[str]  # the GGUF file of the weights (None: not from a GGUF file)
    eos: str = "suppress"  # "suppress": EOS ids get no mass (the paper's n tokens); "stop": a row ends at EOS

    @property
    def prompt(self):
        """The prompt's token ids as a tuple of Python ints (host code only: not under a trace)."""
        return tuple(np.asarray(self.prompt_ids).tolist())

    @property
    def prompt_length(self):
        """P, the prompt's number of tokens: static (the shape of `prompt_ids`), also under a trace."""
        return self.prompt_ids.shape[0]

    @property
    def suppressed_eos(self):
        """The EOS ids the sampling distribution removes: all of them under eos="suppress"."""
        return self.eos_ids if self.eos == "suppress" else ()

    @property
    def stopping_eos(self):
        """The EOS ids that end a row: all of them under eos="stop", none under "suppress"."""
        return self.eos_ids if self.eos == "stop" else ()

    @property
    def dtype(self):
        """The compute dtype's name (serving.dtype)."""
        return self.serving.dtype

    def forward(self, tokens, positions, segments=()):
        """(raw logits float32 [B, T, V], the new tokens' (keys, values) as the cache stores them)
        of tokens [B, T] at positions [T] after `segments`, served as `self.serving`."""
        return _forward(self.graphdef, self.state, self.serving, tokens, positions, segments)

    def decode_cache(self, num, slots):
        """An empty decode cache (keys, values) for `num` rows of `slots` tokens, in the cache's format."""
        empty = lambda a: jnp.zeros((a.shape[0], num, slots, *a.shape[3:]), a.dtype)
        return jax.tree.map(empty, self.prompt_keys), jax.tree.map(empty, self.prompt_values)

    @staticmethod
    def write_cache(cache, new, t):
        """`cache` (keys or values of `decode_cache`) with slot t set to a step's `new` ones."""
        return jax.tree.map(lambda c, x: jax.lax.dynamic_update_slice_in_dim(c, x, t, axis=2), cache, new)

    def _logit_parts(self, tokens):
        """Raw float32 logits at every prefix of tokens [num, n] (teacher forcing), in two parts:
        after the prompt [num, 1, V], and after x_<=t [num, n - 1, V] (one forward pass)."""
        num = tokens.shape[0]
        first = jnp.broadcast_to(self.first_logits, (num, 1, self.vocab_size))
        if self.n == 1:
            return (first,)
        P = self.prompt_length
        shared = Segment(self.prompt_keys, self.prompt_values, jnp.ones((1, P), bool))
        rest, _ = self.forward(tokens[:, :-1], P + jnp.arange(self.n - 1), (shared,))
        return first, rest

    def _logits(self, tokens):
        """Raw float32 logits [num, n, V] at every prefix of tokens [num, n] (teacher forcing)."""
        return jnp.concatenate(self._logit_parts(tokens), axis=1)

    def next_token_logprobs(self, tokens):
        return _next_token_logprobs(self, jnp.asarray(tokens, jnp.int32))

    def path_logprobs(self, tokens):
        return _path_logprobs(self, jnp.asarray(tokens, jnp.int32))

    def sample(self, key, num):
        return _sample(self, key, num)

    def variant(self, **changes):
        """The same weights and prompt with other settings: the sampling ones (temperature, top_k,
        top_p), the serving ones (dtype, weights, kv_cache_dtype, attention_chunk, group_size:
        see Serving), max_chunk_rows. Unknown keywords are a TypeError, bad values a ValueError.
        A new weight format is computed here from the loaded weights (once for this variant and
        the variants made from it); any serving change recomputes the prompt cache."""
        allowed = set(Sampling._fields) | set(Serving._fields) | {"max_chunk_rows"}
        if set(changes) - allowed:
            raise TypeError(f"variant() takes {sorted(allowed)}, got {sorted(set(changes) - allowed)}")
        sampling = check_sampling(self.sampling._replace(**{k: v for k, v in changes.items() if k in Sampling._fields}),
                                  self.vocab_size)
        serving = check_serving(self.serving._replace(**{k: v for k, v in changes.items() if k in Serving._fields}),
                                self.config, self.source)
        out = dataclasses.replace(self, sampling=sampling, max_support=_max_support(sampling, self.vocab_size,
                                                                                    self.suppressed_eos))
        if "max_chunk_rows" in changes:
            out = dataclasses.replace(out, max_chunk_rows=_positive_int("max_chunk_rows", changes["max_chunk_rows"]))
        return out if serving == self.serving else _served(out, serving)

    def with_prompt(self, prompt_ids):
        """The same model, weights (as served) and settings continuing other prompt token ids: only
        the prompt cache is recomputed. For prompts of this one's length, sampling and scoring reuse
        the programs compiled for it."""
        ids = _check_prompt_ids([int(t) for t in prompt_ids], self.config, self.n)
        return _prompted(self, ids)


jax.tree_util.register_dataclass(
    LanguageModel,
    data_fields=["state", "base_state", "first_logits", "prompt_keys", "prompt_values", "prompt_ids"],
    meta_fields=["graphdef", "base_graphdef", "config", "n", "vocab_size", "max_support", "sampling",
                 "eos_ids", "serving", "max_chunk_rows", "vocab_id", "source", "eos"],
)


def _served(lm, serving):
    """lm served as `serving`: its weights in that format (reused when the format is lm's own, else
    computed from the loaded weights) and the prompt cache recomputed."""
    if _weights_key(serving) == _weights_key(lm.serving):
        graphdef, state = lm.graphdef, lm.state
    else:
        graphdef, state = serving_weights(lm.base_graphdef, lm.base_state, serving.weights, lm.config,
                                          serving.group_size, lm.source)
    first, keys, values = prefill(graphdef, state, lm.prompt_ids, serving)
    return dataclasses.replace(lm, graphdef=graphdef, state=state, serving=serving, first_logits=first,
                               prompt_keys=keys, prompt_values=values)


def _prompted(lm, ids):
    """lm continuing the (checked) token ids `ids` instead: its prompt cache recomputed."""
    ids = jnp.asarray(ids, jnp.int32)
    first, keys, values = prefill(lm.graphdef, lm.state, ids, lm.serving)
    return dataclasses.replace(lm, prompt_ids=ids, first_logits=first, prompt_keys=keys, prompt_values=values)


def after_eos(logprobs, stopped, eos_ids):
    """logprobs [..., V] where `stopped` (an EOS among the earlier tokens) is False; where it is
    True, the pad: the first EOS id with probability 1 (a stopped row repeats it to the end)."""
    if not eos_ids:
        return logprobs
    pad = jnp.full(logprobs.shape[-1], -jnp.inf, jnp.float32).at[eos_ids[0]].set(0.0)
    return jnp.where(stopped[..., None], pad, logprobs)


def _is_eos(tokens, eos_ids):
    """bool, the shape of tokens: an EOS id (False everywhere without EOS ids)."""
    return jnp.isin(tokens, jnp.asarray(eos_ids)) if eos_ids else jnp.zeros(tokens.shape, bool)


def stopped_before(tokens, eos_ids):
    """bool [num, n]: an EOS id among x_<t (False everywhere without EOS ids)."""
    hits = _is_eos(tokens, eos_ids).astype(jnp.int32)
    return (jnp.cumsum(hits, axis=-1) - hits) > 0


@jax.jit
def _next_token_logprobs(lm, tokens):
    logprobs = sampling_logprobs(lm._logits(tokens), lm.sampling, lm.suppressed_eos)
    return after_eos(logprobs, stopped_before(tokens, lm.stopping_eos), lm.stopping_eos)


def in_row_chunks(fn, tokens, rows):
    """fn(tokens) for tokens [num, ...] whose outputs are [num, ...], computed at most `rows` rows at a
    time: jax.lax.map over near-equal chunks (one compiled body, the memory of one chunk), the last
    chunk padded with copies of row 0 and the pad dropped."""
    num = tokens.shape[0]
    if num <= rows:
        return fn(tokens)
    count = -(-num // rows)
    size = -(-num // count)
    padded = jnp.concatenate([tokens, jnp.broadcast_to(tokens[:1], (count * size - num, *tokens.shape[1:]))])
    out = jax.lax.map(fn, padded.reshape(count, size, *tokens.shape[1:]))
    return jax.tree.map(lambda o: o.reshape(count * size, *o.shape[2:])[:num], out)


@jax.jit
def _path_logprobs(lm, tokens):
    # max_chunk_rows rows at a time: a direct call on a large batch holds one chunk's logits.
    return in_row_chunks(functools.partial(_path_logprobs_rows, lm), tokens, lm.max_chunk_rows)


def _path_logprobs_rows(lm, tokens):
    # Part by part (not the [num, n, V] concatenation of _logits): scoring holds one array of logits.
    parts = lm._logit_parts(tokens)
    bounds = np.cumsum([0] + [part.shape[1] for part in parts])
    realized = jnp.concatenate([realized_logprobs(part, tokens[:, a:b], lm.sampling, lm.suppressed_eos)
                                for part, a, b in zip(parts, bounds, bounds[1:])], axis=1)
    stopping = lm.stopping_eos
    if not stopping:
        return realized
    # after_eos at the realized tokens: past an EOS, the pad's log-probability (0 at the first EOS id)
    pad = jnp.where(tokens == stopping[0], 0.0, -jnp.inf)
    return jnp.where(stopped_before(tokens, stopping), pad, realized)


def decode_blocks(n):
    """The decode loop's steps 0..n-2 as consecutive (start, stop) runs of near-equal length: as
    many as fit MIN_DECODE_BLOCK steps each, at most MAX_DECODE_BLOCKS, at least one."""
    steps = n - 1
    if steps == 0:
        return []
    count = min(MAX_DECODE_BLOCKS, max(1, steps // MIN_DECODE_BLOCK))
    bounds = [steps * i // count for i in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


def decode_loop(lm, key, targets, choose):
    """The KV-cache decode loop of a LanguageModel over targets [num, n] (only their shape when
    the tokens are drawn): step t feeds x_t at position P + t, reading the prompt cache and the
    row's cache of x_<t, writes x_t's keys and values into the row's cache, and lets
    choose(key, logprobs [num, V], target [num]) -> (x_{t+1} [num], record) pick the next token
    from the sampling distribution. Returns the records, each with a leading [num, n].

    The steps run in the blocks of `decode_blocks`, each with a cache of its own length: a step
    attends to the prompt, the finished blocks and the filled slots of its own block, so attention
    reads about the filled prefix of the row, not all n slots."""
    P, n = lm.prompt_length, lm.n
    num = targets.shape[0]
    keys = jax.random.split(key, n)
    stopping = lm.stopping_eos
    # A row that has emitted EOS (eos="stop") is past its end: its distribution is the pad's.
    distribution = lambda logits, stopped: after_eos(sampling_logprobs(logits, lm.sampling, lm.suppressed_eos),
                                                     stopped, stopping)
    stopped = jnp.zeros((num,), bool)
    token, first = choose(keys[0], distribution(jnp.broadcast_to(lm.first_logits, (num, lm.vocab_size)), stopped),
                          targets[:, 0])
    finished = [Segment(lm.prompt_keys, lm.prompt_values, jnp.ones((1, P), bool))]
    records = [jax.tree.map(lambda f: f[:, None], first)]
    for a, b in decode_blocks(n):
        def step(carry, xs, a=a, b=b):  # traced by the scan below, before `finished` grows
            cache_k, cache_v, token, stopped = carry
            t, k, target = xs
            stopped = stopped | _is_eos(token, stopping)
            own = Segment(cache_k, cache_v, (jnp.arange(b - a) < t - a)[None, :])
            logits, (new_k, new_v) = lm.forward(token[:, None], (P + t)[None], (*finished, own))
            cache_k, cache_v = lm.write_cache(cache_k, new_k, t - a), lm.write_cache(cache_v, new_v, t - a)
            token, record = choose(k, distribution(logits[:, 0], stopped), target)
            return (cache_k, cache_v, token, stopped), record

        start = (*lm.decode_cache(num, b - a), token, stopped)
        (cache_k, cache_v, token, stopped), rest = jax.lax.scan(
            step, start, (jnp.arange(a, b), keys[1 + a:1 + b], targets[:, 1 + a:1 + b].T))
        finished.append(Segment(cache_k, cache_v, jnp.ones((1, b - a), bool)))
        records.append(jax.tree.map(lambda r: jnp.moveaxis(r, 0, 1), rest))  # steps after the rows
    return jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=1), *records)


def _draw(key, logprobs, target):
    token = draw_token(key, logprobs)
    return token, token


@functools.partial(jax.jit, static_argnums=2)
def _sample(lm, key, num):
    return decode_loop(lm, key, jnp.zeros((num, lm.n), jnp.int32), _draw)


def _positive_int(name, value):
    if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _max_support(sampling, vocab_size, eos_ids):
    """Largest next-token support: top_k (ties can exceed it) or the vocabulary less the EOS ids."""
    allowed = vocab_size - len(set(eos_ids))
    return allowed if sampling.top_k is None else min(sampling.top_k, allowed)


def language_model(model, prompt, n, *, temperature=1.0, top_k=None, top_p=1.0, dtype="float32", eos_ids=None,
                   max_chunk_rows=None, weights="full", kv_cache_dtype=None, attention_chunk=None,
                   group_size=DEFAULT_GROUP_SIZE, eos="suppress"):
    """A LanguageModel over `model` (a LoadedModel): continuations of n tokens of `prompt` (a
    string or chat messages, with the model's tokenizer, or token ids). `eos_ids` defaults to the
    tokenizer's (none without one); `max_chunk_rows` to what CHUNK_LOGITS allows, at most 256;
    dtype, weights, kv_cache_dtype, attention_chunk and group_size: see Serving. eos="suppress"
    (the paper's protocol) gives EOS ids no mass, so every continuation has n tokens; eos="stop"
    keeps their mass and ends a row at its first EOS, padded with the first EOS id (probability
    1 under every variant), as served."""
    config = model.config
    n = _positive_int("n", n)
    ids = _check_prompt_ids(_encode_prompt(model, prompt), config, n)
    if eos_ids is None:
        eos_ids = model.tokenizer.eos_ids if model.tokenizer is not None else ()
    eos_ids = tuple(sorted({int(e) for e in eos_ids}))
    if eos not in ("suppress", "stop"):
        raise ValueError(f"eos must be 'suppress' or 'stop', got {eos!r}")
    if eos == "stop" and not eos_ids:
        raise ValueError("eos='stop' needs EOS ids: this model's tokenizer declares none, pass eos_ids")
    if any(not 0 <= e < config.vocab_size for e in eos_ids) or len(eos_ids) >= config.vocab_size:
        raise ValueError(f"eos_ids {eos_ids} must be distinct ids in [0, {config.vocab_size}) leaving some token")
    sampling = check_sampling(Sampling(temperature, top_k, top_p), config.vocab_size)
    if max_chunk_rows is None:
        max_chunk_rows = max(1, min(MAX_CHUNK_ROWS, CHUNK_LOGITS // (n * config.vocab_size)))
    source = getattr(model, "source", None)
    serving = check_serving(Serving(dtype, weights, kv_cache_dtype, attention_chunk, group_size), config, source)
    graphdef, state = serving_weights(model.graphdef, model.state, weights, config, group_size, source)
    prompt_ids = jnp.asarray(ids, jnp.int32)
    first, keys, values = prefill(graphdef, state, prompt_ids, serving)
    vocab_id = None if model.tokenizer is None else model.tokenizer.vocab_id
    suppressed = eos_ids if eos == "suppress" else ()
    return LanguageModel(state, model.state, first, keys, values, prompt_ids, graphdef, model.graphdef, config, n,
                         config.vocab_size, _max_support(sampling, config.vocab_size, suppressed), sampling, eos_ids,
                         serving, _positive_int("max_chunk_rows", max_chunk_rows), vocab_id, source, eos)


def _encode_prompt(model, prompt):
    """Token ids (a list of ints) of a prompt given as a string or chat messages (with the model's
    tokenizer) or as token ids."""
    if isinstance(prompt, (int, np.integer)) or not hasattr(prompt, "__iter__"):
        raise TypeError(f"a prompt is a string, chat messages or token ids, got {prompt!r:.80}")
    if isinstance(prompt, str) or any(isinstance(m, dict) for m in prompt):
        if model.tokenizer is None:
            raise ValueError("a text or chat prompt needs a tokenizer; this model has none: pass token ids")
        return model.tokenizer.prompt_ids(prompt)
    return [int(t) for t in prompt]


def _check_prompt_ids(ids, config, n):
    if not ids:
        raise ValueError("the prompt is empty: the first token's distribution needs at least one prompt token")
    if min(ids) < 0 or max(ids) >= config.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {config.vocab_size}), got {min(ids)}..{max(ids)}")
    if len(ids) + n > config.max_positions:
        raise ValueError(f"prompt ({len(ids)} tokens) + n ({n}) = {len(ids) + n} exceeds the model's "
                         f"{config.max_positions} positions")
    return ids


def prompt_processes(loaded, prompts, n, **language_model_kwargs):
    """One LanguageModel per prompt of `prompts` (each a string or chat messages, with the model's
    tokenizer, or token ids; a string is encoded as it is: see `tvjax.models.pairs.chat_prompt`
    for chat templating) over the one LoadedModel `loaded`, all with the same settings
    (`language_model`'s keywords) and the same served weights (a quantized format is computed
    once). Only the prompt caches differ, and the prompt ids are data: prompts of one token
    length share every compiled sampling and scoring program; prefill compiles once per length."""
    if isinstance(prompts, str) or not hasattr(prompts, "__iter__"):
        raise TypeError(f"prompts must be a sequence of prompts, got {prompts!r:.80}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty")
    first = language_model(loaded, prompts[0], n, **language_model_kwargs)
    rest = [_prompted(first, _check_prompt_ids(_encode_prompt(loaded, p), first.config, first.n)) for p in prompts[1:]]
    return [first, *rest]


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
    if (pi.eos, pi.eos_ids) != (mu.eos, mu.eos_ids):
        raise ValueError(f"the two sides treat EOS differently ({pi.eos} {pi.eos_ids} vs {mu.eos} {mu.eos_ids}): "
                         "their continuations are not one sample space")
    return pi, mu
