"""TV estimates over a pool: symmetric estimate with bootstrap CI and decomposition, TV against
prefix length, TV against the repetition count with the self-noise floor (paper, Figures 2b, 3, B.6)."""

from typing import NamedTuple

import numpy as np

from tvjax.analysis.currency import (Hygiene, cell_log_means, check_grid, default_pair, sample_queries,
                                     path_logprobs, permutation_streams, powers_of_two, shuffle_repeats,
                                     z_values)
from tvjax.currency import likelihood_ratio_term
from tvjax.pools import Pool


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


def _mean_se(x: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    num = x.shape[axis]
    if num < 2:
        raise ValueError(f"need at least 2 trajectories per side for a standard error, got {num}")
    return x.mean(axis), x.std(axis, ddof=1) / np.sqrt(num)


def _symmetric(z_pi: np.ndarray, z_mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, stderr) of (mean z_pi + mean z_mu)/2 along axis 0 (independent strata)."""
    (m_pi, s_pi), (m_mu, s_mu) = _mean_se(z_pi), _mean_se(z_mu)
    return (m_pi + m_mu) / 2, np.sqrt(s_pi**2 + s_mu**2) / 2


def side_path_logprobs(pool: Pool, side: str, pair, grid) -> tuple[np.ndarray, np.ndarray]:
    """(L under pair[0], L under pair[1]) for trajectories of `side`, in serving order: [N, G] each."""
    return tuple(path_logprobs(pool.logprobs[side][scorer], grid) for scorer in pair)


def bootstrap_ci(rng: np.random.Generator, z_pi: np.ndarray, z_mu: np.ndarray, num_resamples: int,
                 confidence: float) -> tuple[float, float]:
    """Percentile CI of the symmetric mean, resampling trajectories within each side."""
    if not 0 < confidence < 1 or num_resamples < 10:
        raise ValueError(f"need 0 < confidence < 1 and num_resamples >= 10, got {confidence}, {num_resamples}")
    boot = sum(z[rng.integers(0, len(z), (num_resamples, len(z)))].mean(axis=1) for z in (z_pi, z_mu)) / 2
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(boot, [tail, 100 - tail])
    return float(low), float(high)


def tv_estimate(pool: Pool, pair=None, repeats: int | None = None, num_resamples: int = 2000,
                confidence: float = 0.95, seed: int = 0) -> TVReport:
    """Symmetric plug-in TV from the first `repeats` stored passes (default all) of each scorer."""
    pair = default_pair(pool, pair)
    r = int(pool.passes.size if repeats is None else repeats)
    logs = {s: side_path_logprobs(pool, s, pair, [r]) for s in ("pi", "mu")}
    z = {s: z_values(la[:, 0], lb[:, 0]) for s, (la, lb) in logs.items()}
    miss = {s: np.isneginf(la[:, 0]) | np.isneginf(lb[:, 0]) for s, (la, lb) in logs.items()}
    value, stderr = _symmetric(z["pi"], z["mu"])
    (arm_pi, se_pi), (arm_mu, se_mu) = _mean_se(z["pi"]), _mean_se(z["mu"])
    mismatch = (miss["pi"].mean() + miss["mu"].mean()) / 2
    shared = (np.where(miss["pi"], 0.0, z["pi"]).mean() + np.where(miss["mu"], 0.0, z["mu"]).mean()) / 2
    la_pi, lb_pi = logs["pi"]
    la_mu, lb_mu = logs["mu"]
    lr_pi = float(np.mean(likelihood_ratio_term(la_pi[:, 0], lb_pi[:, 0])))
    lr_mu = float(np.mean(likelihood_ratio_term(lb_mu[:, 0], la_mu[:, 0])))
    low, high = bootstrap_ci(np.random.default_rng(seed), z["pi"], z["mu"], num_resamples, confidence)
    sizes = (len(z["pi"]), len(z["mu"]))
    queries = sample_queries(pool.spec.n, r, sides=1) * (sizes[0] + sizes[1])
    return TVReport(float(value), float(stderr), low, high, float(arm_pi), float(se_pi), float(arm_mu),
                    float(se_mu), float(shared), float(mismatch), float(miss["pi"].mean()),
                    float(miss["mu"].mean()), lr_pi, lr_mu, r, sizes, int(queries), pair)


def tv_by_prefix(pool: Pool, pair=None, repeats: int | None = None) -> PrefixCurve:
    """TV between the length-t prefix marginals for every t, from the same trajectories and draws."""
    pair = default_pair(pool, pair)
    r = int(pool.passes.size if repeats is None else repeats)
    z, miss = {}, {}
    for side in ("pi", "mu"):
        la, lb = (np.cumsum(cell_log_means(pool.logprobs[side][s], [r])[..., 0], axis=1) for s in pair)
        z[side], miss[side] = z_values(la, lb), np.isneginf(la) | np.isneginf(lb)
    value, stderr = _symmetric(z["pi"], z["mu"])
    mismatch = (miss["pi"].mean(0) + miss["mu"].mean(0)) / 2
    return PrefixCurve(np.arange(1, pool.spec.n + 1), value, stderr, z["pi"].mean(0), z["mu"].mean(0), mismatch)


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
            draws = [shuffle_repeats(rng, pool.logprobs[side][s])[0] for s in pair]
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
