"""Autoregressive instances with known TV: the paper's block construction, the rare-escape
embedding, independent coins, and random tabular pairs with the perturbations that matter in serving.

A process is a pytree (jit/vmap-able) answering
  sample(key, num)              -> int32 [num, n]
  path_logprobs(tokens)         -> float32 [num, n]      log p(x_i | x_<i), -inf for zero mass
  next_token_logprobs(tokens)   -> float32 [num, n, V]   the whole next-token distribution
Exact TV (the ground truth) lives here too: analytic where the paper gives it, enumeration otherwise.
"""

import dataclasses
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.currency import Realized, likelihood_ratio_term
from tvjax.core.validate import (
    check_log_distribution,
    check_logits,
    check_pair,
    check_positive_int,
    check_probability_vector,
    check_range,
    is_concrete,
)

NEG_INF = -jnp.inf


def _pytree(cls, meta):
    data = [f.name for f in dataclasses.fields(cls) if f.name not in meta]
    return jax.tree_util.register_dataclass(cls, data_fields=data, meta_fields=list(meta))


def _concrete_array(value):
    """`value` as a numpy array when it is a concrete array, else None. Processes are pytrees, so
    their constructors also run on unflattening, where leaves may be tracers or the placeholders
    of jax's tree utilities (an int of vmap's in_axes, None): those are not checked."""
    if isinstance(value, (np.ndarray, jax.Array, np.generic, float)) and is_concrete(value):
        return np.asarray(value)
    return None


def _bits_to_int(bits):
    weights = 2 ** jnp.arange(bits.shape[-1] - 1, -1, -1, dtype=jnp.int32)
    return jnp.sum(bits.astype(jnp.int32) * weights, axis=-1)


# --------------------------------------------------------------------------- block instance


class BlockConstruction(NamedTuple):
    """How `block_pair` built a block pair: enough for the analytic TV."""

    seed: int
    block_bits: int
    p_active: float
    alpha: float


