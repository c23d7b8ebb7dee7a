"""The paper's TV estimators and the baselines, as pure jitted functions of (key, pi, mu, oracle).

All of them reduce trajectories chunk by chunk inside jit (draw, reduce, discard): no [N, n, R]
array exists. Query accounting follows the design: sampling a trajectory costs n queries, scoring
it at r repeats costs n * r per model.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.currency import likelihood_ratio_term, mixture_z
from tvjax.oracles import Exact, Sampler
from tvjax.sharding import shard_rows
from tvjax.validate import check_pair, check_positive_int, check_range, check_repeats

# Trajectory positions held in memory at once by one chunk (times the vocabulary for LogitNoise).
CHUNK_POSITIONS = 2**20


class LevelStats(NamedTuple):
    """Per-level diagnostics, arrays of shape [L] (one level for single-level estimators)."""

    repeats: jax.Array  # r_l
    num_samples: jax.Array  # trajectories used at level l (both sides together)
    mean: jax.Array  # mean of the level's summand (Y_l for multilevel)
    variance: jax.Array  # its per-trajectory variance (pooled within sides when stratified)
    queries: jax.Array  # queries spent at level l


class Estimate(NamedTuple):
    value: jax.Array
    stderr: jax.Array
    queries: jax.Array
    levels: LevelStats


class KLEstimate(NamedTuple):
    """KL-based baselines: `value` is the Pinsker route min(1, sqrt(KL / 2)) on the TV scale."""

    value: jax.Array
    stderr: jax.Array
    queries: jax.Array
    levels: LevelStats
    kl: jax.Array  # +inf under support mismatch
    kl_stderr: jax.Array


class Schedule(NamedTuple):
    """Multilevel schedule: level l uses num_samples[l] trajectories per side at repeats[l] draws."""

    num_samples: tuple
    repeats: tuple


# --------------------------------------------------------------------------- streaming moments


class Moments(NamedTuple):
    count: jax.Array
    mean: jax.Array
    m2: jax.Array  # sum of squared deviations

    @property
    def variance(self):
        return self.m2 / jnp.maximum(self.count - 1, 1)


def masked_moments(values, mask):
    count = jnp.sum(mask, dtype=jnp.float32)
    kept = jnp.where(mask, values, 0.0)
    mean = jnp.sum(kept) / jnp.maximum(count, 1.0)
    return Moments(count, mean, jnp.sum(jnp.where(mask, (values - mean) ** 2, 0.0)))


def merge_moments(a, b):
    """Chan et al.'s pairwise update: stable for long streams in float32; empty sides are fine."""
    count = a.count + b.count
    delta = b.mean - a.mean
    share = b.count / jnp.maximum(count, 1.0)
    return Moments(count, a.mean + delta * share, a.m2 + b.m2 + delta**2 * a.count * share)


