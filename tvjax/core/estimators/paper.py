"""The paper's estimators (Algorithms 1 and 3, Lemma 8) as pure functions of (key, pi, mu, oracle,
sizes), and the shared cores the baselines reuse.

Every estimator is `fn(key, pi, mu, oracle, sizes, *, copies=None, chunk=None)`: sizes is the
estimator's NamedTuple of `tvjax.core.schedules` (runtime values: one compiled program serves every
size); copies=C gives C independent estimates (a leading axis of C on every field) from one stream
of rows in one program, with optional per-copy sizes (a leading axis of C). They are not the
estimates of C separate calls with split keys: the chunks' random keys follow the shared stream.
Queries come from `tvjax.core.cost`; trajectories that stop at EOS (`tvjax.core.currency.stopping_ids`)
spend queries on their real positions only, summed as they are drawn.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core import cost
from tvjax.core.currency import likelihood_ratio_term, mixture_z, stopping_ids, trajectory_lengths
from tvjax.core.programs import program
from tvjax.core.schedules import Level, Samples, Schedule, check_counts, check_repeat_count, check_schedule, per_copy
from tvjax.core.streaming import Moments, chosen_chunk, level_moments
from tvjax.core.validate import all_concrete, check_pair, check_positive_int


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


def summarize_levels(means, variances, counts, repeats, queries):
    """Combine independent per-level sample means into one estimate: sum of level means, with
    stderr sqrt(sum_l Var_l / N_l), for every synthetic estimator. A level with no samples
    (schedule padding) contributes nothing. Arrays are [L], or [copies, L] for copies
    (the result then has a leading copies axis)."""
    means, variances, counts = (jnp.asarray(a, jnp.float32) for a in (means, variances, counts))
    queries = jnp.asarray(queries, jnp.float32)  # float: counts pass 2**31 in real sweeps
    repeats = jnp.broadcast_to(jnp.asarray(repeats), means.shape)
    levels = LevelStats(repeats, counts, means, variances, queries)
    stderr = jnp.sqrt(jnp.sum(jnp.where(counts > 0, variances / jnp.maximum(counts, 1.0), 0.0), axis=-1))
    return Estimate(jnp.sum(means, axis=-1), stderr, jnp.sum(queries, axis=-1), levels)


def unbatched(result, copies):
    """Drop the copies axis of a single estimate."""
    return jax.tree.map(lambda a: a[0], result) if copies is None else result


def check_sizes(sizes, kind):
    if not isinstance(sizes, kind):
        raise TypeError(f"this estimator's sizes are a {kind.__name__}{kind._fields}, got {sizes!r}")
    return sizes


def shared_stopping_ids(pi, mu):
    """The EOS ids at which both sides stop (() for fixed length); sides that stop differently
    have no common sample space."""
    ids = stopping_ids(pi)
    if stopping_ids(mu) != ids:
        raise ValueError(f"pi and mu stop at different EOS ids ({ids} vs {stopping_ids(mu)}): their outputs "
                         "are not one sample space")
    return ids


def stream_positions(key, summand, counts, chunk, stop, n):
    """level_moments of summand(k, segment, level, size) -> (values, paths), and the real
    positions of every group's trajectories [segments, copies, levels]: counted as drawn when
    they stop at the EOS ids `stop`, counts * n otherwise (no per-row work)."""
    if not stop:
        m = level_moments(key, lambda *args: summand(*args)[0], counts, chunk)
        return m, jnp.asarray(counts, jnp.float32) * n

    def with_lengths(*args):
        values, paths = summand(*args)
        return values, trajectory_lengths(paths, stop)

    return level_moments(key, with_lengths, counts, chunk, positions=True)


# --------------------------------------------------------------------------- one-sided (X ~ pi)


def _one_sided(key, pi, mu, oracle, num, repeats, chunk, term):
    """(Moments [copies, 1] of term(L_pi, L_mu) on X ~ pi at `repeats` draws per position, num[c]
    trajectories for copy c; their queries [copies])."""

    draw = oracle.trajectory_sampler(pi, (pi, mu))
    stop = shared_stopping_ids(pi, mu)

    def summand(k, segment, levels, size):
        k_sample, k_score = jax.random.split(k)
        paths = draw(k_sample, size)
        log_pi, log_mu = oracle.nested_path_logprobs(k_score, (pi, mu), paths, (0, repeats))
        return term(log_pi[:, 1], log_mu[:, 1]), paths

    m, positions = stream_positions(key, summand, num[None, :, None], chunk, stop, pi.n)
    return Moments(*(a[0] for a in m)), cost.trajectory_queries(positions[0, :, 0], 1, jnp.asarray(repeats, jnp.float32))


@program(("chunk", "term"))
def _one_sided_program(key, pi, mu, oracle, num, repeats, chunk, term):
    return _one_sided(key, pi, mu, oracle, num, repeats, chunk, term)


def one_sided(key, pi, mu, oracle, sizes, chunk, term, copies):
    """(num [copies], Moments [copies, 1], queries [copies]) of term(L_pi, L_mu) on X ~ pi, the
    Samples checked and the chunk chosen: the core of Algorithm 1 and the KL baselines."""
    check_pair(pi, mu)
    check_sizes(sizes, Samples)
    num = per_copy(check_counts("Samples.num (trajectories)", sizes.num, 2), copies)
    repeats = check_repeat_count(sizes.repeats)
    chunk = chosen_chunk(chunk, pi, oracle, num)
    return (num, *_one_sided_program(key, pi, mu, oracle, num, repeats, chunk, term))


def likelihood_ratio(key, pi, mu, oracle, sizes, *, copies=None, chunk=None):
    """Algorithm 1: mean of (1 - mu(X)/pi(X))_+ over X ~ pi, Samples(num, repeats=1). With a
    noisy oracle it is the naive plug-in that treats (r-averaged) noisy draws as exact."""
    num, m, queries = one_sided(key, pi, mu, oracle, sizes, chunk, likelihood_ratio_term, copies)
    repeats = jnp.broadcast_to(jnp.asarray(sizes.repeats, jnp.int32), (1,))
    estimate = summarize_levels(m.mean, m.variance, num[:, None], repeats, queries[:, None])
    return unbatched(estimate, copies)


# --------------------------------------------------------------------------- symmetric levels


def _symmetric(key, pi, mu, oracle, counts, repeats, chunk):
    """Algorithm 3's levels on X ~ (pi + mu)/2, stratified: counts[c, l] trajectories from each
    side for copy c. Returns an Estimate with a leading copies axis.

    Level l's summand is the coupled increment Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X) on one trajectory
    with nested draws (Y_0 = Z_{r_0}); a single level is the plug-in estimator. The two sides are
    the two segments of the stream (pi's samples, then mu's), so the oracle's draws and the
    scoring compile once."""
    fine = repeats
    coarse = jnp.concatenate([jnp.zeros(1, jnp.int32), fine[:-1]])

    draw = oracle.side_sampler((pi, mu))
    stop = shared_stopping_ids(pi, mu)

    def summand(k, side, level, size):
        k_sample, k_score = jax.random.split(k)
        paths = draw(k_sample, size, side)

        def first_level():  # Y_0 = Z_{r_0}: one drawn sum per cell
            return mixture_z(*oracle.nested_path_logprobs(k_score, (pi, mu), paths, (fine[level, None],)))[:, 0]

        def coupled():  # rows of one chunk may belong to different levels: per-row repeat counts
            log_pi, log_mu = oracle.nested_path_logprobs(k_score, (pi, mu), paths, (coarse[level, None], fine[level, None]))
            z = mixture_z(log_pi, log_mu)
            return z[:, 1] - jnp.where(level > 0, z[:, 0], 0.0)

        # Most chunks hold first-level rows only (the coarsest level has most trajectories):
        # those may skip the coarse sums, which the coupled form draws and multiplies by 0.
        if not oracle.separate_first_level:
            return coupled(), paths
        return jax.lax.cond(jnp.all(level == 0), first_level, coupled), paths

    m, positions = stream_positions(key, summand, jnp.stack([counts, counts]), chunk, stop, pi.n)
    queries = cost.trajectory_queries(positions[0] + positions[1], 1, jnp.asarray(repeats, jnp.float32))
    return summarize_levels(jnp.mean(m.mean, 0), jnp.mean(m.variance, 0), 2.0 * counts, repeats, queries)


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


@program(("num_groups", "chunk"))
def _multilevel_program(key, pi, mu, oracle, counts, repeats, num_groups, chunk):
    # Median-of-means groups are more copies of the stream: [copies * groups] estimates.
    estimates = _symmetric(key, pi, mu, oracle, jnp.repeat(counts, num_groups, axis=0), repeats, chunk)
    if num_groups == 1:
        return estimates
    grouped = jax.tree.map(lambda a: a.reshape((counts.shape[0], num_groups) + a.shape[1:]), estimates)
    return jax.vmap(median_of_means)(grouped)


def multilevel(key, pi, mu, oracle, sizes, *, copies=None, chunk=None, num_groups=1):
    """Algorithm 3 for a Schedule(num_samples, repeats): sum over levels of mean coupled
    increments Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X), the same X and nested draws within a level,
    independent levels; median of num_groups copies. Each group runs the whole schedule (the
    groups do not split it), so the queries are num_groups times the schedule's. Through `Sampler()` it is the sample-only
    estimator of Theorem 1. The schedule's entries may be traced (its number of levels is
    static); level sizes [L] or per copy [C, L]."""
    check_pair(pi, mu)
    counts, repeats = check_schedule(check_sizes(sizes, Schedule))
    counts = per_copy(counts, copies, repeats.shape)
    groups = check_positive_int("num_groups", num_groups)
    if all_concrete(counts):
        check_counts("level sizes times num_groups", np.asarray(counts, np.int64) * groups, 0)
    chunk = chosen_chunk(chunk, pi, oracle, counts * groups)
    return unbatched(_multilevel_program(key, pi, mu, oracle, counts, repeats, groups, chunk), copies)


def plugin(key, pi, mu, oracle, sizes, *, copies=None, chunk=None):
    """Single-level plug-in (Lemma 8), Level(num_per_side, repeats=1): Z_r = tanh(|log pi_r(X) -
    log mu_r(X)| / 2) with r-averaged draws, X ~ (pi + mu)/2 stratified as num_per_side
    trajectories from each side. At r = 1 with exact logits it is Algorithm 1's symmetric form."""
    check_sizes(sizes, Level)
    num = check_counts("num_per_side", sizes.num_per_side, 2)
    schedule = Schedule(num[..., None], check_repeat_count(sizes.repeats).reshape(1))
    return multilevel(key, pi, mu, oracle, schedule, chunk=chunk, copies=copies)
