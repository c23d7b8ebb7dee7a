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
from tvjax.sharding import random_streams, shard_rows
from tvjax.validate import check_pair, check_positive_int, check_range, check_repeats, is_concrete

# Trajectory positions held in memory at once by one chunk (times the vocabulary for LogitNoise).
CHUNK_POSITIONS = 2**20

# Options for compiling an estimator program. With its classic loop emitters XLA's CPU backend
# compiles these programs 20-30% faster than with its newer fusion emitters, with a third less
# peak memory, and runs them within about 20% (benchmarks/README.md); other backends ignore the
# option. JAX takes compiler options from the outermost jit only: pass them to your own jax.jit
# around estimator calls.
COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


def _program(static_argnames):
    """Decorator: jit `fn` with COMPILER_OPTIONS when it is called from Python, plainly when it is
    traced inside another jit (which then decides the options)."""

    def wrap(fn):
        top = jax.jit(fn, static_argnames=static_argnames, compiler_options=COMPILER_OPTIONS)
        nested = jax.jit(fn, static_argnames=static_argnames)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return (top if _all_concrete((args, kwargs)) else nested)(*args, **kwargs)

        call.top = top
        return call

    return wrap


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


# Groups of rows (copy, level) one chunk step may reduce: a step that would reach past the
# WINDOW-th group boundary stops there.
WINDOW = 32


def window_moments(values, local, valid, window, single):
    """Moments [window] of the `valid` values per local group id. `single`: every valid row is
    in group 0 (most chunks of a large estimate), a reduction over the rows alone."""
    one_group = lambda: Moments(*(jnp.pad(a, (0, window - 1)) for a in masked_moments(values[:, None], valid[:, None])))
    many_groups = lambda: masked_moments(values[:, None], valid[:, None] & (local[:, None] == jnp.arange(window)))
    return jax.lax.cond(single, one_group, many_groups)


def level_moments(key, summand, counts, chunk):
    """Moments of summand(key, segment, levels [chunk], chunk) -> [chunk] per group of rows.

    counts [segments, copies, levels]: group (c, l) of segment s is counts[s, c, l] rows at
    level l. A segment's groups are laid end to end, copy after copy, as one stream of rows that
    runs in chunks of the static size `chunk`, each row tagged with its level; a chunk holds rows
    of up to WINDOW consecutive groups. So padding costs at most one chunk per segment, whatever
    the numbers of copies and levels, and many small estimates share chunks. Sizes are runtime
    values (a traced array is fine): one compiled program serves every size and schedule of a
    shape, and memory stays at one chunk. Returns Moments of shape [segments, copies, levels].
    """
    counts = jnp.asarray(counts, jnp.int32)
    segments, copies, levels = counts.shape
    groups = copies * levels
    window = min(WINDOW, groups)

    def segment_body(segment, acc):
        ends = jnp.cumsum(counts[segment].reshape(-1))
        total = ends[-1]
        # Padded so that a window starting at any group stays in bounds.
        window_ends = jnp.concatenate([ends, jnp.full(window, total)])
        segment_key = jax.random.fold_in(key, segment)

        def step(state):
            start, index, m = state
            first = jnp.sum(ends <= start)  # the group holding row `start` (empty groups skipped)
            local_ends = jax.lax.dynamic_slice(window_ends, (first,), (window,))
            stop = jnp.minimum(start + chunk, local_ends[-1])
            rows = start + jnp.arange(chunk)
            local = jnp.sum(rows[:, None] >= local_ends[None, :], axis=1)
            level = (first + jnp.minimum(local, window - 1)) % levels
            values = summand(jax.random.fold_in(segment_key, index), segment, level, chunk)
            seen = Moments(*(jax.lax.dynamic_slice(a, (first,), (window,)) for a in m))
            merged = merge_moments(seen, window_moments(values, local, rows < stop, window, stop <= local_ends[0]))
            m = Moments(*(jax.lax.dynamic_update_slice(a, b, (first,)) for a, b in zip(m, merged)))
            return stop, index + 1, m

        zeros = jnp.zeros(groups + window)
        start = (jnp.int32(0), jnp.int32(0), Moments(zeros, zeros, zeros))
        _, _, m = jax.lax.while_loop(lambda state: state[0] < total, step, start)
        return Moments(*(a.at[segment].set(b[:groups]) for a, b in zip(acc, m)))

    zeros = jnp.zeros((segments, groups))
    with random_streams():
        acc = jax.lax.fori_loop(0, segments, segment_body, Moments(zeros, zeros, zeros))
    return Moments(*(a.reshape(segments, copies, levels) for a in acc))