def default_chunk(process, oracle, num):
    return max(1, min(num, CHUNK_POSITIONS // oracle.row_size(process)))


def level_moments(key, summand, num_per_level, chunk):
    """Per-level moments of summand(key, level, size) -> [size] over num_per_level[l] rows each.

    Every level streams through one compiled body in fixed-size chunks (the last chunk of a level
    is masked), so a ten-level schedule compiles once and memory stays at one chunk.
    """
    plan = [(level, min(chunk, num - start)) for level, num in enumerate(num_per_level) for start in range(0, num, chunk)]
    levels = len(num_per_level)
    ids = jnp.asarray([level for level, _ in plan], jnp.int32)
    valid = jnp.asarray([rows for _, rows in plan], jnp.int32)
    zeros = jnp.zeros(levels)

    def body(acc, item):
        chunk_key, level, rows = item
        m = masked_moments(summand(chunk_key, level, chunk), jnp.arange(chunk) < rows)
        here = jnp.arange(levels) == level
        return merge_moments(acc, Moments(jnp.where(here, m.count, 0.0), jnp.where(here, m.mean, 0.0), jnp.where(here, m.m2, 0.0))), None

    acc, _ = jax.lax.scan(body, Moments(zeros, zeros, zeros), (jax.random.split(key, len(plan)), ids, valid))
    return acc


def stream_chunk(process, oracle, num_per_level):
    """Chunk rows: bounded by memory, and small enough that padding the last chunk of each level
    wastes little (at most one chunk per level)."""
    total = sum(num_per_level)
    balanced = max(64, math.ceil(total / (2 * len(num_per_level))))
    return min(default_chunk(process, oracle, max(num_per_level)), balanced)


# --------------------------------------------------------------------------- building blocks


def _scored(key, side, pi, mu, oracle, size, coarse, fine):
    """Sample `size` trajectories from `side`; [size, 2] (coarse, fine) path log-probs per model."""
    k_sample, k_pi, k_mu = jax.random.split(key, 3)
    tokens = shard_rows(side.sample(k_sample, size))
    return (
        oracle.coupled_path_logprobs(k_pi, pi, tokens, coarse, fine),
        oracle.coupled_path_logprobs(k_mu, mu, tokens, coarse, fine),
    )


def _trajectory_queries(oracle, num, n, repeats):
    return oracle.queries(num, n, 1) + 2 * oracle.queries(num, n, repeats)


def summarize_levels(means, variances, counts, repeats, queries):
    """Combine independent per-level sample means into one estimate: sum of level means, with
    stderr sqrt(sum_l Var_l / N_l). Shared by the synthetic and the pool-based estimators."""
    means, variances, counts = (jnp.asarray(a, jnp.float32) for a in (means, variances, counts))
    queries = jnp.asarray(queries, jnp.float32)  # float: counts pass 2**31 in real sweeps
    levels = LevelStats(jnp.asarray(repeats), counts, means, variances, queries)
    stderr = jnp.sqrt(jnp.sum(variances / counts))
    return Estimate(jnp.sum(means), stderr, jnp.sum(queries), levels)


def _one_sided(key, pi, mu, oracle, num, repeats, chunk, term):
    """Moments of term(L_pi, L_mu) on X ~ pi at `repeats` draws per position (one level)."""

    def summand(k, level, size):
        log_pi, log_mu = _scored(k, pi, pi, mu, oracle, size, 0, repeats)
        return term(log_pi[:, 1], log_mu[:, 1])

    return level_moments(key, summand, (num,), chunk or stream_chunk(pi, oracle, (num,)))


def _symmetric(key, pi, mu, oracle, schedule, chunk):
    """Algorithm 3's levels on X ~ (pi + mu)/2, stratified: N_l trajectories from each side.

    Level l's summand is the coupled increment Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X) on one trajectory
    with nested draws (Y_0 = Z_{r_0}); a single level is the plug-in estimator."""
    fine = jnp.asarray(schedule.repeats, jnp.int32)
    coarse = jnp.concatenate([jnp.zeros(1, jnp.int32), fine[:-1]])
    chunk = chunk or stream_chunk(pi, oracle, schedule.num_samples)

    def summand_for(side):
        def summand(k, level, size):
            log_pi, log_mu = _scored(k, side, pi, mu, oracle, size, coarse[level], fine[level])
            z = mixture_z(log_pi, log_mu)
            return z[:, 1] - jnp.where(level > 0, z[:, 0], 0.0)

        return summand

    k_pi, k_mu = jax.random.split(key)
    m_pi = level_moments(k_pi, summand_for(pi), schedule.num_samples, chunk)
    m_mu = level_moments(k_mu, summand_for(mu), schedule.num_samples, chunk)
    queries = [2 * _trajectory_queries(oracle, num, pi.n, r) for num, r in zip(*schedule)]
    return summarize_levels(
        (m_pi.mean + m_mu.mean) / 2,
        (m_pi.variance + m_mu.variance) / 2,
        [2.0 * num for num in schedule.num_samples],
        schedule.repeats,
        queries,
    )


def _checked(pi, mu, num, name="num_samples"):
    check_pair(pi, mu)
    return check_positive_int(name, num, minimum=2)


# --------------------------------------------------------------------------- estimators


@functools.partial(jax.jit, static_argnames=("num_samples", "chunk"))
def likelihood_ratio(key, pi, mu, oracle=Exact(), num_samples=4096, chunk=None):
    """Algorithm 1: mean of (1 - mu(X)/pi(X))_+ over X ~ pi. With a noisy oracle it is the naive
    plug-in that treats single noisy draws as exact."""
    num = _checked(pi, mu, num_samples)
    m = _one_sided(key, pi, mu, oracle, num, 1, chunk, likelihood_ratio_term)
    return summarize_levels(m.mean, m.variance, [float(num)], (1,), [_trajectory_queries(oracle, num, pi.n, 1)])


@functools.partial(jax.jit, static_argnames=("num_per_side", "repeats", "chunk"))
def plugin(key, pi, mu, oracle=Exact(), num_per_side=2048, repeats=1, chunk=None):
    """Single-level plug-in (Lemma 8): Z_r = tanh(|log pi_r(X) - log mu_r(X)| / 2) with r-averaged
    draws, X ~ (pi + mu)/2 stratified as num_per_side trajectories from each side."""
    num = _checked(pi, mu, num_per_side, "num_per_side")
    return _symmetric(key, pi, mu, oracle, Schedule((num,), check_repeats((repeats,))), chunk)


def mixture(key, pi, mu, oracle=Exact(), num_per_side=2048, chunk=None):
    """Algorithm 1's symmetric form: tanh(|L_pi - L_mu| / 2) on X ~ (pi + mu)/2 (one draw each)."""
    return plugin(key, pi, mu, oracle, num_per_side=num_per_side, repeats=1, chunk=chunk)


def check_schedule(schedule):
    repeats = check_repeats(schedule.repeats)
    # N_l = 1 is allowed (the paper's finest levels use it); such a level's within-side variance
    # is 0 by construction, so its stderr contribution is a lower bound.
    counts = tuple(check_positive_int("level size N_l", n) for n in schedule.num_samples)
    if len(counts) != len(repeats):
        raise ValueError(f"schedule has {len(counts)} level sizes but {len(repeats)} repeat counts")
    return Schedule(counts, repeats)


def median_of_means(estimates):
    """Median over independent groups (leading axis) for a 1 - delta guarantee. The stderr uses
    the asymptotic efficiency of the median of Gaussian means: sqrt(pi/2) * stderr / sqrt(G)."""
    groups = estimates.value.shape[0]
    levels = estimates.levels
    pooled = LevelStats(
        levels.repeats[0],
        jnp.sum(levels.num_samples, 0),
        jnp.mean(levels.mean, 0),
        jnp.mean(levels.variance, 0),
        jnp.sum(levels.queries, 0),
    )
    stderr = math.sqrt(math.pi / 2) * jnp.mean(estimates.stderr) / math.sqrt(groups)
    return Estimate(jnp.median(estimates.value), stderr, jnp.sum(estimates.queries), pooled)


def groups_for_confidence(delta):
    """Number of median-of-means groups for failure probability delta: ceil(8 ln(1/delta)), odd."""
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    groups = math.ceil(8 * math.log(1 / delta))
    return groups + (groups % 2 == 0)


@functools.partial(jax.jit, static_argnames=("schedule", "num_groups", "chunk"))
def multilevel(key, pi, mu, oracle, schedule, num_groups=1, chunk=None):
    """Algorithm 3: sum over levels of mean coupled increments Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X),
    the same X and nested draws within a level, independent levels; median of num_groups copies."""
    check_pair(pi, mu)
    schedule = check_schedule(Schedule(*schedule))
    groups = check_positive_int("num_groups", num_groups)
    run = lambda k: _symmetric(k, pi, mu, oracle, schedule, chunk)
    if groups == 1:
        return run(key)
    return median_of_means(jax.lax.map(run, jax.random.split(key, groups)))


def sample_only(key, pi, mu, schedule, num_groups=1, chunk=None):
    """Theorem 1: Algorithm 3 through prefix samplers (a noisy oracle with sigma^2 <= K)."""
    return multilevel(key, pi, mu, Sampler(), schedule, num_groups=num_groups, chunk=chunk)


def paper_schedule(eps, sigma, n, c=1.0, budget_constant=1.0):
    """The schedule of Algorithm 3: r_l = 1 + ceil(c n sigma^2 2^l) and
    N_l = ceil(budget_constant * 2^-l (L + 1) / eps^2) for l = 0..L, with L = ceil(2 log2(1/eps))
    so that the top level's plug-in bias, of order sqrt(n sigma^2 / r_L) = 2^(-L/2), is below eps.
    Levels whose r equals the previous level's are dropped: their increment is identically 0."""
    check_range("eps", eps, 0.0, 1.0, low_open=True, high_open=True)
    check_range("sigma", sigma, 0.0)
    check_range("c", c, 0.0, low_open=True)
    check_range("budget_constant", budget_constant, 0.0, low_open=True)
    n = check_positive_int("n", n)
    top = math.ceil(2 * math.log2(1 / eps))
    counts, repeats = [], []
    for level in range(top + 1):
        r = 1 + math.ceil(c * n * sigma**2 * 2**level)
        if repeats and r == repeats[-1]:
            continue
        repeats.append(r)
        counts.append(max(2, math.ceil(budget_constant * 2.0**-level * (top + 1) / eps**2)))
    return Schedule(tuple(counts), tuple(repeats))


# --------------------------------------------------------------------------- baselines


def _kl_estimate(key, pi, mu, oracle, num, repeats, chunk, term):
    num = _checked(pi, mu, num)
    r = check_repeats((repeats,))
    m = _one_sided(key, pi, mu, oracle, num, repeats, chunk, term)
    kl = m.mean[0]
    mismatch = jnp.isinf(kl) | jnp.isnan(kl)
    kl = jnp.where(mismatch, jnp.inf, kl)
    kl_stderr = jnp.where(mismatch, jnp.inf, jnp.sqrt(m.variance[0] / num))
    tv = jnp.minimum(1.0, jnp.sqrt(jnp.maximum(kl, 0.0) / 2))
    # Delta method for sqrt(KL / 2); infinite KL gives the vacuous bound 1 with no spread.
    tv_stderr = jnp.where(mismatch | (tv >= 1.0), 0.0, kl_stderr / (4 * jnp.maximum(tv, 1e-12)))
    queries = jnp.asarray(_trajectory_queries(oracle, num, pi.n, repeats), jnp.float32)
    levels = LevelStats(jnp.asarray(r), jnp.asarray([float(num)]), m.mean, m.variance, queries[None])
    return KLEstimate(tv, tv_stderr, queries, levels, kl, kl_stderr)


def _plugin_kl_term(log_pi, log_mu):
    # log pi - log mu, +inf where mu has zero mass: KL is infinite under support mismatch.
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, log_pi - jnp.where(jnp.isneginf(log_mu), 0.0, log_mu))


def _k3_term(log_pi, log_mu):
    # k3 = (rho - 1) - log rho with rho = mu/pi: nonnegative, unbiased for KL(pi || mu) at exact access.
    log_rho = log_mu - log_pi
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, jnp.expm1(log_rho) - log_rho)


@functools.partial(jax.jit, static_argnames=("num_samples", "repeats", "chunk"))
def plugin_kl(key, pi, mu, oracle=Exact(), num_samples=4096, repeats=1, chunk=None):
    """Baseline: plug-in KL(pi || mu) = E_pi[log pi - log mu] and Pinsker's sqrt(KL / 2)."""
    return _kl_estimate(key, pi, mu, oracle, num_samples, repeats, chunk, _plugin_kl_term)


@functools.partial(jax.jit, static_argnames=("num_samples", "repeats", "chunk"))
def k3_pinsker(key, pi, mu, oracle=Exact(), num_samples=4096, repeats=1, chunk=None):
    """Baseline: the k3 KL estimator followed by Pinsker's bound."""
    return _kl_estimate(key, pi, mu, oracle, num_samples, repeats, chunk, _k3_term)


def naive_noisy_plugin(key, pi, mu, oracle, num_samples=4096, chunk=None):
    """Baseline: Algorithm 1 on single noisy draws, as if they were exact logits."""
    return likelihood_ratio(key, pi, mu, oracle, num_samples=num_samples, chunk=chunk)
