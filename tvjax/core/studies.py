"""Repeated estimates and their summaries, for studies in Hydra apps, notebooks or scripts
(no Hydra, no plotting: those live beside the apps in experiments/).

    spec = REGISTRY["likelihood_ratio"]
    est = replicate(spec.fn, key, 512, pi, mu, Exact(), Samples(np.int32(4096)))
    mae, rmse, bias = errors(est.value, exact_tv(pi, mu))
"""

import functools
import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.cost import SCORING_MODELS
from tvjax.core.programs import jit_program, saved_program
from tvjax.core.schedules import Samples, Schedule


class Fit(NamedTuple):
    """Least-squares line log(y) = intercept + slope * log(x)."""

    slope: float
    intercept: float
    points: int


def replicate(fn, key, reps, pi, mu, oracle, sizes, fast_compile=False):
    """fn(key, pi, mu, oracle, sizes, copies=reps) as numpy: `reps` independent estimates from
    one stream of rows, stacked along a leading axis. `sizes` (the estimator's NamedTuple) is a
    runtime argument, so one compiled program, cached per (fn, reps, fast_compile) and the
    shapes of the arguments, serves every size of a study; pass numpy arrays (e.g.
    `schedules.as_runtime`) for sizes that change between calls. fast_compile lowers XLA's
    backend optimization (about 2x faster compiles, slower runs). With a compilation cache on,
    a tvjax estimator's program is saved and reloaded whole (`tvjax.core.programs.saved_program`):
    a warm cache skips its tracing and lowering too."""
    return jax.tree.map(np.asarray, _replicated(fn, reps, fast_compile)(key, pi, mu, oracle, sizes))


@functools.lru_cache(maxsize=None)
def _replicated(fn, copies, fast_compile):
    jitted = jit_program(lambda key, pi, mu, oracle, sizes: fn(key, pi, mu, oracle, sizes, copies=copies), fast_compile)
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", "<unknown>")
    if not module.startswith("tvjax.") or "<" in name:
        return jitted  # code outside tvjax's sources (or a closure): traced every process, never saved
    return saved_program(jitted, ("replicate", module, name, copies, fast_compile))


def job_key(seed, *indices):
    """The PRNG key of one job of a study: the job's indices folded into key(seed), equal to
    jax.random.fold_in applied in turn (tests/test_fixed_costs.py checks the two agree). Computed in
    NumPy because JAX's key and fold_in are programs of their own to compile and dispatch. Measured
    on a 2-core EPYC VM with jax 0.10: a process's first key costs 180-230 ms through JAX on a cold
    compilation cache and 94 ms on a warm one, against 12 ms here; each further key 0.42 ms against
    0.12 ms. Figure 5's whole study takes 1.8 s cold and 1.3 s warm (benchmarks/anchors.json), so
    JAX's own keys would add 6-11% to it."""
    words = [seed, *indices]
    threefry = jax.config.jax_default_prng_impl == "threefry2x32"
    if not (threefry and all(isinstance(w, (int, np.integer)) and 0 <= w < 2**31 for w in words)):
        key = jax.random.key(seed)  # JAX's own rules (and errors) for other values and PRNGs
        for index in indices:
            key = jax.random.fold_in(key, index)
        return key
    data = np.array([0, seed], np.uint32)  # threefry's key(seed): the seed's high and low words
    for index in indices:
        data = _threefry2x32(data, np.array([0, index], np.uint32))
    return jax.random.wrap_key_data(data)


_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(key, count):
    """Threefry-2x32 (20 rounds; Salmon et al. 2011) of one 64-bit block `count` under `key`,
    both uint32[2], as JAX's threefry PRNG computes it: its fold_in(key, d) is
    _threefry2x32(key, [0, d])."""
    with np.errstate(over="ignore"):
        ks = (np.uint32(key[0]), np.uint32(key[1]), np.uint32(key[0] ^ key[1] ^ np.uint32(0x1BD11BDA)))
        x0, x1 = np.uint32(count[0] + ks[0]), np.uint32(count[1] + ks[1])
        for group in range(5):
            for rotation in _ROTATIONS[group % 2]:
                x0 = np.uint32(x0 + x1)
                x1 = np.uint32((x1 << np.uint32(rotation)) | (x1 >> np.uint32(32 - rotation))) ^ x0
            x0 = np.uint32(x0 + ks[(group + 1) % 3])
            x1 = np.uint32(x1 + ks[(group + 2) % 3] + np.uint32(group + 1))
    return np.array([x0, x1], np.uint32)


