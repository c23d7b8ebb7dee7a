"""The multilevel evaluation protocol of appendix B.7 (Figure 4), on stored draws.

Per repeat permutation: the first half of each cell's (permuted) repeats feeds the levels r in a
grid (r <= R/2); the held-out second half gives a deep reference Z_ref. Per symmetric sample (one
trajectory of each side, both scored by both models) Z_r is the level value and the cost is
2 (n + 2 n r) queries. Full-data covariances of (Z_r) over the grid and biases
b_r = |mean(Z_r - Z_ref)| floored at its paired standard error define the analytic RMSE of any
schedule at any budget. Each pilot (P random samples, scored at the deepest grid level, cost
counted and recycled into every level) estimates the same quantities, selects the best schedule of
at most `max_levels` levels (ties go to fewer levels) and the best single level; their RMSE is then
evaluated with the full-data quantities, so the pilot affects selection only. The hindsight-best
single level is the pointwise minimum over fixed single-level curves (no pilot).
"""

import itertools
from typing import NamedTuple

import numpy as np

from tvjax.core.validate import check_positive_int
from tvjax.pools.analysis.currency import (
    Hygiene,
    check_grid,
    default_pair,
    mean_length,
    path_logprobs,
    permutation_streams,
    powers_of_two,
    sample_queries,
    shuffle_repeats,
    z_values,
)
from tvjax.pools.store import SIDES, Pool

_TIE = 1e-9  # relative RMSE margin a schedule with more levels must beat


class Schedules(NamedTuple):
    """All candidate schedules as level-difference matrices: diff [S, L, G] maps Z over the grid
    to the coupled increments Y_l; mask [S, L]; repeats [S, L] (1 where masked); top [S] grid index."""

    diff: np.ndarray
    mask: np.ndarray
    repeats: np.ndarray
    top: np.ndarray
    levels: tuple


class MultilevelEvaluation(NamedTuple):
    """RMSE against budget (queries) of the pilot-chosen multilevel schedule, the pilot-chosen
    single level and the hindsight-best single level, averaged over pilot draws and permutations.

    rmse_single[g]: the fixed single level grid[g] without pilot. multilevel_fraction[b]: share of
    pilot draws choosing >= 2 levels at budget b; chosen[b]: the most frequent choice (repeat
    counts). saving_*: equal-accuracy budget ratio of a baseline to the multilevel curve, maximized
    over budgets (None where the curves never reach a common accuracy). rmse_ratio: min over
    budgets of rmse_multilevel / rmse_single_pilot."""

    grid: np.ndarray
    budgets: np.ndarray
    rmse_multilevel: np.ndarray
    rmse_single_pilot: np.ndarray
    rmse_hindsight: np.ndarray
    rmse_single: np.ndarray
    multilevel_fraction: np.ndarray
    chosen: tuple
    variance: np.ndarray
    increment_variance: np.ndarray
    bias: np.ndarray
    reference: float
    saving_hindsight: float | None
    saving_pilot: float | None
    rmse_ratio: float
    pilot_size: int
    num_pilots: int
    pilot_queries: float
    arm: str
    permuted: bool


def make_schedules(grid, max_levels: int = 4) -> Schedules:
    """Every increasing subset of the grid with 1..max_levels levels."""
    grid = np.asarray(grid)
    size = len(grid)
    levels = [c for k in range(1, min(max_levels, size) + 1) for c in itertools.combinations(range(size), k)]
    width = max(len(c) for c in levels)
    diff = np.zeros((len(levels), width, size))
    mask = np.zeros((len(levels), width), bool)
    repeats = np.ones((len(levels), width))
    for s, combo in enumerate(levels):  # a few hundred small schedules, built once
        for j, g in enumerate(combo):
            diff[s, j, g] = 1.0
            if j:
                diff[s, j, combo[j - 1]] = -1.0
            mask[s, j], repeats[s, j] = True, grid[g]
    top = np.array([c[-1] for c in levels])
    return Schedules(diff, mask, repeats, top, tuple(tuple(int(grid[g]) for g in c) for c in levels))


