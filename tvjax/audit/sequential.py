"""Anytime-valid TV estimates and the TV gate: trajectories drawn in rounds, with a confidence
sequence that holds at every round at once, so one may look after each round and stop.

    for state in anytime_tv(key, pi, mu, "exact", delta=0.05, budget=1e8):
        if state.high - state.low < 0.02:
            break
    result = gate(key, pi, mu, tau=0.05, delta=0.05, budget=1e8)   # PASS / FAIL / INCONCLUSIVE

The sequence is the hedged betting confidence sequence for the mean of observations in [0, 1]
(Waudby-Smith and Ramdas, "Estimating means of bounded random variables by betting", JRSS B
2024): for every candidate mean m on a grid, the capital of betting that the mean is above m and
of betting that it is below, with predictable bets; by Ville's inequality the capital of the true
mean passes 1/delta with probability at most delta at any time, so the set of m whose capital
stays below it covers the mean at every round simultaneously.

One observation is one trajectory from each side, X ~ pi and X' ~ mu, and the average of
Z = |pi - mu| / (pi + mu) over the two (in [0, 1]; E_{(pi + mu)/2}[Z] = TV, the symmetric form of
Algorithm 1 the paper reports). Z = 1 wherever one side has zero mass, so the share of such
trajectories is the support-mismatch part of the TV, seen from both sides (a one-sided R over
X ~ pi misses mu's tokens outside pi's support).

* Exact logits: Z is exact and its mean is the TV.
* Noisy and sample-only access: Z is the plug-in at r draws per position, whose mean TV_r is
  biased. The bias is bounded as the multilevel
  extrapolation does (`tvjax.core.api.top_level_bias`): with b(r) = C r^(-1/2), b(r) = |E[Y]| /
  (sqrt(r / r_c) - 1) for the coupled increment Y = Z_r - Z_{r_c} on the same trajectories
  (nested draws, r_c = ceil(r / 4)). |E[Y]| is bounded by a second confidence sequence, and
  delta is split between the two. The interval is the first sequence widened by that bound; the
  r^(-1/2) decay is the assumption this rests on.
"""

import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core import cost
from tvjax.core.api import resolve_oracle
from tvjax.core.betting import (  # noqa: F401  (re-exported: the gate's sequence)
    BET_CAP,
    GRID_SIZE,
    BettingState,
    betting_interval,
    betting_pieces,
    betting_start,
    betting_update,
)
from tvjax.core.currency import Realized, mixture_z, stopping_ids, trajectory_lengths
from tvjax.core.validate import check_pair, check_positive_int, check_range
from tvjax.pools.analysis.currency import default_pair, path_logprobs, z_values
from tvjax.pools.store import SIDES

# --------------------------------------------------------------------------- rounds of trajectories


class Round(NamedTuple):
    """One round's observations: `value` in [0, 1] (mean TV, or TV_r), `increment` in [-1, 1]
    (Z_r - Z_{r_c}; zeros at exact logits) and `mismatch`, the share of the observation's
    trajectories on which one side has zero mass (Z = 1: the support-mismatch part of TV)."""

    value: jax.Array
    increment: jax.Array
    mismatch: jax.Array
    positions: jax.Array  # real positions of the round's trajectories (up to EOS), both sides


def _real_positions(paths, process):
    if isinstance(paths, Realized):  # a compact sampler: fixed-length trajectories
        return jnp.asarray(paths.log_path[0].shape[0] * process.n, jnp.float32)
    return jnp.sum(trajectory_lengths(paths, stopping_ids(process))).astype(jnp.float32)


def _symmetric_round(key, pi, mu, oracle, num, repeats, coarse):
    z_sides, mismatch, positions = [], [], 0.0
    for side, k in zip((pi, mu), jax.random.split(key)):
        k_sample, k_score = jax.random.split(k)
        paths = oracle.trajectory_sampler(side, (pi, mu))(k_sample, num)
        log_pi, log_mu = oracle.nested_path_logprobs(k_score, (pi, mu), paths, (coarse, repeats))
        z_sides.append(mixture_z(log_pi, log_mu))  # [num, 2]: Z at r_c and at r, nested draws
        mismatch.append((jnp.isneginf(log_pi[:, 1]) | jnp.isneginf(log_mu[:, 1])).astype(jnp.float32))
        positions = positions + _real_positions(paths, side)
    z = (z_sides[0] + z_sides[1]) / 2
    return Round(z[:, 1], z[:, 1] - z[:, 0], (mismatch[0] + mismatch[1]) / 2, positions)


