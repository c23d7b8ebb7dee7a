"""tvjax.audit.distinguish: the certified TV lower bound from a trained distinguisher.

The binomial bounds against their defining tails and closed forms; validity over seeds on pairs of known TV (the observed rate of
bound > TV within a binomial tolerance of delta, a support-mismatch pair included), identical
pairs, the point estimate against the true TV as N grows, the held-out rows untouched by training,
the sources (texts, processes that stop at EOS, pools) and bad input. Fixed seeds throughout."""

import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from scipy import stats

from tvjax.audit.distinguish import (
    ByteTokenizer,
    TrainSettings,
    clopper_pearson_lower,
    clopper_pearson_upper,
    distinguish,
    distinguish_copies,
    held_out_rows,
    pool_samples,
    sample_pair,
    split_sizes,
    texts_to_samples,
    token_samples,
    tv_lower_bound,
)
from tvjax.core.instances import coin_pair, exact_tv, random_tabular_pair, stopping_tabular_pair

COPIES = 100


def binomial_tolerance(rate, trials, z=3.0):
    """The largest observed share of `trials` Bernoulli(rate) events within z standard errors."""
    return rate + z * math.sqrt(rate * (1 - rate) / trials)


# --------------------------------------------------------------------------- the binomial bounds


@pytest.mark.parametrize("successes, trials", [(0, 1), (1, 1), (0, 10), (3, 10), (10, 10), (1, 1000), (517, 1000),
                                               (999, 1000), (4000, 5000), (3, 10**7)])
@pytest.mark.parametrize("alpha", [0.025, 0.1])
def test_clopper_pearson_bounds_solve_their_defining_binomial_tails(successes, trials, alpha):
    """Ground truth independent of the beta quantiles: the binomial tails at the bounds equal alpha."""
    lower, upper = clopper_pearson_lower(successes, trials, alpha), clopper_pearson_upper(successes, trials, alpha)
    assert 0.0 <= lower < upper <= 1.0
    if successes:
        assert stats.binom.sf(successes - 1, trials, lower) == pytest.approx(alpha, rel=1e-9)
    else:
        assert lower == 0.0
    if successes < trials:
        assert stats.binom.cdf(successes, trials, upper) == pytest.approx(alpha, rel=1e-9)
    else:
        assert upper == 1.0


@pytest.mark.parametrize("trials", [1, 7, 1000])
def test_clopper_pearson_closed_forms_at_the_extremes(trials):
    """All successes: P_p(X >= n) = p^n = alpha; no success: P_p(X <= 0) = (1 - p)^n = alpha."""
    assert clopper_pearson_lower(trials, trials, 0.05) == pytest.approx(0.05 ** (1 / trials), rel=1e-12)
    assert clopper_pearson_upper(0, trials, 0.05) == pytest.approx(1 - 0.05 ** (1 / trials), rel=1e-12)


def test_tv_lower_bound_is_the_union_of_two_one_sided_bounds():
    bound = tv_lower_bound(700, 1000, 400, 900, 0.05)
    assert bound == clopper_pearson_lower(700, 1000, 0.025) - clopper_pearson_upper(400, 900, 0.025)
    assert 0.15 < bound < 0.7 - 400 / 900
    assert tv_lower_bound(0, 10, 10, 10, 0.05) == -1.0


# --------------------------------------------------------------------------- validity and accuracy


NUM = 600  # per side: one compiled program per (pair structure, NUM) serves several tests
TOP_K_PAIR = dict(seed=3, vocab_size=4, n=3, context_len=1, top_k=(2, 3))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["coins", "top-k (support mismatch)"])
def test_bound_exceeds_the_true_tv_in_at_most_delta_of_the_seeds(family):
    """Coins: the n-gram classifier is near the Bayes classifier, so the bound is tight and the
    rate is a real test of delta. Top-k 2 vs 3 of 4 tokens: part of mu's mass is outside pi's
    support. delta = 0.2 so that a miscalibrated bound would show in 100 seeds."""
    pi, mu = coin_pair(n=8, shift=0.25) if family == "coins" else random_tabular_pair(**TOP_K_PAIR)
    truth = exact_tv(pi, mu)
    result = distinguish_copies(jax.random.key(1), pi, mu, NUM, COPIES, delta=0.2)
    assert np.mean(result.lower_bound > truth) <= binomial_tolerance(0.2, COPIES)
    assert np.mean(result.lower_bound) > 0.4 * truth  # and not vacuous


