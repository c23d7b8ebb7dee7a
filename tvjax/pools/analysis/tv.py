"""TV estimates over a pool: symmetric estimate with bootstrap CI and decomposition, TV against
prefix length, TV against the repetition count with the self-noise floor (paper, Figures 2b, 3, B.6)."""

from typing import NamedTuple

import numpy as np

from tvjax.pools.analysis.currency import (
    Hygiene,
    cell_log_means,
    check_grid,
    default_pair,
    lr_values,
    path_logprobs,
    permutation_streams,
    pool_queries,
    powers_of_two,
    shuffle_repeats,
    z_values,
)
from tvjax.pools.store import SIDES, Pool


class TVReport(NamedTuple):
    """Symmetric TV estimate (value = (arm_pi + arm_mu) / 2, arm_s = mean of Z over X ~ s) with its
    stratified stderr and bootstrap CI, split into the shared-support part and the support-mismatch
    part (trajectories where a model's r-averaged mass is zero, Z = 1): value == shared + mismatch.
    lr_pi / lr_mu are the one-sided likelihood-ratio arms (Algorithm 1) for comparison."""

    value: float
    stderr: float
    ci_low: float
    ci_high: float
    arm_pi: float
    arm_pi_stderr: float
    arm_mu: float
    arm_mu_stderr: float
    shared: float
    mismatch: float
    mismatch_rate_pi: float
    mismatch_rate_mu: float
    lr_pi: float
    lr_mu: float
    repeats: int
    num_per_side: tuple[int, int]
    queries: int
    pair: tuple[str, str]


class PrefixCurve(NamedTuple):
    """TV of the prefix marginals against t = 1..n (Figure 3a), each [n]."""

    lengths: np.ndarray
    value: np.ndarray
    stderr: np.ndarray
    arm_pi: np.ndarray
    arm_mu: np.ndarray
    mismatch: np.ndarray


class RepeatCurve(NamedTuple):
    """Estimated TV against the repetition count r (Figure 2b), averaged over repeat permutations,
    beside the self-noise floor of each scorer: the estimated TV between two disjoint halves of the
    same scorer's repeats at r (r <= R/2), which tends to 0 as r grows for any noisy oracle."""

    repeats: np.ndarray
    value: np.ndarray
    stderr: np.ndarray
    floor_repeats: np.ndarray
    floor: dict
    floor_stderr: dict
    pair: tuple[str, str]
    permuted: bool