def schedule_rmse(cov, bias, schedules: Schedules, budgets, pilot: int, sample_cost, pilot_queries: float):
    """Analytic RMSE [..., S, B] of every schedule at every budget.

    cov [..., G, G] covariance of Z over the grid per sample; bias [..., G]; sample_cost(r) queries
    of one sample at r. Samples N_l are proportional to sqrt(V_l / r_l) and spend the budget left
    after the pilot; the `pilot` samples (scored at every level) are added to every level.
    """
    d, mask = schedules.diff, schedules.mask
    var = np.maximum(np.einsum("slg,...gh,slh->...sl", d, cov, d), 0.0)
    cross = np.einsum("slg,...gh,skh->...slk", d, cov, d)
    cost = np.where(mask, sample_cost(schedules.repeats), 0.0)
    weight = np.where(mask, np.sqrt(var / schedules.repeats), 0.0)
    spend = np.asarray(budgets, float) - pilot_queries  # [B]
    denom = np.sum(weight * cost, axis=-1)  # [..., S]
    flat = np.zeros_like(weight)
    flat[..., 0] = 1.0 / cost[:, 0]  # all on the first level when no increment has variance
    share = np.where(denom[..., None] > 0, weight / np.where(denom > 0, denom, 1.0)[..., None], flat)
    num = spend[:, None] * share[..., None, :]  # [..., S, B, L]
    v = var[..., None, :]
    if pilot:
        fresh = np.sum(np.where(mask[:, None], num * v / (pilot + num) ** 2, 0.0), axis=-1)
        w = np.where(mask[:, None], pilot / (pilot + num), 0.0)
        recycled = np.einsum("...sbl,...slk,...sbk->...sb", w, cross, w) / pilot
        total = fresh + recycled
    else:
        total = np.sum(np.where(mask[:, None] & (v > 0), v / np.where(num > 0, num, 1.0), 0.0), axis=-1)
    top_bias = np.take_along_axis(bias, np.broadcast_to(schedules.top, bias.shape[:-1] + schedules.top.shape), -1)
    return np.sqrt(np.maximum(total, 0.0) + top_bias[..., None] ** 2)


def select(rmse, schedules: Schedules, allowed: np.ndarray) -> np.ndarray:
    """Index of the chosen schedule per [..., B]: least RMSE among `allowed`; within a relative
    margin of the least, fewest levels, then cheapest top level."""
    rmse = np.where(allowed[:, None], rmse, np.inf)
    best = rmse.min(axis=-2, keepdims=True)
    near = rmse <= best * (1 + _TIE)
    rank = np.lexsort((schedules.repeats.max(axis=1), schedules.mask.sum(axis=1)))
    priority = np.empty(len(rank))
    priority[rank] = np.arange(len(rank))
    return np.argmin(np.where(near, priority[:, None], np.inf), axis=-2)


def _cov(z):
    """Sample covariance over axis -2: [..., P, G] -> [..., G, G]."""
    centered = z - z.mean(axis=-2, keepdims=True)
    return np.einsum("...pg,...ph->...gh", centered, centered) / (z.shape[-2] - 1)


def _bias(diff):
    """|mean| floored at the standard error, over axis -2: [..., P, G] -> [..., G]."""
    se = diff.std(axis=-2, ddof=1) / np.sqrt(diff.shape[-2])
    return np.maximum(np.abs(diff.mean(axis=-2)), se)


def level_values(pool: Pool, pair, grid, rng, arm: str) -> tuple[np.ndarray, np.ndarray]:
    """(Z per sample at each grid level from the first half of the repeats [M, G], Z_ref from the
    second half [M]) for one permutation; a symmetric sample averages one trajectory per side."""
    half = pool.passes.size // 2
    zs, refs = {}, {}
    for side in SIDES if arm == "symmetric" else (arm,):
        draws = [shuffle_repeats(rng, pool.logprobs[side][s]) for s in pair]
        zs[side] = z_values(path_logprobs(draws[0][..., :half], grid), path_logprobs(draws[1][..., :half], grid))
        refs[side] = z_values(*(path_logprobs(d[..., half:2 * half], [half])[:, 0] for d in draws))
    m = min(len(z) for z in zs.values())
    return sum(z[:m] for z in zs.values()) / len(zs), sum(r[:m] for r in refs.values()) / len(refs)


def _saving(budgets, curve, baseline) -> float | None:
    """max over budgets of (budget at which `baseline` reaches curve's RMSE) / budget."""
    base = np.minimum.accumulate(baseline)
    reachable = (curve >= base[-1]) & (curve <= base[0])
    if not reachable.any() or base[-1] <= 0:  # a zero-RMSE baseline (no noise, no spread) has no saving
        return None
    # base is nonincreasing in budget: interpolate log budget against reversed log RMSE
    log_b = np.interp(-np.log(curve[reachable]), -np.log(base), np.log(budgets))
    return float(np.max(np.exp(log_b) / budgets[reachable]))