def stream_chunk(process, oracle, sizes):
    """Static chunk rows, bounded by memory. Concrete sizes (every row of the stream): about an
    eighth of the stream, rounded up to a power of two (nearby sizes share one compiled program)
    and at most 2048 rows (larger chunks stop paying on CPU). Traced sizes: the oracle's
    `traced_chunk_rows`."""
    cap = memory_chunk(process, oracle)
    if not _all_concrete(sizes):
        return min(cap, oracle.traced_chunk_rows)
    rows = max(64, math.ceil(int(np.sum(np.asarray(sizes))) / 8))
    return min(cap, 2048, 1 << (rows - 1).bit_length())


# --------------------------------------------------------------------------- building blocks


def _scored(key, tokens, pi, mu, oracle, coarse, fine):
    """[num, 2] (coarse, fine) path log-probs of `tokens` under each model, independent draws."""
    return oracle.coupled_path_logprobs(key, (pi, mu), tokens, coarse, fine)


def _trajectory_queries(oracle, num, n, repeats):
    return oracle.queries(num, n, 1) + 2 * oracle.queries(num, n, repeats)


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


def _one_sided(key, pi, mu, oracle, num, repeats, chunk, term):
    """Moments [copies, 1] of term(L_pi, L_mu) on X ~ pi at `repeats` draws per position, num[c]
    trajectories for copy c."""

    def summand(k, segment, levels, size):
        k_sample, k_score = jax.random.split(k)
        log_pi, log_mu = _scored(k_score, shard_rows(pi.sample(k_sample, size)), pi, mu, oracle, 0, repeats)
        return term(log_pi[:, 1], log_mu[:, 1])

    m = level_moments(key, summand, num[None, :, None], chunk)
    return Moments(*(a[0] for a in m))


def _symmetric(key, pi, mu, oracle, counts, repeats, chunk):
    """Algorithm 3's levels on X ~ (pi + mu)/2, stratified: counts[c, l] trajectories from each
    side for copy c. Returns an Estimate with a leading copies axis.

    Level l's summand is the coupled increment Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X) on one trajectory
    with nested draws (Y_0 = Z_{r_0}); a single level is the plug-in estimator. The two sides are
    the two segments of the stream (pi's samples, then mu's), so the oracle's draws and the
    scoring compile once."""
    fine = repeats
    coarse = jnp.concatenate([jnp.zeros(1, jnp.int32), fine[:-1]])

    def summand(k, side, level, size):
        k_sample, k_score = jax.random.split(k)
        tokens = jax.lax.cond(side == 0, lambda k: pi.sample(k, size), lambda k: mu.sample(k, size), k_sample)
        # Rows of one chunk may belong to different levels: per-row repeat counts.
        log_pi, log_mu = _scored(k_score, shard_rows(tokens), pi, mu, oracle, coarse[level, None], fine[level, None])
        z = mixture_z(log_pi, log_mu)
        return z[:, 1] - jnp.where(level > 0, z[:, 0], 0.0)

    m = level_moments(key, summand, jnp.stack([counts, counts]), chunk)
    queries = 2 * _trajectory_queries(oracle, counts, pi.n, repeats)
    return summarize_levels(jnp.mean(m.mean, 0), jnp.mean(m.variance, 0), 2.0 * counts, repeats, queries)


def _all_concrete(tree):
    return all(is_concrete(leaf) for leaf in jax.tree.leaves(tree))


def _check_counts(name, counts, minimum):
    """Integer counts >= minimum, elementwise; traced counts pass through (their caller checked)."""
    if _all_concrete(counts):
        array = np.asarray(counts)
        integral = array.dtype != bool and np.all(np.isfinite(array.astype(float))) and np.all(array == np.round(array))
        if array.size == 0 or not integral or np.any(array < minimum):
            raise ValueError(f"{name} must be integers >= {minimum}, got {counts!r}")
    return _int32(counts)


def _int32(values):
    # numpy while concrete: inside an outer jit a jnp array is a tracer, and the chunk size
    # (static) is chosen from concrete sizes.
    return np.asarray(values, np.int32) if _all_concrete(values) else jnp.asarray(values, jnp.int32)


def _per_copy(sizes, copies, shape=()):
    """Sizes broadcast to [copies, *shape] (one copy when copies is None)."""
    sizes = _int32(sizes)
    xp = np if isinstance(sizes, np.ndarray) else jnp
    per_copy = sizes.ndim > len(shape)
    if copies is None:
        if per_copy:
            raise ValueError(f"sizes of shape {sizes.shape} have a copies axis: pass copies={sizes.shape[0]}")
        return sizes[None]
    copies = check_positive_int("copies", copies)
    if per_copy and sizes.shape[0] != copies:
        raise ValueError(f"per-copy sizes have {sizes.shape[0]} entries for {copies} copies")
    return xp.broadcast_to(sizes, (copies,) + shape)


