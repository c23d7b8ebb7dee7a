"""Instances and their ground truth: exact values, enumeration against brute force, sampling laws."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tvjax
from tvjax.instances import (
    TabularProcess,
    block_pair,
    enumerate_tv,
    exact_tv,
    paper_block_pair,
    random_tabular_pair,
    rare_escape_pair,
    tabular_logits,
)


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


def test_next_token_logprobs_consistent_with_path():
    for pi, _ in (paper_block_pair(), random_tabular_pair(seed=0, top_k=(2, 3)), rare_escape_pair([0.5, 0.5], [0.9, 0.1], 9)):
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
        tvjax.estimators.likelihood_ratio(jax.random.PRNGKey(0), a, b, tvjax.Exact(), tvjax.Samples(16))


def test_rare_escape_uniform_pair_has_the_stated_tv():
    pi, mu = tvjax.rare_escape_uniform_pair(K=4, n=8, tv_outcomes=0.3, escape_scale=2.0)
    q = 2.0 / 8
    assert exact_tv(pi, mu) == pytest.approx((1 - (1 - q) ** 8) * 0.3, rel=1e-12)
    assert enumerate_tv(pi, mu) == pytest.approx(exact_tv(pi, mu), abs=1e-6)
    assert pi.max_support == pi.vocab_size == 5
    for bad in ({"K": 3}, {"K": 0}, {"tv_outcomes": 0.6}):
        with pytest.raises(ValueError):
            tvjax.rare_escape_uniform_pair(**bad)