def _min_ratio(curve, baseline) -> float:
    """min over budgets of curve / baseline, counting 0 / 0 (both exact) as 1."""
    both_zero = (curve == 0) & (baseline == 0)
    return float(np.min(np.where(both_zero, 1.0, curve / np.where(baseline > 0, baseline, 1.0))))


def evaluate_multilevel(pool: Pool, pair=None, grid=None, budgets=None, pilot_size: int = 64,
                        num_pilots: int = 40, max_levels: int = 4, arm: str = "symmetric",
                        hygiene: Hygiene = Hygiene(num_permutations=20), seed: int = 0) -> MultilevelEvaluation:
    """Appendix B.7 on a pool: pilot-selected multilevel schedule vs single levels (Figure 4)."""
    pair = default_pair(pool, pair)
    num_pilots = check_positive_int("num_pilots", num_pilots)
    if arm not in ("symmetric",) + SIDES:
        raise ValueError(f"arm must be 'symmetric', 'pi' or 'mu', got {arm!r}")
    half = pool.passes.size // 2
    if half < 2:
        raise ValueError("the multilevel evaluation needs at least 4 stored repeats (levels + held-out reference)")
    grid = check_grid(powers_of_two(half) if grid is None else grid, half, "multilevel grid (r <= R/2)")
    sides = 2 if arm == "symmetric" else 1
    length = mean_length(pool)  # outputs that stop at EOS cost their real positions
    sample_cost = lambda r: sample_queries(length, r, sides)
    schedules = make_schedules(grid, max_levels)
    single = schedules.mask.sum(axis=1) == 1
    rng = np.random.default_rng(seed)
    pilot_queries = float(pilot_size * sample_cost(grid[-1]))
    budgets = pilot_queries * np.geomspace(2, 2000, 13) if budgets is None else np.asarray(budgets, float)
    if budgets.min() <= pilot_queries:
        raise ValueError(f"every budget must exceed the pilot's cost {pilot_queries:.0f} queries")
    ml, sp, hind, fixed, frac, choices, stats = [], [], [], [], [], [], []
    for stream in permutation_streams(hygiene):
        z, ref = level_values(pool, pair, grid, stream, arm)
        if not 2 <= pilot_size < len(z):
            raise ValueError(f"pilot_size must be in [2, {len(z)}), got {pilot_size}")
        cov, bias = _cov(z), _bias(z - ref[:, None])
        picks = np.stack([rng.choice(len(z), pilot_size, replace=False) for _ in range(num_pilots)])
        zp, refp = z[picks], ref[picks]
        estimated = schedule_rmse(_cov(zp), _bias(zp - refp[..., None]), schedules, budgets, pilot_size,
                                  sample_cost, pilot_queries)  # [K, S, B]
        truth = schedule_rmse(cov, bias, schedules, budgets, pilot_size, sample_cost, pilot_queries)  # [S, B]
        chosen = select(estimated, schedules, np.ones(len(single), bool))  # [K, B]
        chosen_single = select(estimated, schedules, single)
        columns = np.arange(len(budgets))
        ml.append(truth[chosen, columns].mean(0)), sp.append(truth[chosen_single, columns].mean(0))
        no_pilot = schedule_rmse(cov, bias, schedules, budgets, 0, sample_cost, 0.0)[single]  # [G, B]
        fixed.append(no_pilot), hind.append(no_pilot.min(0))
        frac.append((schedules.mask.sum(axis=1)[chosen] >= 2).mean(0)), choices.append(chosen)
        inc = np.diff(z, axis=1, prepend=0.0)
        stats.append((np.diag(cov), inc.var(axis=0, ddof=1), bias, ref.mean()))
    choices = np.concatenate(choices)
    mode = tuple(schedules.levels[np.bincount(c, minlength=len(single)).argmax()] for c in choices.T)
    ml, sp, hind = np.mean(ml, 0), np.mean(sp, 0), np.mean(hind, 0)
    variance, increments, bias, reference = (np.mean([s[i] for s in stats], 0) for i in range(4))
    return MultilevelEvaluation(grid, budgets, ml, sp, hind, np.mean(fixed, 0), np.mean(frac, 0), mode, variance,
                                increments, bias, float(reference), _saving(budgets, ml, hind),
                                _saving(budgets, ml, sp), _min_ratio(ml, sp), pilot_size, num_pilots,
                                pilot_queries, arm, hygiene.permute)
