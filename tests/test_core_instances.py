"""Instances and their ground truth: exact values, enumeration against brute force, sampling laws."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tvjax
from tvjax.core.currency import likelihood_ratio_term
from tvjax.core.instances import (
    TabularProcess,
    block_pair,
    coin_pair,
    enumerate_tv,
    exact_tv,
    likelihood_ratio_moments,
    paper_block_pair,
    random_tabular_pair,
    rare_escape_pair,
    tabular_logits,
)
from tvjax.core.oracles import Exact, Noisy


def test_paper_instance_exact_tv():
    pi, mu = paper_block_pair()
    assert exact_tv(pi, mu) == 0.3883154296875
    assert int(np.sum(np.asarray(pi.final_p1) != np.asarray(mu.final_p1))) == 1623
    assert (pi.n, pi.hidden_paths.shape) == (128, (4096, 115))


def test_block_analytic_equals_enumeration():
    pi, mu = block_pair(seed=3, n=9, block_bits=3, p_active=0.5, alpha=0.3)
    assert exact_tv(pi, mu) == pytest.approx(enumerate_tv(pi, mu), abs=1e-6)


def test_rare_escape_closed_form_equals_enumeration():
    P = np.array([0.5, 0.3, 0.2, 0.0])
    Q = np.array([0.1, 0.3, 0.2, 0.4])  # Q has an outcome P never produces: support mismatch
    pi, mu = rare_escape_pair(P, Q, n=7, escape_scale=1.5)
    q = 1.5 / 7
    closed = (1 - (1 - q) ** 7) * 0.5 * np.abs(P - Q).sum()
    assert exact_tv(pi, mu) == pytest.approx(closed, rel=1e-12)
    assert enumerate_tv(pi, mu) == pytest.approx(closed, rel=1e-5)


def _brute_force_probs(logits, temperature, top_k, context_len):
    """Independent float64 reference: softmax(top-k(logits / T)) per (position, context)."""
    scaled = np.asarray(logits, np.float64) / temperature
    if top_k is not None:
        kth = np.sort(scaled, axis=-1)[..., -top_k][..., None]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


def _brute_force_tv(V, n, c, logits, temperatures, top_ks):
    tables = [_brute_force_probs(*args, c) for args in zip(logits, temperatures, top_ks)]
    total = 0.0
    for seq in itertools.product(range(V), repeat=n):
        probs = []
        for table in tables:
            prob = 1.0
            for i, token in enumerate(seq):
                context = [0] * max(0, c - i) + list(seq[max(0, i - c) : i])
                index = 0
                for t in context:
                    index = index * V + t
                prob *= table[i, index, token]
            probs.append(prob)
        total += abs(probs[0] - probs[1])
    return total / 2


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(top_k=(2, 3)),  # truncation change: support mismatch
        dict(temperature=(1.0, 1.4)),
        dict(logit_noise=0.3),
        dict(top_k=(3, 3), temperature=(0.7, 0.7), logit_noise=0.2),
    ],
)
def test_random_tabular_enumeration_matches_brute_force(kwargs):
    pi, mu = random_tabular_pair(seed=1, vocab_size=4, n=5, context_len=2, **kwargs)
    logits = tabular_logits(1, 4, 5, 2, kwargs.get("logit_noise", 0.0))
    reference = _brute_force_tv(4, 5, 2, logits, kwargs.get("temperature", (1.0, 1.0)), kwargs.get("top_k", (None, None)))
    assert exact_tv(pi, mu) == pytest.approx(reference, abs=2e-6)


def test_enumeration_too_large_raises():
    pi, mu = random_tabular_pair(seed=0, vocab_size=50, n=12, context_len=1)
    with pytest.raises(ValueError, match="enumeration"):
        exact_tv(pi, mu)


@pytest.mark.parametrize(
    "pair",
    [
        lambda: random_tabular_pair(seed=2, vocab_size=3, n=3, context_len=1, top_k=(2, 2)),
        lambda: rare_escape_pair([0.6, 0.4], [0.2, 0.8], n=3, escape_scale=1.0),
        lambda: block_pair(seed=1, n=5, block_bits=2, p_active=0.5, alpha=0.4),
        lambda: coin_pair(n=4, shift=0.3),
        lambda: tvjax.core.instances.stopping_tabular_pair(seed=3, vocab_size=3, n=4),
    ],
)
def test_sampling_law_matches_path_logprobs(pair):
    """Empirical sequence frequencies agree with exp(sum path_logprobs) within 4.5 binomial stderr."""
    pi, _ = pair()
    num = 60_000
    tokens = np.asarray(jax.jit(pi.sample, static_argnums=1)(jax.random.PRNGKey(0), num))
    seqs, counts = np.unique(tokens, axis=0, return_counts=True)
    probs = np.exp(np.asarray(jnp.sum(pi.path_logprobs(jnp.asarray(seqs)), axis=1), np.float64))
    freq = counts / num
    stderr = np.sqrt(probs * (1 - probs) / num) + 1e-9
    assert np.all(np.abs(freq - probs) < 4.5 * stderr + 1e-4)
    assert probs.min() > 0  # nothing sampled outside the support
    assert probs.sum() == pytest.approx(1.0, abs=0.02)


@pytest.mark.slow
def test_next_token_logprobs_consistent_with_path():
    pairs = (paper_block_pair(), random_tabular_pair(seed=0, top_k=(2, 3)), rare_escape_pair([0.5, 0.5], [0.9, 0.1], 9),
             coin_pair(7))
    for pi, _ in pairs:
        tokens = pi.sample(jax.random.PRNGKey(1), 64)
        full = pi.next_token_logprobs(tokens)
        gathered = jnp.take_along_axis(full, tokens[..., None], -1)[..., 0]
        np.testing.assert_allclose(np.asarray(gathered), np.asarray(pi.path_logprobs(tokens)), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.nn.logsumexp(full, -1)), 0.0, atol=1e-5)


def test_top_k_is_tie_inclusive():
    probs = np.full((1, 1, 4), 0.25)
    proc = TabularProcess.from_probs(probs, context_len=0, top_k=2)
    np.testing.assert_allclose(np.exp(np.asarray(proc.logprobs))[0, 0], 0.25, rtol=1e-6)
    assert proc.max_support == 4


def test_processes_are_pytrees_that_jit_and_vmap():
    pi, mu = paper_block_pair()
    tokens = jax.jit(lambda p, k: p.sample(k, 8))(pi, jax.random.PRNGKey(0))
    logp = jax.jit(lambda p, x: p.path_logprobs(x))(mu, tokens)
    assert logp.shape == (8, 128)
    per_key = jax.vmap(lambda k: pi.sample(k, 4))(jax.random.split(jax.random.PRNGKey(1), 3))
    assert per_key.shape == (3, 4, 128)
    t_pi, _ = random_tabular_pair(seed=0)
    assert jax.vmap(t_pi.path_logprobs)(t_pi.sample(jax.random.PRNGKey(2), 6)[:, None]).shape == (6, 1, 6)


# --------------------------------------------------------------------------- bad input


def test_bad_instance_parameters_raise():
    with pytest.raises(ValueError, match="outside"):
        TabularProcess.from_probs(np.array([[[1.2, -0.2]]]), context_len=0)
    with pytest.raises(ValueError, match="sum to 1"):
        TabularProcess.from_probs(np.array([[[0.3, 0.3]]]), context_len=0)
    with pytest.raises(ValueError, match="sum to 1"):
        rare_escape_pair([0.5, 0.4], [0.5, 0.5], n=4)
    with pytest.raises(ValueError, match="same outcomes"):
        rare_escape_pair([0.5, 0.5], [0.2, 0.3, 0.5], n=4)
    with pytest.raises(ValueError, match="alpha"):
        block_pair(alpha=0.7)
    with pytest.raises(ValueError, match="top_k"):
        random_tabular_pair(vocab_size=4, top_k=(5, None))
    with pytest.raises(ValueError, match="temperature"):
        random_tabular_pair(temperature=(0.0, 1.0))


def test_mismatched_pairs_raise():
    pi, _ = paper_block_pair()
    short, _ = block_pair(n=64)
    with pytest.raises(ValueError, match="sequence lengths"):
        exact_tv(pi, short)
    a, _ = random_tabular_pair(vocab_size=3, n=6)
    b, _ = random_tabular_pair(vocab_size=4, n=6)
    with pytest.raises(ValueError, match="vocabularies"):
        exact_tv(a, b)
    with pytest.raises(ValueError, match="vocabularies"):
        tvjax.core.estimators.likelihood_ratio(jax.random.PRNGKey(0), a, b, tvjax.Exact(), tvjax.Samples(16))


def test_rare_escape_uniform_pair_has_the_stated_tv():
    pi, mu = tvjax.rare_escape_uniform_pair(K=4, n=8, tv_outcomes=0.3, escape_scale=2.0)
    q = 2.0 / 8
    assert exact_tv(pi, mu) == pytest.approx((1 - (1 - q) ** 8) * 0.3, rel=1e-12)
    assert enumerate_tv(pi, mu) == pytest.approx(exact_tv(pi, mu), abs=1e-6)
    assert pi.max_support == pi.vocab_size == 5
    for bad in ({"K": 3}, {"K": 0}, {"tv_outcomes": 0.6}):
        with pytest.raises(ValueError):
            tvjax.rare_escape_uniform_pair(**bad)


@pytest.mark.parametrize("n, shift", [(1, 0.3), (6, 0.25), (13, 0.4), (18, 1.5)])
def test_coin_pair_tv_by_its_sufficient_statistic_equals_enumeration(n, shift):
    """The sum over the number of ones against the sum over all 2^n sequences, up to near-total
    separation (shift 1.5 at n = 18: a = 0.35)."""
    pi, mu = coin_pair(n=n, shift=shift)
    assert exact_tv(pi, mu) == pytest.approx(enumerate_tv(pi, mu), abs=2e-6)


def test_coin_pair_tv_is_stable_in_n_and_finite_far_out():
    """a = shift / sqrt(n) keeps the TV near 2 Phi(2 shift) - 1; the log-space sum stays finite
    where the binomial coefficients overflow float64 (n > 1029)."""
    from scipy.stats import norm

    limit = 2 * norm.cdf(0.5) - 1
    values = [exact_tv(*coin_pair(n=n, shift=0.25)) for n in (32, 512, 4096)]
    assert all(abs(v - limit) < 0.01 for v in values) and values[0] < values[1] < values[2]
    with pytest.raises(ValueError, match="shift"):
        coin_pair(n=4, shift=1.0)  # a = 1/2: a coin with p = 1 and one with p = 0


def _path_mismatched_block_pair():
    """Two block processes whose hidden paths differ in some blocks: mu has zero mass off its path."""
    pi, mu = block_pair(seed=4, n=10, block_bits=3, p_active=0.5, alpha=0.3)
    other, _ = block_pair(seed=5, n=10, block_bits=3, p_active=0.5, alpha=0.3)
    hidden = np.asarray(pi.hidden_paths).copy()
    hidden[::2] = np.asarray(other.hidden_paths)[::2]
    return pi, dataclasses.replace(mu, hidden_paths=hidden)


@pytest.mark.parametrize("pair", ["paper", "path_mismatch"])
def test_realized_sampler_equals_the_token_path(pair):
    """The block instance's compact sampler gives exactly the realized log-probs, zero-mass counts
    and path log-probs that its tokens give under every oracle's token path."""
    pi, mu = paper_block_pair() if pair == "paper" else _path_mismatched_block_pair()
    key = jax.random.key(7)
    for sampler in (pi, mu):
        compact = sampler.realized_sampler((pi, mu))(key, 3000)
        from_tokens = Noisy(0.1).realize((pi, mu), sampler.sample(key, 3000))
        for got, want in zip(compact, from_tokens):
            for a, b in zip(got, want):  # sums of a dozen float32 terms: equal to rounding
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=0)
    if pair == "path_mismatch":
        assert np.any(np.asarray(compact.zero_mass[0]) > 0) and np.any(np.asarray(compact.zero_mass[1]) == 0)
    # A pair of another kind has no compact sampler: the oracles fall back to tokens.
    tab, _ = random_tabular_pair()
    assert pi.realized_sampler((pi, tab)) is None



