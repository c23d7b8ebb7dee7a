"""Oracle-noise calibration over a pool: the union-support chi-square of appendix B.3 and the
empirical top-k support union of appendix B.4."""

from typing import NamedTuple

import numpy as np

from tvjax.pools.analysis.currency import Hygiene, check_scorer, permutation_streams, real_cells
from tvjax.pools.store import SIDES, Pool

PERCENTILES = (50.0, 90.0, 99.0, 100.0)
_MAX_ELEMENTS = 2**21  # bound on the top-k entries of one vectorized row block (memory)


class SigmaCalibration(NamedTuple):
    """Per-call relative noise sigma of one scorer (B.3).

    Per (trajectory, position) cell, with pA / pB the mean next-token distributions of two halves
    of the (permuted) repeats and pbar = (pA + pB)/2, sigma2_cell = (R/4) sum_b (pA_b - pB_b)^2 /
    pbar_b over the union of the cell's top-k ids; sigma2 is the mean over the cells whose pooled
    distribution is not a point mass (variance-type aggregation), averaged over permutations.
    `realized_*` is the same functional restricted to the realized token (no top-k needed);
    `union_*` fields are None when the pool has no top-k readout. Percentiles (50, 90, 99, max) are
    of per-cell values across cells.
    """

    scorer: str
    realized_sigma: float
    realized_sigma2: float
    realized_sigma2_stderr: float
    realized_percentiles: np.ndarray
    union_sigma: float | None
    union_sigma2: float | None
    union_sigma2_stderr: float | None
    union_percentiles: np.ndarray | None
    union_median: float | None
    num_cells: int
    nondegenerate_fraction: float
    repeats: int


class SupportUnion(NamedTuple):
    """Size of the union of the per-pass top-k sets (ids with positive mass) over the first r
    passes of each cell (B.4), averaged over permutations: mean / p99 / max across cells, [R] each."""

    scorer: str
    repeats: np.ndarray
    mean: np.ndarray
    p99: np.ndarray
    max: np.ndarray
    top_k: int


