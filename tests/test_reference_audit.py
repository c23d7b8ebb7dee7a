"""tvjax.audit.reference: the reference-model audit against ground truth, on fixed seeds.

* the exact null: uniform ranks, and reference_audit with the target = the reference process (m = 1
  and m = 3, two prompts, a score with heavy ties), give p-values that reject at alpha within three
  standard errors of alpha, from both sides where the statistic is continuous enough;
* power on a temperature-1.3 pair;
* the certified bounds against the true TV and against the sharper quantity they estimate, the
  rank-law distance sup_k |G_k - F_k|, computed exactly here by enumerating every continuation
  (tabular, top-k support mismatch, trajectories that stop at EOS, a tiny random LLM): the rate of
  bound > truth stays within delta + 3 se, for the ranks of reference_audit end to end and for
  ranks drawn from the exact rank law over more seeds;
* the anytime bound and the gate: type I error at every round, coverage of the grid distance at
  every round, early stopping under an alternative;
* the scores against direct computations, the learned score, and bad input.
"""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.special import gammaln, xlogy

from tvjax.audit.reference import (
    DEFAULT_SCORES,
    TargetCalls,
    anytime_bound,
    continuation_features,
    exchangeable_test,
    fit_learned_score,
    per_prompt_bounds,
    process_calls,
    rank_bound,
    rank_gate,
    rank_sequence_start,
    rank_sequence_update,
    rank_test,
    reference_audit,
    round_ranks,
    score_ranks,
    target_ranks,
)
from tvjax.audit.reference.audit import call_features
from tvjax.audit.reference.sequential import rank_thresholds
from tvjax.core.currency import stopping_ids, trajectory_lengths
from tvjax.core.instances import TabularProcess, exact_tv, random_tabular_pair, stopping_tabular_pair

ALPHA = 0.05  # test level of the p-values
DELTA = 0.05  # level of the certified bounds
METHODS = ("dkw", "binomial")
STATISTICS = ("cvm", "ks", "stratified", "combined")
NULL_DRAWS = 199  # the Monte Carlo p-value is exactly valid at any number of null draws


def upper_tolerance(rate, trials, z=3.0):
    """The largest share of `trials` Bernoulli(rate) events within z standard errors."""
    return rate + z * math.sqrt(rate * (1 - rate) / trials)


def lower_tolerance(rate, trials, z=3.0):
    return rate - z * math.sqrt(rate * (1 - rate) / trials)


def run_key(tag, seed):
    return jax.random.fold_in(jax.random.key(tag), seed)


# --------------------------------------------------------------------------- processes and exact truths


@functools.partial(jax.jit, static_argnums=2)
def _tabular_sample(process, key, num):
    return TabularProcess.sample(process, key, num)


@dataclasses.dataclass(frozen=True)
class JitTabular(TabularProcess):
    """A TabularProcess whose sample is one compiled program (TabularProcess.sample retraces its
    scan at every call: seconds per audit, where the tests run hundreds)."""

    def sample(self, key, num):
        return _tabular_sample(self, key, num)


jax.tree_util.register_dataclass(JitTabular, data_fields=["logprobs"],
                                 meta_fields=["n", "vocab_size", "context_len", "max_support", "eos_ids"])


def jit_sampling(*processes):
    return tuple(JitTabular(**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}) for p in processes)


def all_sequences(vocab, n):
    return np.array(list(itertools.product(range(vocab), repeat=n)), np.int32)


def sequence_probs(process, tokens):
    """float64 [N]: the probability of each whole sequence (padding after EOS has probability 1)."""
    return np.exp(np.asarray(process.path_logprobs(jnp.asarray(tokens)), np.float64).sum(axis=1))


