"""Oracle-noise calibration over a pool: the union-support chi-square of appendix B.3 and the
empirical top-k support union of appendix B.4."""

from typing import NamedTuple

import numpy as np

from tvjax.analysis.currency import Hygiene, permutation_streams, shuffle_repeats
from tvjax.pools import SIDES, Pool

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


def _half_means(probs: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray]:
    return probs[:, :, :half].mean(axis=2), probs[:, :, half:2 * half].mean(axis=2)


def realized_chi2(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Realized-token half-split chi-square per cell and the mask of usable cells (0 < pbar < 1).

    draws: [N, n, R] log-probabilities in the order to split (first half vs second half).
    """
    half = draws.shape[-1] // 2
    p_a, p_b = _half_means(np.exp(draws.astype(np.float64)), half)
    p_bar = (p_a + p_b) / 2
    usable = (p_bar > 0) & (p_bar < 1 - 1e-9)
    chi2 = np.where(usable, (half / 2) * (p_a - p_b) ** 2 / np.where(usable, p_bar, 1.0), 0.0)
    return chi2, usable


def union_chi2(ids: np.ndarray, logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union-support half-split chi-square per cell and the mask of non-degenerate cells.

    ids / logprobs: [N, n, R, k] top-k readouts in the order to split. Ids are pooled per cell by
    sorting; each id's half means are segment sums. Returns ([N, n], bool [N, n]).
    """
    num, n, num_r, k = ids.shape
    half = num_r // 2
    weight = np.exp(logprobs[:, :, :2 * half].astype(np.float64)) / half  # each pass weighs 1/half
    in_a = np.arange(2 * half) < half
    flat_ids = ids[:, :, :2 * half].reshape(num * n, 2 * half * k)
    w_a = np.where(in_a[None, :, None], weight.reshape(num * n, 2 * half, k), 0.0).reshape(num * n, -1)
    w_b = np.where(~in_a[None, :, None], weight.reshape(num * n, 2 * half, k), 0.0).reshape(num * n, -1)
    order = np.argsort(flat_ids, axis=1, kind="stable")
    sid = np.take_along_axis(flat_ids, order, axis=1)
    cum_a = np.cumsum(np.take_along_axis(w_a, order, axis=1), axis=1)
    cum_b = np.cumsum(np.take_along_axis(w_b, order, axis=1), axis=1)
    is_end = np.ones_like(sid, dtype=bool)
    is_end[:, :-1] = sid[:, 1:] != sid[:, :-1]
    # cumulative sums are nondecreasing, so a running max of the values at segment ends gives the
    # cumulative sum just before each segment
    prev_a = np.maximum.accumulate(np.where(is_end, cum_a, 0.0), axis=1)
    prev_b = np.maximum.accumulate(np.where(is_end, cum_b, 0.0), axis=1)
    seg_a = cum_a - np.concatenate([np.zeros((num * n, 1)), prev_a[:, :-1]], axis=1)
    seg_b = cum_b - np.concatenate([np.zeros((num * n, 1)), prev_b[:, :-1]], axis=1)
    p_bar = (seg_a + seg_b) / 2
    live = is_end & (p_bar > 0)
    terms = np.where(live, (seg_a - seg_b) ** 2 / np.where(live, p_bar, 1.0), 0.0)
    chi2 = (half / 2) * terms.sum(axis=1)
    nondegenerate = live.sum(axis=1) >= 2
    return chi2.reshape(num, n), nondegenerate.reshape(num, n)


def _aggregate(per_perm: list[np.ndarray], mask: np.ndarray):
    """Mean over permutations per cell, then (mean, stderr, percentiles, median) over masked cells."""
    cells = np.mean(per_perm, axis=0)[mask]
    if cells.size < 2:
        raise ValueError(f"sigma calibration needs at least 2 cells with a non-degenerate distribution, got {cells.size}")
    mean = float(cells.mean())
    return mean, float(cells.std(ddof=1) / np.sqrt(cells.size)), np.percentile(cells, PERCENTILES), float(np.median(cells))


def calibrate_sigma(pool: Pool, scorer: str, hygiene: Hygiene = Hygiene()) -> SigmaCalibration:
    """Sigma of `scorer` from the half-split of its repeats on the trajectories of both sides."""
    num_r = pool.passes.size
    if num_r < 2:
        raise ValueError("sigma calibration needs at least 2 stored repeats")
    with_topk = pool.topk_ids is not None
    realized, union = [], []
    real_mask = union_mask = None
    for rng in permutation_streams(hygiene):
        r_cells, u_cells, r_masks, u_masks = [], [], [], []
        for side in SIDES:
            draws = pool.logprobs[side][scorer]
            for rows in _row_blocks(draws.shape[0], draws[0].size * (pool.spec.top_k or 1)):
                arrays = [draws[rows]] + ([pool.topk_ids[side][scorer][rows],
                                          pool.topk_logprobs[side][scorer][rows]] if with_topk else [])
                arrays = shuffle_repeats(rng, *arrays)
                chi2, usable = realized_chi2(arrays[0])
                r_cells.append(chi2.ravel()), r_masks.append(usable.ravel())
                if with_topk:
                    chi2, live = union_chi2(arrays[1], arrays[2])
                    u_cells.append(chi2.ravel()), u_masks.append(live.ravel())
        realized.append(np.concatenate(r_cells))
        real_mask = np.concatenate(r_masks)
        if with_topk:
            union.append(np.concatenate(u_cells))
            union_mask = np.concatenate(u_masks)
    r_mean, r_se, r_pct, _ = _aggregate(realized, real_mask)
    if with_topk:
        u_mean, u_se, u_pct, u_med = _aggregate(union, union_mask)
        u_sigma, frac = float(np.sqrt(u_mean)), float(union_mask.mean())
    else:
        u_mean = u_se = u_pct = u_med = u_sigma = None
        frac = float(real_mask.mean())
    return SigmaCalibration(scorer, float(np.sqrt(r_mean)), r_mean, r_se, r_pct, u_sigma, u_mean, u_se, u_pct,
                            u_med, int(real_mask.size), frac, 2 * (num_r // 2))


def union_sizes(ids: np.ndarray, logprobs: np.ndarray) -> np.ndarray:
    """Union size of the top-k sets (positive-mass ids) over the first r passes, r = 1..R: [N, n, R].

    A cell's distinct ids are counted at the pass where each first appears: sort (id, pass) keys,
    keep each id's first occurrence, histogram those passes, cumulate.
    """
    num, n, num_r, k = ids.shape
    cells = num * n
    passes = np.broadcast_to(np.arange(num_r)[:, None], (num_r, k))
    valid = np.isfinite(logprobs).reshape(cells, num_r * k)
    keys = ids.reshape(cells, num_r * k).astype(np.int64) * num_r + passes.reshape(1, -1)
    sentinel = np.iinfo(np.int64).max
    keys = np.sort(np.where(valid, keys, sentinel), axis=1)
    first = np.ones_like(keys, dtype=bool)
    first[:, 1:] = (keys[:, 1:] // num_r) != (keys[:, :-1] // num_r)
    first &= keys != sentinel
    cell_idx = np.broadcast_to(np.arange(cells)[:, None], keys.shape)
    counts = np.bincount((cell_idx * num_r + keys % num_r)[first], minlength=cells * num_r)
    return np.cumsum(counts.reshape(cells, num_r), axis=1).reshape(num, n, num_r)


def support_union(pool: Pool, scorer: str, hygiene: Hygiene = Hygiene()) -> SupportUnion:
    """Union of top-k sets against r = 1..R over all cells of both sides (B.4)."""
    if pool.topk_ids is None:
        raise ValueError("the support-union measurement needs a pool with a top-k readout (spec.top_k)")
    means, p99s, maxes = [], [], []
    for rng in permutation_streams(hygiene):
        sizes = []
        for side in SIDES:
            ids, lps = pool.topk_ids[side][scorer], pool.topk_logprobs[side][scorer]
            for rows in _row_blocks(ids.shape[0], ids[0].size):
                _, i, lp = shuffle_repeats(rng, pool.logprobs[side][scorer][rows], ids[rows], lps[rows])
                sizes.append(union_sizes(i, lp).reshape(-1, ids.shape[2]))
        sizes = np.concatenate(sizes)
        means.append(sizes.mean(0)), p99s.append(np.percentile(sizes, 99, axis=0)), maxes.append(sizes.max(0))
    return SupportUnion(scorer, np.arange(1, pool.passes.size + 1), np.mean(means, 0), np.mean(p99s, 0),
                        np.max(maxes, 0), int(pool.spec.top_k))
