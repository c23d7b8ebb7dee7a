"""The streaming reduction under every synthetic estimator, and its chunk policy.

Trajectories are drawn, reduced and discarded chunk by chunk inside jit: no [N, n, R] array
exists. `level_moments` lays groups of rows (copy, level) end to end as one stream that runs in
chunks of a static size, and keeps running moments per group.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.sharding import random_streams
from tvjax.validate import all_concrete

# Trajectory positions one chunk holds at once (times the vocabulary for LogitNoise): bounds memory.
CHUNK_POSITIONS = 2**20
# Concrete sizes: a chunk is about 1/CHUNKS_PER_STREAM of the stream, rounded up to a power of
# two (nearby sizes share one compiled program), between MIN_CHUNK_ROWS and MAX_CHUNK_ROWS rows
# (larger chunks stop paying on CPU).
CHUNKS_PER_STREAM = 8
MIN_CHUNK_ROWS = 64
MAX_CHUNK_ROWS = 2048
# Groups of rows (copy, level) one chunk step may reduce: a step that would reach past the
# WINDOW-th group boundary stops there.
WINDOW = 32


class Moments(NamedTuple):
    count: jax.Array
    mean: jax.Array
    m2: jax.Array  # sum of squared deviations

    @property
    def variance(self):
        return self.m2 / jnp.maximum(self.count - 1, 1)


def masked_moments(values, mask):
    """Moments over the leading axis of the entries where `mask` holds (values broadcast to it)."""
    count = jnp.sum(mask, axis=0, dtype=jnp.float32)
    kept = jnp.where(mask, values, 0.0)  # where, not a product: masked entries may be inf
    mean = jnp.sum(kept, axis=0) / jnp.maximum(count, 1.0)
    return Moments(count, mean, jnp.sum(jnp.where(mask, (values - mean) ** 2, 0.0), axis=0))


def merge_moments(a, b):
    """Chan et al.'s pairwise update: stable for long streams in float32; empty sides are fine."""
    count = a.count + b.count
    delta = b.mean - a.mean
    share = b.count / jnp.maximum(count, 1.0)
    return Moments(count, a.mean + delta * share, a.m2 + b.m2 + delta**2 * a.count * share)


def grouped_moments(values, local, valid, window):
    """Moments [window] of the `valid` values per local group id in [0, window), as the masked
    two-pass form computes them (deviations from each group's mean), through [rows, window]
    one-hot products: matrix products run several times faster on CPU than masked reductions
    along the rows. Products would spread a non-finite value into every group (inf * 0), so a
    chunk holding one takes the masked form."""
    finite = jnp.all(jnp.where(valid, jnp.isfinite(values), True))

    def products():
        onehot = ((local[:, None] == jnp.arange(window)) & valid[:, None]).astype(values.dtype)
        kept = jnp.where(valid, values, 0.0)
        count = jnp.sum(onehot, axis=0)
        mean = (kept @ onehot) / jnp.maximum(count, 1.0)
        deviation = jnp.where(valid, kept - onehot @ mean, 0.0)
        return Moments(count, mean, (deviation * deviation) @ onehot)

    masked = lambda: masked_moments(values[:, None], valid[:, None] & (local[:, None] == jnp.arange(window)))
    return jax.lax.cond(finite, products, masked)


def window_moments(values, local, valid, window, single):
    """Moments [window] of the `valid` values per local group id. `single`: every valid row is
    in group 0 (most chunks of a large estimate), a reduction over the rows alone."""
    one_group = lambda: Moments(*(jnp.pad(a, (0, window - 1)) for a in masked_moments(values[:, None], valid[:, None])))
    return jax.lax.cond(single, one_group, lambda: grouped_moments(values, local, valid, window))