@dataclasses.dataclass(frozen=True)
class BlockProcess:
    """Binary block construction (paper 3.2, B.2).

    x = u (block_bits uniform bits) + hidden path of block u (deterministic) + one final bit whose
    law depends on the block. `construction` records how a pair was built, for the analytic TV.
    """

    hidden_paths: jax.Array  # int8 [num_blocks, n - block_bits - 1]
    final_p1: jax.Array  # float [num_blocks], P(final bit = 1) in each block
    n: int
    block_bits: int
    construction: Optional[BlockConstruction] = None  # set by block_pair
    vocab_size: int = 2
    max_support: int = 2

    def __post_init__(self):
        paths, final_p1 = _concrete_array(self.hidden_paths), _concrete_array(self.final_p1)
        if paths is not None and (paths.ndim < 2 or paths.shape[-1] != self.n - self.block_bits - 1):
            raise ValueError(f"hidden_paths must have shape [num_blocks, n - block_bits - 1] = "
                             f"[*, {self.n - self.block_bits - 1}], got {paths.shape}")
        if paths is not None and not np.isin(paths, (0, 1)).all():
            raise ValueError("hidden_paths must be bits (0 or 1)")
        if final_p1 is not None:
            check_range("final_p1", final_p1, 0.0, 1.0)
            if paths is not None and final_p1.shape != paths.shape[:-1]:
                raise ValueError(f"final_p1 has shape {final_p1.shape}, expected one per block: {paths.shape[:-1]}")

    @property
    def random_words_per_sample(self):
        """32-bit words `sample` draws per trajectory (see `_draw`)."""
        return 1 if 32 - self.block_bits >= 20 else 2

    @property
    def stochastic_positions(self):
        """The block bits and the final bit; on the hidden path every conditional is 0 or 1."""
        return tuple(range(self.block_bits)) + (self.n - 1,)

    def _block(self, tokens):
        return _bits_to_int(tokens[:, : self.block_bits])

    def _draw(self, key, num, final_p1=None):
        """(block u [num], final bit [num]) of `num` trajectories. One random word per trajectory:
        its top block_bits bits are the block (uniform), the rest a uniform on [0, 1) that the
        final bit compares to p1, so P(final = 1) is p1 rounded up to a multiple of 2^-(32 -
        block_bits) (2^-20 on the paper's instance). Fewer than 20 bits left: a second word's top 24.
        `final_p1(u)` gives each row's P(final = 1) in block u (default: this process's)."""
        uniform_bits = 32 - self.block_bits
        if uniform_bits >= 20:
            words = jax.random.bits(key, (num,), jnp.uint32)
            rest = words & jnp.uint32(2**uniform_bits - 1)
        else:
            pair = jax.random.bits(key, (2 * num,), jnp.uint32).reshape(num, 2)
            words, rest, uniform_bits = pair[:, 0], pair[:, 1] >> 8, 24
        u = (words >> uniform_bits).astype(jnp.int32)
        uniform = rest.astype(jnp.float32) * 2.0**-uniform_bits
        p1 = jnp.asarray(self.final_p1, jnp.float32)[u] if final_p1 is None else final_p1(u)
        return u, (uniform < p1).astype(jnp.int32)

    def sample(self, key, num):
        u, final = self._draw(key, num)
        shifts = jnp.arange(self.block_bits - 1, -1, -1, dtype=jnp.int32)
        u_bits = (u[:, None] >> shifts) & 1
        path = jnp.asarray(self.hidden_paths)[u].astype(jnp.int32)
        return jnp.concatenate([u_bits, path, final[:, None]], axis=1)

    def realized_sampler(self, models, samplers=None):
        """A function (key, num) -> `Realized` giving the trajectories of `sample(key, num)` under
        `models` (block processes of this shape; None otherwise: callers fall back to tokens)
        without forming a token: per model the block bits' log(1/2), the final bit's log-prob,
        and how many hidden-path positions of block u that model's path disagrees on (each one
        zero mass). The per-block tables are built here, once, outside the callers' chunk loops.

        samplers: block processes of this shape; the function then takes a third argument
        `side` (a scalar or one per row) and gives rows of samplers[side], the same rows as
        samplers[side].realized_sampler(models) from the same key: every side through one draw
        (one random call to compile, not one per side)."""
        sides = (self,) if samplers is None else tuple(samplers)
        if not all(isinstance(m, BlockProcess) and (m.n, m.block_bits) == (self.n, self.block_bits) for m in models + sides):
            return None
        final_p1 = jnp.stack([jnp.asarray(side.final_p1, jnp.float32) for side in sides])  # [sides, blocks]
        tables = []
        for model in models:
            p1 = jnp.asarray(model.final_p1, jnp.float32)
            mismatches = jnp.stack([jnp.sum(jnp.asarray(model.hidden_paths) != jnp.asarray(side.hidden_paths), axis=1,
                                            dtype=jnp.int32) for side in sides])  # [sides, blocks]
            # The whole path's log-prob per (side, block u, final bit), flat as u * 2 + bit: exact
            # logits read one entry per row (what the oracles that draw need, below, goes unused).
            last = jnp.stack([jnp.log(1.0 - p1), jnp.log(p1)], axis=-1)  # [blocks, 2]
            paths = self.block_bits * jnp.log(0.5) + last + jnp.where(mismatches > 0, NEG_INF, 0.0)[..., None]
            tables.append((last, mismatches, paths.reshape(len(sides), -1)))

        def sample(key, num, side=0):
            # One side: its table rows sliced first, so that the lookups are 1-d gathers.
            pick = (lambda table, u: table[side][u]) if jnp.ndim(side) == 0 else (lambda table, u: table[side, u])
            u, final = self._draw(key, num, lambda u: pick(final_p1, u))
            head = jnp.full((num, self.block_bits), jnp.log(0.5), jnp.float32)
            logprobs = [jnp.concatenate([head, last.reshape(-1)[2 * u + final][:, None]], axis=1) for last, _, _ in tables]
            zero_mass = [pick(mismatches, u) for _, mismatches, _ in tables]
            log_path = [pick(paths, 2 * u + final) for _, _, paths in tables]
            return Realized(tuple(logprobs), tuple(zero_mass), tuple(log_path))

        return sample

    def path_logprobs(self, tokens):
        u = self._block(tokens)
        num = tokens.shape[0]
        head = jnp.full((num, self.block_bits), jnp.log(0.5))
        on_path = tokens[:, self.block_bits : -1] == jnp.asarray(self.hidden_paths)[u]
        middle = jnp.where(on_path, 0.0, NEG_INF)
        p1 = jnp.asarray(self.final_p1, jnp.float32)[u]
        final = jnp.log(jnp.where(tokens[:, -1] == 1, p1, 1.0 - p1))[:, None]
        return jnp.concatenate([head, middle, final], axis=1)

    def next_token_logprobs(self, tokens):
        u = self._block(tokens)
        num = tokens.shape[0]
        head = jnp.full((num, self.block_bits, 2), jnp.log(0.5))
        hidden = jnp.asarray(self.hidden_paths)[u].astype(jnp.int32)
        # Off the hidden path the conditional is undefined (zero-mass prefix); keep following it.
        middle = jnp.where(jax.nn.one_hot(hidden, 2) > 0, 0.0, NEG_INF)
        p1 = jnp.asarray(self.final_p1, jnp.float32)[u]
        final = jnp.log(jnp.stack([1.0 - p1, p1], axis=-1))[:, None, :]
        return jnp.concatenate([head, middle, final], axis=1)