@pytest.mark.parametrize("pair", ["paper", "path_mismatch", "tabular"])
def test_side_sampler_draws_each_side_as_its_own_sampler(pair):
    """One sampler for both sides (a side index selects the tables, or a switch where the pair has
    no compact sampler) gives, per side, exactly the rows that side's own sampler gives from the
    same key; the block instance's takes a side per row too."""
    pi, mu = {"paper": paper_block_pair, "path_mismatch": _path_mismatched_block_pair, "tabular": random_tabular_pair}[pair]()
    oracle, key = Noisy(0.1), jax.random.key(11)
    draw = jax.jit(oracle.side_sampler((pi, mu)), static_argnums=1)
    for side, sampler in enumerate((pi, mu)):
        want = oracle.trajectory_sampler(sampler, (pi, mu))(key, 500)
        got = draw(key, 500, jnp.int32(side))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if pair != "tabular":
        rows = jnp.arange(500) % 2
        mixed = oracle.side_sampler((pi, mu))(key, 500, rows)
        per_side = [oracle.trajectory_sampler(s, (pi, mu))(key, 500) for s in (pi, mu)]
        for a, b, c in zip(jax.tree.leaves(mixed), *map(jax.tree.leaves, per_side)):
            expected = np.where(np.asarray(rows).reshape((-1,) + (1,) * (np.ndim(a) - 1)) == 0, np.asarray(b), np.asarray(c))
            np.testing.assert_array_equal(np.asarray(a), expected)