def rank_law(reference, target, m, score="logprob"):
    """The exact law [m + 1] of the target's rank among m reference samples under `score`, ties
    broken uniformly: every continuation enumerated, the score's atoms with their reference and
    target masses, and for a target continuation at an atom with reference masses (below, tie,
    above) the multinomial law of (#below, #tied) among the m reference samples."""
    tokens = all_sequences(reference.vocab_size, reference.n)
    ref_p, tgt_p = sequence_probs(reference, tokens), sequence_probs(target, tokens)
    keep = (ref_p > 0) | (tgt_p > 0)
    values = continuation_features(reference, tokens[keep], with_ranks=score == "log_rank")[score]
    atoms, index = np.unique(values, return_inverse=True)
    tie = np.bincount(index.ravel(), ref_p[keep], len(atoms))
    tie /= tie.sum()
    mass = np.bincount(index.ravel(), tgt_p[keep], len(atoms))
    mass /= mass.sum()
    below = np.clip(np.cumsum(tie) - tie, 0.0, 1.0)
    above = np.clip(1.0 - below - tie, 0.0, 1.0)
    b, c = np.meshgrid(np.arange(m + 1), np.arange(m + 1), indexing="ij")  # reference samples below, tied
    valid = b + c <= m
    a = np.where(valid, m - b - c, 0)
    log_multinomial = (gammaln(m + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(a + 1))[None] \
        + xlogy(b[None], below[:, None, None]) + xlogy(c[None], tie[:, None, None]) + xlogy(a[None], above[:, None, None])
    joint = np.where(valid[None], np.exp(log_multinomial), 0.0)
    j = np.arange(m + 1)
    rank_given = (valid[..., None] & (b[..., None] <= j) & (j <= (b + c)[..., None])) / (c + 1)[..., None]
    return np.einsum("a,abc,bcj->j", mass, joint, rank_given)


def cdf_gaps(pmf):
    """G_k - F_k for k = 0..m-1 of a rank law."""
    m = pmf.shape[0] - 1
    return np.cumsum(pmf)[:-1] - np.arange(1, m + 1) / (m + 1)


def rank_distance(pmf):
    """sup_k |G_k - F_k|: what the certified bounds estimate (<= TV)."""
    return float(np.max(np.abs(cdf_gaps(pmf))))


@functools.cache
def lm_pair_enumerable():
    from tvjax.models.pairs import lm_pair

    return lm_pair("random:llama", prompt=[1, 2, 3], n=3, pi={}, mu={"temperature": 1.3})


# (reference, target) pairs of known TV; the target is the process the audit calls as a black box
PAIRS = {
    "temperature 1.5": lambda: jit_sampling(*random_tabular_pair(1, 4, 4, 1, temperature=(1.0, 1.5))),
    "temperature 0.7": lambda: jit_sampling(*random_tabular_pair(4, 4, 4, 1, temperature=(1.0, 0.7))),
    "top-k support mismatch": lambda: jit_sampling(*random_tabular_pair(2, 4, 4, 1, top_k=(2, None))),
    "stops at EOS": lambda: jit_sampling(*stopping_tabular_pair(3, 4, 5, 1, stop_prob=(0.15, 0.35))),
    "random LLM, temperature 1.3": lm_pair_enumerable,
}


@functools.cache
def pair(name):
    return PAIRS[name]()


@functools.cache
def pair_truths(name, m):
    """TV and the exact rank law of each default score."""
    reference, target = pair(name)
    return exact_tv(reference, target), {s: rank_law(reference, target, m, s) for s in DEFAULT_SCORES}


def test_exact_rank_law_is_uniform_under_the_null_and_below_the_tv():
    """The ground truth itself: with target = reference the rank law is uniform (ties included:
    the length of a fixed-length process is one atom), and sup_k |G_k - F_k| <= TV(rank laws) <= TV."""
    reference, target = pair("stops at EOS")
    for score in ("logprob", "length", "log_rank"):
        np.testing.assert_allclose(rank_law(reference, reference, 5, score), np.full(6, 1 / 6), atol=1e-12)
    fixed, _ = pair("temperature 1.5")
    np.testing.assert_allclose(rank_law(fixed, fixed, 3, "length"), np.full(4, 0.25), atol=1e-12)
    tv = exact_tv(reference, target)
    for score in ("logprob", "length"):
        pmf = rank_law(reference, target, 16, score)
        assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
        assert 0 < rank_distance(pmf) <= 0.5 * np.abs(pmf - 1 / 17).sum() + 1e-12 <= tv + 1e-9


# --------------------------------------------------------------------------- 1. the exact null


def rejection_checks(label, pvalues, two_sided):
    """Reject at ALPHA at a rate <= alpha + 3 se and (two_sided) >= alpha - 3 se."""
    rate = float(np.mean(np.asarray(pvalues) <= ALPHA))
    assert rate <= upper_tolerance(ALPHA, len(pvalues)), (label, rate)
    if two_sided:
        assert rate >= lower_tolerance(ALPHA, len(pvalues)), (label, rate)
    return rate


@pytest.mark.parametrize("m", [1, 3, 20])
def test_rank_test_pvalues_are_exact_on_uniform_ranks(m):
    """600 sets of 150 uniform ranks in 3 groups: every p-value rejects at alpha within 3 se."""
    seeds, num = 600, 150
    groups = np.arange(num) % 3
    pvalues = {s: [] for s in STATISTICS}
    for seed in range(seeds):
        ranks = np.random.default_rng(seed).integers(0, m + 1, num)
        test = rank_test(run_key(1, seed), ranks, m, groups, draws=NULL_DRAWS)
        assert (test.num, test.m, test.num_groups, test.draws) == (num, m, 3, NULL_DRAWS)
        for s in STATISTICS:
            pvalues[s].append(test.pvalues[s])
    for s in STATISTICS:
        rejection_checks((m, s), pvalues[s], two_sided=True)


def correlated_null_scores(rng, num, m):
    """Three scores of N calls' m + 1 exchangeable continuations: a continuous one, a noisy copy
    of it (correlation about 0.9) and a discrete one with heavy ties (5 atoms)."""
    base = rng.normal(size=(num, m + 1))
    values = np.stack([base, base + 0.5 * rng.normal(size=base.shape), np.floor(rng.uniform(0, 5, base.shape))], -1)
    return values[:, 0], values[:, 1:]


@pytest.mark.parametrize("m", [1, 7])
def test_exchangeable_test_is_exact_over_correlated_and_tied_scores(m):
    """500 null data sets of 60 calls, three correlated scores one of them tied: the joint p-value
    rejects at alpha within 3 se of alpha from both sides, without a correction for the number of
    scores; each per-score p-value too."""
    seeds, num = 500, 60
    joint, per_score = [], []
    for seed in range(seeds):
        target, reference = correlated_null_scores(np.random.default_rng(seed), num, m)
        test = exchangeable_test(run_key(9, seed), target, reference, draws=NULL_DRAWS)
        assert (test.num, test.m, test.draws, test.score_pvalues.shape) == (num, m, NULL_DRAWS, (3,))
        joint.append(test.pvalue)
        per_score.append(test.score_pvalues)
    rejection_checks((m, "joint"), joint, two_sided=True)
    for s, values in enumerate(np.array(per_score).T):
        rejection_checks((m, s), values, two_sided=True)


def test_exchangeable_test_pays_nothing_for_a_repeated_score_and_detects_a_shift():
    """Three copies of one continuous score give exactly the p-value of that score alone (same key,
    same draws), where Bonferroni would triple it; a target shifted by half a standard deviation in
    one of two scores is detected at N = 100 in at least 90% of 50 seeds."""
    rng = np.random.default_rng(0)
    target, reference = rng.normal(size=(100, 1)), rng.normal(size=(100, 7, 1))
    target[:, 0] += 0.3
    alone = exchangeable_test(run_key(10, 0), target, reference, draws=999)
    tripled = exchangeable_test(run_key(10, 0), np.repeat(target, 3, 1), np.repeat(reference, 3, 2), draws=999)
    assert tripled.pvalue == alone.pvalue and 0 < alone.pvalue < 1
    np.testing.assert_array_equal(tripled.score_pvalues, np.repeat(alone.score_pvalues, 3))
    detected = 0
    for seed in range(50):
        rng = np.random.default_rng(100 + seed)
        target, reference = rng.normal(size=(100, 2)), rng.normal(size=(100, 7, 2))
        target[:, 1] += 0.5
        detected += exchangeable_test(run_key(11, seed), target, reference, draws=NULL_DRAWS).pvalue < ALPHA
    assert detected / 50 >= 0.9, detected / 50


def tabular_prompts():
    """Two prompts' reference processes (two different tables)."""
    return jit_sampling(*random_tabular_pair(5, 4, 4, 1, temperature=(1.0, 1.4)))


NULL_CONFIGS = {
    # label: (references, m, scores, scores whose p-values are also checked from below)
    "m=1, two prompts": (tabular_prompts, 1, DEFAULT_SCORES, DEFAULT_SCORES),
    "m=3, two prompts, log_rank and learned": (tabular_prompts, 3, ("logprob", "log_rank", "learned"),
                                               ("logprob", "log_rank", "learned")),
    "m=3, stops at EOS, length (heavy ties)": (lambda: pair("stops at EOS")[:1], 3, ("length", "logprob"), ("logprob",)),
}


@pytest.mark.parametrize("label", list(NULL_CONFIGS))
def test_reference_audit_is_exact_when_the_target_is_the_reference(label):
    """400 audits of 100 calls of the reference process itself: each score's p-values reject at
    alpha within 3 se of it (from below too, except the heavy-tied length), the headline (the joint
    test of the fixed scores, times two with the learned one) at most at alpha + 3 se, and the certified bound exceeds
    the true TV = 0 in at most delta + 3 se."""
    make, m, scores, two_sided = NULL_CONFIGS[label]
    references = make()
    seeds, num = 400, 100
    prompts = np.arange(num) % len(references)
    pvalues, headline, bounds = {}, [], []
    for seed in range(seeds):
        key_calls, key_audit = jax.random.split(run_key(2, seed))
        calls = process_calls(key_calls, references, prompts)
        result = reference_audit(key_audit, references, calls, m=m, scores=scores, draws=NULL_DRAWS)
        assert result.mismatch_share == 0.0 and result.calls == num
        for name, audit in result.scores.items():
            for s in STATISTICS:
                pvalues.setdefault((name, s), []).append(audit.test.pvalues[s])
        headline.append(result.pvalue)
        bounds.append(result.lower_bound)
    for (name, s), values in pvalues.items():
        rejection_checks((label, name, s), values, two_sided=name in two_sided)
    rejection_checks((label, "headline"), headline, two_sided=False)
    assert np.mean(np.asarray(bounds) > 0) <= upper_tolerance(DELTA, seeds), label


def test_equal_continuations_tie_whatever_the_batch():
    """Regression: float32 scores of one continuation can differ with the compiled batch shape
    (256 vs 1024 rows here), which turned the ties of a target continuation with equal reference
    ones into a fixed order and broke the null (rejection 0.12 at alpha 0.05 on this 16-sequence
    support). Equal rows now score equally, and the ranks of the reference against itself at
    N = 400 (400 vs 6400 rows scored) pool to the uniform law within a DKW band at 1e-3."""
    reference, _ = pair("top-k support mismatch")
    tokens = all_sequences(4, 4)
    features = call_features([reference], np.zeros(1, int), np.tile(tokens, (4, 1))[None], False)["logprob"]
    assert np.array_equal(features.reshape(4, -1), np.tile(features[0, :256], (4, 1)), equal_nan=True)
    m, pooled = 16, []
    for seed in range(100):
        key_calls, key_audit = jax.random.split(run_key(8, seed))
        calls = process_calls(key_calls, [reference], np.zeros(400, int))
        pooled.append(reference_audit(key_audit, [reference], calls, m=m, scores=("logprob",), draws=9).scores["logprob"].ranks)
    ranks = np.concatenate(pooled)
    empirical = np.cumsum(np.bincount(ranks, minlength=m + 1))[:-1] / ranks.size
    band = math.sqrt(math.log(2 / 1e-3) / (2 * ranks.size))
    assert np.max(np.abs(empirical - np.arange(1, m + 1) / (m + 1))) <= band


# --------------------------------------------------------------------------- 2. power


def test_power_against_temperature_one_point_three():
    """N = 400 calls, m = 16, the logprob score: p < 0.05 in at least 90% of 50 seeds (TV 0.14)."""
    reference, target = jit_sampling(*random_tabular_pair(0, 4, 4, 1, temperature=(1.0, 1.3)))
    assert exact_tv(reference, target) == pytest.approx(0.1414, abs=1e-3)
    seeds, detected = 50, 0
    for seed in range(seeds):
        key_calls, key_audit = jax.random.split(run_key(3, seed))
        calls = process_calls(key_calls, [target], np.zeros(400, int))
        result = reference_audit(key_audit, [reference], calls, m=16, scores=("logprob",), draws=NULL_DRAWS)
        detected += result.pvalue < ALPHA
    assert detected / seeds >= 0.9, detected / seeds


# --------------------------------------------------------------------------- 3. certified bounds


def chosen_gap(bound, gaps):
    """The signed true gap at the threshold and side a binomial bound chose (its exact target)."""
    return max(0.0, bound.side * float(gaps[bound.threshold]))


@pytest.mark.parametrize("name", list(PAIRS))
def test_rank_bound_covers_on_ranks_from_the_exact_rank_law(name):
    """1000 seeds of N = 400 ranks (m = 16) drawn from the exact rank law of the logprob score
    (and of length for the EOS pair): for dkw and binomial, the rate of bound > TV and of bound >
    sup_k |G_k - F_k| is <= delta + 3 se; binomial also against the gap of the threshold it picked
    (Clopper-Pearson's exact target); and the bound is informative: its mean > 0.3 TV and > 0.5
    of the rank-law distance."""
    m, num, seeds = 16, 400, 1000
    tv, laws = pair_truths(name, m)
    for score in ("logprob", "length") if name == "stops at EOS" else ("logprob",):
        pmf = laws[score]
        truth, gaps = rank_distance(pmf), cdf_gaps(pmf)
        rng = np.random.default_rng(7)
        ranks = rng.choice(m + 1, (seeds, num), p=pmf / pmf.sum())
        for method in METHODS:
            bounds = [rank_bound(row, m, DELTA, method) for row in ranks]
            values = np.array([b.lower_bound for b in bounds])
            assert all(b.method == method and b.delta == DELTA for b in bounds)
            label = (name, score, method, truth, tv)
            assert np.mean(values > tv) <= upper_tolerance(DELTA, seeds), label
            assert np.mean(values > truth) <= upper_tolerance(DELTA, seeds), (label, np.mean(values > truth))
            if method == "binomial":
                missed = np.mean([b.lower_bound > chosen_gap(b, gaps) for b in bounds])
                assert missed <= upper_tolerance(DELTA, seeds), (label, missed)
            assert values.mean() > 0.3 * tv and values.mean() > 0.5 * truth, (label, values.mean())


@pytest.mark.parametrize("name", list(PAIRS))
def test_reference_audit_bounds_cover_end_to_end(name):
    """200 audits of N = 400 calls (m = 16, the default scores), the audit's own method
    alternating: the pooled ranks of each score follow the exact rank law (DKW band at 1e-3);
    for both methods the headline bound (each score at delta / 3) exceeds the TV and the largest
    rank-law distance in at most delta + 3 se of the seeds, and so does each score's bound at
    delta against that score's distance; the headline is informative (mean > 0.3 TV)."""
    reference, target = pair(name)
    m, num, seeds = 16, 400, 200
    tv, laws = pair_truths(name, m)
    truths = {s: rank_distance(laws[s]) for s in DEFAULT_SCORES}
    share = DELTA / len(DEFAULT_SCORES)
    headline = {method: [] for method in METHODS}
    per_score = {(method, s): [] for method in METHODS for s in DEFAULT_SCORES}
    pooled = {s: [] for s in DEFAULT_SCORES}
    for seed in range(seeds):
        key_calls, key_audit = jax.random.split(run_key(4, seed))
        calls = process_calls(key_calls, [target], np.zeros(num, int))
        result = reference_audit(key_audit, [reference], calls, m=m, draws=19, bound=METHODS[seed % 2])
        for method in METHODS:
            bounds = {s: rank_bound(result.scores[s].ranks, m, share, method).lower_bound for s in DEFAULT_SCORES}
            headline[method].append(max(bounds.values()))
            if method == METHODS[seed % 2]:
                assert result.lower_bound == headline[method][-1]
                assert result.scores[result.best_score].bound.lower_bound == result.lower_bound
            for s in DEFAULT_SCORES:
                per_score[method, s].append(rank_bound(result.scores[s].ranks, m, DELTA, method).lower_bound)
        for s in DEFAULT_SCORES:
            pooled[s].append(result.scores[s].ranks)
    for s in DEFAULT_SCORES:
        ranks = np.concatenate(pooled[s])
        empirical = np.cumsum(np.bincount(ranks, minlength=m + 1))[:-1] / ranks.size
        band = math.sqrt(math.log(2 / 1e-3) / (2 * ranks.size))
        assert np.max(np.abs(empirical - np.cumsum(laws[s])[:-1])) <= band, (name, s)
    for method in METHODS:
        values = np.array(headline[method])
        assert np.mean(values > tv) <= upper_tolerance(DELTA, seeds), (name, method)
        assert np.mean(values > max(truths.values())) <= upper_tolerance(DELTA, seeds), (name, method)
        assert values.mean() > 0.3 * tv, (name, method, values.mean(), tv)
        for s in DEFAULT_SCORES:
            missed = np.mean(np.array(per_score[method, s]) > truths[s])
            assert missed <= upper_tolerance(DELTA, seeds), (name, method, s, missed)


def test_support_mismatch_is_reported_and_per_prompt_bounds_are_each_prompts_own():
    reference, target = pair("top-k support mismatch")
    tokens = all_sequences(4, 4)
    outside = float(sequence_probs(target, tokens)[sequence_probs(reference, tokens) == 0].sum())
    calls = process_calls(run_key(5, 0), [target], np.zeros(2000, int))
    result = reference_audit(run_key(5, 1), [reference], calls, m=8, scores=("logprob",), draws=19)
    se = math.sqrt(outside * (1 - outside) / 2000)
    assert abs(result.mismatch_share - outside) <= 4 * se, (result.mismatch_share, outside)
    ranks = np.random.default_rng(0).integers(0, 9, 300)
    groups = np.array(["a", "b", "c"])[np.arange(300) % 3]
    bounds = per_prompt_bounds(ranks, 8, groups, DELTA)
    assert set(bounds) == {"a", "b", "c"}
    for label, bound in bounds.items():
        assert bound == rank_bound(ranks[groups == label], 8, DELTA, "dkw")


# --------------------------------------------------------------------------- 4. anytime validity

GATE_M = 20


def skewed_law(m, tilt):
    """Ranks that run high: pmf_j proportional to 1 + tilt (2 j / m - 1)."""
    pmf = 1 + tilt * (2 * np.arange(m + 1) / m - 1)
    return pmf / pmf.sum()


def grid_distance(pmf):
    """max over the gate's thresholds of |G_k - F_k|: what the anytime bound estimates."""
    gaps = cdf_gaps(pmf)
    return float(max(abs(gaps[k]) for k in rank_thresholds(pmf.shape[0] - 1)))


@pytest.mark.slow
def test_rank_gate_type_one_error_at_every_round_under_the_null():
    """300 runs of 40 rounds of 10 uniform ranks (m = 20), tau = 0: the gate FAILs (the anytime
    bound passes 0 = TV at some round) in at most delta + 3 se of them; a PASS ran the horizon."""
    runs, rounds, size = 300, 40, 10
    fails = 0
    for run in range(runs):
        rng = np.random.default_rng(run)
        seen = []
        result = rank_gate((rng.integers(0, GATE_M + 1, size) for _ in range(rounds)), GATE_M, tau=0.0, delta=DELTA,
                           on_round=seen.append)
        failed = result.verdict == "FAIL"
        assert failed == any(b.lower_bound > 0 for b in seen) and result.exit_code == int(failed)
        if not failed:
            assert len(seen) == rounds and result.bound.calls == rounds * size == result.budget
        fails += failed
    assert fails / runs <= upper_tolerance(DELTA, runs), fails / runs


def test_anytime_bound_covers_the_grid_distance_at_every_round():
    """200 runs of 20 rounds of 16 ranks from a skewed law: the bound after any round exceeds
    max_k |G_k - F_k| over the grid thresholds in at most delta + 3 se of the runs, and ends
    informative."""
    runs, rounds, size = 200, 20, 16
    pmf = skewed_law(GATE_M, 0.9)
    truth = grid_distance(pmf)
    missed, final = 0, []
    for run in range(runs):
        rng = np.random.default_rng(1000 + run)
        sequence, over = rank_sequence_start(GATE_M), False
        assert anytime_bound(sequence, DELTA).lower_bound == 0.0
        for _ in range(rounds):
            sequence = rank_sequence_update(sequence, rng.choice(GATE_M + 1, size, p=pmf), DELTA)
            bound = anytime_bound(sequence, DELTA)
            over |= bound.lower_bound > truth
        assert bound.calls == rounds * size
        missed += over
        final.append(bound.lower_bound)
    assert missed / runs <= upper_tolerance(DELTA, runs), missed / runs
    assert np.mean(final) > 0.25 * truth, (np.mean(final), truth)


def test_rank_gate_fails_early_under_an_alternative():
    """Ranks from a clearly skewed law: the gate FAILs in at least 90% of 40 runs, stopping well
    before the horizon (median calls < half of it); the budget stops a run that has not failed."""
    runs, rounds, size = 40, 40, 16
    pmf = skewed_law(GATE_M, 0.9)
    verdicts, calls = [], []
    for run in range(runs):
        rng = np.random.default_rng(2000 + run)
        result = rank_gate((rng.choice(GATE_M + 1, size, p=pmf) for _ in range(rounds)), GATE_M, tau=0.0, delta=DELTA)
        verdicts.append(result.verdict)
        calls.append(result.bound.calls)
        if result.verdict == "FAIL":
            assert result.exit_code == 1 and result.bound.lower_bound > 0
    assert np.mean(np.array(verdicts) == "FAIL") >= 0.9, verdicts
    assert np.median(calls) < rounds * size / 2, calls
    rng = np.random.default_rng(0)
    capped = rank_gate((rng.integers(0, GATE_M + 1, size) for _ in range(rounds)), GATE_M, budget=48)
    assert capped.verdict == "PASS" and capped.bound.calls == 48 and capped.budget == 48


def test_round_ranks_feed_the_gate_end_to_end():
    """Rounds of target calls through score_ranks / round_ranks: the gate FAILs on a top-k
    mismatch pair and each round's ranks are score_ranks of that round's key."""
    reference, target = pair("top-k support mismatch")
    rounds = [process_calls(run_key(6, r), [target], np.zeros(64, int)) for r in range(6)]
    result = rank_gate(round_ranks(run_key(7, 0), [reference], iter(rounds), 8), 8)
    assert result.verdict == "FAIL" and result.bound.calls < 6 * 64
    first = next(round_ranks(run_key(7, 0), [reference], iter(rounds), 8))
    np.testing.assert_array_equal(first, score_ranks(jax.random.fold_in(run_key(7, 0), 0), [reference], rounds[0], 8))


# --------------------------------------------------------------------------- 5. scores


def test_continuation_features_equal_a_direct_computation_from_path_logprobs():
    """On a process that stops at EOS: logprob = the sum of path_logprobs over the real positions
    (trajectory_lengths), length, mean_logprob = their ratio; log_rank from next_token_logprobs;
    with_ranks gives the same logprob; a continuation outside the reference's support is -inf."""
    reference, target = pair("stops at EOS")
    tokens = np.concatenate([np.asarray(target.sample(jax.random.key(0), 300)),
                             np.array([[3, 3, 3, 3, 3], [0, 1, 2, 0, 1], [1, 3, 3, 3, 3]], np.int32)])
    path = np.asarray(reference.path_logprobs(jnp.asarray(tokens)), np.float64)
    lengths = np.asarray(trajectory_lengths(tokens, stopping_ids(reference)))
    assert set(lengths[-3:]) == {1, 5, 2} and len(set(lengths)) > 3
    real = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    logprob = np.where(real, path, 0.0).sum(axis=1)
    features = continuation_features(reference, tokens)
    np.testing.assert_array_equal(features["length"], lengths)
    np.testing.assert_allclose(features["logprob"], logprob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(features["mean_logprob"], logprob / lengths, rtol=1e-5, atol=1e-5)
    assert "log_rank" not in features
    with_ranks = continuation_features(reference, tokens, with_ranks=True)
    np.testing.assert_allclose(with_ranks["logprob"], features["logprob"], rtol=1e-6, atol=1e-6)
    mismatch_ref, mismatch_target = pair("top-k support mismatch")
    sampled = np.asarray(mismatch_target.sample(jax.random.key(1), 200))
    outside = sequence_probs(mismatch_ref, sampled) == 0
    assert outside.any() and not outside.all()
    assert np.array_equal(np.isneginf(continuation_features(mismatch_ref, sampled)["logprob"]), outside)


def brute_force_log_rank(process, tokens):
    """mean over real positions of log(1 + #{v: log p(v) > log p(x_t)}), in numpy."""
    table = np.asarray(process.next_token_logprobs(jnp.asarray(tokens)), np.float64)
    lengths = np.asarray(trajectory_lengths(tokens, stopping_ids(process)))
    out = np.zeros(tokens.shape[0])
    for i, row in enumerate(tokens):
        out[i] = np.mean([math.log1p(np.sum(table[i, t] > table[i, t, row[t]])) for t in range(lengths[i])])
    return out


@pytest.mark.parametrize("name", ["stops at EOS", "random LLM, temperature 1.3"])
def test_log_rank_equals_a_brute_force_count(name):
    reference, target = pair(name)
    tokens = np.asarray(target.sample(jax.random.key(2), 200))
    expected = brute_force_log_rank(reference, tokens)
    assert np.std(expected) > 0.1
    np.testing.assert_allclose(continuation_features(reference, tokens, with_ranks=True)["log_rank"], expected,
                               rtol=1e-5, atol=1e-6)


def test_learned_score_separates_two_feature_clouds():
    """Target features shifted by one standard deviation in logprob and length, 10% of them
    impossible for the reference (-inf): the fitted score's training AUC is > 0.9, also for the -inf
    rows alone against the reference's, and the score is linear in its design."""
    rng = np.random.default_rng(0)
    num = 400

    def cloud(shift):
        logprob = rng.normal(-10 + 2 * shift, 2, num)
        length = rng.normal(20 - 3 * shift, 3, num)
        return {"logprob": logprob, "mean_logprob": logprob / length, "length": length,
                "log_rank": rng.normal(1 + shift, 0.5, num)}

    target, reference = cloud(1.0), cloud(0.0)
    target["logprob"][:40] = target["mean_logprob"][:40] = -np.inf
    score = fit_learned_score(target, reference)
    assert score.names == ("logprob", "mean_logprob", "length", "log_rank")
    t, r = score(target), score(reference)
    assert np.all(np.isfinite(t)) and np.all(np.isfinite(r))
    auc = stats.mannwhitneyu(t, r, alternative="greater").statistic / (num * num)
    assert auc > 0.9, auc
    impossible = stats.mannwhitneyu(t[:40], r, alternative="greater").statistic / (40 * num)
    assert impossible > 0.9, impossible
    np.testing.assert_allclose(score(reference), score.design(reference) @ score.weights)


# --------------------------------------------------------------------------- 6. bad input


def small_audit_inputs():
    reference, target = pair("temperature 1.5")
    return reference, process_calls(jax.random.key(0), [target], np.zeros(8, int))


def bad_inputs():
    reference, calls = small_audit_inputs()
    key = jax.random.key(0)
    audit = lambda calls=calls, **kw: reference_audit(key, [reference], calls, draws=9, **{"m": 4, **kw})
    tokens = np.asarray(calls.tokens)
    out_of_vocab = tokens.copy()
    out_of_vocab[3, 1] = 4
    return {
        "NaN target score": (lambda: target_ranks(key, [np.nan, 1.0], [[0.0, 1.0], [1.0, 2.0]]), "target scores hold NaN"),
        "NaN reference score": (lambda: target_ranks(key, [0.0], [[np.nan]]), "reference scores hold NaN"),
        "no reference samples": (lambda: target_ranks(key, [0.0], np.zeros((1, 0))), "no reference samples"),
        "score shapes": (lambda: target_ranks(key, [0.0, 1.0], np.zeros((3, 2))), "target \\[N\\] and reference \\[N, m\\]"),
        "rank above m": (lambda: rank_test(key, np.array([0, 5]), 3), "must lie in \\[0, m=3\\]"),
        "negative rank": (lambda: rank_bound(np.array([-1, 2]), 3, DELTA), "must lie in \\[0, m=3\\]"),
        "rank above m, gate": (lambda: rank_gate([np.array([0, 21])], 20), "must lie in \\[0, m=20\\]"),
        "float ranks": (lambda: rank_test(key, np.array([0.5, 1.0]), 3), "ranks must be integers"),
        "empty ranks": (lambda: rank_bound(np.array([], int), 3, DELTA), "non-empty 1-D"),
        "groups shape": (lambda: rank_test(key, np.array([0, 1]), 3, groups=[0]), "groups"),
        "m = 0, ranks": (lambda: rank_test(key, np.array([0, 0]), 0), "m must be an integer >= 1"),
        "m = 0, audit": (lambda: audit(m=0), "m must be an integer >= 1"),
        "no calls": (lambda: audit(TargetCalls(np.zeros((0, 4), np.int32), np.zeros(0, np.int64))), "N >= 1"),
        "prompts shape": (lambda: audit(TargetCalls(tokens, np.zeros(3, int))), "prompts \\[N\\]"),
        "prompt out of range": (lambda: audit(TargetCalls(tokens, np.arange(8) % 2)), "indices into the 1 reference"),
        "negative prompt": (lambda: audit(TargetCalls(tokens, -np.ones(8, int))), "indices into the 1 reference"),
        "tokens too wide": (lambda: audit(TargetCalls(np.zeros((8, 5), np.int32), np.zeros(8, int))), "n=5 positions"),
        "token id outside the vocabulary": (lambda: audit(TargetCalls(out_of_vocab, np.zeros(8, int))),
                                            "token ids must lie in \\[0, 4\\)"),
        "features of the wrong width": (lambda: continuation_features(reference, tokens[:, :3]), "n=4"),
        "unknown score": (lambda: audit(scores=("logprob", "perplexity")), "non-empty subset"),
        "no scores": (lambda: audit(scores=()), "non-empty subset"),
        "repeated score": (lambda: audit(scores=("logprob", "logprob")), "repeat a name"),
        "learned sequential score": (lambda: score_ranks(key, [reference], calls, 4, score="learned"),
                                     "sequential score must be one of"),
        "learned with one call": (lambda: audit(TargetCalls(tokens[:1], np.zeros(1, int)), scores=("learned",)),
                                  "learned score needs calls to fit and to test"),
        "learned share 1": (lambda: audit(scores=("learned",), learned_share=1.0), "learned score needs calls"),
        "no references": (lambda: reference_audit(key, [], calls), "no reference processes"),
        "unknown bound method": (lambda: rank_bound(np.array([0, 1]), 3, DELTA, "hoeffding"), "method must be one of"),
        "unknown test statistic": (lambda: audit(test_statistic="ad"), "test_statistic must be"),
        "delta = 0, audit": (lambda: audit(delta=0.0), "delta must be > 0"),
        "delta = 1, audit": (lambda: audit(delta=1.0), "delta must be < 1"),
        "delta = 1.5, dkw": (lambda: rank_bound(np.array([0, 1]), 3, 1.5, "dkw"), "delta must be < 1"),
        "delta = 0, binomial": (lambda: rank_bound(np.array([0, 1]), 3, 0.0), "delta must be > 0"),
        "delta = -1, per prompt": (lambda: per_prompt_bounds(np.array([0, 1]), 3, [0, 0], -1.0), "delta must be > 0"),
        "delta = 0, gate": (lambda: rank_gate([np.array([0, 1])], 3, delta=0.0), "delta must be > 0"),
        "delta = 1, anytime": (lambda: anytime_bound(rank_sequence_start(3), 1.0), "delta must be < 1"),
        "tau = 1, gate": (lambda: rank_gate([np.array([0, 1])], 3, tau=1.0), "tau must be < 1"),
        "draws = 0": (lambda: rank_test(key, np.array([0, 1]), 3, draws=0), "draws must be an integer >= 1"),
        "joint score shapes": (lambda: exchangeable_test(key, np.zeros((4, 2)), np.zeros((4, 3, 3))),
                               "target \\[N, S\\] and reference \\[N, m, S\\]"),
        "joint NaN score": (lambda: exchangeable_test(key, np.full((2, 1), np.nan), np.zeros((2, 3, 1))), "hold NaN"),
    }


BAD_CASES = [
    "NaN target score", "NaN reference score", "no reference samples", "score shapes", "rank above m", "negative rank",
    "rank above m, gate", "float ranks", "empty ranks", "groups shape", "m = 0, ranks", "m = 0, audit", "no calls",
    "prompts shape", "prompt out of range", "negative prompt", "tokens too wide", "token id outside the vocabulary",
    "features of the wrong width", "unknown score", "no scores", "repeated score", "learned sequential score",
    "learned with one call", "learned share 1", "no references", "unknown bound method", "unknown test statistic",
    "delta = 0, audit", "delta = 1, audit", "delta = 1.5, dkw", "delta = 0, binomial", "delta = -1, per prompt",
    "delta = 0, gate", "delta = 1, anytime", "tau = 1, gate", "draws = 0", "joint score shapes",
    "joint NaN score"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_a_value_error_that_names_the_problem(case):
    cases = bad_inputs()
    assert set(cases) == set(BAD_CASES)
    call, message = cases[case]
    with pytest.raises(ValueError, match=message):
        call()
