"""Anytime-valid lower bounds on TV from ranks, and the reference-model gate.

After every call one may look and stop. For a grid of thresholds k (THRESHOLD_LEVELS of the rank
range), the indicators 1{rank <= k} have mean G_k, and G_k = F_k = (k + 1) / (m + 1) exactly when
the target samples as the reference does. A betting confidence sequence for each G_k
(`tvjax.core.betting`, at delta / K for K thresholds: they hold at every call and every k at
once) gives

    TV >= max_k max(low_k - F_k, F_k - high_k, 0)   at every call, with probability >= 1 - delta

(the rank argument of `tvjax.audit.reference.certify`). The gate says FAIL as soon as that bound
passes tau (tau = 0: "the target differs from the reference"), so its type I error (FAIL when
TV <= tau) is at most delta however long it runs. When the budget runs out first it says PASS,
which here means "no difference above tau detected within the budget": a score-based audit
bounds TV from below only, and cannot certify that it is small.
"""

import math
from typing import NamedTuple

import jax
import numpy as np

from tvjax.audit.reference.ranks import check_ranks
from tvjax.core.betting import betting_interval, betting_pieces, betting_start
from tvjax.core.validate import check_range

THRESHOLD_LEVELS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
EXIT_CODES = {"PASS": 0, "FAIL": 1}


def rank_thresholds(m):
    """The distinct thresholds k in [0, m - 1] nearest to THRESHOLD_LEVELS of the rank range."""
    levels = np.asarray(THRESHOLD_LEVELS)
    return tuple(int(k) for k in np.unique(np.clip(np.round(levels * (m + 1)).astype(int) - 1, 0, m - 1)))


class RankSequence(NamedTuple):
    """The betting states of the indicators 1{rank <= k}, one per threshold."""

    m: int
    thresholds: tuple
    states: tuple  # BettingState per threshold
    calls: int


def rank_sequence_start(m):
    thresholds = rank_thresholds(m)
    return RankSequence(m, thresholds, tuple(betting_start() for _ in thresholds), 0)


def rank_sequence_update(sequence, ranks, delta):
    """The sequence after the calls' ranks (in call order); delta: the sequence's total level."""
    ranks, _ = check_ranks(ranks, sequence.m)
    level = delta / len(sequence.thresholds)
    states = tuple(betting_pieces(state, jax.numpy.asarray(ranks <= k, jax.numpy.float32), level)
                   for state, k in zip(sequence.states, sequence.thresholds))
    return RankSequence(sequence.m, sequence.thresholds, states, sequence.calls + int(ranks.shape[0]))


class AnytimeRankBound(NamedTuple):
    """TV >= lower_bound, holding at every call at once with probability >= 1 - delta; estimate:
    max_k |G_hat_k - F_k| over the thresholds; threshold: the k of the bound."""

    lower_bound: float
    estimate: float
    threshold: int
    calls: int
    delta: float


def anytime_bound(sequence, delta):
    """The bound after the calls so far (0 before any call)."""
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    if sequence.calls == 0:
        return AnytimeRankBound(0.0, 0.0, sequence.thresholds[0], 0, float(delta))
    level = delta / len(sequence.thresholds)
    best, best_k, estimate = 0.0, sequence.thresholds[0], 0.0
    for state, k in zip(sequence.states, sequence.thresholds):
        target = (k + 1) / (sequence.m + 1)
        low, high = betting_interval(state, level)
        bound = max(low - target, target - high, 0.0)
        estimate = max(estimate, abs(float(state.total) / sequence.calls - target))
        if bound > best:
            best, best_k = bound, k
    return AnytimeRankBound(best, estimate, best_k, sequence.calls, float(delta))


class ReferenceGateResult(NamedTuple):
    """FAIL (exit 1): TV > tau certified at level 1 - delta, after `calls` target calls. PASS
    (exit 0): no difference above tau detected within the budget (not a certificate that TV <= tau)."""

    verdict: str
    exit_code: int
    tau: float
    delta: float
    budget: int
    bound: AnytimeRankBound


def rank_gate(rank_rounds, m, tau=0.0, delta=0.05, budget=None, on_round=None):
    """Feed the rounds of ranks (an iterable of int arrays, each round's calls in order) until the
    anytime bound passes tau (FAIL), the budget of calls is reached or the rounds run out (PASS).
    on_round(bound) after every round (progress)."""
    check_range("tau", tau, 0.0, 1.0, high_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    budget = math.inf if budget is None else budget
    sequence = rank_sequence_start(m)
    bound = anytime_bound(sequence, delta)
    for ranks in rank_rounds:
        sequence = rank_sequence_update(sequence, ranks, delta)
        bound = anytime_bound(sequence, delta)
        if on_round is not None:
            on_round(bound)
        if bound.lower_bound > tau or sequence.calls >= budget:
            break
    verdict = "FAIL" if bound.lower_bound > tau else "PASS"
    return ReferenceGateResult(verdict, EXIT_CODES[verdict], float(tau), float(delta),
                               int(sequence.calls) if math.isinf(budget) else int(budget), bound)
