"""The hedged betting confidence sequence for the mean of observations in [0, 1] (Waudby-Smith and
Ramdas, "Estimating means of bounded random variables by betting", JRSS B 2024): for every
candidate mean m on a grid, the capital of betting that the mean is above m and of betting that
it is below, with predictable bets; by Ville's inequality the capital of the true mean passes
1/delta with probability at most delta at any time, so the grid values whose capital stays below
it cover the mean at every step at once. Used by the TV gate (`tvjax.audit.sequential`) and the
reference-model audit's anytime bound (`tvjax.audit.reference.sequential`).
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

BET_CAP = 0.5  # bets truncated to c / m and c / (1 - m): every factor of the capital stays >= 1 - c
GRID_SIZE = 2000  # candidate means j / GRID_SIZE; the interval is widened by one step


class BettingState(NamedTuple):
    """A betting confidence sequence after `count` observations: the log capital of betting
    that the mean is above (`log_up`) and below (`log_down`) each grid value, and the running
    sums behind the predictable bets."""

    log_up: jax.Array  # [GRID_SIZE + 1]
    log_down: jax.Array
    count: jax.Array  # observations so far
    total: jax.Array  # their sum
    spread: jax.Array  # sum of (x_i - mean estimate after i)^2


def betting_start():
    zeros = jnp.zeros(GRID_SIZE + 1, jnp.float32)
    return BettingState(zeros, zeros, *(jnp.zeros((), jnp.float32) for _ in range(3)))


def _grid():
    return jnp.arange(GRID_SIZE + 1, dtype=jnp.float32) / GRID_SIZE


@jax.jit
def betting_update(state, x, delta):
    """The state after the observations x (in [0, 1], in order). Each bet uses only the
    observations before it: lambda_i = sqrt(2 log(2/delta) / (s2_{i-1} i log(1 + i))) with the
    regularized running mean and variance of Waudby-Smith and Ramdas (their predictable plug-in)."""
    x = jnp.asarray(x, jnp.float32)
    index = state.count + jnp.arange(1, x.shape[0] + 1, dtype=jnp.float32)  # i = 1, 2, ... overall
    running_total = state.total + jnp.cumsum(x)
    mean_after = (0.5 + running_total) / (index + 1)
    deviation = (x - mean_after) ** 2
    spread_before = state.spread + jnp.cumsum(deviation) - deviation
    variance_before = (0.25 + spread_before) / index
    bet = jnp.sqrt(2 * jnp.log(2 / delta) / (variance_before * index * jnp.log1p(index)))
    m = _grid()[:, None]
    up = jnp.minimum(bet[None, :], jnp.where(m > 0, BET_CAP / jnp.maximum(m, 1e-12), jnp.inf))
    down = jnp.minimum(bet[None, :], jnp.where(m < 1, BET_CAP / jnp.maximum(1 - m, 1e-12), jnp.inf))
    gap = x[None, :] - m
    return BettingState(state.log_up + jnp.sum(jnp.log1p(up * gap), axis=1),
                        state.log_down + jnp.sum(jnp.log1p(-down * gap), axis=1),
                        index[-1], running_total[-1], state.spread + jnp.sum(deviation))


def betting_pieces(state, x, delta, piece=1024):
    """betting_update over x in order, `piece` observations at a time: the grid times a piece
    bounds the memory of one update."""
    for start in range(0, x.shape[0], piece):
        state = betting_update(state, x[start : start + piece], delta)
    return state


def betting_interval(state, delta):
    """(low, high): the grid values whose hedged capital (half on each side, a test martingale
    for the true mean) stays below 1/delta, widened by one grid step; [0, 1] before any data."""
    log_capital = jnp.logaddexp(state.log_up, state.log_down) + math.log(0.5)
    inside = np.asarray(log_capital < math.log(1 / delta))
    grid = np.arange(GRID_SIZE + 1) / GRID_SIZE
    step = 1.0 / GRID_SIZE
    if not inside.any():  # a sequence narrower than the grid's step: the step around its best point
        nearest = grid[int(np.argmin(np.asarray(log_capital)))]
        return max(0.0, float(nearest) - step), min(1.0, float(nearest) + step)
    return max(0.0, float(grid[inside].min()) - step), min(1.0, float(grid[inside].max()) + step)