_pytree(BlockProcess, ["n", "block_bits", "construction", "vocab_size", "max_support"])


def _block_arrays(rng, num_blocks, path_len, p_active):
    # Order and dtypes fixed by the paper's protocol: the int8 dtype changes the random stream.
    hidden = rng.integers(0, 2, size=(num_blocks, path_len), dtype=np.int8)
    orientation = rng.integers(0, 2, size=num_blocks, dtype=np.int8)
    active = rng.random(num_blocks) < p_active
    return hidden, orientation, active


def block_pair(seed=10, n=128, block_bits=12, p_active=0.4, alpha=0.49):
    """(pi, mu) for the block construction drawn with numpy's default_rng(seed).

    In an active block the final bit is (1/2 + alpha on the oriented bit) under pi and swapped
    under mu; inactive blocks are (1/2, 1/2) on both. TV = 2 * alpha * (fraction of active blocks).
    """
    block_bits = check_positive_int("block_bits", block_bits)
    n = check_positive_int("n", n)
    if n < block_bits + 2:
        raise ValueError(f"n must be at least block_bits + 2 = {block_bits + 2}, got n={n}")
    if block_bits > 20:
        raise ValueError(f"block_bits={block_bits} would store 2**{block_bits} hidden paths; use <= 20")
    check_range("p_active", p_active, 0.0, 1.0)
    check_range("alpha", alpha, 0.0, 0.5)
    num_blocks = 2**block_bits
    hidden, orientation, active = _block_arrays(
        np.random.default_rng(seed), num_blocks, n - block_bits - 1, p_active
    )
    tilt = np.where(active, alpha, 0.0) * np.where(orientation == 1, 1.0, -1.0)
    construction = BlockConstruction(int(seed), int(block_bits), float(p_active), float(alpha))
    make = lambda p1: BlockProcess(hidden, np.asarray(p1, np.float32), n, block_bits, construction)
    return make(0.5 + tilt), make(0.5 - tilt)


def paper_block_pair():
    """The paper's synthetic instance (B.2): n=128, block_bits=12, p_active=0.4, alpha=0.49, seed 10."""
    return block_pair(seed=10, n=128, block_bits=12, p_active=0.4, alpha=0.49)


def _block_tv(pi, mu):
    if not np.array_equal(np.asarray(pi.hidden_paths), np.asarray(mu.hidden_paths)):
        return None
    p_pi = np.asarray(pi.final_p1, np.float64)
    p_mu = np.asarray(mu.final_p1, np.float64)
    if pi.construction is not None and pi.construction == mu.construction:
        # Exact in float64 from the construction: each differing block contributes 2 * alpha.
        return 2.0 * pi.construction.alpha * int(np.sum(p_pi != p_mu)) / p_pi.size
    return float(np.mean(np.abs(p_pi - p_mu)))


# --------------------------------------------------------------------------- rare escape