def test_block_final_bit_law_and_one_word_per_trajectory():
    """P(final bit = 1 | block) is p1 to within 2^-20 plus sampling error, from one random word."""
    pi, _ = paper_block_pair()
    num = 400_000
    u, final = pi._draw(jax.random.key(3), num)
    p1 = np.asarray(pi.final_p1, np.float64)[np.asarray(u)]
    z = (np.sum(np.asarray(final)) - np.sum(p1)) / np.sqrt(np.sum(p1 * (1 - p1)))
    assert abs(z) < 5
    counts = np.bincount(np.asarray(u), minlength=4096)
    assert abs(counts.mean() - num / 4096) < 1e-9 and counts.std() < 2 * np.sqrt(num / 4096)
    words = jax.make_jaxpr(lambda k: pi._draw(k, num))(jax.random.key(0))
    assert f"shape=({num},)" in str(words) and f"shape=({2 * num},)" not in str(words)


@pytest.mark.parametrize("pair", ["paper", "path_mismatch", "tabular_top_k"])
def test_exact_ratio_moments_match_sampling(pair):
    """Var(R) of Algorithm 1 computed exactly (a sum over blocks, or enumeration) agrees with the
    sampled mean and variance of 200k trajectories within 5 standard errors, and its mean is the TV."""
    if pair == "paper":
        pi, mu = paper_block_pair()
    elif pair == "path_mismatch":
        pi, mu = _path_mismatched_block_pair()
    else:
        pi, mu = random_tabular_pair(seed=2, vocab_size=3, n=5, context_len=1, top_k=(2, None))
    exact = likelihood_ratio_moments(pi, mu)
    assert exact.mean == pytest.approx(exact_tv(pi, mu), abs=1e-6)
    assert exact.mean == pytest.approx(enumerate_tv(pi, mu), abs=1e-6) if pair != "paper" else True
    num = 200_000
    logs = Exact().nested_path_logprobs(None, (pi, mu), pi.sample(jax.random.key(11), num), (1,))
    r = np.asarray(likelihood_ratio_term(logs[0][:, 0], logs[1][:, 0]), np.float64)
    assert abs(r.mean() - exact.mean) < 5 * np.sqrt(exact.variance / num) + 1e-6
    # Var of the sample variance: (mu4 - sigma^4) / N, with mu4 <= E[R^4] <= E[R^2] for R in [0, 1].
    assert abs(r.var(ddof=1) - exact.variance) < 5 * np.sqrt((exact.variance + exact.mean**2) / num) + 1e-6


