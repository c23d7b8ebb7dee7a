"""Query accounting, the one cost model of every estimator, study, pool analysis and benchmark.

A query is one answer of an oracle about one position of one trajectory: sampling a trajectory of
length n costs n queries, and scoring it at r repeats costs n * r per model (an exact oracle is
the r = 1 case). Every estimator in tvjax samples a trajectory once and scores it under both
models, so a trajectory costs n (1 + 2 r).

The functions are plain arithmetic on what they are given: Python numbers, numpy arrays or
(traced) JAX arrays. Callers that count past 2**31 pass floats.
"""

SCORING_MODELS = 2  # every estimator scores each trajectory under pi and under mu


def sampling_queries(num, n):
    """Queries to sample `num` trajectories of length n."""
    return num * n


def scoring_queries(num, n, repeats):
    """Queries to score `num` trajectories under one model at `repeats` draws per position."""
    return num * n * repeats


def trajectory_queries(num, n, repeats):
    """Sampling `num` trajectories and scoring them under both models at `repeats` draws."""
    return sampling_queries(num, n) + SCORING_MODELS * scoring_queries(num, n, repeats)


def symmetric_queries(num_per_side, n, repeats):
    """A symmetric (stratified) level: `num_per_side` trajectories from each of the two sides."""
    return 2 * trajectory_queries(num_per_side, n, repeats)


def schedule_queries(schedule, n):
    """Total queries of a symmetric multilevel schedule: (per-side level sizes, repeat counts)."""
    num_samples, repeats = schedule
    return sum(symmetric_queries(num, n, r) for num, r in zip(num_samples, repeats))


def trajectories_for_budget(budget, n, repeats=1):
    """The most trajectories (sampled and scored under both models) that `budget` queries buy."""
    return int(budget // trajectory_queries(1, n, repeats))


def symmetric_pairs_for_budget(budget, n, repeats):
    """The most per-side trajectory pairs of a symmetric level that `budget` queries buy."""
    return int(budget // symmetric_queries(1, n, repeats))