@dataclasses.dataclass(frozen=True)
class RareEscapeProcess:
    """Rare-escape embedding (paper 4.4) of a finite distribution P over K outcomes.

    Token 0 is "stay". While no escape has happened, each step escapes with probability q and
    reveals one draw a ~ P as token a + 1; after the escape every token is 0 (deterministic).
    """

    outcome_probs: jax.Array  # float [K]
    escape_prob: jax.Array  # scalar q
    n: int
    vocab_size: int  # K + 1: "stay" and the K outcomes

    def __post_init__(self):
        outcome_probs, escape_prob = _concrete_array(self.outcome_probs), _concrete_array(self.escape_prob)
        if outcome_probs is not None:
            check_probability_vector("outcome_probs", outcome_probs)
            if outcome_probs.shape[-1:] != (self.vocab_size - 1,):
                raise ValueError(f"outcome_probs has shape {outcome_probs.shape}, expected "
                                 f"({self.vocab_size - 1},) = vocab_size - 1")
        if escape_prob is not None:
            check_range("escape_prob", escape_prob, 0.0, 1.0, low_open=True)

    @property
    def max_support(self):
        """Largest next-token support: every token is possible before the escape."""
        return self.vocab_size

    def _logs(self):
        q = jnp.asarray(self.escape_prob, jnp.float32)
        return jnp.log1p(-q), jnp.log(q) + jnp.log(jnp.asarray(self.outcome_probs, jnp.float32))

    def sample(self, key, num):
        key_time, key_outcome = jax.random.split(key)
        escapes = jax.random.bernoulli(key_time, self.escape_prob, (num, self.n))
        first = jnp.argmax(escapes, axis=1)
        escaped = jnp.any(escapes, axis=1)
        outcome = jax.random.categorical(
            key_outcome, jnp.log(jnp.asarray(self.outcome_probs, jnp.float32)), shape=(num,)
        )
        at_escape = (jnp.arange(self.n)[None, :] == first[:, None]) & escaped[:, None]
        return jnp.where(at_escape, outcome[:, None] + 1, 0).astype(jnp.int32)

    def _alive(self, tokens):
        # alive[i]: no escape among x_<i.
        escaped_so_far = jnp.cumsum(tokens != 0, axis=1) - (tokens != 0)
        return escaped_so_far == 0

    def next_token_logprobs(self, tokens):
        log_stay, log_escape = self._logs()
        alive_row = jnp.concatenate([log_stay[None], log_escape])
        dead_row = jnp.full((self.vocab_size,), NEG_INF).at[0].set(0.0)
        return jnp.where(self._alive(tokens)[..., None], alive_row, dead_row)

    def path_logprobs(self, tokens):
        rows = self.next_token_logprobs(tokens)
        return jnp.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0]


_pytree(RareEscapeProcess, ["n", "vocab_size"])


def rare_escape_pair(P, Q, n, escape_scale=1.0):
    """(pi_P, mu_Q) escaping with probability q = escape_scale / n per step.

    TV(pi_P, mu_Q) = (1 - (1 - q)^n) * TV(P, Q): the escape time has the same law on both sides.
    """
    P = check_probability_vector("P", P)
    Q = check_probability_vector("Q", Q)
    if P.ndim != 1 or P.shape != Q.shape:
        raise ValueError(f"P and Q must be 1-D over the same outcomes, got shapes {P.shape} and {Q.shape}")
    n = check_positive_int("n", n)
    check_range("escape_scale", escape_scale, 0.0, n, low_open=True, high_open=True)
    q = np.float64(escape_scale) / n
    size = P.size + 1
    return tuple(RareEscapeProcess(D, q, n, size) for D in (P, Q))


