"""The streaming reduction under every synthetic estimator, and its chunk policy.

Trajectories are drawn, reduced and discarded chunk by chunk inside jit: no [N, n, R] array
exists. `level_moments` lays groups of rows (copy, level) end to end, level after level, as one
stream that runs in chunks of a static size, and keeps running moments per group (`range_moments`).
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.sharding import random_streams
from tvjax.core.validate import all_concrete, check_positive_int

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


def _block_rows(rows):
    """Rows per block for `range_moments`: about the square root of the chunk, a power of two,
    so that the per-block pass over the chunk and the per-range passes over a block or two
    cost about the same."""
    return 1 << max(0, (max(rows, 1).bit_length() - 1) // 2)


def range_moments(values, lo, hi):
    """Moments [ranges] of values[lo[j]:hi[j]] for ranges that do not overlap (lo, hi [ranges],
    0 <= lo <= hi <= len(values); rows outside every range are never read into one).

    The chunk is cut into blocks of about sqrt(rows) rows. A block lying wholly inside a range
    enters it through the block's own two-pass moments, merged by Chan et al.'s formula; the
    rows of a range in a block it only partly covers (its head and its tail) enter by masked
    two-pass moments over that one block. So the cost is one pass over the rows plus a few
    blocks per range, where a per-row group label needs [rows, ranges] work, and every sum runs
    over one range's rows only: a non-finite value stays in its own range."""
    rows = values.shape[0]
    size = _block_rows(rows)
    shift = size.bit_length() - 1  # size is a power of two and lo, hi >= 0: shifts, not jnp's floor division
    blocks = -(-rows // size)
    grid = jnp.pad(values, (0, blocks * size - rows)).reshape(blocks, size)
    block_mean = jnp.mean(grid, axis=1)
    block = Moments(jnp.full(blocks, float(size)), block_mean, jnp.sum((grid - block_mean[:, None]) ** 2, axis=1))
    lo, hi = jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32)
    first_full = ((lo + size - 1) >> shift) << shift  # the first block boundary at or past lo
    last_full = (hi >> shift) << shift  # the last block boundary at or before hi
    spans_blocks = first_full <= last_full
    starts = jnp.arange(blocks, dtype=jnp.int32) * size
    inside = (starts >= first_full[:, None]) & (starts + size <= last_full[:, None])  # [ranges, blocks]
    full = _merged_blocks(block, inside)

    def partial(begin, end):
        # Rows [begin, end) of each range, all in the block holding `begin` (empty when begin >= end).
        index = jnp.minimum(begin >> shift, blocks - 1)
        where = index[:, None] * size + jnp.arange(size, dtype=jnp.int32)
        return masked_moments(grid[index].T, ((where >= begin[:, None]) & (where < end[:, None])).T)

    head = partial(lo, jnp.where(spans_blocks, first_full, hi))
    tail = partial(jnp.where(spans_blocks, last_full, hi), hi)
    return _combine((head, full, tail))


def _merged_blocks(block, inside):
    """Moments [ranges] of the blocks marked `inside` [ranges, blocks] (each block's Moments)."""
    count = jnp.sum(jnp.where(inside, block.count, 0.0), axis=1)
    mean = jnp.sum(jnp.where(inside, block.count * block.mean, 0.0), axis=1) / jnp.maximum(count, 1.0)
    spread = block.m2 + block.count * (block.mean - mean[:, None]) ** 2
    return Moments(count, mean, jnp.sum(jnp.where(inside, spread, 0.0), axis=1))


def _combine(parts):
    """One Moments from disjoint parts, in one step (their means weighted, then the spread of the
    means): exact where a part is empty, and a part's inf mean stays inf."""
    count = sum(part.count for part in parts)
    total = sum(jnp.where(part.count > 0, part.count * part.mean, 0.0) for part in parts)
    mean = total / jnp.maximum(count, 1.0)
    m2 = sum(jnp.where(part.count > 0, part.m2 + part.count * (part.mean - mean) ** 2, 0.0) for part in parts)
    return Moments(count, mean, m2)


def level_moments(key, summand, counts, chunk, positions=False):
    """Moments of summand(key, segment, levels [chunk], chunk) -> [chunk] per group of rows.

    counts [segments, copies, levels]: group (c, l) of segment s is counts[s, c, l] rows at
    level l. A segment's groups are laid end to end, level after level, as one stream of rows that
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
        # Level major: every copy's first level, then every copy's second, ... so that most chunks
        # hold one level's rows (Algorithm 3 draws less for a chunk of first-level rows).
        sizes = counts[segment].T.reshape(-1)
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
            # The window's groups as row ranges of this chunk: group j ends at local_ends[j].
            begins = jnp.concatenate([start[None], local_ends[:-1]])
            lo = jnp.clip(begins - start, 0, chunk)
            hi = jnp.clip(jnp.minimum(local_ends, stop) - start, lo, chunk)
            # A row's group only matters for its level (and its positions): none for one level.
            local = jnp.sum(rows[:, None] >= local_ends[None, :], axis=1) if levels > 1 or positions else None
            # Rows past `stop` are padding: they take the first group's level, so that a chunk of
            # one level's rows is seen as such (Algorithm 3's first level draws less).
            # lax.div truncates, which is floor division here (group numbers are >= 0) without
            # jnp's sign corrections.
            level = (jax.lax.div(order[jnp.where(rows < stop, first + jnp.minimum(local, window - 1), first)], jnp.int32(copies))
                     if levels > 1 else jnp.zeros(chunk, jnp.int32))
            out = summand(jax.random.fold_in(segment_key, index), segment, level, chunk)
            values = out[0] if positions else out
            seen = Moments(*(jax.lax.dynamic_slice(a, (first,), (window,)) for a in m))
            merged = merge_moments(seen, range_moments(values, lo, hi))
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
    by_copy = lambda a: jnp.swapaxes(a.reshape(segments, levels, copies), 1, 2)
    moments = Moments(*(by_copy(a) for a in moments))
    return (moments, by_copy(spent)) if positions else moments


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


def chosen_chunk(chunk, process, oracle, sizes):
    """An estimator's `chunk` argument: None picks `stream_chunk`; otherwise any number of rows
    >= 1. It need not divide the batch: the stream's last step reduces the rows that are left,
    and every group's moments cover exactly its own rows."""
    if chunk is None:
        return stream_chunk(process, oracle, sizes)
    return check_positive_int("chunk (rows per step)", chunk)