def errors(values, truth):
    """(mean absolute error, root mean squared error, bias) of repeated estimates."""
    deviation = np.asarray(values, np.float64) - truth
    return float(np.mean(np.abs(deviation))), float(np.sqrt(np.mean(deviation**2))), float(np.mean(deviation))


def loglog_fit(x, y):
    """Least-squares slope of log y against log x over the finite, positive points."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if keep.sum() < 2:
        return Fit(math.nan, math.nan, int(keep.sum()))
    slope, intercept = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
    return Fit(float(slope), float(intercept), int(keep.sum()))


# --------------------------------------------------------------------------- needed budgets and their exponents


def _needed_budgets(values, truth, eps, pilot_queries):
    """Queries at which RMSE = eps, from repeated estimates along the last axis of `values` at
    `pilot_queries`: the variance falls as 1/queries and the bias stays, so RMSE^2(Q) =
    b^2 + v Q_pilot / Q and Q = Q_pilot v / (eps^2 - b^2), infinite when the bias reaches eps.
    b^2 is estimated without its upward bias: the squared mean error overstates b^2 by v / reps."""
    values = np.asarray(values, np.float64)
    reps = values.shape[-1]
    deviation = np.mean(values, axis=-1) - truth
    variance = np.var(values, axis=-1, ddof=1)
    bias_squared = np.maximum(deviation**2 - variance / reps, 0.0)
    slack = eps**2 - bias_squared
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(slack > 0, pilot_queries * variance / slack, np.inf), deviation


class Needed(NamedTuple):
    """The budget one estimator needs for RMSE = eps at one point, from repeated estimates at a
    pilot budget: `budget` (inf when unreachable), the estimate's `bias` and per-estimate `stderr`."""

    budget: float
    bias: float
    stderr: float


def needed_budget(values, truth, eps, pilot_queries):
    """Needed: the queries at which repeated estimates at `pilot_queries` reach RMSE = eps."""
    budget, bias = _needed_budgets(values, truth, eps, pilot_queries)
    return Needed(float(budget), float(bias), float(np.std(np.asarray(values, np.float64), ddof=1)))


class ExponentFit(NamedTuple):
    """Least-squares slope of log(needed budget) on log(x) over a grid, with a bootstrap interval:
    each resample redraws every point's repetitions with replacement (points are independent
    runs) and refits. `unreachable` counts grid points whose bias reaches eps (no fit then);
    `undetermined` is the share of resamples with an unreachable point (their slope is unknown,
    and the interval is only reported when that share is below (1 - level) / 2)."""

    slope: float
    low: float
    high: float
    unreachable: int
    undetermined: float


def _slope_weights(x):
    centered = np.log(np.asarray(x, np.float64))
    centered -= centered.mean()
    return centered / np.sum(centered**2)  # slope = weights . log(y), a linear map per resample


def bootstrap_exponent(x, values, truths, eps, pilot_queries, rng, resamples=2000, level=0.95):
    """ExponentFit of the needed budget along x: values[i] are the repeated estimates at grid
    point x[i] (truth, eps and pilot queries per point)."""
    if len(x) < 2:
        raise ValueError(f"an exponent needs at least 2 grid points, got {len(x)}")
    budgets = [_needed_budgets(v, t, e, q)[0] for v, t, e, q in zip(values, truths, eps, pilot_queries)]
    unreachable = int(sum(not np.isfinite(b) for b in budgets))
    if unreachable:
        return ExponentFit(math.nan, math.nan, math.nan, unreachable, 1.0)
    weights = _slope_weights(x)
    resampled = np.stack([
        _needed_budgets(np.asarray(v)[rng.integers(0, len(v), (resamples, len(v)))], t, e, q)[0]
        for v, t, e, q in zip(values, truths, eps, pilot_queries)
    ], axis=-1)  # [resamples, points]
    finite = np.all(np.isfinite(resampled), axis=-1)
    slopes = np.log(resampled[finite]) @ weights
    undetermined = 1.0 - finite.mean()
    tail = (1.0 - level) / 2
    low, high = np.quantile(slopes, [tail, 1 - tail]) if undetermined < tail and slopes.size else (math.nan, math.nan)
    return ExponentFit(float(weights @ np.log(budgets)), float(low), float(high), 0, float(undetermined))


