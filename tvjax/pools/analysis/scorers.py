"""Scorer diagnostics over a pool: own-token zero-mass rates and the comparison of two scorers on
the same trajectories (the bias report of appendix B.5 / Figure 8)."""

from typing import NamedTuple

import numpy as np

from tvjax.pools.analysis.currency import default_pair, path_logprobs, real_cells
from tvjax.pools.analysis.tv import TVReport, mean_stderr, tv_estimate
from tvjax.pools.store import SIDES, Pool


class ZeroMassRates(NamedTuple):
    """Zero-mass rates from the r-average over all stored passes.

    `trajectory[side][scorer]`: fraction of `side`'s trajectories with at least one zero-mass
    position under `scorer`; `position[side][scorer]`: fraction of zero-mass positions among the
    real ones (up to EOS); own[scorer]:
    the trajectory rate of each sampler on its own side (0 for a faithful replay oracle)."""

    trajectory: dict
    position: dict
    own: dict


class ScorerComparison(NamedTuple):
    """Two scorer pairs on the same trajectories (B.5). delta = L_pi-scorer - L_mu-scorer per
    trajectory; the shift statistics use trajectories with finite delta under both pairs.
    compression = least-squares slope of delta_b on delta_a (< 1: b compresses the differences).
    repeat_variance[scorer]: mean over cells of the variance of the probability draws across
    passes over the real positions (a bias has ~0 repeat variance, noise does not)."""

    pair_a: tuple[str, str]
    pair_b: tuple[str, str]
    tv_a: TVReport
    tv_b: TVReport
    mismatch_a: float
    mismatch_b: float
    mean_abs_delta_a: float
    mean_abs_delta_b: float
    shift: float
    shift_stderr: float
    compression: float
    num_shared: int
    repeat_variance: dict


def _zero_positions(draws: np.ndarray) -> np.ndarray:
    return np.all(np.isneginf(draws), axis=-1)


def zero_mass_rates(pool: Pool) -> ZeroMassRates:
    """Trajectory- and position-level zero-mass rates of every loaded scorer on both sides."""
    scorers = list(pool.logprobs[SIDES[0]])
    zero = {s: {sc: _zero_positions(pool.logprobs[s][sc]) for sc in scorers} for s in SIDES}
    trajectory = {s: {sc: float(z.any(axis=1).mean()) for sc, z in zero[s].items()} for s in SIDES}
    position = {s: {sc: float(z[real_cells(pool, s)].mean()) for sc, z in zero[s].items()} for s in SIDES}
    own = {sc: trajectory[s][sc] for s, sc in zip(SIDES, pool.spec.samplers) if sc in scorers}
    return ZeroMassRates(trajectory, position, own)


def _deltas(pool: Pool, pair) -> np.ndarray:
    """L_pair[0] - L_pair[1] per trajectory of both sides (pi side first); +inf where either is zero mass."""
    out = []
    for side in SIDES:
        la, lb = (path_logprobs(pool.logprobs[side][s], [pool.passes.size])[:, 0] for s in pair)
        finite = np.isfinite(la) & np.isfinite(lb)
        out.append(np.where(finite, la - np.where(finite, lb, 0.0), np.inf))
    return np.concatenate(out)


def compare_scorers(pool: Pool, pair_b, pair_a=None) -> ScorerComparison:
    """Compare TV, zero mass and log-probability differences under pair_b against pair_a (default
    the samplers), e.g. a sequence-scoring API against replay scoring."""
    pair_a, pair_b = default_pair(pool, pair_a), default_pair(pool, pair_b)
    tv_a, tv_b = tv_estimate(pool, pair_a), tv_estimate(pool, pair_b)
    d_a, d_b = _deltas(pool, pair_a), _deltas(pool, pair_b)
    shared = np.isfinite(d_a) & np.isfinite(d_b)
    if shared.sum() < 2:
        raise ValueError(f"fewer than 2 trajectories have finite log-probabilities under both {pair_a} and {pair_b}")
    a, b = d_a[shared], d_b[shared]
    shift, shift_se = mean_stderr(np.abs(b) - np.abs(a))
    denom = float(np.sum(a * a))
    if denom == 0:
        raise ValueError(f"pair {pair_a} gives identical log-probabilities on every shared trajectory; "
                         "the compression slope is undefined")
    scorers = sorted(set(pair_a) | set(pair_b))
    cell_variance = lambda side, s: np.exp(pool.logprobs[side][s].astype(np.float64)).var(axis=-1)[real_cells(pool, side)]
    variance = {s: float(np.mean([cell_variance(side, s).mean() for side in SIDES])) for s in scorers}
    mismatch = lambda tv: (tv.mismatch_rate_pi + tv.mismatch_rate_mu) / 2
    return ScorerComparison(pair_a, pair_b, tv_a, tv_b, mismatch(tv_a), mismatch(tv_b),
                            float(np.abs(a).mean()), float(np.abs(b).mean()), float(shift), float(shift_se),
                            float(np.sum(a * b) / denom), int(shared.sum()), variance)