def _row_blocks(num_rows: int, per_row: int):
    step = max(1, _MAX_ELEMENTS // max(per_row, 1))
    return [slice(a, min(a + step, num_rows)) for a in range(0, num_rows, step)]


def pass_ranks(rng: np.random.Generator | None, num_cells: int, num_passes: int) -> np.ndarray:
    """Position of every pass after an independent uniform permutation per cell ([C, R]); serving
    order (rank = pass index) when rng is None."""
    if rng is None:
        return np.broadcast_to(np.arange(num_passes), (num_cells, num_passes))
    return np.argsort(rng.random((num_cells, num_passes), dtype=np.float32), axis=1)


class IdSegments(NamedTuple):
    """The positive-mass top-k entries of a block of cells, grouped by (cell, token id).

    entry_cell / entry_pass / weight [E]: cell, pass and probability of each entry, in group
    order; starts [S]: first entry of each group; segment_cell [S]: its cell. Built once (one sort);
    every permutation then only regroups passes, never re-sorts ids."""

    entry_cell: np.ndarray
    entry_pass: np.ndarray
    weight: np.ndarray
    starts: np.ndarray
    segment_cell: np.ndarray
    num_cells: int
    num_passes: int


def id_segments(ids: np.ndarray, logprobs: np.ndarray) -> IdSegments:
    """Group the entries of ids / logprobs [..., R, k] (cells = leading axes) by (cell, id)."""
    num_passes, k = ids.shape[-2:]
    ids = ids.reshape(-1, num_passes * k).astype(np.int64)
    cells = ids.shape[0]
    cell, slot = np.nonzero(np.isfinite(logprobs.reshape(cells, num_passes * k)))
    cell, slot = cell.astype(np.int32), slot.astype(np.int32)
    key = cell.astype(np.int64) * (int(ids.max(initial=0)) + 1) + ids[cell, slot]
    order = np.argsort(key, kind="stable")
    cell, slot, key = cell[order], slot[order], key[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, np.int64)
    weight = np.exp(logprobs.reshape(cells, -1)[cell, slot].astype(np.float64))
    return IdSegments(cell, slot // k, weight, starts, cell[starts], cells, num_passes)


def union_chi2(seg: IdSegments, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union-support half-split chi-square per cell ([C]) and the mask of non-degenerate cells.

    Passes of rank < R/2 form half A, the next R/2 half B; per id, pA / pB are the half means of
    its probability (0 in passes where it is outside the top-k); sigma2_cell =
    (R/4) sum_ids (pA - pB)^2 / pbar over ids with pbar > 0; non-degenerate: at least two such ids.
    """
    half = seg.num_passes // 2
    rank = ranks[seg.entry_cell, seg.entry_pass]
    if seg.starts.size == 0:
        return np.zeros(seg.num_cells), np.zeros(seg.num_cells, bool)
    p_a = np.add.reduceat(np.where(rank < half, seg.weight, 0.0), seg.starts) / half
    p_b = np.add.reduceat(np.where((rank >= half) & (rank < 2 * half), seg.weight, 0.0), seg.starts) / half
    p_bar = (p_a + p_b) / 2
    live = p_bar > 0
    terms = np.where(live, (p_a - p_b) ** 2 / np.where(live, p_bar, 1.0), 0.0)
    chi2 = (half / 2) * np.bincount(seg.segment_cell, terms, minlength=seg.num_cells)
    return chi2, np.bincount(seg.segment_cell, live, minlength=seg.num_cells) >= 2


def realized_chi2(draws: np.ndarray, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Realized-token half-split chi-square per cell and the mask of usable cells (0 < pbar < 1).

    draws: [C, R] log-probabilities; ranks as in `union_chi2`.
    """
    half = draws.shape[-1] // 2
    probs = np.exp(draws.astype(np.float64))
    p_a = np.where(ranks < half, probs, 0.0).sum(axis=-1) / half
    p_b = np.where((ranks >= half) & (ranks < 2 * half), probs, 0.0).sum(axis=-1) / half
    p_bar = (p_a + p_b) / 2
    usable = (p_bar > 0) & (p_bar < 1 - 1e-9)
    chi2 = np.where(usable, (half / 2) * (p_a - p_b) ** 2 / np.where(usable, p_bar, 1.0), 0.0)
    return chi2, usable


def _aggregate(cells: np.ndarray, mask: np.ndarray):
    """(mean, stderr, percentiles, median) of the per-cell values over the masked cells."""
    cells = cells[mask]
    if cells.size < 2:
        raise ValueError(f"sigma calibration needs at least 2 cells with a non-degenerate distribution, got {cells.size}")
    mean = float(cells.mean())
    return mean, float(cells.std(ddof=1) / np.sqrt(cells.size)), np.percentile(cells, PERCENTILES), float(np.median(cells))


def _blocks(pool: Pool, scorer: str, with_topk: bool):
    """(realized draws [C, R], IdSegments or None, real [C]) per row block of both sides, built
    lazily so only one block's entries are in memory at a time; `real` marks the cells up to EOS
    (the cells after it are the pad, a point mass, and stay out of every statistic)."""
    for side in SIDES:
        draws, real = pool.logprobs[side][scorer], real_cells(pool, side)
        for rows in _row_blocks(draws.shape[0], draws[0].size * (pool.spec.top_k or 1)):
            seg = id_segments(pool.topk_ids[side][scorer][rows], pool.topk_logprobs[side][scorer][rows]) \
                if with_topk else None
            yield draws[rows].reshape(-1, draws.shape[-1]), seg, real[rows].reshape(-1)


def _permutation_mean(values: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-cell mean over permutations of (value, usable) pairs; usable in every permutation."""
    return np.mean([v for v, _ in values], axis=0), np.logical_and.reduce([m for _, m in values])


def calibrate_sigma(pool: Pool, scorer: str, hygiene: Hygiene = Hygiene()) -> SigmaCalibration:
    """Sigma of `scorer` from the half-split of its repeats on the trajectories of both sides,
    averaged per cell over repeat permutations, then over cells."""
    check_scorer(pool, scorer)
    num_r = pool.passes.size
    if num_r < 2:
        raise ValueError("sigma calibration needs at least 2 stored repeats")
    with_topk = pool.topk_ids is not None
    streams = list(permutation_streams(hygiene))
    realized, union, real = [], [], []
    for draws, seg, block_real in _blocks(pool, scorer, with_topk):
        ranks = [pass_ranks(rng, draws.shape[0], num_r) for rng in streams]
        realized.append(_permutation_mean([realized_chi2(draws, rk) for rk in ranks]))
        if with_topk:
            union.append(_permutation_mean([union_chi2(seg, rk) for rk in ranks]))
        real.append(block_real)
    real = np.concatenate(real)
    token_cells, token_mask = (np.concatenate(x) for x in zip(*realized))
    r_mean, r_se, r_pct, _ = _aggregate(token_cells, token_mask & real)
    if with_topk:
        union_cells, union_mask = (np.concatenate(x) for x in zip(*union))
        u_mean, u_se, u_pct, u_med = _aggregate(union_cells, union_mask & real)
        u_sigma, frac = float(np.sqrt(u_mean)), float(union_mask[real].mean())
    else:
        u_mean = u_se = u_pct = u_med = u_sigma = None
        frac = float(token_mask[real].mean())
    return SigmaCalibration(scorer, float(np.sqrt(r_mean)), r_mean, r_se, r_pct, u_sigma, u_mean, u_se, u_pct,
                            u_med, int(real.sum()), frac, 2 * (num_r // 2))


def union_sizes(seg: IdSegments, ranks: np.ndarray) -> np.ndarray:
    """Union size of the top-k sets (positive-mass ids) over the first r passes, r = 1..R: [C, R].

    Each distinct id of a cell counts from the earliest rank at which it appears: a segment minimum
    of the ranks, histogrammed per cell and cumulated.
    """
    counts = np.zeros(seg.num_cells * seg.num_passes, np.int64)
    if seg.starts.size:
        first = np.minimum.reduceat(ranks[seg.entry_cell, seg.entry_pass], seg.starts)
        counts = np.bincount(seg.segment_cell * seg.num_passes + first, minlength=counts.size)
    return np.cumsum(counts.reshape(seg.num_cells, seg.num_passes), axis=1)


def support_union(pool: Pool, scorer: str, hygiene: Hygiene = Hygiene()) -> SupportUnion:
    """Union of top-k sets against r = 1..R over the real cells (up to EOS) of both sides (B.4)."""
    check_scorer(pool, scorer)
    if pool.topk_ids is None:
        raise ValueError("the support-union measurement needs a pool with a top-k readout (spec.top_k)")
    streams = list(permutation_streams(hygiene))
    sizes = [[] for _ in streams]  # per permutation, per block: int32 [C, R]
    for _, seg, real in _blocks(pool, scorer, True):
        for acc, rng in zip(sizes, streams):
            acc.append(union_sizes(seg, pass_ranks(rng, seg.num_cells, seg.num_passes))[real].astype(np.int32))
    sizes = [np.concatenate(s) for s in sizes]
    return SupportUnion(scorer, np.arange(1, pool.passes.size + 1), np.mean([s.mean(0) for s in sizes], 0),
                        np.mean([np.percentile(s, 99, axis=0) for s in sizes], 0), np.max([s.max(0) for s in sizes], 0),
                        int(pool.spec.top_k))
