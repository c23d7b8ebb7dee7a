"""Exact Binomial(count, p) draws whose cost follows the average work per cell, not the slowest cell.

`jax.random.binomial` runs its inversion loop and its rejection loop over every cell, each drawing
a full-shape uniform per iteration until the slowest cell of the array is done. Here each cell takes
one of three exact paths, each with its own random words, and a path that no cell of a call takes
is skipped:

* q = min(p, 1 - p); X ~ Binomial(count, q) is reflected to count - X where p > 1/2. count = 0 and
  q = 0 come out as 0, with no special case.
* Fair coins (p = 1/2 exactly, count <= 64): X is the number of set bits among `count` random bits,
  one 16-bit piece per cell (half a word) where every such count of the call is at most 16, else
  four: a chunk of fair cells costs about the words it consumes.
* count * q <= 10: inversion over the window k < 32, straight-line, from a uniform of two words.
  The unnormalized weights w_k = prod_{j<k} (count - j) q / ((j + 1)(1 - q)) are summed from the
  top, s_k = sum_{j>=k} w_j, and X = #{k >= 1: e s_0 <= s_k} for e uniform in (0, 1] (resolution
  2^-64 near 0). Normalizing by the computed total and summing from the top keep every tail
  probability s_k / s_0 accurate to ~32 ulp relative, where a forward CDF walk from (1 - q)^count
  carries an absolute error of ~1e-6 and cannot reach tails below 2^-24. The mass past the window
  is covered by a geometric envelope w_32 rho^j / (1 - rho) (rho, the weight ratio at 32, is < 0.61
  as count * q <= 10): a cell that lands there (chance < 1e-7) takes an exact accept/reject step
  (its place in the envelope, uniform given that it landed there, is drawn afresh) and is redrawn
  whole on rejection, in a loop that only a call with such a cell enters. No tail is cut off.
  Where these cells lie in at most 1/16 of the call's blocks of 256 consecutive cells (a few
  positions of a stream's chunk, the rest fair or exact), only those blocks are gathered and
  drawn, their uniforms and the first fair piece coming from one generator call (on XLA's CPU each
  call is a loop whose passes cost as much as thousands of words); else every cell is drawn.
* count * q > 10 (fair coins past 64 included): BTRS (Hormann 1993, as in `jax.random.binomial`),
  its log-acceptance bound written in d = k - m so the float32 rounding scales with |d|, not with
  k. The first trial runs on every cell; the 12-27% rejected are compacted into a buffer of size /
  8 for the second trial, the cells rejected there into a quarter of that, and so on; the last
  buffer runs 8 trials per cell side by side and keeps the first accepted. Later trials thus draw
  words for pending cells only (~0.4 words per cell on mixed counts, on top of the two). The
  compaction ranks cells through 32-bit masks, so its one cumulative sum runs over size / 32
  entries (XLA's CPU scan over the whole array costs about one random draw per cell). A cell that
  does not fit a buffer, or is still rejected after the last, stays pending for another pass: any
  mix is exact, if slower.

Outside the domain (count negative, non-finite or >= 2^24; p outside [0, 1] or NaN) the result is NaN.

Why not `jax.random.binomial`: the draws are most of the sample-only oracle's run time, and on its
chunk shape (13,312 cells) `benchmarks/binomial_bench.py` measures these runs 4.6-9.2x faster than
jax.random.binomial's (0.8-1.7 ms against 6.1-9.7 ms; jax 0.10.2, 2-core EPYC VM, 2026-12-06), for
1.0 s more compile (2.6 s against 1.6 s, once per process and shape).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_INVERSION_MAX_MEAN = 10.0  # BTRS needs count * q >= 10 (Hormann 1993).
_WINDOW = 32  # Poisson(10) puts 2.5e-8 at or past 32: the envelope path is rare.
_MAX_COUNT = 2.0**24  # float32 holds every integer below it.
_PIECE_BITS = 16  # fair coins read their bits in 16-bit pieces,
_FAIR_PIECES = 4  # at most 4 (count <= 64); BTRS costs about as much as 8 more pieces.
_BLOCK = 256  # cells per block for the sparse inversion path,
_SPARSE_SHARE = 16  # which draws at most 1/16 of the blocks (rounded up).
_FIRST_TIER = 8  # retry buffers: size / 8 cells first (~1.4x the cells pending on mixed counts),
_TIER_SHRINK = 4  # then a quarter each (BTRS accepts 73-88% per trial),
_MIN_TIER = 64  # none under 64 cells,
_MAX_TIERS = 4  # at most 4 (each adds compile time);
_LAST_TRIALS = 8  # the last runs 8 trials per cell side by side (all rejected: 0.27^8 = 3e-5).

# Hormann's fc(k) = log k! - [(k + 1/2) log(k + 1) - (k + 1) + log sqrt(2 pi)] for k < 10.
_STIRLING_TAIL = (
    0.0810614667953272, 0.0413406959554092, 0.0276779256849983, 0.02079067210376509, 0.0166446911898211,
    0.0138761288230707, 0.0118967099458917, 0.0104112652619720, 0.00925546218271273, 0.00833056343336287,
)


def binomial(key, count, p):
    """Binomial(count, p) draws as float32 of shape broadcast(count, p); count (int or float) may be traced."""
    p = jnp.asarray(p, jnp.float32)
    count = jnp.asarray(count)
    shape = jnp.broadcast_shapes(count.shape, p.shape)
    if 0 in shape:
        return jnp.zeros(shape, jnp.float32)
    # Cells keep their shape: an elementwise kernel over a flattened broadcast computes each
    # element's index by division, one over the shape runs its last axis as a vector loop.
    cells = shape if shape else (1,)
    n = jnp.broadcast_to(count, shape).astype(jnp.float32).reshape(cells)
    n = n if jnp.issubdtype(count.dtype, jnp.integer) else jnp.floor(n)
    p = jnp.broadcast_to(p, shape).reshape(cells)
    valid = (n >= 0) & (n < _MAX_COUNT) & (p >= 0) & (p <= 1)
    n = jnp.where(valid, n, 0.0)
    flip = p > 0.5
    q = jnp.where(valid, jnp.where(flip, 1.0 - p, p), 0.0)
    fair = (q == 0.5) & (n <= _PIECE_BITS * _FAIR_PIECES)
    mean = n * q
    small = ~fair & (mean > 0) & (mean <= _INVERSION_MAX_MEAN)
    big = ~fair & (mean > _INVERSION_MAX_MEAN)
    # One split for every path, and one generator call for the first fair piece and the sparse
    # inversion's uniforms: on XLA's CPU each call is a loop whose passes cost thousands of words.
    key_shared, key_fair, key_small, key_tail, key_big, key_retry = jax.random.split(key, 6)
    # Each path gets harmless parameters on the other's cells (n = 0: X = 0 at once).
    zeros = lambda: jnp.zeros(cells)
    fair_n = jnp.where(fair, n, 0.0)
    small_n, small_q = jnp.where(small, n, 0.0), jnp.where(small, q, 0.0)
    any_fair, any_small = jnp.any(fair_n > 0), jnp.any(small)
    plan = _blocks(small_q)
    piece_words = int(np.prod(cells[:-1])) * -(-cells[-1] // 2)
    sparse_words = 2 * plan.capacity * _BLOCK if plan.capacity < plan.count else 0
    shared_words = lambda: jax.random.bits(key_shared, (piece_words + sparse_words,), jnp.uint32)
    no_words = lambda: jnp.zeros((piece_words + sparse_words,), jnp.uint32)
    words = lax.cond(any_fair | (any_small & plan.sparse), shared_words, no_words)
    x = lax.cond(any_fair, lambda: _fair(key_fair, fair_n, words[:piece_words]), zeros)
    inversion = lambda: _inversion(key_small, key_tail, small_n, small_q, plan, words[piece_words:])
    x_small = lax.cond(any_small, inversion, zeros)
    big_n, big_q = jnp.where(big, n, 100.0), jnp.where(big, q, 0.5)
    flat = lambda a: a.reshape(-1)
    btrs = lambda: _btrs(key_big, key_retry, flat(big_n), flat(big_q), flat(big)).reshape(cells)
    x_big = lax.cond(jnp.any(big), btrs, zeros)
    x = jnp.where(big, x_big, jnp.where(small, x_small, x))
    x = jnp.where(flip, n - x, x)
    return jnp.where(valid, x, jnp.nan).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Fair coins: set bits.


def _fair(key, n, first):
    """Binomial(n, 1/2) for n <= 64 as set bits of n random bits: one 16-bit piece per cell where
    every n is at most 16 (the words of that piece are given), else _FAIR_PIECES (the others drawn here)."""
    one = lambda: _set_bits(n, first, 1)
    rest = lambda: jax.random.bits(key, ((_FAIR_PIECES - 1) * first.shape[0],), jnp.uint32)
    more = lambda: _set_bits(n, jnp.concatenate([first, rest()]), _FAIR_PIECES)
    return lax.cond(jnp.max(n) <= _PIECE_BITS, one, more)


def _set_bits(n, words, pieces):
    """Set bits among the first n of `pieces` 16-bit pieces per cell. A word holds two pieces: along
    the last axis, the low halves of the words serve its first half, the high halves the rest."""
    *lead, length = n.shape
    words = words.reshape(pieces, *lead, -(-length // 2))
    bits = jnp.concatenate([words & np.uint32(0xFFFF), words >> np.uint32(_PIECE_BITS)], axis=-1)[..., :length]
    x = jnp.zeros(n.shape, jnp.int32)
    for j in range(pieces):
        width = jnp.clip(n - _PIECE_BITS * j, 0, _PIECE_BITS).astype(jnp.uint32)
        x = x + lax.population_count(bits[j] & ((np.uint32(1) << width) - np.uint32(1))).astype(jnp.int32)
    return x.astype(jnp.float32)


# ---------------------------------------------------------------------------------------------
# Small mean: windowed inversion.


def _unit_open(hi, lo):
    """A uniform in (0, 1] from two words, at float32 precision down to 2^-64."""
    return (hi.astype(jnp.float32) + (lo.astype(jnp.float32) + 0.5) * np.float32(2.0**-32)) * np.float32(2.0**-32)


def _weights(n, q):
    """w_k / w_0 for k < 32, and the envelope weight w_32 / (1 - rho) standing for the mass past 32."""
    r = q / (1.0 - q)
    w = [jnp.ones_like(n)]
    for k in range(_WINDOW):
        w.append(w[-1] * ((n - k) * r) * np.float32(1.0 / (k + 1)))
    return w[:_WINDOW], jnp.where(w[_WINDOW] > 0, w[_WINDOW] / (1.0 - _rho(n, r)), 0.0)


def _rho(n, r):
    """The weight ratio w_33 / w_32, which bounds every ratio past it."""
    return (n - _WINDOW) * r * np.float32(1.0 / (_WINDOW + 1))


def _window(e, n, q):
    """X = #{1 <= k <= 32: e s_0 <= s_k}, s_32 being the envelope weight: X = 32 means the draw is in
    the envelope. One output only: XLA's CPU fusions recompute their whole body for each output."""
    w, envelope = _weights(n, q)
    s = [envelope]
    for k in range(_WINDOW - 1, 0, -1):
        s.append(s[-1] + w[k])
    t = e * (s[-1] + w[0])
    return sum((t <= s_k).astype(jnp.float32) for s_k in s)