_symmetric_round_program = jax.jit(_symmetric_round, static_argnames=("num", "repeats", "coarse"))


class AnytimeEstimate(NamedTuple):
    """The state after a round: the interval [low, high] that holds at every round with
    probability 1 - delta, the running mean `value`, the plug-in `bias_bound` inside the
    interval (0 at exact logits), the support-mismatch share, and what was spent."""

    low: float
    high: float
    value: float
    bias_bound: float
    mismatch_share: float
    observations: int
    queries: float
    rounds: int
    repeats: int


def default_repeats(noise, n, bias_target=0.02):
    """r for the plug-in arm: the plug-in bias, of order sqrt(n sigma^2 / r), at bias_target."""
    return 1 + math.ceil(n * noise**2 / bias_target**2)




def sequence_estimates(rounds, delta, repeats, coarse):
    """An AnytimeEstimate after every Round of the iterable `rounds` (observations in order, each
    round's drawn independently of the ones before): the betting sequence on the values, widened
    at repeats > 1 by the bias bound from a second sequence on the increments Z_r - Z_{r_c}
    (delta split in half). repeats = 1 is exact scoring (no bias)."""
    exact = repeats == 1
    main_delta = delta if exact else delta / 2  # the rest bounds the plug-in's bias
    values, increments = betting_start(), betting_start()
    low, high, bias_low, bias_high = 0.0, 1.0, 0.0, 1.0
    spent, mismatches, count = 0.0, 0.0, 0
    for index, obs in enumerate(rounds):
        values = betting_pieces(values, obs.value, main_delta)
        round_low, round_high = betting_interval(values, main_delta)
        low, high = max(low, round_low), min(high, round_high)  # the running intersection holds too
        bias = 0.0
        if not exact:
            increments = betting_pieces(increments, (obs.increment + 1) / 2, delta - main_delta)
            round_low, round_high = betting_interval(increments, delta - main_delta)
            bias_low, bias_high = max(bias_low, round_low), min(bias_high, round_high)
            largest_increment = max(abs(2 * bias_low - 1), abs(2 * bias_high - 1))
            bias = largest_increment / (math.sqrt(repeats / coarse) - 1)
        spent += float(cost.trajectory_queries(obs.positions, 1, repeats))  # queries of real positions only
        mismatches += float(jnp.sum(obs.mismatch))
        count = int(values.count)
        yield AnytimeEstimate(max(0.0, low - bias), min(1.0, high + bias), float(values.total) / count, bias,
                              mismatches / count, count, spent, index + 1, repeats)


def anytime_tv(key, pi, mu, access="exact", delta=0.05, budget=1e8, round_size=1024, sigma=None, scale=None,
               repeats=None):
    """Rounds of `round_size` observations until the next round could pass `budget` queries:
    yields an AnytimeEstimate after every round (stop whenever: the interval holds at every
    round at once). An observation is one trajectory from each side, scored at `repeats` draws
    per position (1 at exact logits; default `default_repeats` otherwise). Trajectories that
    stop at an EOS (`stopping_ids`) spend queries on their real positions only."""
    check_pair(pi, mu)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    round_size = check_positive_int("round_size", round_size)
    oracle = resolve_oracle(access, sigma, scale)
    noise = oracle.noise_level(pi, mu)
    exact = noise == 0.0
    if repeats is None:
        repeats = 1 if exact else default_repeats(noise, pi.n)
    repeats = check_positive_int("repeats", repeats)
    if not exact and repeats < 2:
        raise ValueError("noisy and sample-only access need repeats >= 2 (the bias bound compares r with r / 4)")
    coarse = max(1, math.ceil(repeats / 4))  # exact logits: r = r_c = 1, no increment
    per_round = float(cost.symmetric_queries(round_size, pi.n, repeats))  # at most: no trajectory stops early
    if per_round > budget:
        raise ValueError(f"budget={budget:.4g} queries is less than one round ({round_size} observations cost "
                         f"{per_round:.4g}); raise the budget or lower round_size")

    def rounds():
        for index in itertools.count():
            yield _symmetric_round_program(jax.random.fold_in(key, index), pi, mu, oracle, num=round_size,
                                           repeats=repeats, coarse=coarse)

    for estimate in sequence_estimates(rounds(), delta, repeats, coarse):
        yield estimate
        if estimate.queries + per_round > budget:
            return