def test_identical_pair_bound_is_at_most_zero_up_to_delta():
    pi, _ = coin_pair(n=8, shift=0.25)
    result = distinguish_copies(jax.random.key(2), pi, pi, NUM, COPIES, delta=0.2)
    assert np.mean(result.lower_bound > 0) <= binomial_tolerance(0.2, COPIES)
    assert abs(np.mean(result.estimate)) < 4 * np.std(result.estimate) / math.sqrt(COPIES) + 1e-9


@pytest.mark.slow
def test_point_estimate_approaches_the_true_tv_as_n_grows():
    """On a small tabular pair (V = 4, n = 3, top-k 2 vs 3) the estimate pi_hat(A) - mu_hat(A) is
    below the TV on average (A is one event) and closes on it as the sample grows."""
    pi, mu = random_tabular_pair(**TOP_K_PAIR)
    truth = exact_tv(pi, mu)
    ratios = []
    for num, copies in ((NUM, COPIES), (8000, 10)):
        result = distinguish_copies(jax.random.key(num), pi, mu, num, copies)
        ratios.append(np.mean(result.estimate) / truth)
        assert np.mean(result.estimate) < truth + 4 * np.std(result.estimate) / math.sqrt(copies)
    assert ratios[0] < ratios[1] and ratios[1] > 0.9, ratios


# --------------------------------------------------------------------------- the held-out rows


def test_training_never_reads_the_test_rows():
    pi, mu = coin_pair(n=8, shift=0.25)
    a, b = sample_pair(jax.random.key(3), pi, mu, 200)
    key = jax.random.key(4)
    first = distinguish(key, a, b, fast_compile=True)
    test_pi, test_mu = held_out_rows(key, 200, 200)
    assert len(test_pi) == first.pi_test and len(test_mu) == first.mu_test
    # overwrite the held-out rows: training (its diagnostics and threshold) is unchanged
    rng = np.random.default_rng(0)
    scrambled = [np.asarray(s.tokens).copy() for s in (a, b)]
    for tokens, rows in zip(scrambled, (test_pi, test_mu)):
        tokens[rows] = rng.integers(0, 2, (len(rows), tokens.shape[1]))
    second = distinguish(key, token_samples(scrambled[0], vocab_size=2), token_samples(scrambled[1], vocab_size=2),
                         fast_compile=True)
    training = ("epochs", "best_epoch", "best_validation_loss", "best_validation_accuracy", "stopped_early", "threshold")
    assert [getattr(first, f) for f in training] == [getattr(second, f) for f in training]
    # permuting the held-out rows among themselves changes nothing at all
    permuted = [np.asarray(s.tokens).copy() for s in (a, b)]
    for tokens, rows in zip(permuted, (test_pi, test_mu)):
        tokens[rows] = tokens[rng.permutation(rows)]
    assert distinguish(key, token_samples(permuted[0], vocab_size=2), token_samples(permuted[1], vocab_size=2),
                       fast_compile=True) == first
    # while changing a training row does change training
    changed = np.asarray(a.tokens).copy()
    train_row = np.setdiff1d(np.arange(200), test_pi)[0]
    changed[train_row] = 1 - changed[train_row]
    third = distinguish(key, token_samples(changed, vocab_size=2), b, fast_compile=True)
    assert third.best_validation_loss != first.best_validation_loss


def test_a_seed_reproduces_the_result():
    pi, mu = coin_pair(n=8, shift=0.25)
    a, b = sample_pair(jax.random.key(5), pi, mu, 200)
    assert distinguish(7, a, b, fast_compile=True) == distinguish(jax.random.key(7), a, b, fast_compile=True)


# --------------------------------------------------------------------------- sources


def test_processes_that_stop_at_eos_give_their_lengths_and_padding_is_never_read():
    pi, mu = stopping_tabular_pair(seed=0, vocab_size=4, n=6, stop_prob=(0.2, 0.5))
    a, b = sample_pair(jax.random.key(6), pi, mu, 300)
    lengths = np.asarray(b.lengths)
    assert lengths.min() < 6 and lengths.max() <= 6
    tokens = np.asarray(b.tokens)
    assert np.all(tokens[np.arange(6)[None] >= lengths[:, None]] == 3)  # the EOS pad
    first = distinguish(8, a, b, fast_compile=True)
    tokens = tokens.copy()
    tokens[np.arange(6)[None] >= lengths[:, None]] = 0  # other padding: same result
    assert distinguish(8, a, token_samples(tokens, lengths, vocab_size=4), fast_compile=True) == first
    assert first.estimate > 0