def rare_escape_uniform_pair(K=8, n=64, tv_outcomes=0.5, escape_scale=1.0):
    """The rare-escape pair (paper 4.4) over K outcomes: P uniform, Q moves tv_outcomes of mass
    from the second half of the outcomes to the first, so TV(P, Q) = tv_outcomes."""
    if K < 2 or K % 2:
        raise ValueError(f"rare_escape_uniform_pair needs an even K >= 2, got K={K}")
    check_range("tv_outcomes", tv_outcomes, 0.0, 0.5)
    P = np.full(K, 1.0 / K)
    shift = np.where(np.arange(K) < K // 2, 1.0, -1.0) * 2.0 * tv_outcomes / K
    return rare_escape_pair(P, P + shift, n, escape_scale=escape_scale)


def _rare_escape_tv(pi, mu):
    if float(pi.escape_prob) != float(mu.escape_prob):
        return None
    q = float(pi.escape_prob)
    tv_outcomes = 0.5 * float(np.sum(np.abs(np.asarray(pi.outcome_probs, np.float64) - np.asarray(mu.outcome_probs, np.float64))))
    return (1.0 - (1.0 - q) ** pi.n) * tv_outcomes


# --------------------------------------------------------------------------- independent coins


@dataclasses.dataclass(frozen=True)
class CoinProcess:
    """n independent coins Bern(p1): every position is random, so a noisy or sampled draw at every
    one of the n positions adds to the noise of log p(x) (the n^2 sigma^2 of Theorem 3 shows)."""

    p1: jax.Array  # scalar P(x_i = 1)
    n: int
    vocab_size: int = 2
    max_support: int = 2

    def __post_init__(self):
        p1 = _concrete_array(self.p1)
        if p1 is not None:
            check_range("p1", p1, 0.0, 1.0)

    def _logs(self):
        p1 = jnp.asarray(self.p1, jnp.float32)
        return jnp.log1p(-p1), jnp.log(p1)

    def sample(self, key, num):
        return jax.random.bernoulli(key, self.p1, (num, self.n)).astype(jnp.int32)

    def path_logprobs(self, tokens):
        log_zero, log_one = self._logs()
        return jnp.where(tokens == 1, log_one, log_zero)

    def next_token_logprobs(self, tokens):
        log_zero, log_one = self._logs()
        return jnp.broadcast_to(jnp.stack([log_zero, log_one]), tokens.shape + (2,))


_pytree(CoinProcess, ["n", "vocab_size", "max_support"])


MAX_COINS = 2**24


def coin_pair(n=64, shift=0.25):
    """(pi, mu) = (Bern(1/2 + a)^n, Bern(1/2 - a)^n) with a = shift / sqrt(n), so the TV stays
    near 2 Phi(2 shift) - 1 (about 0.38 at shift 0.25) as n grows; exact TV by a sum over the
    number of ones, the pair's sufficient statistic."""
    n = check_positive_int("n", n)
    if n > MAX_COINS:
        raise ValueError(f"coin_pair needs n <= {MAX_COINS} (its exact TV sums n + 1 terms), got n={n}")
    a = float(shift) / math.sqrt(n)
    check_range("shift / sqrt(n)", a, 0.0, 0.5, low_open=True, high_open=True)
    return CoinProcess(np.float64(0.5 + a), n), CoinProcess(np.float64(0.5 - a), n)


def _coin_tv(pi, mu):
    """TV of two products of n coins: 1/2 sum_k C(n, k) |p^k (1-p)^(n-k) - q^k (1-q)^(n-k)|,
    each term in log space (the binomial coefficients overflow float64 from n of about 1030)."""
    k = np.arange(pi.n + 1, dtype=np.float64)
    log_choose = np.array([math.lgamma(pi.n + 1) - math.lgamma(j + 1) - math.lgamma(pi.n - j + 1) for j in range(pi.n + 1)])
    log_mass = lambda p: log_choose + k * math.log(p) + (pi.n - k) * math.log1p(-p)
    one, other = log_mass(float(pi.p1)), log_mass(float(mu.p1))
    high, low = np.maximum(one, other), np.minimum(one, other)
    return float(0.5 * np.sum(np.exp(high) * -np.expm1(low - high)))  # |e^a - e^b| = e^max (1 - e^(min - max))


# --------------------------------------------------------------------------- random tabular


def normalized_table(logits, temperature=1.0, top_k=None):
    """log softmax(top_k(logits / temperature)) over the last axis, in float64 numpy.

    Top-k keeps every logit tied with the k-th largest (tie-inclusive); the rest get zero mass."""
    scaled = np.asarray(logits, np.float64) / temperature
    if top_k is not None:
        kth = -np.sort(-scaled, axis=-1)[..., top_k - 1 : top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    peak = np.max(scaled, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return scaled - peak - np.log(np.sum(np.exp(scaled - peak), axis=-1, keepdims=True))


@dataclasses.dataclass(frozen=True)
class TabularProcess:
    """Order-`context_len` autoregressive table: the next-token log-distribution at position i is
    logprobs[i, context], context = the previous context_len tokens (read as 0 before the start)."""

    logprobs: jax.Array  # float32 [n, V**context_len, V], -inf for zero probability
    n: int
    vocab_size: int
    context_len: int
    max_support: int
    eos_ids: tuple = ()  # stop tokens, absorbing in the table (see stopping_tabular_pair)

    def __post_init__(self):
        """Refuse a table that is no distribution (NaN, +inf, a row of all -inf, or a row whose
        probabilities do not sum to 1 within validate.LOG_MASS_ATOL in log space), naming the row."""
        table = _concrete_array(self.logprobs)
        if table is None:
            return
        expected = (self.n, self.vocab_size**self.context_len, self.vocab_size)
        if table.shape[-3:] != expected:  # leading axes: a stack of processes, for vmap
            raise ValueError(f"logprobs must have shape [n, V**context_len, V] = {list(expected)}, got {list(table.shape)}")
        check_log_distribution("logprobs[position, context]", table)
        if any(not 0 <= int(eos) < self.vocab_size for eos in self.eos_ids):
            raise ValueError(f"eos_ids {self.eos_ids} must be token ids in [0, {self.vocab_size})")

    def _contexts(self, tokens):
        """Context index of every position [num, n]."""
        c = self.context_len
        padded = jnp.pad(tokens, ((0, 0), (c, 0)))
        ctx = jnp.zeros(tokens.shape, jnp.int32)
        for j in range(c):  # c is a small static constant (the Markov order), not a data axis
            ctx = ctx * self.vocab_size + padded[:, j : j + self.n]
        return ctx

    def next_token_logprobs(self, tokens):
        return jnp.asarray(self.logprobs)[jnp.arange(self.n)[None, :], self._contexts(tokens)]

    def path_logprobs(self, tokens):
        rows = self.next_token_logprobs(tokens)
        return jnp.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0]

    def sample(self, key, num):
        c, V = self.context_len, self.vocab_size

        def step(ctx, inputs):
            key_i, table_i = inputs
            token = jax.random.categorical(key_i, table_i[ctx])
            return (ctx * V + token) % (V**c), token

        keys = jax.random.split(key, self.n)
        _, tokens = jax.lax.scan(step, jnp.zeros((num,), jnp.int32), (keys, jnp.asarray(self.logprobs)))
        return tokens.T.astype(jnp.int32)

    @classmethod
    def from_logits(cls, logits, context_len, temperature=1.0, top_k=None):
        """softmax(top_k(logits / temperature)) from raw logits [n, V**context_len, V]."""
        logits = np.asarray(logits, np.float64)
        if logits.ndim != 3:
            raise ValueError(f"logits must have shape [n, V**context_len, V], got {logits.shape}")
        n, num_ctx, V = logits.shape
        if num_ctx != V**context_len:
            raise ValueError(f"table has {num_ctx} contexts, expected V**context_len = {V**context_len}")
        check_logits("logits[position, context]", logits)
        check_range("temperature", temperature, 0.0, low_open=True)
        if top_k is not None:
            top_k = check_positive_int("top_k", top_k)
            if top_k > V:
                raise ValueError(f"top_k={top_k} exceeds the vocabulary size {V}")
        table = normalized_table(logits, temperature, top_k).astype(np.float32)
        support = int(np.max(np.sum(np.isfinite(table), axis=-1)))
        return cls(table, n, V, context_len, support)

    @classmethod
    def from_probs(cls, probs, context_len, temperature=1.0, top_k=None):
        """From a probability table [n, V**context_len, V] (validated); zeros stay zeros."""
        probs = check_probability_vector("tabular probabilities", probs, axis=-1)
        with np.errstate(divide="ignore"):
            return cls.from_logits(np.log(probs), context_len, temperature, top_k)


_pytree(TabularProcess, ["n", "vocab_size", "context_len", "max_support", "eos_ids"])

MAX_TABLE_ENTRIES = 50_000_000


def tabular_logits(seed, vocab_size, n, context_len, logit_noise=0.0, logit_scale=2.0):
    """The raw logits of random_tabular_pair: base ~ N(0, logit_scale^2) from default_rng(seed),
    then mu's = base + logit_noise * N(0, 1) from the same stream."""
    rng = np.random.default_rng(seed)
    base = rng.normal(scale=logit_scale, size=(n, vocab_size**context_len, vocab_size))
    return base, base + logit_noise * rng.normal(size=base.shape)


def random_tabular_pair(
    seed=0,
    vocab_size=4,
    n=6,
    context_len=2,
    top_k=(None, None),
    temperature=(1.0, 1.0),
    logit_noise=0.0,
    logit_scale=2.0,
):
    """A random tabular pair from numpy's default_rng(seed), and the perturbations that matter in
    serving: per-side top-k truncation (support mismatch), per-side temperature, and a fixed
    Gaussian perturbation of mu's logits with standard deviation `logit_noise`."""
    V = check_positive_int("vocab_size", vocab_size, minimum=2)
    n = check_positive_int("n", n)
    context_len = check_positive_int("context_len", context_len, minimum=0)
    entries = n * V ** (context_len + 1)
    if entries > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"a tabular process with V={V}, context_len={context_len}, n={n} needs {entries:.3g} "
            f"table entries (limit {MAX_TABLE_ENTRIES:.0e}); lower context_len or vocab_size"
        )
    check_range("logit_noise", logit_noise, 0.0)
    base, perturbed = tabular_logits(seed, V, n, context_len, logit_noise, logit_scale)
    pi = TabularProcess.from_logits(base, context_len, temperature[0], top_k[0])
    mu = TabularProcess.from_logits(perturbed, context_len, temperature[1], top_k[1])
    return pi, mu


def _with_stop(probs, stop_prob, context_len):
    """probs [n, V**c, V] with token EOS drawn with probability stop_prob at every step and
    absorbing: after EOS (the context's last token) the next token is EOS with probability 1,
    the deterministic pad of a stopped trajectory."""
    V = probs.shape[-1]
    eos = V - 1  # not 0: a table reads the context before the start as token 0
    rest = probs.copy()
    rest[..., eos] = 0.0
    rest = (1.0 - stop_prob) * rest / rest.sum(axis=-1, keepdims=True)
    rest[..., eos] = stop_prob
    after_eos = np.arange(V**context_len) % V == eos  # the context's most recent token is EOS
    rest[:, after_eos, :] = np.eye(V)[eos]
    return rest


def stopping_tabular_pair(seed=0, vocab_size=4, n=6, context_len=1, stop_prob=(0.2, 0.3), top_k=(None, None),
                          temperature=(1.0, 1.0), logit_noise=0.0, logit_scale=2.0):
    """A random tabular pair whose trajectories stop: the last token, V - 1, is EOS, drawn with probability
    stop_prob[side] at every step (the other tokens share the rest as softmax(top_k(logits / T))),
    and after it every position is EOS again with probability 1 (log-probability 0 under both
    models), so a stopped trajectory is its tokens up to and including EOS, padded. The exact TV
    (enumeration) is the TV over sequences of length <= n; every estimator and oracle applies
    unchanged, and `tvjax.core.currency.trajectory_lengths` gives the real positions."""
    V = check_positive_int("vocab_size", vocab_size, minimum=3)
    context_len = check_positive_int("context_len", context_len, minimum=1)  # EOS is absorbing through the context
    for stop in stop_prob:
        check_range("stop_prob", stop, 0.0, 1.0, low_open=True, high_open=True)
    pi, mu = random_tabular_pair(seed, V, n, context_len, top_k, temperature, logit_noise, logit_scale)
    sides = []
    for process, stop in zip((pi, mu), stop_prob):
        probs = _with_stop(np.exp(np.asarray(process.logprobs, np.float64)), stop, context_len)
        stopped = TabularProcess.from_probs(probs, context_len)
        sides.append(dataclasses.replace(stopped, eos_ids=(V - 1,)))
    return tuple(sides)


# --------------------------------------------------------------------------- exact TV

MAX_ENUMERATION = 2**22


def _enumerated_sums(pi, mu, summands, max_sequences, chunk):
    """sum over all V**n sequences x of summands(log pi(x), log mu(x)) -> [k] (small instances only)."""
    check_pair(pi, mu)
    V, n = pi.vocab_size, pi.n
    total = V**n
    if total > min(max_sequences, 2**31 - 1):
        raise ValueError(
            f"exact TV by enumeration needs V**n = {V}**{n} = {total:.3g} sequences, more than "
            f"max_sequences={max_sequences:.3g}; use a smaller instance or an analytic pair"
        )
    digits = V ** jnp.arange(n - 1, -1, -1, dtype=jnp.int32)

    @jax.jit
    def chunk_sums(start):
        index = start + jnp.arange(chunk)
        tokens = ((index[:, None] // digits) % V).astype(jnp.int32)
        values = summands(jnp.sum(pi.path_logprobs(tokens), 1), jnp.sum(mu.path_logprobs(tokens), 1))
        return jnp.sum(jnp.where((index < total)[:, None], values, 0.0), axis=0)

    return sum(np.asarray(chunk_sums(start), np.float64) for start in range(0, total, chunk))


def enumerate_tv(pi, mu, max_sequences=MAX_ENUMERATION, chunk=2**16):
    """TV by summing |pi(x) - mu(x)| / 2 over all V**n sequences (small instances only)."""
    gap = lambda log_pi, log_mu: jnp.abs(jnp.exp(log_pi) - jnp.exp(log_mu))[:, None]
    return 0.5 * float(_enumerated_sums(pi, mu, gap, max_sequences, chunk)[0])


class RatioMoments(NamedTuple):
    """Exact mean and variance of Algorithm 1's R = (1 - mu(X)/pi(X))_+ over X ~ pi."""

    mean: float
    variance: float


def _block_ratio_moments(pi, mu):
    # X is (block u, final bit b): pi(u, b) = 2^-bits p_b(u); the hidden paths agree or mu(X) = 0.
    same = np.all(np.asarray(pi.hidden_paths) == np.asarray(mu.hidden_paths), axis=1)
    p1_pi, p1_mu = (np.asarray(p.final_p1, np.float64) for p in (pi, mu))
    weight = np.stack([1.0 - p1_pi, p1_pi]) / p1_pi.size
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.stack([(1.0 - p1_mu) / (1.0 - p1_pi), p1_mu / p1_pi])
    r = np.where(same, np.maximum(1.0 - np.nan_to_num(ratio, nan=0.0, posinf=0.0), 0.0), 1.0)
    return np.sum(weight * r), np.sum(weight * r**2)


def likelihood_ratio_moments(pi, mu, max_sequences=MAX_ENUMERATION):
    """RatioMoments of R over X ~ pi, exactly: a sum over the 2 * 2^block_bits outcomes of a
    block pair, enumeration over all V**n sequences otherwise (small instances only). The
    estimator's standard error at N trajectories is sqrt(variance / N)."""
    check_pair(pi, mu)
    if isinstance(pi, BlockProcess) and isinstance(mu, BlockProcess) and pi.block_bits == mu.block_bits:
        first, second = _block_ratio_moments(pi, mu)
    else:
        powers = jnp.arange(1, 3)  # E[R] and E[R^2]
        moments = lambda log_pi, log_mu: jnp.exp(log_pi)[:, None] * likelihood_ratio_term(log_pi, log_mu)[:, None] ** powers
        first, second = _enumerated_sums(pi, mu, moments, max_sequences, 2**16)
    return RatioMoments(float(first), float(max(second - first**2, 0.0)))


def exact_tv(pi, mu, max_sequences=MAX_ENUMERATION):
    """The ground-truth TV(pi, mu): analytic for block, rare-escape and coin pairs, else enumeration."""
    check_pair(pi, mu)
    analytic = None
    if isinstance(pi, BlockProcess) and isinstance(mu, BlockProcess) and pi.block_bits == mu.block_bits:
        analytic = _block_tv(pi, mu)
    elif isinstance(pi, RareEscapeProcess) and isinstance(mu, RareEscapeProcess):
        analytic = _rare_escape_tv(pi, mu)
    elif isinstance(pi, CoinProcess) and isinstance(mu, CoinProcess):
        analytic = _coin_tv(pi, mu)
    if analytic is not None:
        return analytic
    return enumerate_tv(pi, mu, max_sequences=max_sequences)