# --------------------------------------------------------------------------- pools: rounds of stored rows


class PoolScoring(NamedTuple):
    """How a pool's draws are read: `repeats` passes averaged per position (1 when every pass
    repeats the first: deterministic replay, exact), nested `coarse` passes for the bias bound."""

    pair: tuple
    repeats: int
    coarse: int
    deterministic: bool


def pool_scoring(pool, pair=None):
    """The pool's scoring for the gate: deterministic when every scorer's passes agree at every
    cell (CPU replay; with one pass that cannot be checked, and is assumed), else the plug-in
    over all R passes with its bias bound."""
    pair = default_pair(pool, pair)
    draws = [pool.logprobs[side][scorer] for side in SIDES for scorer in pair]
    if all(np.array_equal(d, np.broadcast_to(d[..., :1], d.shape)) for d in draws):
        return PoolScoring(pair, 1, 1, True)
    passes = pool.passes.size  # >= 2: the passes differ
    return PoolScoring(pair, passes, max(1, math.ceil(passes / 4)), False)


def _pool_z(pool, side, scorers, grid):
    """Z [N_side, len(grid)] between two scorers' r-averaged path log-probs on `side`'s rows."""
    return z_values(*(path_logprobs(pool.logprobs[side][s], grid) for s in scorers))


def pool_rounds(pool, scoring, round_size):
    """Rounds of stored observations: row i of each side is observation i (rows are independent
    draws in sampling order), `round_size` at a time, the last round shorter."""
    grid = [scoring.coarse, scoring.repeats] if scoring.repeats > 1 else [1]
    z = [_pool_z(pool, side, scoring.pair, grid) for side in SIDES]
    num = min(len(z[0]), len(z[1]))
    mismatch = [np.isinf(path_logprobs(pool.logprobs[side][s], [scoring.repeats])[:, 0]) for side in SIDES
                for s in scoring.pair]
    miss = ((mismatch[0] | mismatch[1])[:num] + (mismatch[2] | mismatch[3])[:num]) / 2
    both = (z[0][:num] + z[1][:num]) / 2
    lengths = pool.lengths[SIDES[0]][:num] + pool.lengths[SIDES[1]][:num]
    for start in range(0, num, round_size):
        rows = slice(start, start + round_size)
        yield Round(jnp.asarray(both[rows, -1]), jnp.asarray(both[rows, -1] - both[rows, 0]), jnp.asarray(miss[rows]),
                    jnp.asarray(float(lengths[rows].sum())))


def noise_floor(pools, scorer, delta=0.05, round_size=256):
    """The A/A control of one scorer: the TV estimate between two disjoint halves of its own
    replay passes on the rows of both sides of every pool in `pools` (the same engine against
    itself, independent pass seeds), with its confidence sequence after all rows. Its true value
    is 0; what it shows is the noise an engine's replay adds at r = R/2. None with fewer than 2
    passes."""
    half = pools[0].passes.size // 2
    if half < 1:
        return None
    halves = lambda d: [path_logprobs(d[..., part], [half])[:, 0] for part in (slice(0, half), slice(half, 2 * half))]
    per_pool = []
    for pool in pools:
        z = [z_values(*halves(pool.logprobs[side][scorer])) for side in SIDES]
        num = min(len(z[0]), len(z[1]))
        per_pool.append((z[0][:num] + z[1][:num]) / 2)
    both = np.concatenate(per_pool)
    zeros = np.zeros(len(both))
    rounds = (Round(jnp.asarray(both[a:a + round_size]), jnp.asarray(zeros[a:a + round_size]),
                    jnp.asarray(zeros[a:a + round_size]), jnp.asarray(0.0)) for a in range(0, len(both), round_size))
    return list(sequence_estimates(rounds, delta, 1, 1))[-1]


