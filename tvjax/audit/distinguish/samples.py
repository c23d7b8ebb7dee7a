"""Sample sets for the distinguisher: token ids with per-row lengths, from arrays, texts, processes or pools.

A sample set is a `TokenSamples`: tokens int32 [N, n], lengths int32 [N] (the real positions of
each row, up to and including its EOS for outputs that stop; n for fixed-length rows; positions at
or after a row's length are padding and never read) and the vocabulary size the ids index.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.currency import stopping_ids, trajectory_lengths
from tvjax.core.validate import all_concrete, check_pair, check_positive_int


class TokenSamples(NamedTuple):
    """One side's samples: tokens int32 [N, n], lengths int32 [N] in [0, n], ids in [0, vocab_size)."""

    tokens: jax.Array
    lengths: jax.Array
    vocab_size: int


def token_samples(tokens, lengths=None, vocab_size=None):
    """A checked TokenSamples: `tokens` [N, n] integer ids, `lengths` [N] (default n: full rows),
    `vocab_size` (default the largest id + 1). Ids out of [0, vocab_size) at real positions, lengths
    outside [0, n] and non-integer or non-2-D tokens are ValueErrors."""
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be a 2-D array [num, n] of token ids, got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be integer token ids, got dtype {tokens.dtype}")
    num, n = tokens.shape
    if n < 1:
        raise ValueError("tokens have no positions (n = 0)")
    lengths = jnp.full((num,), n, jnp.int32) if lengths is None else jnp.asarray(lengths)
    if lengths.shape != (num,):
        raise ValueError(f"lengths must have shape [num] = ({num},), got {lengths.shape}")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"lengths must be integers, got dtype {lengths.dtype}")
    if all_concrete((tokens, lengths)) and num:
        host_tokens, host_lengths = np.asarray(tokens), np.asarray(lengths)
        if host_lengths.min() < 0 or host_lengths.max() > n:
            raise ValueError(f"lengths must lie in [0, n={n}], found {host_lengths.min()}..{host_lengths.max()}")
        real = np.arange(n)[None, :] < host_lengths[:, None]
        ids = host_tokens[real]
        largest = int(ids.max()) if ids.size else 0
        if vocab_size is None:
            vocab_size = largest + 1
        vocab_size = check_positive_int("vocab_size", vocab_size)
        if ids.size and (ids.min() < 0 or largest >= vocab_size):
            bad = ids[(ids < 0) | (ids >= vocab_size)]
            raise ValueError(f"token ids must lie in [0, vocab_size={vocab_size}), found {bad[:3].tolist()}")
    elif vocab_size is None:
        raise ValueError("traced tokens need an explicit vocab_size")
    return TokenSamples(tokens.astype(jnp.int32), lengths.astype(jnp.int32), int(vocab_size))


def check_sample_pair(pi, mu):
    """Two sample sets must share n and the vocabulary (a ValueError says which differs)."""
    for name, side in (("pi", pi), ("mu", mu)):
        if not isinstance(side, TokenSamples):
            raise TypeError(f"{name} must be a TokenSamples (see token_samples), got {type(side).__name__}")
    if pi.tokens.shape[1] != mu.tokens.shape[1]:
        raise ValueError(f"pi and mu samples have different lengths: n={pi.tokens.shape[1]} vs n={mu.tokens.shape[1]}")
    if pi.vocab_size != mu.vocab_size:
        raise ValueError(f"pi and mu samples have different vocabularies: {pi.vocab_size} vs {mu.vocab_size} tokens "
                         "(pass the same vocab_size to token_samples when both index one vocabulary)")


def tokenizer_vocab_size(tokenizer):
    """The vocabulary size a tokenizer declares (`vocab_size`, `get_vocab_size()`, or those of its
    `.tokenizer`, as `tvjax.models.ChatTokenizer` wraps a `tokenizers.Tokenizer`), else None."""
    for obj in (tokenizer, getattr(tokenizer, "tokenizer", None)):
        if obj is None:
            continue
        if isinstance(getattr(obj, "vocab_size", None), int):
            return obj.vocab_size
        if callable(getattr(obj, "get_vocab_size", None)):
            return int(obj.get_vocab_size())
    return None


