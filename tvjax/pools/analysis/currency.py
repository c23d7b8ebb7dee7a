"""The shared currency over stored draws: repeat-axis hygiene and r-averaged path log-probabilities.

Pools hold draws[N, n, R] of log p(x_i | x_<i). Every repeat-axis statistic first permutes the
repeats independently and uniformly at each (trajectory, position) cell (paper, B.1), and is
averaged over several such permutations; `Hygiene(permute=False)` keeps serving order instead.
"""

from typing import Iterator, NamedTuple

import jax.numpy as jnp
import numpy as np

from tvjax.core import cost
from tvjax.core.currency import likelihood_ratio_term, mixture_z
from tvjax.pools.store import SIDES, Pool, padded_positions


class Hygiene(NamedTuple):
    """Repeat-axis hygiene: permute (default) or keep serving order; permutations are averaged."""

    permute: bool = True
    num_permutations: int = 8
    seed: int = 0


def check_hygiene(hygiene: Hygiene) -> Hygiene:
    if int(hygiene.num_permutations) != hygiene.num_permutations or hygiene.num_permutations < 1:
        raise ValueError(f"num_permutations must be a positive integer, got {hygiene.num_permutations!r}")
    return hygiene


def permutation_streams(hygiene: Hygiene) -> Iterator[np.random.Generator | None]:
    """One random stream per permutation to average over, or a single None (serving order)."""
    check_hygiene(hygiene)
    if not hygiene.permute:
        yield None
        return
    for seq in np.random.SeedSequence(hygiene.seed).spawn(hygiene.num_permutations):
        yield np.random.default_rng(seq)


def shuffle_repeats(rng: np.random.Generator | None, draws: np.ndarray) -> np.ndarray:
    """Permute the repeat axis of draws [N, n, R] independently and uniformly per (trajectory,
    position) cell; rng None keeps serving order."""
    if rng is None:
        return draws
    order = np.argsort(rng.random(draws.shape, dtype=np.float32), axis=-1)
    return np.take_along_axis(draws, order, axis=-1)


def check_grid(grid, limit: int, name: str = "repetition grid") -> np.ndarray:
    grid = np.asarray(grid, dtype=np.int64)
    if grid.ndim != 1 or grid.size == 0 or np.any(np.diff(grid) <= 0) or grid[0] < 1 or grid[-1] > limit:
        raise ValueError(f"{name} must be strictly increasing integers in [1, {limit}], got {grid.tolist()}")
    return grid


def powers_of_two(limit: int) -> np.ndarray:
    """1, 2, 4, ... up to limit, plus limit itself."""
    grid = 2 ** np.arange(int(np.log2(limit)) + 1)
    return np.unique(np.append(grid, limit))


def cell_log_means(draws: np.ndarray, grid) -> np.ndarray:
    """log of the mean of the first r draws per cell for each r in grid, clipped to <= 0.

    draws: [N, n, R] log-probabilities (-inf = zero mass) -> [N, n, G]; -inf where all r draws
    are zero (a pool's zero is a real zero: no floor). Accumulated in log space (no underflow).
    """
    grid = check_grid(grid, draws.shape[-1])
    log_sums = np.logaddexp.accumulate(draws.astype(np.float64), axis=-1)[..., grid - 1]
    return np.minimum(log_sums - np.log(grid), 0.0)


def path_logprobs(draws: np.ndarray, grid) -> np.ndarray:
    """L_r = sum_i log(mean of the first r draws) for each r in grid: [N, n, R] -> [N, G]."""
    return cell_log_means(draws, grid).sum(axis=1)


def _shifted(log_a: np.ndarray, log_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both sides minus their common finite maximum: float32 inside JAX then keeps the full
    precision of the difference even when L is in the thousands."""
    log_a, log_b = np.asarray(log_a, np.float64), np.asarray(log_b, np.float64)
    top = np.maximum(log_a, log_b)
    shift = np.where(np.isneginf(top), 0.0, top)
    return jnp.asarray(log_a - shift), jnp.asarray(log_b - shift)


def z_values(log_a: np.ndarray, log_b: np.ndarray) -> np.ndarray:
    """Z = tanh(|L_a - L_b| / 2) (1 where a side has zero mass), via tvjax.core.currency.mixture_z."""
    return np.asarray(mixture_z(*_shifted(log_a, log_b)), dtype=np.float64)


def lr_values(log_own: np.ndarray, log_other: np.ndarray) -> np.ndarray:
    """(1 - p_other / p_own)_+ for X ~ own (Algorithm 1), via tvjax.core.currency.likelihood_ratio_term."""
    return np.asarray(likelihood_ratio_term(*_shifted(log_own, log_other)), dtype=np.float64)


def _unknown_scorers(pool: Pool, names) -> list:
    """The names among `names` that are not loaded scorers of `pool`, in order."""
    loaded = pool.logprobs[SIDES[0]]
    return [name for name in names if name not in loaded]


def check_scorer(pool: Pool, scorer: str) -> str:
    """`scorer`, or ValueError naming it and the pool's loaded scorers."""
    if _unknown_scorers(pool, [scorer]):
        raise ValueError(f"unknown scorer {scorer!r}; the pool's loaded scorers are {sorted(pool.logprobs[SIDES[0]])}")
    return scorer


def default_pair(pool: Pool, pair=None) -> tuple[str, str]:
    """(scorer of pi, scorer of mu): the given pair, else the pool's samplers; checked against the pool."""
    pair = tuple(pool.spec.samplers if pair is None else pair)
    unknown = _unknown_scorers(pool, pair)
    if len(pair) != 2 or unknown:
        raise ValueError(f"pair must name two loaded scorers {sorted(pool.logprobs[SIDES[0]])}, got {pair!r}"
                         + (f" (unknown: {', '.join(map(repr, unknown))})" if unknown else ""))
    return pair


def real_cells(pool: Pool, side: str) -> np.ndarray:
    """bool [N, n]: the positions of `side`'s trajectories up to and including their EOS (all of
    them in a fixed-length pool). Positions after are the deterministic pad: per-position
    statistics leave them out, and they cost no query."""
    return ~padded_positions(pool.lengths[side], pool.spec.n)


def mean_length(pool: Pool) -> float:
    """Mean real positions per trajectory over both sides (n in a fixed-length pool)."""
    return float(np.mean(np.concatenate([pool.lengths[s] for s in SIDES])))


def pool_queries(pool: Pool, repeats) -> float:
    """Queries behind the loaded trajectories of both sides: each sampled and scored under both
    models at r repeats, on its real positions only (`tvjax.core.cost`)."""
    positions = sum(float(np.sum(pool.lengths[s], dtype=np.float64)) for s in SIDES)
    return float(cost.trajectory_queries(positions, 1, float(repeats)))


def sample_queries(n: int, repeats, sides: int = 2):
    """Queries of one sample (`tvjax.core.cost`): per side, a trajectory sampled and scored under both
    models at r repeats. A symmetric sample has one trajectory per side (sides=2)."""
    return sides * cost.trajectory_queries(1, n, np.asarray(repeats, dtype=np.float64))