# --------------------------------------------------------------------------- the gate

EXIT_CODES = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 2}


class GateResult(NamedTuple):
    """The decision: PASS when the interval's upper end is below tau, FAIL when its lower end is
    above tau, INCONCLUSIVE when the budget (or a pool's rows) ran out first; `exit_code` 0 / 1 /
    2. `noise_floor`: for a pool whose replay is not deterministic, the A/A control of each
    scorer (`noise_floor`), else None."""

    verdict: str
    exit_code: int
    tau: float
    delta: float
    budget: float | None  # None: a pool's rows were the only limit
    estimate: AnytimeEstimate
    noise_floor: dict | None = None


def decide(estimates, tau, delta, budget, on_round=None, noise_floor=None):
    """The first estimate whose interval excludes tau, or the last one: the GateResult. The
    sequence holds at every round at once, so stopping at the first decisive round keeps the
    error probability at most delta."""
    estimate = None
    for estimate in estimates:
        if on_round is not None:
            on_round(estimate)
        if estimate.high < tau or estimate.low > tau:
            break
    verdict = "PASS" if estimate.high < tau else "FAIL" if estimate.low > tau else "INCONCLUSIVE"
    budget = None if budget is None else float(budget)
    return GateResult(verdict, EXIT_CODES[verdict], float(tau), float(delta), budget, estimate, noise_floor)


def _check_gate(tau, budget):
    check_range("tau", tau, 0.0, 1.0, low_open=True, high_open=True)
    if budget is not None:
        check_range("budget", budget, 0.0, low_open=True)


def gate(key, pi, mu, tau, delta=0.05, budget=1e8, access="exact", round_size=1024, sigma=None, scale=None,
         repeats=None, on_round=None):
    """Is TV(pi, mu) below tau, at confidence 1 - delta? Rounds until the confidence sequence
    decides or the budget is spent; `on_round(estimate)` is called after every round (progress)."""
    _check_gate(tau, budget)
    stops = [(getattr(side, "eos", None), getattr(side, "eos_ids", ())) for side in (pi, mu)]
    if stops[0] != stops[1]:
        raise ValueError(f"pi and mu treat EOS differently ({stops[0]} vs {stops[1]}): their continuations "
                         "are not one sample space")
    estimates = anytime_tv(key, pi, mu, access, delta, budget, round_size, sigma, scale, repeats)
    return decide(estimates, tau, delta, budget, on_round)


def gate_pool(pool, tau, delta=0.05, budget=None, round_size=256, pair=None, on_round=None):
    """The gate over a loaded pool's rows, in their sampling order, `round_size` observations a
    round, until it decides, the query budget (None: the rows) is spent or the rows run out. Deterministic replay
    (every pass equal) is exact scoring; otherwise the plug-in over the R passes with its bias
    bound, and the A/A control of both scorers beside the verdict."""
    _check_gate(tau, budget)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    round_size = check_positive_int("round_size", round_size)
    scoring = pool_scoring(pool, pair)
    per_round = float(cost.symmetric_queries(round_size, pool.spec.n, scoring.repeats))
    budget = math.inf if budget is None else budget
    if per_round > budget:
        raise ValueError(f"budget={budget:.4g} queries is less than one round ({round_size} observations cost "
                         f"up to {per_round:.4g})")

    def within_budget():
        for estimate in sequence_estimates(pool_rounds(pool, scoring, round_size), delta, scoring.repeats,
                                           scoring.coarse):
            yield estimate
            if estimate.queries + per_round > budget:
                return

    floor = None if scoring.deterministic else {s: noise_floor([pool], s, delta, round_size) for s in scoring.pair}
    return decide(within_budget(), tau, delta, None if math.isinf(budget) else budget, on_round, floor)