class ByteTokenizer(NamedTuple):
    """Texts as their UTF-8 bytes (vocabulary 256): for endpoints whose tokenizer is unknown (closed
    providers); model equality testing uses unicode code points the same way."""

    vocab_size: int = 256

    def encode(self, text):
        return list(text.encode("utf-8"))


def check_tokenizer(tokenizer):
    """Texts need a tokenizer with .encode(text) -> ids: a ValueError that says which ones do."""
    if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
        raise ValueError("texts need a tokenizer with .encode(text) -> token ids (a tvjax.models.ChatTokenizer, or "
                         "ByteTokenizer() when the endpoint's tokenizer is unknown); or pass token ids to token_samples")


def texts_to_samples(texts, tokenizer, n=None, vocab_size=None, pad_id=0):
    """Texts encoded with `tokenizer.encode(text) -> ids`, right-padded with `pad_id` to n (default:
    the longest encoding; longer encodings are cut at n), lengths the encoded lengths (at most n)."""
    check_tokenizer(tokenizer)
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of strings, got one string")
    encoded = [list(tokenizer.encode(text)) for text in texts]
    if not encoded:
        raise ValueError("no texts")
    n = max(1, max(len(ids) for ids in encoded)) if n is None else check_positive_int("n", n)
    tokens = np.full((len(encoded), n), pad_id, np.int32)
    lengths = np.zeros(len(encoded), np.int32)
    for row, ids in enumerate(encoded):
        ids = ids[:n]
        tokens[row, : len(ids)] = ids
        lengths[row] = len(ids)
    return token_samples(tokens, lengths, vocab_size or tokenizer_vocab_size(tokenizer))


def text_pair(texts_pi, texts_mu, tokenizer):
    """(pi samples, mu samples) of two sides' texts under one tokenizer, padded to one n: the
    longest encoding of either side."""
    check_tokenizer(tokenizer)
    n = max([1] + [len(tokenizer.encode(t)) for texts in (texts_pi, texts_mu) for t in texts])
    return texts_to_samples(texts_pi, tokenizer, n=n), texts_to_samples(texts_mu, tokenizer, n=n)


def sample_process(key, process, num):
    """`num` trajectories of a process (`process.sample`) with their lengths (`trajectory_lengths`)."""
    tokens = process.sample(key, num)
    return TokenSamples(tokens, trajectory_lengths(tokens, stopping_ids(process)), int(process.vocab_size))


def sample_pair(key, pi, mu, num_per_side):
    """(pi samples, mu samples): `num_per_side` trajectories of each process of a pair (synthetic
    instances of tvjax.core.instances or LanguageModel variants), drawn with independent keys."""
    check_pair(pi, mu)
    num = check_positive_int("num_per_side", num_per_side)
    key_pi, key_mu = jax.random.split(key)
    return sample_process(key_pi, pi, num), sample_process(key_mu, mu, num)


def pool_samples(pool, vocab_size=None):
    """(pi samples, mu samples) from a loaded pool's tokens (`tvjax.pools.store.load_pool`); its scores are
    not read. Lengths are the pool's (`Pool.lengths`: up to EOS in a stopping pool, n otherwise)."""
    lengths = pool.lengths
    tokens = {side: np.asarray(pool.tokens[side]) for side in ("pi", "mu")}
    if vocab_size is None:
        vocab_size = pool.metadata.get("vocab_size") if isinstance(pool.metadata, dict) else None
    if vocab_size is None:  # one vocabulary for both sides: the largest id seen on either
        vocab_size = 1 + max(int(t.max()) if t.size else 0 for t in tokens.values())
    return tuple(token_samples(tokens[side], lengths.get(side), vocab_size) for side in ("pi", "mu"))