def test_texts_through_a_tokenizer():
    """Texts of up to 6 letters over "abcd" (vocabulary 4, the stopping pair's shapes: one program)."""
    tokenizer = SimpleNamespace(encode=lambda text: [ord(c) - ord("a") for c in text], vocab_size=4)
    rng = np.random.default_rng(1)
    pi_texts = ["".join(rng.choice(list("ab"), size=rng.integers(1, 8))) for _ in range(300)]
    mu_texts = ["".join(rng.choice(list("abcd"), size=rng.integers(1, 8))) for _ in range(300)]
    a, b = texts_to_samples(pi_texts, tokenizer, n=6), texts_to_samples(mu_texts, tokenizer, n=6)
    assert a.vocab_size == 4 and np.asarray(a.lengths).tolist() == [min(len(t), 6) for t in pi_texts]
    result = distinguish(9, a, b, fast_compile=True)
    assert result.pi_test == 150 and result.estimate > 0.5
    as_bytes = texts_to_samples(["hé", "a"], ByteTokenizer())
    assert as_bytes.vocab_size == 256 and np.asarray(as_bytes.tokens).tolist() == [[104, 195, 169], [97, 0, 0]]


def test_pool_tokens_with_and_without_lengths():
    """A fixed-length pool's lengths are n throughout (`Pool.lengths`); a stopping pool's are its own."""
    tokens = {"pi": np.array([[1, 2, 0], [2, 2, 2]]), "mu": np.array([[0, 0, 0], [1, 0, 0]])}
    plain = SimpleNamespace(tokens=tokens, metadata={}, lengths={"pi": np.array([3, 3]), "mu": np.array([3, 3])})
    a, b = pool_samples(plain)
    assert a.vocab_size == b.vocab_size == 3 and np.asarray(a.lengths).tolist() == [3, 3]
    stopped = SimpleNamespace(tokens=tokens, metadata={"vocab_size": 5},
                              lengths={"pi": np.array([2, 3]), "mu": np.array([1, 1])})
    a, b = pool_samples(stopped)
    assert a.vocab_size == 5 and np.asarray(b.lengths).tolist() == [1, 1]


@pytest.mark.slow
def test_transformer_learns_a_coin_pair():
    pi, mu = coin_pair(n=8, shift=0.5)
    a, b = sample_pair(jax.random.key(10), pi, mu, 400)
    result = distinguish(11, a, b, classifier="transformer", settings=TrainSettings(max_epochs=15, patience=3))
    assert result.classifier == "transformer" and result.epochs <= 15
    assert result.lower_bound > 0.2 and result.estimate <= exact_tv(pi, mu) + 0.15


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_a_clear_error():
    ones = token_samples(np.ones((20, 4), np.int32), vocab_size=2)
    with pytest.raises(ValueError, match="different lengths: n=4 vs n=5"):
        distinguish(0, ones, token_samples(np.ones((20, 5), np.int32), vocab_size=2))
    with pytest.raises(ValueError, match="different vocabularies: 2 vs 3"):
        distinguish(0, ones, token_samples(np.ones((20, 4), np.int32), vocab_size=3))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, vocab_size=2\), found \[5\]"):
        token_samples(np.array([[0, 5]]), vocab_size=2)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, n=2\]"):
        token_samples(np.array([[0, 1]]), lengths=[3])
    with pytest.raises(ValueError, match="too few to split.*need at least 3 per side"):
        distinguish(0, token_samples(np.ones((2, 4), np.int32), vocab_size=2), ones)
    assert split_sizes(3) == (1, 1, 1) and split_sizes(1000) == (500, 125, 375)
    with pytest.raises(ValueError, match="texts need a tokenizer"):
        texts_to_samples(["a", "b"], None)
    for delta in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="delta must be"):
            distinguish(0, ones, ones, delta=delta)
    with pytest.raises(ValueError, match="unknown classifier 'forest'"):
        distinguish(0, ones, ones, classifier="forest")
    with pytest.raises(ValueError, match="successes must be an integer in"):
        clopper_pearson_lower(11, 10, 0.05)
