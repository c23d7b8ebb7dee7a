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

from tvjax.currency import likelihood_ratio_term, mixture_z
from tvjax.oracles import Exact, Sampler
from tvjax.sharding import random_streams, shard_rows
from tvjax.validate import check_pair, check_positive_int, check_range, check_repeats, is_concrete

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
    """Moments over the leading axis of the entries where `mask` holds (values broadcast to it)."""
    count = jnp.sum(mask, axis=0, dtype=jnp.float32)
    kept = jnp.where(mask, values, 0.0)  # where, not a product: masked entries may be inf
    mean = jnp.sum(kept, axis=0) / jnp.maximum(count, 1.0)
    return Moments(count, mean, jnp.sum(jnp.where(mask, (values - mean) ** 2, 0.0), axis=0))


def merge_moments(a, b):
    """Chan et al.'s pairwise update: stable for long streams in float32; empty sides are fine."""
    count = a.count + b.count
    delta = b.mean - a.mean
    share = b.count / jnp.maximum(count, 1.0)
    return Moments(count, a.mean + delta * share, a.m2 + b.m2 + delta**2 * a.count * share)


def memory_chunk(process, oracle):
    """Most trajectories one chunk may hold: CHUNK_POSITIONS floats per oracle row."""
    return max(1, CHUNK_POSITIONS // oracle.row_size(process))


def level_moments(key, summand, num_per_level, chunk, segments=1):
    """Per-level moments of summand(key, segment, levels [chunk], chunk) -> [chunk] over
    num_per_level[l] rows of each level l.

    The levels form `segments` equal groups (the estimators' sides); a segment's levels are laid
    end to end as one stream of rows that runs in chunks of the static size `chunk`, each row
    tagged with its level, so padding costs at most one chunk per segment whatever the number of
    levels. Sizes are runtime values (a traced array is fine): one compiled program serves every
    size and schedule of a length, and memory stays at one chunk.
    """
    counts = jnp.asarray(num_per_level, jnp.int32).reshape(segments, -1)
    levels = counts.shape[1]
    level_ids = jnp.arange(levels)

    def segment_body(segment, acc):
        ends = jnp.cumsum(counts[segment])
        segment_key = jax.random.fold_in(key, segment)

        def chunk_body(index, m):
            rows = index * chunk + jnp.arange(chunk)
            row_level = jnp.sum(rows[:, None] >= ends[None, :], axis=1)  # == levels past the end
            values = summand(jax.random.fold_in(segment_key, index), segment, jnp.minimum(row_level, levels - 1), chunk)
            return merge_moments(m, masked_moments(values[:, None], row_level[:, None] == level_ids))

        zeros = jnp.zeros(levels)
        m = jax.lax.fori_loop(0, (ends[-1] + chunk - 1) // chunk, chunk_body, Moments(zeros, zeros, zeros))
        return Moments(*(total.at[segment].set(part) for total, part in zip(acc, m)))

    zeros = jnp.zeros((segments, levels))
    with random_streams():
        acc = jax.lax.fori_loop(0, segments, segment_body, Moments(zeros, zeros, zeros))
    return Moments(*(a.reshape(-1) for a in acc))


def stream_chunk(process, oracle, num_per_level):
    """Static chunk rows, bounded by memory. Concrete sizes: about an eighth of the stream, rounded
    up to a power of two (nearby sizes share one compiled program) and at most 2048 rows (larger
    chunks stop paying on CPU). Traced sizes: the oracle's `traced_chunk_rows`."""
    cap = memory_chunk(process, oracle)
    if not all(is_concrete(num) for num in num_per_level):
        return min(cap, oracle.traced_chunk_rows)
    rows = max(64, math.ceil(sum(int(num) for num in num_per_level) / 8))
    return min(cap, 2048, 1 << (rows - 1).bit_length())


# --------------------------------------------------------------------------- building blocks


def _scored(key, tokens, pi, mu, oracle, coarse, fine):
    """[num, 2] (coarse, fine) path log-probs of `tokens` under each model, independent draws."""
    return oracle.coupled_path_logprobs(key, (pi, mu), tokens, coarse, fine)


def _trajectory_queries(oracle, num, n, repeats):
    return oracle.queries(num, n, 1) + 2 * oracle.queries(num, n, repeats)


def summarize_levels(means, variances, counts, repeats, queries):
    """Combine independent per-level sample means into one estimate: sum of level means, with
    stderr sqrt(sum_l Var_l / N_l), for every synthetic estimator. A level
    with no samples (schedule padding) contributes nothing."""
    means, variances, counts = (jnp.asarray(a, jnp.float32) for a in (means, variances, counts))
    queries = jnp.asarray(queries, jnp.float32)  # float: counts pass 2**31 in real sweeps
    levels = LevelStats(jnp.asarray(repeats), counts, means, variances, queries)
    stderr = jnp.sqrt(jnp.sum(jnp.where(counts > 0, variances / jnp.maximum(counts, 1.0), 0.0)))
    return Estimate(jnp.sum(means), stderr, jnp.sum(queries), levels)


def _one_sided(key, pi, mu, oracle, num, repeats, chunk, term):
    """Moments of term(L_pi, L_mu) on X ~ pi at `repeats` draws per position (one level)."""

    def summand(k, segment, levels, size):
        k_sample, k_score = jax.random.split(k)
        log_pi, log_mu = _scored(k_score, shard_rows(pi.sample(k_sample, size)), pi, mu, oracle, 0, repeats)
        return term(log_pi[:, 1], log_mu[:, 1])

    return level_moments(key, summand, jnp.reshape(num, (1,)), chunk)


def _symmetric(key, pi, mu, oracle, counts, repeats, chunk):
    """Algorithm 3's levels on X ~ (pi + mu)/2, stratified: counts[l] trajectories from each side.

    Level l's summand is the coupled increment Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X) on one trajectory
    with nested draws (Y_0 = Z_{r_0}); a single level is the plug-in estimator. The two sides are
    the two segments of one stream (levels 0..L-1 sample pi, L..2L-1 sample mu), so the oracle's
    draws and the scoring compile once."""
    levels = counts.shape[0]
    fine = repeats
    coarse = jnp.concatenate([jnp.zeros(1, jnp.int32), fine[:-1]])

    def summand(k, side, level, size):
        k_sample, k_score = jax.random.split(k)
        tokens = jax.lax.cond(side == 0, lambda k: pi.sample(k, size), lambda k: mu.sample(k, size), k_sample)
        # Rows of one chunk may belong to different levels: per-row repeat counts.
        log_pi, log_mu = _scored(k_score, shard_rows(tokens), pi, mu, oracle, coarse[level, None], fine[level, None])
        z = mixture_z(log_pi, log_mu)
        return z[:, 1] - jnp.where(level > 0, z[:, 0], 0.0)

    m = level_moments(key, summand, jnp.concatenate([counts, counts]), chunk, segments=2)
    queries = 2 * _trajectory_queries(oracle, counts, pi.n, repeats)
    return summarize_levels(
        (m.mean[:levels] + m.mean[levels:]) / 2,
        (m.variance[:levels] + m.variance[levels:]) / 2,
        2.0 * counts,
        repeats,
        queries,
    )


def _checked(pi, mu, num, name="num_samples"):
    """The pair and a trajectory count, checked; a traced count passes through (its caller checked it)."""
    check_pair(pi, mu)
    return check_positive_int(name, num, minimum=2) if is_concrete(num) else num


# --------------------------------------------------------------------------- estimators
# Public estimators are plain functions that check their arguments and call one jitted core per
# estimator. Sizes are runtime values of the core, so a sweep over N or over schedules of a
# length reuses one compiled program; only the chunk (and the number of levels) is static.


@functools.partial(jax.jit, static_argnames=("chunk", "term"))
def _one_sided_estimate(key, pi, mu, oracle, num, repeats, chunk, term):
    m = _one_sided(key, pi, mu, oracle, num, repeats, chunk, term)
    queries = _trajectory_queries(oracle, num, pi.n, repeats)
    return m, queries


def likelihood_ratio(key, pi, mu, oracle=Exact(), num_samples=4096, chunk=None):
    """Algorithm 1: mean of (1 - mu(X)/pi(X))_+ over X ~ pi. With a noisy oracle it is the naive
    plug-in that treats single noisy draws as exact. `num_samples` may be traced."""
    num = _checked(pi, mu, num_samples)
    chunk = chunk or stream_chunk(pi, oracle, (num,))
    m, queries = _one_sided_estimate(key, pi, mu, oracle, num, 1, chunk, likelihood_ratio_term)
    return summarize_levels(m.mean, m.variance, jnp.reshape(num, (1,)), jnp.ones(1, jnp.int32), queries[None])


def plugin(key, pi, mu, oracle=Exact(), num_per_side=2048, repeats=1, chunk=None):
    """Single-level plug-in (Lemma 8): Z_r = tanh(|log pi_r(X) - log mu_r(X)| / 2) with r-averaged
    draws, X ~ (pi + mu)/2 stratified as num_per_side trajectories from each side."""
    num = _checked(pi, mu, num_per_side, "num_per_side")
    return multilevel(key, pi, mu, oracle, Schedule((num,), (repeats,)), chunk=chunk)


def mixture(key, pi, mu, oracle=Exact(), num_per_side=2048, chunk=None):
    """Algorithm 1's symmetric form: tanh(|L_pi - L_mu| / 2) on X ~ (pi + mu)/2 (one draw each)."""
    return plugin(key, pi, mu, oracle, num_per_side=num_per_side, repeats=1, chunk=chunk)


def check_schedule(schedule):
    """A schedule's level sizes and repeats as int32 arrays, checked where concrete.

    N_l = 1 is allowed (the paper's finest levels use it); such a level's within-side variance is
    0 by construction, so its stderr contribution is a lower bound. Trailing levels with N_l = 0
    are padding (see `pad_schedule`): they cost nothing and add nothing."""
    counts, repeats = schedule
    if len(counts) != len(repeats):
        raise ValueError(f"schedule has {len(counts)} level sizes but {len(repeats)} repeat counts")
    if not len(counts):
        raise ValueError("the schedule has no levels")
    if all(is_concrete(v) for v in (*counts, *repeats)):
        counts = tuple(check_positive_int("level size N_l", n, minimum=0) for n in counts)
        used = max((l + 1 for l, n in enumerate(counts) if n > 0), default=0)
        if used == 0 or any(n == 0 for n in counts[:used]):
            raise ValueError(f"level sizes must be >= 1 (zeros only as trailing padding), got {counts}")
        real = check_repeats(repeats[:used])
        if any(int(r) != real[-1] for r in repeats[used:]):
            raise ValueError(f"padding levels repeat the last real level's r, got {tuple(repeats)}")
    return jnp.asarray(counts, jnp.int32), jnp.asarray(repeats, jnp.int32)


def pad_schedule(schedule, levels):
    """`schedule` with empty levels appended up to `levels`: schedules of different depths then
    share one compiled program (their estimates and level stats are unchanged but padded)."""
    counts, repeats = (tuple(int(v) for v in part) for part in schedule)
    if levels < len(counts):
        raise ValueError(f"cannot pad a {len(counts)}-level schedule to {levels} levels")
    extra = levels - len(counts)
    return Schedule(counts + (0,) * extra, repeats + (repeats[-1],) * extra)


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


@functools.partial(jax.jit, static_argnames=("num_groups", "chunk"))
def _multilevel(key, pi, mu, oracle, counts, repeats, num_groups, chunk):
    run = lambda k: _symmetric(k, pi, mu, oracle, counts, repeats, chunk)
    if num_groups == 1:
        return run(key)
    return median_of_means(jax.lax.map(run, jax.random.split(key, num_groups)))


def multilevel(key, pi, mu, oracle, schedule, num_groups=1, chunk=None):
    """Algorithm 3: sum over levels of mean coupled increments Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X),
    the same X and nested draws within a level, independent levels; median of num_groups copies.
    The schedule's entries may be traced (its number of levels is static)."""
    check_pair(pi, mu)
    counts, repeats = check_schedule(schedule)
    groups = check_positive_int("num_groups", num_groups)
    chunk = chunk or stream_chunk(pi, oracle, tuple(schedule[0]))
    return _multilevel(key, pi, mu, oracle, counts, repeats, groups, chunk)


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
    r = check_repeats((repeats,)) if is_concrete(repeats) else repeats
    chunk = chunk or stream_chunk(pi, oracle, (num,))
    m, queries = _one_sided_estimate(key, pi, mu, oracle, num, repeats, chunk, term)
    kl = m.mean[0]
    mismatch = jnp.isinf(kl) | jnp.isnan(kl)
    kl = jnp.where(mismatch, jnp.inf, kl)
    kl_stderr = jnp.where(mismatch, jnp.inf, jnp.sqrt(m.variance[0] / num))
    tv = jnp.minimum(1.0, jnp.sqrt(jnp.maximum(kl, 0.0) / 2))
    # Delta method for sqrt(KL / 2); infinite KL gives the vacuous bound 1 with no spread.
    tv_stderr = jnp.where(mismatch | (tv >= 1.0), 0.0, kl_stderr / (4 * jnp.maximum(tv, 1e-12)))
    one = lambda x, dtype=None: jnp.reshape(jnp.asarray(x, dtype), (1,))
    levels = LevelStats(one(r), one(num, jnp.float32), m.mean, m.variance, queries[None])
    return KLEstimate(tv, tv_stderr, queries, levels, kl, kl_stderr)


def _plugin_kl_term(log_pi, log_mu):
    # log pi - log mu, +inf where mu has zero mass: KL is infinite under support mismatch.
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, log_pi - jnp.where(jnp.isneginf(log_mu), 0.0, log_mu))


def _k3_term(log_pi, log_mu):
    # k3 = (rho - 1) - log rho with rho = mu/pi: nonnegative, unbiased for KL(pi || mu) at exact access.
    log_rho = log_mu - log_pi
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, jnp.expm1(log_rho) - log_rho)


def plugin_kl(key, pi, mu, oracle=Exact(), num_samples=4096, repeats=1, chunk=None):
    """Baseline: plug-in KL(pi || mu) = E_pi[log pi - log mu] and Pinsker's sqrt(KL / 2)."""
    return _kl_estimate(key, pi, mu, oracle, num_samples, repeats, chunk, _plugin_kl_term)


def k3_pinsker(key, pi, mu, oracle=Exact(), num_samples=4096, repeats=1, chunk=None):
    """Baseline: the k3 KL estimator followed by Pinsker's bound."""
    return _kl_estimate(key, pi, mu, oracle, num_samples, repeats, chunk, _k3_term)


def naive_noisy_plugin(key, pi, mu, oracle, num_samples=4096, chunk=None):
    """Baseline: Algorithm 1 on single noisy draws, as if they were exact logits."""
    return likelihood_ratio(key, pi, mu, oracle, num_samples=num_samples, chunk=chunk)