def mean_stderr(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of the mean along `axis` (at least 2 samples)."""
    num = x.shape[axis]
    if num < 2:
        raise ValueError(f"need at least 2 trajectories per side for a standard error, got {num}")
    return x.mean(axis), x.std(axis, ddof=1) / np.sqrt(num)


def _symmetric(z_pi: np.ndarray, z_mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, stderr) of (mean z_pi + mean z_mu)/2 along axis 0 (independent strata)."""
    (m_pi, s_pi), (m_mu, s_mu) = mean_stderr(z_pi), mean_stderr(z_mu)
    return (m_pi + m_mu) / 2, np.sqrt(s_pi**2 + s_mu**2) / 2


def prefix_terms(pool: Pool, pair, repeats: int, hygiene: Hygiene) -> dict:
    """Per side, per trajectory and prefix length t: (Z, mismatch indicator, Z off the mismatch,
    likelihood-ratio term) from the r-averages of the first `repeats` passes, each [N, n], averaged
    over repeat permutations (one pass suffices when repeats = R: the full average ignores order)."""
    num_r = pool.passes.size
    if not 1 <= repeats <= num_r:
        raise ValueError(f"repeats must be in [1, {num_r}], got {repeats}")
    streams = [None] if repeats == num_r else list(permutation_streams(hygiene))
    terms = {}
    for side in SIDES:
        acc = 0.0
        for rng in streams:
            la, lb = (np.cumsum(cell_log_means(shuffle_repeats(rng, pool.logprobs[side][s]), [repeats])[..., 0],
                                axis=1) for s in pair)
            own, other = (la, lb) if side == SIDES[0] else (lb, la)
            z, miss = z_values(la, lb), np.isneginf(la) | np.isneginf(lb)
            acc = acc + np.stack([z, miss, np.where(miss, 0.0, z), lr_values(own, other)])
        terms[side] = tuple(acc / len(streams))
    return terms


def bootstrap_ci(rng: np.random.Generator, z_pi: np.ndarray, z_mu: np.ndarray, num_resamples: int,
                 confidence: float) -> tuple[float, float]:
    """Percentile CI of the symmetric mean, resampling trajectories within each side."""
    if not 0 < confidence < 1 or num_resamples < 10:
        raise ValueError(f"need 0 < confidence < 1 and num_resamples >= 10, got {confidence}, {num_resamples}")
    boot = sum(z[rng.integers(0, len(z), (num_resamples, len(z)))].mean(axis=1) for z in (z_pi, z_mu)) / 2
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(boot, [tail, 100 - tail])
    return float(low), float(high)


def tv_estimate(pool: Pool, pair=None, repeats: int | None = None, hygiene: Hygiene = Hygiene(),
                num_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> TVReport:
    """Symmetric plug-in TV from r = `repeats` passes (default all) of each scorer; for r < R the
    per-trajectory terms are averaged over repeat permutations before the bootstrap."""
    pair = default_pair(pool, pair)
    r = int(pool.passes.size if repeats is None else repeats)
    terms = {s: tuple(x[:, -1] for x in v) for s, v in prefix_terms(pool, pair, r, hygiene).items()}
    (z_pi, miss_pi, shared_pi, lr_pi), (z_mu, miss_mu, shared_mu, lr_mu) = terms["pi"], terms["mu"]
    value, stderr = _symmetric(z_pi, z_mu)
    (arm_pi, se_pi), (arm_mu, se_mu) = mean_stderr(z_pi), mean_stderr(z_mu)
    mismatch, shared = (miss_pi.mean() + miss_mu.mean()) / 2, (shared_pi.mean() + shared_mu.mean()) / 2
    low, high = bootstrap_ci(np.random.default_rng(seed), z_pi, z_mu, num_resamples, confidence)
    sizes = (len(z_pi), len(z_mu))
    queries = pool_queries(pool, r)
    return TVReport(float(value), float(stderr), low, high, float(arm_pi), float(se_pi), float(arm_mu),
                    float(se_mu), float(shared), float(mismatch), float(miss_pi.mean()),
                    float(miss_mu.mean()), float(lr_pi.mean()), float(lr_mu.mean()), r, sizes, int(queries), pair)


def tv_by_prefix(pool: Pool, pair=None, repeats: int | None = None, hygiene: Hygiene = Hygiene()) -> PrefixCurve:
    """TV between the length-t prefix marginals for every t, from the same trajectories and draws.
    A trajectory that stopped before t is its whole output in the prefix marginal (its padded
    positions are deterministic), so the curve ends at the TV of the outputs."""
    pair = default_pair(pool, pair)
    r = int(pool.passes.size if repeats is None else repeats)
    (z_pi, miss_pi, _, _), (z_mu, miss_mu, _, _) = prefix_terms(pool, pair, r, hygiene).values()
    value, stderr = _symmetric(z_pi, z_mu)
    mismatch = (miss_pi.mean(0) + miss_mu.mean(0)) / 2
    return PrefixCurve(np.arange(1, pool.spec.n + 1), value, stderr, z_pi.mean(0), z_mu.mean(0), mismatch)


def self_noise_z(draws: np.ndarray, grid) -> np.ndarray:
    """Z between two disjoint halves of one scorer's (already ordered) repeats at each r: [N, G]."""
    half = draws.shape[-1] // 2
    return z_values(path_logprobs(draws[..., :half], grid), path_logprobs(draws[..., half:2 * half], grid))


def tv_by_repeats(pool: Pool, pair=None, grid=None, hygiene: Hygiene = Hygiene()) -> RepeatCurve:
    """Estimated TV at each r in grid (default 1, 2, 4, ..., R) and each scorer's self-noise floor
    (r up to R/2), averaged over repeat-axis permutations."""
    pair = default_pair(pool, pair)
    num_r = pool.passes.size
    if num_r < 2:
        raise ValueError("the self-noise floor needs at least 2 stored repeats")
    grid = check_grid(powers_of_two(num_r) if grid is None else grid, num_r)
    floor_grid = grid[grid <= num_r // 2]
    values, errors = [], []
    floors = {s: [] for s in pair}
    floor_errors = {s: [] for s in pair}
    for rng in permutation_streams(hygiene):
        z, zf = {}, {s: {} for s in pair}
        for side in ("pi", "mu"):
            draws = [shuffle_repeats(rng, pool.logprobs[side][s]) for s in pair]
            z[side] = z_values(path_logprobs(draws[0], grid), path_logprobs(draws[1], grid))
            for s, d in zip(pair, draws):
                zf[s][side] = self_noise_z(d, floor_grid)
        v, e = _symmetric(z["pi"], z["mu"])
        values.append(v), errors.append(e)
        for s in pair:
            fv, fe = _symmetric(zf[s]["pi"], zf[s]["mu"])
            floors[s].append(fv), floor_errors[s].append(fe)
    return RepeatCurve(grid, np.mean(values, 0), np.mean(errors, 0), floor_grid,
                       {s: np.mean(v, 0) for s, v in floors.items()},
                       {s: np.mean(v, 0) for s, v in floor_errors.items()}, pair, hygiene.permute)