def level_moments(key, summand, counts, chunk, positions=False):
    """Moments of summand(key, segment, levels [chunk], chunk) -> [chunk] per group of rows.

    counts [segments, copies, levels]: group (c, l) of segment s is counts[s, c, l] rows at
    level l. A segment's groups are laid end to end, copy after copy, as one stream of rows that
    runs in chunks of the static size `chunk`, each row tagged with its level; a chunk holds rows
    of up to WINDOW consecutive non-empty groups (empty ones, such as padding levels, take no
    place in the stream). So padding costs at most one chunk per segment, whatever the numbers
    of copies and levels, and many small estimates share chunks. Sizes are runtime
    values (a traced array is fine): one compiled program serves every size and schedule of a
    shape, and memory stays at one chunk. Returns Moments of shape [segments, copies, levels].

    positions=True: the summand returns (values, real positions of each row's trajectory), and the
    result is (Moments, summed positions [segments, copies, levels]): what trajectories that stop
    at EOS cost, counted as they are drawn.
    """
    counts = jnp.asarray(counts, jnp.int32)
    segments, copies, levels = counts.shape
    groups = copies * levels
    window = min(WINDOW, groups)

    def segment_body(segment, acc):
        # The stream runs over the non-empty groups, in order: `order[j]` is the j-th one's group.
        sizes = counts[segment].reshape(-1)
        order = jnp.argsort(sizes == 0, stable=True)
        ends = jnp.cumsum(sizes[order])
        total = ends[-1]
        # Padded so that a window starting at any group stays in bounds.
        window_ends = jnp.concatenate([ends, jnp.full(window, total)])
        segment_key = jax.random.fold_in(key, segment)

        def step(state):
            start, index, m, p = state
            first = jnp.sum(ends <= start)  # the group holding row `start` (empty groups skipped)
            local_ends = jax.lax.dynamic_slice(window_ends, (first,), (window,))
            stop = jnp.minimum(start + chunk, local_ends[-1])
            rows = start + jnp.arange(chunk)
            local = jnp.sum(rows[:, None] >= local_ends[None, :], axis=1)
            # Rows past `stop` are padding: they take the first group's level, so that a chunk of
            # one level's rows is seen as such (Algorithm 3's first level draws less).
            level = order[jnp.where(rows < stop, first + jnp.minimum(local, window - 1), first)] % levels
            out = summand(jax.random.fold_in(segment_key, index), segment, level, chunk)
            values = out[0] if positions else out
            seen = Moments(*(jax.lax.dynamic_slice(a, (first,), (window,)) for a in m))
            merged = merge_moments(seen, window_moments(values, local, rows < stop, window, stop <= local_ends[0]))
            m = Moments(*(jax.lax.dynamic_update_slice(a, b, (first,)) for a, b in zip(m, merged)))
            if positions:  # static: fixed-length estimators carry p untouched
                in_group = (rows < stop)[:, None] & (local[:, None] == jnp.arange(window))
                spent = jnp.sum(jnp.where(in_group, out[1][:, None].astype(jnp.float32), 0.0), axis=0)
                p = jax.lax.dynamic_update_slice(p, jax.lax.dynamic_slice(p, (first,), (window,)) + spent, (first,))
            return stop, index + 1, m, p

        zeros = jnp.zeros(groups + window)
        start = (jnp.int32(0), jnp.int32(0), Moments(zeros, zeros, zeros), zeros)
        _, _, m, p = jax.lax.while_loop(lambda state: state[0] < total, step, start)
        moments, spent = acc
        unordered = lambda a: jnp.zeros(groups).at[order].set(a[:groups])
        return (Moments(*(a.at[segment].set(unordered(b)) for a, b in zip(moments, m))),
                spent.at[segment].set(unordered(p)))

    zeros = jnp.zeros((segments, groups))
    with random_streams():
        moments, spent = jax.lax.fori_loop(0, segments, segment_body, (Moments(zeros, zeros, zeros), zeros))
    moments = Moments(*(a.reshape(segments, copies, levels) for a in moments))
    return (moments, spent.reshape(segments, copies, levels)) if positions else moments


def memory_chunk(process, oracle):
    """Most trajectories one chunk may hold: CHUNK_POSITIONS floats per oracle row, and no more
    than a process's own `max_chunk_rows` where it declares one (a language model's row holds
    activations and logits far beyond its n floats)."""
    rows = max(1, CHUNK_POSITIONS // oracle.row_size(process))
    cap = getattr(process, "max_chunk_rows", None)
    return rows if cap is None else min(rows, cap)


def stream_chunk(process, oracle, sizes):
    """Static chunk rows for a stream of `sizes` rows (an array of row counts), bounded by memory.
    Concrete sizes: the policy above. Traced sizes: the oracle's `traced_chunk_rows`."""
    cap = memory_chunk(process, oracle)
    if not all_concrete(sizes):
        return min(cap, oracle.traced_chunk_rows)
    rows = max(MIN_CHUNK_ROWS, math.ceil(int(np.sum(np.asarray(sizes, np.int64))) / CHUNKS_PER_STREAM))
    return min(cap, MAX_CHUNK_ROWS, 1 << (rows - 1).bit_length())
