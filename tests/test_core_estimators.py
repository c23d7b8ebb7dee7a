"""Estimators against ground truth (|estimate - truth| < 4 stderr on fixed seeds), oracles' laws,
query accounting, jit/vmap on the public functions, and bad input."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tvjax
from tvjax.core import estimators as E
from tvjax.core.currency import likelihood_ratio_term, mixture_z
from tvjax.core.estimators.paper import _multilevel_program, _one_sided_program
from tvjax.core.instances import exact_tv, paper_block_pair, random_tabular_pair, rare_escape_pair
from tvjax.core.oracles import Exact, LogitNoise, Noisy, Sampler
from tvjax.core.schedules import Level, Samples, Schedule, groups_for_confidence, pad_schedule, paper_schedule

KEY = jax.random.PRNGKey(2026)

FAMILIES = {
    "block": lambda: paper_block_pair(),
    # Q puts mass on an outcome P never produces: trajectories outside pi's support.
    "rare_escape_mismatch": lambda: rare_escape_pair([0.5, 0.3, 0.2, 0.0], [0.2, 0.3, 0.1, 0.4], n=16),
    # top-k 2 vs 3: the serving-style truncation change, support mismatch at every step.
    "tabular_top_k": lambda: random_tabular_pair(seed=4, vocab_size=4, n=6, context_len=2, top_k=(2, 3)),
}


@functools.lru_cache(maxsize=None)
def family(name):
    pi, mu = FAMILIES[name]()
    return pi, mu, exact_tv(pi, mu)


def assert_near_truth(result, truth, extra=0.0):
    value, stderr = float(result.value), float(result.stderr)
    assert stderr > 0
    assert abs(value - truth) < 4 * stderr + extra, f"{value:.5f} vs truth {truth:.5f} (stderr {stderr:.5f})"


# --------------------------------------------------------------------------- currency


def test_mixture_z_handles_zero_mass_explicitly():
    neg = -jnp.inf
    z = mixture_z(jnp.array([0.0, neg, -1.0, neg, -2.0]), jnp.array([neg, 0.0, neg, neg, -2.0]))
    np.testing.assert_array_equal(np.asarray(z), [1.0, 1.0, 1.0, 1.0, 0.0])
    assert float(mixture_z(jnp.log(0.75), jnp.log(0.25))) == pytest.approx(0.5)


def test_likelihood_ratio_term_edges():
    neg = -jnp.inf
    r = likelihood_ratio_term(jnp.array([-1.0, neg, jnp.log(0.5), jnp.log(0.2)]),
                              jnp.array([neg, -1.0, jnp.log(0.25), jnp.log(0.4)]))
    np.testing.assert_allclose(np.asarray(r), [1.0, 0.0, 0.5, 0.0], atol=1e-7)
    assert not np.any(np.isnan(np.asarray(r)))


# --------------------------------------------------------------------------- exact access


@pytest.mark.parametrize("name", list(FAMILIES))
def test_likelihood_ratio_and_mixture_hit_truth(name):
    pi, mu, truth = family(name)
    assert_near_truth(E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(6000)), truth)
    assert_near_truth(E.plugin(KEY, pi, mu, Exact(), Level(3000)), truth)


def test_query_accounting():
    pi, mu, _ = family("block")
    assert float(E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(100)).queries) == 100 * (128 + 2 * 128)
    plug = E.plugin(KEY, pi, mu, Noisy(0.1), Level(50, 8))
    assert float(plug.queries) == 2 * 50 * (128 + 2 * 128 * 8)
    ml = E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((40, 10), (2, 8)))
    assert float(ml.queries) == 2 * 40 * (128 + 256 * 2) + 2 * 10 * (128 + 256 * 8)
    np.testing.assert_array_equal(np.asarray(ml.levels.repeats), [2, 8])
    np.testing.assert_array_equal(np.asarray(ml.levels.num_samples), [80, 20])


# --------------------------------------------------------------------------- noisy access


@pytest.mark.parametrize("name", ["rare_escape_mismatch", "tabular_top_k"])
def test_plugin_hits_truth_at_large_r(name):
    pi, mu, truth = family(name)
    assert_near_truth(E.plugin(KEY, pi, mu, Noisy(0.1), Level(3000, 4096)), truth)


@pytest.mark.parametrize("name", ["block", "rare_escape_mismatch", "tabular_top_k"])
def test_multilevel_hits_truth(name):
    pi, mu, truth = family(name)
    schedule = Schedule((3000, 800, 200, 60), (64, 512, 4096, 32768))
    assert_near_truth(E.multilevel(KEY, pi, mu, Noisy(0.2), schedule), truth)


def test_multilevel_increment_variance_decays_at_small_sigma():
    pi, mu, _ = family("block")
    result = E.multilevel(KEY, pi, mu, Noisy(0.04), Schedule((4096, 4096, 4096, 4096), (1, 8, 32, 256)))
    var = np.asarray(result.levels.variance)
    assert var[1] > var[2] > var[3] > 0
    assert var[1] < 0.1 * var[0]


def test_median_of_means_groups():
    pi, mu, truth = family("rare_escape_mismatch")
    assert groups_for_confidence(0.1) == 19
    result = E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((800, 200), (256, 4096)), num_groups=5)
    assert float(result.levels.num_samples[0]) == 5 * 1600
    assert_near_truth(result, truth)


def test_noisy_oracle_draws_are_unbiased_with_relative_variance():
    pi, _, _ = family("block")
    tokens = pi.sample(KEY, 512)
    sigma = 0.3
    draws = np.asarray(Noisy(sigma).draw_probs(KEY, pi, tokens, 400))
    p = np.exp(np.asarray(pi.path_logprobs(tokens)))[..., None]
    noisy = np.broadcast_to((p > 0) & (p < 1), draws.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        standardized = ((draws - p) / (sigma * np.sqrt(p * (1 - p))))[noisy]
    assert abs(standardized.mean()) < 4 / math.sqrt(standardized.size)
    assert standardized.var() == pytest.approx(1.0, abs=0.02)
    # deterministic transitions stay deterministic
    np.testing.assert_array_equal(draws[~noisy], np.broadcast_to(p, draws.shape)[~noisy])


@pytest.mark.slow
def test_nested_draws_match_explicit_averages():
    """The directly drawn r-average has the law of averaging r explicit draws."""
    pi, _ = rare_escape_pair([0.5, 0.5], [0.5, 0.5], n=2, escape_scale=1.0)
    tokens = jnp.zeros((20000, 2), jnp.int32)  # p = 1 - q = 0.5 at both positions
    for oracle in (Noisy(0.5), Sampler()):
        direct = np.asarray(oracle.nested_path_logprobs(KEY, (pi,), tokens, (4, 16))[0])
        draws = np.asarray(oracle.draw_probs(jax.random.PRNGKey(7), pi, tokens, 16))
        for column, r in enumerate((4, 16)):
            explicit = np.sum(np.log(np.clip(draws[..., :r].mean(-1), oracle.floor, 1)), -1)
            # Distribution functions, not moments (a clipped zero average, log 1e-12, is a rare,
            # huge outlier) nor quantiles (the sampler's averages are discrete: a quantile can sit
            # on an atom's edge). At each threshold the two empirical CDFs of 20000 independent
            # values agree within 4 standard errors of their difference.
            thresholds = np.unique(np.percentile(explicit, [10, 25, 50, 75, 90])) + 1e-6
            cdf_direct = np.mean(direct[:, column, None] <= thresholds, axis=0)
            cdf_explicit = np.mean(explicit[:, None] <= thresholds, axis=0)
            se = np.sqrt(2 * cdf_explicit * (1 - cdf_explicit) / len(explicit))
            np.testing.assert_array_less(np.abs(cdf_direct - cdf_explicit), 4 * se + 1e-9)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Unhinted:
    """A process with its `stochastic_positions` hidden: oracles then draw at every position."""

    inner: object

    n = property(lambda self: self.inner.n)
    vocab_size = property(lambda self: self.inner.vocab_size)

    def sample(self, key, num):
        return self.inner.sample(key, num)

    def path_logprobs(self, tokens):
        return self.inner.path_logprobs(tokens)


def test_block_instance_is_deterministic_outside_its_stochastic_positions():
    pi, mu, _ = family("block")
    off_path = jax.random.bernoulli(KEY, 0.5, (500, pi.n)).astype(jnp.int32)
    tokens = jnp.concatenate([pi.sample(KEY, 500), mu.sample(KEY, 500), off_path])
    fixed = np.setdiff1d(np.arange(pi.n), pi.stochastic_positions)
    for process in (pi, mu):
        logp = np.asarray(process.path_logprobs(tokens))[:, fixed]
        assert np.all((logp == 0) | np.isneginf(logp))
        assert np.isneginf(logp).any() and (logp == 0).all(axis=1).any()


def bootstrap_quantile_se(x, levels, rng, resamples=40):
    picks = rng.integers(0, len(x), (resamples, len(x)))
    return np.std([np.percentile(x[i], levels) for i in picks], axis=0)


@pytest.mark.slow
@pytest.mark.parametrize("oracle", [Noisy(0.5), Sampler()], ids=["noisy", "sampler"])
def test_skipping_deterministic_positions_keeps_the_law_of_the_averages(oracle):
    """Drawing only at the declared stochastic positions gives path log-probs of the same law as
    drawing everywhere (quantiles within 4 bootstrap standard errors)."""
    pi, mu, _ = family("block")
    tokens = jnp.concatenate([pi.sample(KEY, 2000), mu.sample(jax.random.PRNGKey(3), 2000)])
    levels = [10, 25, 50, 75, 90]
    rng = np.random.default_rng(0)
    for model in (pi, mu):
        hinted = np.asarray(oracle.nested_path_logprobs(jax.random.PRNGKey(5), (model,), tokens, (2, 16))[0])
        everywhere = np.asarray(oracle.nested_path_logprobs(jax.random.PRNGKey(6), (Unhinted(model),), tokens, (2, 16))[0])
        for column in range(2):
            a, b = hinted[:, column], everywhere[:, column]
            se = np.hypot(bootstrap_quantile_se(a, levels, rng), bootstrap_quantile_se(b, levels, rng))
            np.testing.assert_array_less(np.abs(np.percentile(a, levels) - np.percentile(b, levels)), 4 * se + 1e-6)


def test_draw_distributions_marginals():
    pi, _, _ = family("tabular_top_k")
    tokens = pi.sample(KEY, 256)
    for oracle in (Noisy(0.2), Sampler(), LogitNoise(0.3), Exact()):
        dists = np.asarray(oracle.draw_distributions(KEY, pi, tokens, 64))
        assert dists.shape == (256, 6, 64, 4)
        np.testing.assert_allclose(dists.sum(-1), 1.0, atol=1e-5)
        # tokens outside pi's top-k keep zero mass under every oracle
        support = np.exp(np.asarray(pi.next_token_logprobs(tokens))) > 0
        assert np.all(dists[~np.broadcast_to(support[:, :, None, :], dists.shape)] == 0)


# --------------------------------------------------------------------------- sample-only access


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rare_escape_mismatch", "tabular_top_k"])
def test_sample_only_converges(name):
    pi, mu, truth = family(name)
    coarse = E.plugin(KEY, pi, mu, Sampler(), Level(3000, 4))
    result = E.multilevel(KEY, pi, mu, Sampler(), Schedule((2000, 400, 100), (1024, 16384, 262144)))
    assert abs(float(result.value) - truth) < abs(float(coarse.value) - truth)
    assert_near_truth(result, truth)


# --------------------------------------------------------------------------- logit noise


def test_logit_noise_self_distance_falls_with_r():
    pi, _, _ = family("tabular_top_k")
    values = [float(E.plugin(KEY, pi, pi, LogitNoise(0.5), Level(500, r)).value) for r in (1, 16, 256)]
    assert values[0] > 2 * values[1] > 4 * values[2] > 0


# --------------------------------------------------------------------------- baselines


def test_kl_baselines_report_infinity_under_support_mismatch():
    pi, mu, _ = family("tabular_top_k")
    for baseline in (E.plugin_kl, E.k3_pinsker):
        result = baseline(KEY, mu, pi, Exact(), Samples(2000))  # mu (top-3) samples tokens pi (top-2) never does
        assert float(result.kl) == np.inf
        assert float(result.value) == 1.0
        assert not np.isnan(float(result.stderr))


def test_kl_baselines_estimate_kl_without_mismatch():
    pi, mu = random_tabular_pair(seed=5, vocab_size=3, n=4, context_len=1, logit_noise=0.5)
    tokens = jnp.asarray(np.array(np.meshgrid(*[np.arange(3)] * 4, indexing="ij")).reshape(4, -1).T)
    lp, lm = (np.asarray(jnp.sum(p.path_logprobs(tokens), 1), np.float64) for p in (pi, mu))
    kl = float(np.sum(np.exp(lp) * (lp - lm)))
    for baseline in (E.plugin_kl, E.k3_pinsker):
        result = baseline(KEY, pi, mu, Exact(), Samples(20000))
        assert abs(float(result.kl) - kl) < 4 * float(result.kl_stderr)
        assert float(result.value) == pytest.approx(min(1.0, math.sqrt(float(result.kl) / 2)), rel=1e-5)


def test_naive_noisy_plugin_is_biased_where_the_paper_estimators_are_not():
    pi, mu, truth = family("block")
    naive = E.likelihood_ratio(KEY, pi, mu, Noisy(0.5), Samples(4000))
    assert float(naive.value) - truth > 4 * float(naive.stderr)


# --------------------------------------------------------------------------- front door


def test_estimate_tv_exact_and_noisy():
    pi, mu, truth = family("block")
    exact = tvjax.estimate_tv(KEY, pi, mu, access="exact", eps=0.05, delta=0.1)
    assert float(exact.ci_low) < float(exact.value) < float(exact.ci_high)
    assert abs(float(exact.value) - truth) < min(0.05, 4 * float(exact.stderr))
    assert float(exact.queries) == math.ceil(math.log(20) / (2 * 0.05**2)) * 3 * 128
    noisy = tvjax.estimate_tv(KEY, *FAMILIES["rare_escape_mismatch"](), access="noisy", eps=0.1, delta=0.2, sigma=0.2)
    assert abs(float(noisy.value) - family("rare_escape_mismatch")[2]) < 0.1


def test_interval_includes_the_extrapolated_top_level_bias():
    from tvjax.core.api import confidence_interval, top_level_bias

    levels = E.LevelStats(jnp.array([8, 32]), jnp.array([100.0, 50.0]), jnp.array([0.3, -0.01]), jnp.array([0.2, 0.01]),
                          jnp.array([1.0, 1.0]))
    assert float(top_level_bias(levels)) == pytest.approx(0.01 / (2 - 1))
    est = E.Estimate(jnp.array(0.29), jnp.array(0.02), jnp.array(2.0), levels)
    ci = confidence_interval(est, 0.1)
    z = 1.6448536269514722
    assert float(ci.ci_high - ci.value) == pytest.approx(z * 0.02 + 0.01, rel=1e-5)
    single = E.Estimate(jnp.array(0.29), jnp.array(0.02), jnp.array(1.0), E.LevelStats(*(a[:1] for a in levels)))
    assert float(confidence_interval(single, 0.1).bias) == 0.0


def test_estimate_tv_sampler_on_small_instance():
    pi, mu, truth = family("tabular_top_k")
    result = tvjax.estimate_tv(KEY, pi, mu, access="sampler", eps=0.1, delta=0.2)
    assert abs(float(result.value) - truth) < 0.1
    assert 0.0 <= float(result.ci_low) <= float(result.value) <= float(result.ci_high) <= 1.0


def test_paper_schedule_shape():
    schedule = paper_schedule(eps=0.1, sigma=0.5, n=128)
    top = math.ceil(2 * math.log2(10))
    assert schedule.repeats == tuple(1 + math.ceil(128 * 0.25 * 2**l) for l in range(top + 1))
    assert schedule.num_samples[0] == math.ceil((top + 1) / 0.01)
    assert paper_schedule(eps=0.1, sigma=0.0, n=128).repeats == (1,)


# --------------------------------------------------------------------------- jit and vmap


@pytest.mark.slow
def test_every_estimator_jits_and_vmaps_over_keys():
    pi, mu, _ = family("tabular_top_k")
    keys = jax.random.split(KEY, 3)
    calls = {
        "likelihood_ratio": lambda k: E.likelihood_ratio(k, pi, mu, Exact(), Samples(64)),
        "plugin_exact": lambda k: E.plugin(k, pi, mu, Exact(), Level(32)),
        "plugin": lambda k: E.plugin(k, pi, mu, Noisy(0.1), Level(32, 4)),
        "multilevel": lambda k: E.multilevel(k, pi, mu, Noisy(0.1), Schedule((32, 8), (2, 8)), num_groups=3),
        "multilevel_sampler": lambda k: E.multilevel(k, pi, mu, Sampler(), Schedule((32, 8), (4, 16))),
        "plugin_kl": lambda k: E.plugin_kl(k, pi, mu, Exact(), Samples(32)),
        "k3_pinsker": lambda k: E.k3_pinsker(k, pi, mu, Exact(), Samples(32)),
        "likelihood_ratio_noisy": lambda k: E.likelihood_ratio(k, pi, mu, Noisy(0.1), Samples(32)),
        "estimate_tv": lambda k: tvjax.estimate_tv(k, pi, mu, "noisy", eps=0.5, delta=0.5, sigma=0.1),
        "logit_noise": lambda k: E.plugin(k, pi, mu, LogitNoise(0.1), Level(16, 3)),
    }
    for name, call in calls.items():
        batched = jax.jit(jax.vmap(call))(keys)
        single = call(keys[1])
        assert batched.value.shape == (3,), name
        np.testing.assert_allclose(float(batched.value[1]), float(single.value), rtol=1e-4, atol=1e-6, err_msg=name)


def test_oracle_parameters_are_traceable():
    pi, mu, _ = family("rare_escape_mismatch")
    sigmas = jnp.array([0.0, 0.1, 0.4])
    values = jax.vmap(lambda s: E.plugin(KEY, pi, mu, Noisy(s), Level(64, 2)).value)(sigmas)
    assert values.shape == (3,) and np.all(np.isfinite(np.asarray(values)))


# --------------------------------------------------------------------------- one program per estimator


def test_sizes_are_runtime_values_so_a_sweep_compiles_once():
    pi, mu, _ = family("block")
    before = _multilevel_program.top()._cache_size(), _one_sided_program.top()._cache_size()
    for scale in (1, 2, 3):
        E.multilevel(KEY, pi, mu, Noisy(0.3), Schedule((64 * scale, 16 * scale), (2, 8)), chunk=64)
        E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(100 * scale), chunk=64)
    after = _multilevel_program.top()._cache_size(), _one_sided_program.top()._cache_size()
    assert after[0] - before[0] <= 1 and after[1] - before[1] <= 1


def test_traced_sizes_give_the_numbers_of_concrete_ones():
    pi, mu, _ = family("tabular_top_k")
    concrete = E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(300), chunk=64)
    traced = jax.jit(lambda n: E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(n), chunk=64))(300)
    np.testing.assert_allclose(float(traced.value), float(concrete.value), rtol=1e-6)
    schedule = Schedule((96, 24), (2, 8))
    concrete = E.multilevel(KEY, pi, mu, Sampler(), schedule, chunk=64)
    traced = jax.jit(lambda c, r: E.multilevel(KEY, pi, mu, Sampler(), Schedule(c, r), chunk=64))(
        jnp.asarray(schedule.num_samples), jnp.asarray(schedule.repeats))
    np.testing.assert_allclose(float(traced.value), float(concrete.value), rtol=1e-6)


def test_padding_levels_change_nothing_but_the_shape():
    pi, mu, _ = family("block")
    schedule = Schedule((80, 20, 5), (2, 8, 32))
    plain = E.multilevel(KEY, pi, mu, Noisy(0.3), schedule, chunk=64)
    padded = E.multilevel(KEY, pi, mu, Noisy(0.3), pad_schedule(schedule, 6), chunk=64)
    np.testing.assert_allclose([float(padded.value), float(padded.stderr), float(padded.queries)],
                               [float(plain.value), float(plain.stderr), float(plain.queries)], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(padded.levels.num_samples), [160, 40, 10, 0, 0, 0])
    with pytest.raises(ValueError, match="trailing padding"):
        E.multilevel(KEY, pi, mu, Noisy(0.3), Schedule((80, 0, 5), (2, 8, 32)))
    with pytest.raises(ValueError, match="padding levels"):
        E.multilevel(KEY, pi, mu, Noisy(0.3), Schedule((80, 20, 0), (2, 8, 64)))
    with pytest.raises(ValueError, match="cannot pad"):
        pad_schedule(schedule, 2)


def test_padding_levels_take_no_place_in_the_stream():
    # 48 one-row copies of a one-level schedule, padded to 3 levels: 96 of the 144 groups are
    # empty. A chunk reaches up to 32 non-empty groups; were the empty ones part of the stream, it
    # would reach 11 copies rather than 32, and its rows (and random draws) would fall elsewhere.
    pi, mu, _ = family("block")
    counts = np.ones((48, 1), np.int32)
    plain = E.multilevel(KEY, pi, mu, Noisy(0.3), Schedule(counts, (8,)), copies=48, chunk=64)
    padded = E.multilevel(KEY, pi, mu, Noisy(0.3), Schedule(np.pad(counts, ((0, 0), (0, 2))), (8, 8, 8)),
                          copies=48, chunk=64)
    np.testing.assert_allclose(np.asarray(padded.value), np.asarray(plain.value), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(padded.levels.num_samples)[:, 1:], 0)


# --------------------------------------------------------------------------- copies: many estimates, one stream


@pytest.mark.parametrize("name", ["block", "tabular_top_k"])
def test_copies_are_independent_estimates_with_their_stated_spread(name):
    pi, mu, truth = family(name)
    copies = 400
    result = E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(64), copies=copies)
    values, stderrs = np.asarray(result.value, np.float64), np.asarray(result.stderr, np.float64)
    assert values.shape == stderrs.shape == (copies,)
    # Their mean is unbiased: within 4 standard errors of the mean of copies.
    assert abs(values.mean() - truth) < 4 * values.std(ddof=1) / math.sqrt(copies)
    # Each copy's stderr describes the spread between copies: the sample sd of 400 values has a
    # relative standard error of about 1 / sqrt(2 * 399) (3.5%), plus that of the mean stderr.
    assert abs(values.std(ddof=1) / stderrs.mean() - 1) < 4 * 0.036
    # Neighbouring copies share chunks but not rows: uncorrelated within 4 / sqrt(copies).
    assert abs(np.corrcoef(values[:-1], values[1:])[0, 1]) < 4 / math.sqrt(copies)


def test_copies_smaller_than_a_window_of_groups_share_chunks():
    # 300 copies of 2 trajectories: a 64-row chunk spans more groups than one step may reduce
    # (WINDOW), so steps stop at the window; every copy still gets exactly its rows.
    pi, mu, truth = family("block")
    result = E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((2, 1), (2, 8)), copies=300, chunk=64)
    np.testing.assert_array_equal(np.asarray(result.levels.num_samples), np.tile([4.0, 2.0], (300, 1)))
    values = np.asarray(result.value, np.float64)
    assert np.all(np.isfinite(values)) and np.all(np.abs(values) <= 2)
    assert abs(values.mean() - truth) < 4 * values.std(ddof=1) / math.sqrt(300) + 0.05  # + r = 8 plug-in bias


def test_per_copy_sizes_and_empty_copies():
    pi, mu, _ = family("block")
    counts = np.array([[64, 16], [32, 8], [0, 0]], np.int32)
    run = jax.jit(lambda c: E.multilevel(KEY, pi, mu, Noisy(0.2), Schedule(c, (2, 8)), copies=3))
    result = run(counts)
    np.testing.assert_array_equal(np.asarray(result.levels.num_samples), 2 * counts)
    expected = [sum(2 * 128 * c * (1 + 2 * r) for c, r in zip(row, (2, 8))) for row in counts]
    np.testing.assert_allclose(np.asarray(result.queries), expected)
    # A traced empty copy (a padded repetition) costs nothing and estimates nothing.
    assert float(result.value[2]) == 0.0 and float(result.stderr[2]) == 0.0
    with pytest.raises(ValueError, match="trailing padding"):
        E.multilevel(KEY, pi, mu, Noisy(0.2), Schedule(counts, (2, 8)), copies=3)
    with pytest.raises(ValueError, match="entries for 4 copies"):
        E.multilevel(KEY, pi, mu, Noisy(0.2), Schedule(counts[:2], (2, 8)), copies=4)
    with pytest.raises(ValueError, match="pass copies=2"):
        E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(np.array([64, 32])))


def test_copies_keep_support_mismatch_and_median_of_means_per_copy():
    pi, mu, _ = family("tabular_top_k")
    kl = E.plugin_kl(KEY, mu, pi, Exact(), Samples(200), copies=5)  # mu (top-3) samples what pi never does
    assert np.all(np.isinf(np.asarray(kl.kl))) and np.all(np.asarray(kl.value) == 1.0)
    grouped = E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((64, 16), (2, 8)), num_groups=3, copies=4)
    assert grouped.value.shape == (4,) and grouped.levels.mean.shape == (4, 2)
    np.testing.assert_array_equal(np.asarray(grouped.levels.num_samples), np.tile([3 * 128.0, 3 * 32.0], (4, 1)))


# --------------------------------------------------------------------------- bad input


def test_bad_estimator_inputs_raise():
    pi, mu, _ = family("block")
    with pytest.raises(ValueError, match="sigma"):
        Noisy(-0.1)
    with pytest.raises(ValueError, match="scale"):
        LogitNoise(-1.0)
    with pytest.raises(ValueError, match="r"):
        E.plugin(KEY, pi, mu, Noisy(0.1), Level(8, 0))
    with pytest.raises(ValueError, match="strictly increasing"):
        E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((8, 8), (8, 8)))
    with pytest.raises(ValueError, match="strictly increasing"):
        E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((8, 8), (16, 4)))
    with pytest.raises(ValueError, match="level sizes"):
        E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((8,), (1, 4)))
    for eps in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="eps"):
            tvjax.estimate_tv(KEY, pi, mu, eps=eps)
    for delta in (0.0, 1.5):
        with pytest.raises(ValueError, match="delta"):
            tvjax.estimate_tv(KEY, pi, mu, delta=delta)
    with pytest.raises(ValueError, match="sigma"):
        tvjax.estimate_tv(KEY, pi, mu, access="noisy")
    with pytest.raises(ValueError, match="unknown access"):
        tvjax.estimate_tv(KEY, pi, mu, access="telepathy")
    with pytest.raises(ValueError, match="Samples.num"):
        E.likelihood_ratio(KEY, pi, mu, Exact(), Samples(1))
    # Sizes past what the int32 counters hold: the same clear error, not numpy's OverflowError.
    for sizes in (Samples(10**12), Samples(4096.0 * 2**32)):
        with pytest.raises(ValueError, match="at most 2147483647"):
            E.likelihood_ratio(KEY, pi, mu, Exact(), sizes)
    with pytest.raises(ValueError, match="at most 2147483647"):
        E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((2**40, 8), (1, 4)))
    # Each estimator says which sizes it takes.
    with pytest.raises(TypeError, match="Samples"):
        E.likelihood_ratio(KEY, pi, mu, Exact(), 4096)
    with pytest.raises(TypeError, match="Schedule"):
        E.multilevel(KEY, pi, mu, Noisy(0.1), Level(8, 4))
    with pytest.raises(TypeError, match="Level"):
        E.plugin(KEY, pi, mu, Noisy(0.1), Samples(8))


# --------------------------------------------------------------------------- the registry and the cost model


REGISTRY_SIZES = {
    "likelihood_ratio": Samples(40, 3),
    "plugin": Level(30, 4),
    "multilevel": Schedule((40, 10), (2, 8)),
    "plugin_kl": Samples(40),
    "k3_pinsker": Samples(40, 2),
}


@pytest.mark.slow
def test_every_registered_estimator_spends_what_the_cost_model_says():
    pi, mu, _ = family("block")
    assert set(REGISTRY_SIZES) == set(E.REGISTRY)
    for name, spec in E.REGISTRY.items():
        sizes = REGISTRY_SIZES[name]
        result = spec.fn(KEY, pi, mu, Noisy(0.1), sizes)
        assert float(result.queries) == spec.queries(sizes, pi.n), name
        assert float(result.queries) == float(np.sum(result.levels.queries)), name
        copies = spec.fn(KEY, pi, mu, Noisy(0.1), sizes, copies=2)
        np.testing.assert_array_equal(np.asarray(copies.queries), [spec.queries(sizes, pi.n)] * 2, err_msg=name)
    # The hand count of the design: a trajectory costs n to sample and n r per model to score.
    assert E.REGISTRY["plugin"].queries(Level(30, 4), 128) == 2 * 30 * (128 + 2 * 128 * 4)
    with pytest.raises(TypeError, match="Schedule"):
        E.REGISTRY["multilevel"].queries(Samples(4), 128)


def test_registry_lookup_and_configured_estimators():
    pi, mu, _ = family("tabular_top_k")
    with pytest.raises(ValueError, match="unknown estimator 'mixture'"):
        E.lookup("mixture")
    est = E.configured("multilevel", {"num_samples": [32, 8], "repeats": [2, 8]}, num_groups=3)
    assert est.sizes == Schedule((32, 8), (2, 8)) and est.options == {"num_groups": 3}
    direct = E.multilevel(KEY, pi, mu, Noisy(0.1), Schedule((32, 8), (2, 8)), num_groups=3)
    assert float(est(KEY, pi, mu, Noisy(0.1)).value) == float(direct.value)
    assert est.queries(pi.n) == float(direct.queries)
    with pytest.raises(ValueError, match="takes sizes Samples"):
        E.configured("likelihood_ratio", {"num_per_side": 8})
    with pytest.raises(ValueError, match="takes options"):
        E.configured("plugin", {"num_per_side": 8}, num_groups=3)


@pytest.mark.parametrize("rows", [64, 100, 2048, 16384])
def test_range_moments_match_float64_and_keep_non_finite_values_in_their_range(rows):
    """The streaming reduction's per-group moments (blocks inside a range by their own moments,
    partly covered blocks by masks) against a float64 reference per range: ranges that start and
    end inside a block, span several, cover whole blocks or are empty; rows outside every range
    hold inf and must not be read. A valid inf (a KL baseline under support mismatch) stays in
    its own range instead of turning every range's moments into NaN."""
    from tvjax.core.streaming import range_moments

    rng = np.random.default_rng(rows)
    moments = jax.jit(range_moments)
    for _ in range(5):
        cuts = np.sort(rng.integers(0, rows + 1, 2 * 20))
        lo, hi = cuts[0::2].astype(np.int32), cuts[1::2].astype(np.int32)
        lo[3], hi[3] = lo[4], lo[4]  # an empty range
        values = np.full(rows, np.inf, np.float32)  # rows between ranges may hold anything
        for j, (a, b) in enumerate(zip(lo, hi)):
            values[a:b] = rng.normal(size=b - a) * 0.1 + 0.3 * j + 5.0
        count, mean, m2 = (np.asarray(a, np.float64) for a in moments(values, lo, hi))
        for j, (a, b) in enumerate(zip(lo, hi)):
            kept = values[a:b].astype(np.float64)
            assert count[j] == kept.size
            if kept.size:
                assert mean[j] == pytest.approx(kept.mean(), rel=1e-6, abs=1e-6)
                assert m2[j] == pytest.approx(np.sum((kept - kept.mean()) ** 2), rel=1e-4, abs=1e-6)
            else:
                assert mean[j] == 0.0 and m2[j] == 0.0
    wide = int(np.argmax(hi - lo))
    values[(lo[wide] + hi[wide]) // 2] = np.inf
    _, mean_inf, _ = (np.asarray(a) for a in moments(values, lo, hi))
    assert mean_inf[wide] == np.inf
    np.testing.assert_allclose(np.delete(mean_inf, wide), np.delete(mean, wide), rtol=1e-6, atol=1e-6)