def _stopped_tv_by_brute_force(seed, V, n, stop):
    """TV over variable-length sequences (length <= n, ending at EOS = V - 1 or at n) from the raw
    tables of random_tabular_pair with context_len = 1, without padding or absorbing rows."""
    raw = [np.exp(np.asarray(p.logprobs, np.float64)) for p in random_tabular_pair(seed, V, n, 1)]
    eos = V - 1

    def mass(table, s, seq):
        prob, prev = 1.0, 0  # the table reads the context before the start as token 0
        for i, token in enumerate(seq):
            row = table[i, prev].copy()
            row[eos] = 0.0
            row = (1 - s) * row / row.sum()
            prob *= s if token == eos else row[token]
            prev = token
        return prob

    sequences = [seq + (eos,) for k in range(n) for seq in itertools.product(range(eos), repeat=k)]
    sequences += list(itertools.product(range(eos), repeat=n))
    masses = np.array([[mass(table, s, seq) for seq in sequences] for table, s in zip(raw, stop)])
    assert np.allclose(masses.sum(axis=1), 1.0)
    return 0.5 * np.abs(masses[0] - masses[1]).sum()


@pytest.mark.parametrize("seed, V, n", [(0, 3, 4), (1, 4, 5)])
def test_stopping_tabular_tv_equals_the_variable_length_sum(seed, V, n):
    """Padded enumeration over V^n (what exact_tv does) against a sum over the sequences of
    length <= n themselves: after EOS the pad is deterministic under both models."""
    pi, mu = tvjax.core.instances.stopping_tabular_pair(seed=seed, vocab_size=V, n=n, stop_prob=(0.2, 0.35))
    assert pi.eos_ids == mu.eos_ids == (V - 1,)
    assert exact_tv(pi, mu) == pytest.approx(_stopped_tv_by_brute_force(seed, V, n, (0.2, 0.35)), abs=2e-6)