def bound_verdict(fit, upper=None, upper_with_logs=None, lower=None):
    """Whether a fitted exponent is consistent with the paper's bounds over its grid: an upper
    bound (the theory's slope, and the same with the theorem's log factors) must not lie below
    the interval; a lower bound must not lie above it. None skips a bound."""
    if fit.unreachable:
        return "unreachable"
    if math.isnan(fit.low):
        return "undetermined"
    if lower is not None and fit.high < lower:
        return "below the lower bound"
    if upper is not None and fit.low > upper:
        if upper_with_logs is not None and fit.low <= upper_with_logs:
            return "consistent up to the log factor"
        return "exceeds the upper bound"
    return "consistent"


# --------------------------------------------------------------------------- the random-number floor


def random_words(pi, oracle, sizes, copies=1):
    """The random 32-bit words `copies` estimates at `sizes` need at the least: each trajectory's
    sample (`pi.random_words_per_sample`, else one word per position) and, for an oracle that
    draws (`oracle.draws`), one word per drawn sum: per model and drawn position, one for a
    level's first increment and one more for a coupled level's second."""
    if isinstance(sizes, Schedule):
        per_side, sides = np.asarray(sizes.num_samples, np.float64), 2
        sums = np.where(np.arange(per_side.shape[-1]) > 0, 2, 1)
    else:
        per_side = np.asarray(sizes.num if isinstance(sizes, Samples) else sizes.num_per_side, np.float64)
        sides, sums = (1 if isinstance(sizes, Samples) else 2), 1
    positions = len(getattr(pi, "stochastic_positions", range(pi.n)))
    drawn = SCORING_MODELS * positions * sums if oracle.draws else 0
    return int(np.sum(sides * per_side * copies * (getattr(pi, "random_words_per_sample", pi.n) + drawn)))


@functools.cache
def _word_drawer(chunk):
    """A compiled program drawing `steps` chunks of `chunk` random words (kept alive by a running
    xor of each chunk's largest, which XLA cannot drop)."""

    @jax.jit
    def draw(key, steps):
        body = lambda i, acc: acc ^ jnp.max(jax.random.bits(jax.random.fold_in(key, i), (chunk,), jnp.uint32))
        return jax.lax.fori_loop(0, steps, body, jnp.uint32(0))

    jax.block_until_ready(draw(jax.random.key(0), 1))  # compiled here, not in a timed draw
    return draw


def _floor_draw(words, chunk, seed):
    """Seconds to draw `words` random 32-bit words here with JAX's default generator, in chunks
    as the estimators draw them, compile excluded: the floor under a study's runs."""
    draw = _word_drawer(chunk)
    start = time.perf_counter()
    jax.block_until_ready(draw(jax.random.key(seed), max(1, -(-int(words) // chunk))))
    return time.perf_counter() - start


class FloorPairs(NamedTuple):
    """Runs timed between floor draws in one process (`runs_over_floor`)."""

    runs: tuple  # seconds of each repeat of the runs
    floors: tuple  # the floor beside each: the mean of the draws just before and just after it
    ratio: float  # the median over the repeats of runs / floor


def runs_over_floor(run, words, pairs=3, chunk=2**16):
    """How far `run()` (a study's runs) is above the floor of `words` random words, both timed
    alternately in this process: floor, run, floor, run, ..., floor; each run over the mean of the
    two draws beside it, the median over `pairs` runs. A shared machine's speed can move within
    seconds, so a floor drawn once, after the runs, can read another speed than the runs had;
    drawn on either side of each run it reads the same. `run()` returns the seconds of its runs
    (its wall time less what it spent loading or compiling programs, as a study's breakdown
    counts them), or None: then its wall time is its runs."""
    floors = [_floor_draw(words, chunk, 0)]
    runs = []
    for attempt in range(pairs):
        start = time.perf_counter()
        spent = run()
        runs.append(time.perf_counter() - start if spent is None else spent)
        floors.append(_floor_draw(words, chunk, attempt + 1))
    beside = [(before + after) / 2 for before, after in zip(floors, floors[1:])]
    ratio = float(np.median([r / f for r, f in zip(runs, beside)]))
    return FloorPairs(tuple(runs), tuple(beside), ratio)