class _Blocks(NamedTuple):
    """The inversion cells' blocks of _BLOCK consecutive cells: how many (`count`), how many the
    sparse path draws (`capacity`, static), which hold a cell (`active`), and whether they fit."""

    count: int
    capacity: int
    active: jax.Array
    sparse: jax.Array


def _blocks(q):
    length = q.shape[-1]
    if length % _BLOCK == 0:
        # Along the last axis: a flattened view of a computed array costs a division per element.
        active = jnp.any(q.reshape(*q.shape[:-1], length // _BLOCK, _BLOCK) > 0, axis=-1).reshape(-1)
    else:
        active = jnp.any(_padded_blocks(q.reshape(-1)) > 0, axis=1)
    count = active.shape[0]
    capacity = -(-count // _SPARSE_SHARE)
    return _Blocks(count, capacity, active, jnp.sum(active) <= capacity)


def _padded_blocks(a):
    blocks = -(-a.shape[0] // _BLOCK)
    return jnp.pad(a, (0, blocks * _BLOCK - a.shape[0])).reshape(blocks, _BLOCK)


def _inversion(key_words, key_tail, n, q, plan, words):
    """Windowed inversion where n q > 0 (harmless n = q = 0 elsewhere): where the cells lie in at
    most plan.capacity blocks, on those blocks only, from the given words (two per cell); else on
    every cell, from words drawn here."""
    shape = n.shape
    n, q = n.reshape(-1), q.reshape(-1)
    size = n.shape[0]
    blocks, capacity, active = plan.count, plan.capacity, plan.active

    def some_blocks():
        # The active blocks come in by dynamic slices, one per slot, and go back by a gather of
        # rows (XLA's CPU scatters loop over their rows); a slot left empty reads the spare block
        # past the end, a block without a slot reads the zero row past the last slot.
        spare = lambda a: jnp.pad(_padded_blocks(a), ((0, 1), (0, 0)))
        take = lambda a: jnp.concatenate([lax.dynamic_slice_in_dim(a, i, 1) for i in index]).reshape(-1)
        drawn = lambda: _window(sparse_uniforms(), take(spare(n)), take(spare(q)))
        # A branch's result is a buffer of its own (some block is active here): fused into the
        # gather, the window would be evaluated for every cell that the gather reads.
        return put(lax.cond(jnp.any(active), drawn, lambda: jnp.zeros(capacity * _BLOCK)))

    slot = jnp.where(active, jnp.cumsum(active) - 1, capacity)
    index = [jnp.sum(jnp.where(slot == c, jnp.arange(blocks), 0)) + blocks * jnp.all(slot != c) for c in range(capacity)]
    put = lambda v: jnp.pad(v.reshape(capacity, _BLOCK), ((0, 1), (0, 0)))[slot].reshape(-1)[:size]
    sparse_uniforms = lambda: _unit_open(words[:capacity * _BLOCK], words[capacity * _BLOCK:])
    every_cell = lambda: _window(_unit_uniform(key_words, size), n, q)
    x = every_cell() if capacity >= blocks else lax.cond(plan.sparse, some_blocks, every_cell)
    # The envelope's loop only where a draw landed there: even a loop that runs zero times costs
    # a pass over its state.
    tail = lambda: _envelope_tail(key_tail, x, n, q)
    return lax.cond(jnp.any(x == _WINDOW), tail, lambda: x).reshape(shape)


def _unit_uniform(key, size):
    words = jax.random.bits(key, (2, size), jnp.uint32)
    return _unit_open(words[0], words[1])


def _envelope_tail(key, x, n, q):
    """Cells whose draw fell in the envelope: propose 32 + J, J geometric of ratio rho, accept with
    prob w_{32+J} / (w_32 rho^J), else redraw the cell. J is read off a fresh uniform: given that
    the draw fell in the envelope, its place there is uniform and used for nothing else."""

    def body(c):
        i, x, tail = c
        # Computed here, not before the loop: almost no call enters it.
        r = q / (1.0 - q)
        rho = _rho(n, r)
        words = jax.random.bits(jax.random.fold_in(key, i), (6,) + x.shape, jnp.uint32)
        g = _unit_open(words[4], words[5])
        j = jnp.floor(jnp.log(g) / jnp.log(jnp.where(tail, rho, 0.5)))
        v = _unit_open(words[0], words[1])
        accept = tail & (v <= _envelope_ratio(j, n, r, rho, v, tail))
        redo = tail & ~accept
        x_new = _window(_unit_open(words[2], words[3]), jnp.where(redo, n, 0.0), q)
        x = jnp.where(accept, _WINDOW + j, jnp.where(redo, x_new, x))
        return i + 1, x, redo & (x_new == _WINDOW)

    return lax.while_loop(lambda c: jnp.any(c[2]), body, (jnp.int32(0), x, x == _WINDOW))[1]


def _envelope_ratio(j, n, r, rho, v, active):
    """prod_{i<j} (w_{33+i} / w_{32+i}) / rho, stopping once below v: the factors are <= 1."""

    def body(c):
        i, a = c
        k = _WINDOW + i.astype(jnp.float32)
        factor = jnp.maximum((n - k) * r / ((k + 1.0) * rho), 0.0)
        return i + 1, jnp.where(i < j, a * factor, a)

    live = lambda c: jnp.any(active & (c[0] < j) & (c[1] >= v))
    return lax.while_loop(live, body, (jnp.int32(0), jnp.ones_like(v)))[1]


# ---------------------------------------------------------------------------------------------
# Large mean: BTRS, retries in shrinking buffers.


def _unit(word):
    """A uniform in [0, 1) on the 2^-24 grid."""
    return (word >> 8).astype(jnp.float32) * np.float32(2.0**-24)


def _stirling_series(k):
    inv = 1.0 / (k + 1.0)
    inv2 = inv * inv
    return inv * (1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260)))


def _stirling_tail(k):
    out = _stirling_series(k)
    for i, value in enumerate(_STIRLING_TAIL):
        out = jnp.where(k == i, np.float32(value), out)
    return out


def _btrs_trial(n, q, u, v):
    """One BTRS trial per cell: k, or -1 if rejected (one output: see `_window`)."""
    sd = jnp.sqrt(n * q * (1.0 - q))
    b = 1.15 + 2.53 * sd
    a = -0.0873 + 0.0248 * b + 0.01 * q
    m = jnp.floor((n + 1.0) * q)  # >= 10, and so is n - m, where count * q > 10
    u = u - 0.5
    us = 0.5 - jnp.abs(u)
    k = jnp.floor((2.0 * a / us + b) * u + (n * q + 0.5))
    quick = (us >= 0.07) & (v <= 0.92 - 4.2 / b)
    lhs = jnp.log(v * ((2.83 + 5.1 / b) * sd) / (a / (us * us) + b))
    # log(f(k) / f(m)) by Stirling, in d = k - m.
    d = k - m
    log_ratio = (
        d * jnp.log(q * (n - k + 1.0) / ((1.0 - q) * (k + 1.0)))
        - (m + 0.5) * jnp.log1p(d / (m + 1.0))
        - (n - m + 0.5) * jnp.log1p(-d / (n - m + 1.0))
        + _stirling_series(m)
        + _stirling_series(n - m)
        - _stirling_tail(k)
        - _stirling_tail(n - k)
    )
    inside = (k >= 0) & (k <= n)
    return jnp.where(inside & (quick | (lhs <= log_ratio)), k, -1.0)


def _btrs(key_first, key, n, q, big):
    """BTRS on every cell once; the rejected ones through `_retries` until none is left."""
    words = jax.random.bits(key_first, (2,) + n.shape, jnp.uint32)
    x = _btrs_trial(n, q, _unit(words[0]), _unit(words[1]))
    size = x.shape[0]
    tiers = _tier_sizes(size)

    def one_pass(c):
        i, x, pending = c
        # One draw for the trials of all buffers: each call site of the generator costs compile time.
        words = jax.random.bits(jax.random.fold_in(key, i), (2, sum(tiers[:-1]) + _LAST_TRIALS * tiers[-1]), jnp.uint32)
        cells, live = _compact(pending, tiers[0], capacity=12)
        k = _retries(words, tiers, n[cells], q[cells], live)
        done = jnp.where(live & (k >= 0), cells, size)
        return i + 1, x.at[done].set(k, mode="drop"), pending.at[done].set(False, mode="drop")

    # One pass nearly always does; cells that overflowed a buffer stay pending for the next.
    return lax.while_loop(lambda c: jnp.any(c[2]), one_pass, (jnp.int32(0), x, big & (x < 0)))[1]


def _tier_sizes(size):
    tiers = [min(size, max(_MIN_TIER, -(-size // _FIRST_TIER)))]
    while tiers[-1] // _TIER_SHRINK >= _MIN_TIER and len(tiers) < _MAX_TIERS:
        tiers.append(tiers[-1] // _TIER_SHRINK)
    return tiers


def _retries(words, tiers, n, q, live):
    """k for the live cells of a buffer of size tiers[0]: one trial here, the rejected ones
    compacted into the next buffer; in the last one, _LAST_TRIALS trials side by side and the
    first accepted. -1 where a cell overflowed a buffer or was rejected throughout."""
    size = tiers[0]
    if len(tiers) == 1:
        trials = _btrs_trial(jnp.tile(n, _LAST_TRIALS), jnp.tile(q, _LAST_TRIALS), _unit(words[0]), _unit(words[1]))
        trials = trials.reshape(_LAST_TRIALS, size)
        k = trials[-1]
        for t in range(_LAST_TRIALS - 2, -1, -1):
            k = jnp.where(trials[t] >= 0, trials[t], k)
        return k
    k = _btrs_trial(n, q, _unit(words[0, :size]), _unit(words[1, :size]))
    local, live_next = _compact(live & (k < 0), tiers[1], capacity=16)
    k_next = _retries(words[:, size:], tiers[1:], n[local], q[local], live_next)
    return k.at[jnp.where(live_next, local, size)].set(k_next, mode="drop")


# ---------------------------------------------------------------------------------------------
# Compaction without a scan over the whole array.


def _compact(mask, size, capacity):
    """(indices, live) of up to `size` set cells of `mask`, in the first slots; the rest hold 0, not live.

    A [32, L/32] view packs each column's 32 cells into one word; the k-th set bit of a word
    (k < capacity) goes to slot prefix(word) + k, the prefix running over L/32 words only. Cells
    past a word's capacity or past `size` are left out (the callers keep them pending)."""
    length = mask.shape[0]
    cols = -(-length // 32)
    m = jnp.pad(mask, (0, 32 * cols - length)).reshape(32, cols).astype(jnp.uint32)
    word = jnp.sum(m << jnp.arange(32, dtype=jnp.uint32)[:, None], axis=0, dtype=jnp.uint32)
    count = lax.population_count(word).astype(jnp.int32)
    rank = jnp.arange(capacity, dtype=jnp.int32)[:, None]
    row = _select_bit(jnp.broadcast_to(word, (capacity, cols)), rank)
    cell = row * cols + jnp.arange(cols, dtype=jnp.int32)[None, :]
    before = jnp.cumsum(count) - count
    slot = jnp.where(rank < count[None, :], before[None, :] + rank, size)
    cells = jnp.full((size,), length, jnp.int32).at[slot.reshape(-1)].set(cell.reshape(-1), mode="drop")
    live = cells < length
    return jnp.where(live, cells, 0), live


def _select_bit(word, rank):
    """Position of the rank-th set bit of each word, by binary search on popcounts."""
    pos = jnp.zeros(word.shape, jnp.int32)
    for width in (16, 8, 4, 2, 1):
        low = lax.population_count((word >> pos.astype(jnp.uint32)) & jnp.uint32((1 << width) - 1)).astype(jnp.int32)
        right = rank >= low
        rank = jnp.where(right, rank - low, rank)
        pos = jnp.where(right, pos + width, pos)
    return pos
