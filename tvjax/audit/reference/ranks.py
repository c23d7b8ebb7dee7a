"""Ranks of a target's scores among a reference's, and uniformity tests with an exact null.

Call i sends one prompt to the target and draws m continuations of the same prompt from the
reference. With any score s (a function of the prompt and the continuation, fixed before the
data), rank_i = #{j: s(ref_ij) < s(target_i)} + a uniform draw over the ties. When the target
samples as the reference does, the m + 1 continuations are exchangeable, so rank_i is exactly
uniform on {0, ..., m}, independent over calls: at any m, whatever the score and its ties.

The statistics compare the empirical CDF G_hat of the ranks with the uniform F_k = (k + 1) / (m + 1):

* ks:  max_k |G_hat_k - F_k|  (also the plug-in of the certified bound of `tvjax.audit.reference.bounds`);
* cvm: N sum_k (G_hat_k - F_k)^2 / (m + 1)  (the discrete Cramer-von Mises statistic);
* stratified: the sum over prompts of each prompt's cvm: it sees a target whose ranks run high on
  some prompts and low on others, which cancel in the pooled ranks;
* combined: the smallest of the three p-values, calibrated as a statistic of its own.

Their p-values come from the exact null (ranks drawn uniform, the same number per prompt), by
Monte Carlo: p = (1 + #{null statistic >= observed}) / (1 + draws), which is exactly valid
(P(p <= a) <= a) at any N and m, where asymptotic tables are off at small m or N.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.validate import check_key, check_positive_int

STATISTICS = ("cvm", "ks", "stratified")
DEFAULT_DRAWS = 9999  # null draws of a p-value: its resolution is 1e-4
NULL_CHUNK = 1 << 22  # rank cells per chunk of null draws: bounds the memory of the simulation


def check_scores(target, reference):
    """(target float [N], reference float [N, m]) as float32 arrays; NaN scores, shapes that do not
    match and m = 0 are ValueErrors. -inf is a valid score (a continuation the reference cannot
    produce) and ranks below every finite one."""
    target, reference = np.asarray(target, np.float64), np.asarray(reference, np.float64)
    if target.ndim != 1 or reference.ndim != 2 or reference.shape[0] != target.shape[0]:
        raise ValueError(f"scores must be target [N] and reference [N, m], got {target.shape} and {reference.shape}")
    if target.shape[0] == 0 or reference.shape[1] == 0:
        raise ValueError(f"no calls or no reference samples: target {target.shape}, reference {reference.shape}")
    for name, values in (("target", target), ("reference", reference)):
        if np.isnan(values).any():
            raise ValueError(f"{name} scores hold NaN at {np.argwhere(np.isnan(values))[:3].tolist()}: a score must be "
                             "a number or -inf")
    return target, reference


def target_ranks(key, target, reference):
    """int32 [N]: the rank of each call's target score among its m reference scores, in {0..m};
    ties broken uniformly at random (so the null is exactly uniform for discrete scores too)."""
    check_key(key)
    target, reference = check_scores(target, reference)
    below = (reference < target[:, None]).sum(axis=1)
    ties = (reference == target[:, None]).sum(axis=1)
    u = np.asarray(jax.random.uniform(key, target.shape, jnp.float32), np.float64)
    return (below + np.minimum(np.floor(u * (ties + 1)), ties)).astype(np.int32)


def check_ranks(ranks, m):
    """Ranks as an int array [N] in {0..m} (ValueError otherwise); m >= 1."""
    m = check_positive_int("m", m)
    ranks = np.asarray(ranks)
    if ranks.ndim != 1 or ranks.size == 0:
        raise ValueError(f"ranks must be a non-empty 1-D array, got shape {ranks.shape}")
    if not np.issubdtype(ranks.dtype, np.integer):
        raise ValueError(f"ranks must be integers, got dtype {ranks.dtype}")
    if ranks.min() < 0 or ranks.max() > m:
        raise ValueError(f"ranks must lie in [0, m={m}], found {ranks.min()}..{ranks.max()}")
    return ranks.astype(np.int64), m


def rank_cdf_gaps(counts):
    """G_hat_k - F_k for k = 0..m-1 from rank counts [..., m + 1] (the last k, where both are 1, is left out)."""
    counts = np.asarray(counts, np.float64)
    m = counts.shape[-1] - 1
    total = counts.sum(axis=-1, keepdims=True)
    empirical = np.cumsum(counts, axis=-1)[..., :-1] / np.maximum(total, 1)
    return empirical - (np.arange(1, m + 1) / (m + 1))


def _statistics(counts, groups_counts):
    """(cvm, ks, stratified) of pooled counts [..., m + 1] and per-group counts [..., G, m + 1]."""
    m = counts.shape[-1] - 1
    gaps = rank_cdf_gaps(counts)
    total = counts.sum(axis=-1)
    cvm = total * (gaps**2).sum(axis=-1) / (m + 1)
    ks = np.abs(gaps).max(axis=-1)
    group_gaps = rank_cdf_gaps(groups_counts)
    stratified = (groups_counts.sum(axis=-1) * (group_gaps**2).sum(axis=-1)).sum(axis=-1) / (m + 1)
    return np.stack([cvm, ks, stratified], axis=-1)


def _group_index(groups, num):
    if groups is None:
        return np.zeros(num, np.int64), 1
    groups = np.asarray(groups)
    if groups.shape != (num,):
        raise ValueError(f"groups (the prompt of each call) must have shape ({num},), got {groups.shape}")
    _, index = np.unique(groups, return_inverse=True)
    return index.reshape(-1), int(index.max()) + 1


def _counts(ranks, group, num_groups, m):
    """Pooled counts [m + 1] and per-group counts [G, m + 1] of ranks."""
    per_group = np.zeros((num_groups, m + 1), np.int64)
    np.add.at(per_group, (group, ranks), 1)
    return per_group.sum(axis=0), per_group


def _null_statistics(key, group, num_groups, m, draws):
    """[draws, 3]: the statistics of `draws` sets of uniform ranks with the observed group sizes."""
    num = group.shape[0]
    per_chunk = max(1, NULL_CHUNK // max(num, num_groups * (m + 1)))
    out = []
    for start in range(0, draws, per_chunk):
        size = min(per_chunk, draws - start)
        key, sub = jax.random.split(key)
        ranks = np.asarray(jax.random.randint(sub, (size, num), 0, m + 1))
        per_group = np.zeros((size, num_groups, m + 1), np.int64)
        np.add.at(per_group, (np.arange(size)[:, None], group[None, :], ranks), 1)
        out.append(_statistics(per_group.sum(axis=1), per_group))
    return np.concatenate(out)


def _monte_carlo_pvalues(observed, null):
    """(1 + #{null >= observed}) / (1 + draws) per column."""
    return (1 + (null >= observed[None, :]).sum(axis=0)) / (1 + null.shape[0])


class RankTest(NamedTuple):
    """Uniformity tests of the ranks of N calls among m reference samples each."""

    statistics: dict  # cvm, ks, stratified
    pvalues: dict  # cvm, ks, stratified, combined: exact-null Monte Carlo p-values
    num: int
    m: int
    num_groups: int  # prompts
    draws: int


def rank_test(key, ranks, m, groups=None, draws=DEFAULT_DRAWS):
    """Uniformity tests of `ranks` (int [N] in {0..m}) under the exact null. groups: the prompt of
    each call (any hashable labels, [N]); None: one group. The combined p-value is the Monte Carlo
    p-value of min(p_cvm, p_ks, p_stratified), every p-value taken among the pool of the observed and the null draws."""
    check_key(key)
    ranks, m = check_ranks(ranks, m)
    draws = check_positive_int("draws", draws)
    group, num_groups = _group_index(groups, ranks.shape[0])
    counts, per_group = _counts(ranks, group, num_groups, m)
    observed = _statistics(counts, per_group)
    null = _null_statistics(key, group, num_groups, m, draws)
    pvalues = _monte_carlo_pvalues(observed, null)
    # the combined statistic of every member of the pool {observed} + null draws, each column's
    # p-value taken within the pool: exchangeable under the null, so its rank is exactly valid
    pool = np.concatenate([observed[None, :], null])
    order = np.sort(pool, axis=0)
    pool_pvalues = np.stack([pool.shape[0] - np.searchsorted(order[:, j], pool[:, j], side="left")
                             for j in range(pool.shape[1])], axis=1) / pool.shape[0]
    smallest = pool_pvalues.min(axis=1)
    combined = (smallest <= smallest[0]).sum() / pool.shape[0]
    return RankTest(dict(zip(STATISTICS, observed.tolist())),
                    {**dict(zip(STATISTICS, pvalues.tolist())), "combined": float(combined)},
                    int(ranks.shape[0]), m, num_groups, draws)


def _ranks_among(key, values, position):
    """Ranks [..., N, S] of values[n, position[..., n], s] among the other m of values [N, m + 1, S]
    (ties at random)."""
    num, _, scores = values.shape
    chosen = np.take_along_axis(values[None], position[..., None, None].repeat(scores, -1), axis=-2)  # [..., N, 1, S]
    below = (values[None] < chosen).sum(axis=-2)
    ties = (values[None] == chosen).sum(axis=-2) - 1  # the chosen one itself is not a tie
    u = np.asarray(jax.random.uniform(key, below.shape, jnp.float32), np.float64)
    return below + np.minimum(np.floor(u * (ties + 1)), ties).astype(np.int64)


class ExchangeableTest(NamedTuple):
    """The joint test of several scores: pvalue of Fisher's sum of the per-score cvm p-values'
    logarithms under the exchangeable null; statistics and per-score p-values (each calibrated by
    the same draws)."""

    pvalue: float
    statistics: np.ndarray  # [S] observed cvm per score
    score_pvalues: np.ndarray  # [S]
    num: int
    m: int
    draws: int


def exchangeable_test(key, target, reference, draws=DEFAULT_DRAWS):
    """One test over S scores at once, exact without a correction for their number.

    target [N, S] and reference [N, m, S]: each call's scores under every score. When the target
    samples as the reference does, each call's m + 1 continuations are exchangeable, so choosing
    which of them plays the target uniformly at random (independently per call) leaves the joint law
    of everything unchanged. Each draw does that, and computes every score's cvm statistic of the
    ranks; each score's p-value is taken within the pool of the observed and the draws, and the
    joint statistic is Fisher's -sum_s log p_s. The draws and the observed assignment are
    exchangeable, so the joint statistic's Monte Carlo p-value is exactly valid whatever the scores'
    dependence. Fisher's sum, not the smallest p-value: scores that all see a likelihood shift add
    their evidence, and a score that sees nothing dilutes it less than it would the minimum; a
    repeated score changes nothing (its sum is a multiple of one term)."""
    check_key(key)
    target, reference = np.asarray(target, np.float64), np.asarray(reference, np.float64)
    if target.ndim != 2 or reference.ndim != 3 or reference.shape[0] != target.shape[0] or \
            reference.shape[2] != target.shape[1] or reference.shape[1] == 0 or target.shape[0] == 0:
        raise ValueError(f"scores must be target [N, S] and reference [N, m, S], got {target.shape} and {reference.shape}")
    if np.isnan(target).any() or np.isnan(reference).any():
        raise ValueError("scores hold NaN: a score must be a number or -inf")
    draws = check_positive_int("draws", draws)
    num, m, scores = reference.shape
    values = np.concatenate([target[:, None], reference], axis=1)  # [N, m + 1, S]: position 0 is the target
    key_observed, key_draws = jax.random.split(key)
    pieces = [_ranks_among(key_observed, values, np.zeros((1, num), np.int64))]
    per_chunk = max(1, NULL_CHUNK // (num * (m + 1) * scores))
    for start in range(0, draws, per_chunk):
        size = min(per_chunk, draws - start)
        key_draws, k_pos, k_ties = jax.random.split(key_draws, 3)
        position = np.asarray(jax.random.randint(k_pos, (size, num), 0, m + 1))
        pieces.append(_ranks_among(k_ties, values, position))
    ranks = np.concatenate(pieces)  # [1 + draws, N, S]
    counts = np.zeros((ranks.shape[0], scores, m + 1), np.int64)
    for s in range(scores):
        np.add.at(counts[:, s], (np.arange(ranks.shape[0])[:, None], ranks[:, :, s]), 1)
    gaps = rank_cdf_gaps(counts)
    pool = num * (gaps**2).sum(axis=-1) / (m + 1)  # [1 + draws, S]
    order = np.sort(pool, axis=0)
    pool_pvalues = np.stack([pool.shape[0] - np.searchsorted(order[:, s], pool[:, s], side="left")
                             for s in range(scores)], axis=1) / pool.shape[0]
    fisher = -np.log(pool_pvalues).sum(axis=1)  # pool p-values are >= 1 / pool size: finite
    # a tie summed in another order may differ in the last bits: count it as a tie (conservative)
    pvalue = float((fisher >= fisher[0] - 1e-9).sum() / pool.shape[0])
    return ExchangeableTest(pvalue, pool[0], pool_pvalues[0], num, m, draws)