def _unbatched(result, copies):
    """Drop the copies axis of a single estimate."""
    return jax.tree.map(lambda a: a[0], result) if copies is None else result


# --------------------------------------------------------------------------- estimators
# Public estimators are plain functions that check their arguments and call one jitted core per
# estimator. Sizes are runtime values of the core, so a sweep over N or over schedules of a
# shape reuses one compiled program; only the chunk, the number of levels and the number of
# copies are static.
#
# copies=C gives C independent estimates (a leading axis of C on every field) from one stream of
# rows in one program: repetitions of a small estimate share chunks instead of each padding its
# own. Sizes may then carry a leading axis of C (per-copy sizes). They are not the estimates of C
# separate calls with split keys: the chunks' random keys follow the shared stream.


@_program(("chunk", "term"))
def _one_sided_estimate(key, pi, mu, oracle, num, repeats, chunk, term):
    m = _one_sided(key, pi, mu, oracle, num, repeats, chunk, term)
    return m, _trajectory_queries(oracle, num, pi.n, repeats)


def _one_sided_checked(key, pi, mu, oracle, num_samples, repeats, chunk, term, copies):
    """(num [copies], Moments [copies, 1], queries [copies]) of a one-sided estimator, its
    arguments checked and its chunk chosen."""
    check_pair(pi, mu)
    num = _per_copy(_check_counts("num_samples", num_samples, 2), copies)
    chunk = chunk or stream_chunk(pi, oracle, num)
    return (num, *_one_sided_estimate(key, pi, mu, oracle, num, repeats, chunk, term))


def likelihood_ratio(key, pi, mu, oracle=Exact(), num_samples=4096, chunk=None, copies=None):
    """Algorithm 1: mean of (1 - mu(X)/pi(X))_+ over X ~ pi. With a noisy oracle it is the naive
    plug-in that treats single noisy draws as exact. `num_samples` may be traced."""
    num, m, queries = _one_sided_checked(key, pi, mu, oracle, num_samples, 1, chunk, likelihood_ratio_term, copies)
    estimate = summarize_levels(m.mean, m.variance, num[:, None], jnp.ones(1, jnp.int32), queries[:, None])
    return _unbatched(estimate, copies)


def plugin(key, pi, mu, oracle=Exact(), num_per_side=2048, repeats=1, chunk=None, copies=None):
    """Single-level plug-in (Lemma 8): Z_r = tanh(|log pi_r(X) - log mu_r(X)| / 2) with r-averaged
    draws, X ~ (pi + mu)/2 stratified as num_per_side trajectories from each side."""
    num = _check_counts("num_per_side", num_per_side, 2)
    schedule = Schedule(num[..., None], _int32(repeats).reshape(1))
    return multilevel(key, pi, mu, oracle, schedule, chunk=chunk, copies=copies)


def mixture(key, pi, mu, oracle=Exact(), num_per_side=2048, chunk=None, copies=None):
    """Algorithm 1's symmetric form: tanh(|L_pi - L_mu| / 2) on X ~ (pi + mu)/2 (one draw each)."""
    return plugin(key, pi, mu, oracle, num_per_side=num_per_side, repeats=1, chunk=chunk, copies=copies)


def check_schedule(schedule):
    """A schedule's level sizes and repeats as int32 arrays, checked where concrete. Level sizes
    are [L], or [copies, L] for per-copy schedules (see `multilevel`'s copies).

    N_l = 1 is allowed (the paper's finest levels use it); such a level's within-side variance is
    0 by construction, so its stderr contribution is a lower bound. Trailing levels with N_l = 0
    are padding (see `pad_schedule`): they cost nothing and add nothing."""
    counts, repeats = (_int32(part) for part in schedule)
    if repeats.ndim != 1 or counts.ndim not in (1, 2) or counts.shape[-1] != repeats.shape[0]:
        raise ValueError(f"schedule has level sizes of shape {counts.shape} for {repeats.shape} repeat counts")
    if not repeats.shape[0]:
        raise ValueError("the schedule has no levels")
    if _all_concrete(schedule):
        _check_counts("level size N_l", counts, 0)
        used = 0
        for row in counts.reshape(-1, counts.shape[-1]).tolist():
            real = max((l + 1 for l, n in enumerate(row) if n > 0), default=0)
            if real == 0 or any(n == 0 for n in row[:real]):
                raise ValueError(f"level sizes must be >= 1 (zeros only as trailing padding), got {tuple(row)}")
            used = max(used, real)
        last = check_repeats(repeats[:used].tolist())[-1]
        if any(int(r) != last for r in repeats[used:]):
            raise ValueError(f"padding levels repeat the last real level's r, got {tuple(repeats.tolist())}")
    return counts, repeats


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