def test_stopped_trajectories_pad_with_log_probability_zero_and_their_lengths():
    from tvjax.core.currency import trajectory_lengths

    pi, _ = tvjax.core.instances.stopping_tabular_pair(seed=1, n=6, stop_prob=(0.3, 0.3))
    tokens = np.asarray(pi.sample(jax.random.key(0), 4096))
    lengths = np.asarray(trajectory_lengths(tokens, pi.eos_ids))
    logp = np.asarray(pi.path_logprobs(jnp.asarray(tokens)))
    after = np.arange(pi.n)[None, :] >= lengths[:, None]
    assert after.any() and np.all(tokens[after] == pi.eos_ids[0]) and np.all(logp[after] == 0.0)
    assert np.all(np.isfinite(logp))
    # P(length = 1) = 0.3: within 4.5 binomial standard errors.
    assert abs(np.mean(lengths == 1) - 0.3) < 4.5 * np.sqrt(0.3 * 0.7 / 4096)
    assert np.array_equal(np.asarray(trajectory_lengths(tokens, ())), np.full(4096, pi.n))


def test_estimators_apply_unchanged_to_stopping_pairs():
    """Algorithm 1 at exact logits on a stopping pair: within 4 standard errors of the
    variable-length TV."""
    pi, mu = tvjax.core.instances.stopping_tabular_pair(seed=2, vocab_size=4, n=5)
    est = tvjax.estimate_tv(jax.random.key(0), pi, mu, "exact", eps=0.02, delta=0.05)
    assert abs(float(est.value) - exact_tv(pi, mu)) < 4 * float(est.stderr)


def test_estimators_spend_queries_on_real_positions_of_stopping_pairs():
    """Every estimator on a stopping pair reports the queries of the positions it drew: about the
    mean length (from the tokens) in place of n, and exactly n on a fixed-length pair."""
    from tvjax.core.currency import trajectory_lengths
    from tvjax.core.estimators import REGISTRY
    from tvjax.core.schedules import Level, Samples, Schedule

    pi, mu = tvjax.core.instances.stopping_tabular_pair(seed=2, vocab_size=4, n=6, stop_prob=(0.3, 0.3))
    tokens = np.asarray(pi.sample(jax.random.key(9), 20000))
    mean_length = float(np.mean(np.asarray(trajectory_lengths(tokens, pi.eos_ids))))
    assert 2.0 < mean_length < 4.0  # stop probability 0.3 per step: far below n = 6
    num = 4000
    sizes = {"likelihood_ratio": Samples(num, 2), "plugin": Level(num // 2, 2), "multilevel": Schedule((num // 2,), (2,))}
    for name, size in sizes.items():
        est = REGISTRY[name].fn(jax.random.key(1), pi, mu, tvjax.Noisy(0.01), size)
        fixed = REGISTRY[name].queries(size, pi.n)
        share = float(est.queries) / fixed
        # the mean length of 4000 trajectories, within 5 of its standard errors (length sd < 2)
        assert abs(share - mean_length / pi.n) < 5 * 2.0 / np.sqrt(num) / pi.n, name
    flat, _ = tvjax.core.instances.random_tabular_pair(3, vocab_size=4, n=6)
    est = REGISTRY["plugin"].fn(jax.random.key(1), flat, flat, tvjax.Exact(), Level(1000))
    assert float(est.queries) == REGISTRY["plugin"].queries(Level(1000), 6)


def test_estimators_refuse_sides_that_stop_differently():
    pi, _ = tvjax.core.instances.stopping_tabular_pair(seed=2, vocab_size=4, n=6)
    flat, _ = tvjax.core.instances.random_tabular_pair(2, vocab_size=4, n=6)
    with pytest.raises(ValueError, match="stop at different EOS ids"):
        tvjax.estimate_tv(jax.random.key(0), pi, flat, "exact", eps=0.1, delta=0.1)