@_program(("num_groups", "chunk"))
def _multilevel(key, pi, mu, oracle, counts, repeats, num_groups, chunk):
    # Median-of-means groups are more copies of the stream: [copies * groups] estimates.
    estimates = _symmetric(key, pi, mu, oracle, jnp.repeat(counts, num_groups, axis=0), repeats, chunk)
    if num_groups == 1:
        return estimates
    grouped = jax.tree.map(lambda a: a.reshape((counts.shape[0], num_groups) + a.shape[1:]), estimates)
    return jax.vmap(median_of_means)(grouped)


def multilevel(key, pi, mu, oracle, schedule, num_groups=1, chunk=None, copies=None):
    """Algorithm 3: sum over levels of mean coupled increments Y_l = Z_{r_l}(X) - Z_{r_{l-1}}(X),
    the same X and nested draws within a level, independent levels; median of num_groups copies.
    The schedule's entries may be traced (its number of levels is static). copies=C: C
    independent estimates from one stream (level sizes [L] or per copy [C, L])."""
    check_pair(pi, mu)
    counts, repeats = check_schedule(schedule)
    counts = _per_copy(counts, copies, repeats.shape)
    groups = check_positive_int("num_groups", num_groups)
    chunk = chunk or stream_chunk(pi, oracle, counts * groups)
    return _unbatched(_multilevel(key, pi, mu, oracle, counts, repeats, groups, chunk), copies)


def sample_only(key, pi, mu, schedule, num_groups=1, chunk=None, copies=None):
    """Theorem 1: Algorithm 3 through prefix samplers (a noisy oracle with sigma^2 <= K)."""
    return multilevel(key, pi, mu, Sampler(), schedule, num_groups=num_groups, chunk=chunk, copies=copies)


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


def _kl_estimate(key, pi, mu, oracle, num, repeats, chunk, term, copies):
    if _all_concrete(repeats):
        check_repeats((repeats,))
    num, m, queries = _one_sided_checked(key, pi, mu, oracle, num, repeats, chunk, term, copies)
    kl = m.mean[:, 0]
    mismatch = jnp.isinf(kl) | jnp.isnan(kl)
    kl = jnp.where(mismatch, jnp.inf, kl)
    kl_stderr = jnp.where(mismatch, jnp.inf, jnp.sqrt(m.variance[:, 0] / num))
    tv = jnp.minimum(1.0, jnp.sqrt(jnp.maximum(kl, 0.0) / 2))
    # Delta method for sqrt(KL / 2); infinite KL gives the vacuous bound 1 with no spread.
    tv_stderr = jnp.where(mismatch | (tv >= 1.0), 0.0, kl_stderr / (4 * jnp.maximum(tv, 1e-12)))
    column = lambda x, dtype=None: jnp.broadcast_to(jnp.asarray(x, dtype), num.shape)[:, None]
    levels = LevelStats(column(repeats, jnp.int32), column(num, jnp.float32), m.mean, m.variance, queries[:, None])
    return _unbatched(KLEstimate(tv, tv_stderr, queries, levels, kl, kl_stderr), copies)


def _plugin_kl_term(log_pi, log_mu):
    # log pi - log mu, +inf where mu has zero mass: KL is infinite under support mismatch.
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, log_pi - jnp.where(jnp.isneginf(log_mu), 0.0, log_mu))


def _k3_term(log_pi, log_mu):
    # k3 = (rho - 1) - log rho with rho = mu/pi: nonnegative, unbiased for KL(pi || mu) at exact access.
    log_rho = log_mu - log_pi
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, jnp.expm1(log_rho) - log_rho)


def plugin_kl(key, pi, mu, oracle=Exact(), num_samples=4096, repeats=1, chunk=None, copies=None):
    """Baseline: plug-in KL(pi || mu) = E_pi[log pi - log mu] and Pinsker's sqrt(KL / 2)."""
    return _kl_estimate(key, pi, mu, oracle, num_samples, repeats, chunk, _plugin_kl_term, copies)


def k3_pinsker(key, pi, mu, oracle=Exact(), num_samples=4096, repeats=1, chunk=None, copies=None):
    """Baseline: the k3 KL estimator followed by Pinsker's bound."""
    return _kl_estimate(key, pi, mu, oracle, num_samples, repeats, chunk, _k3_term, copies)


def naive_noisy_plugin(key, pi, mu, oracle, num_samples=4096, chunk=None, copies=None):
    """Baseline: Algorithm 1 on single noisy draws, as if they were exact logits."""
    return likelihood_ratio(key, pi, mu, oracle, num_samples=num_samples, chunk=chunk, copies=copies)
