"""Pool analyses against known truth: synthetic pools written from core instances and oracles,
and hand-made draws whose statistics are exact."""

import json

import jax
import numpy as np
import pytest

from tvjax import Exact, Noisy, Sampler, block_pair, exact_tv, random_tabular_pair
from tvjax.core.jsonable import to_jsonable
from tvjax.pools.analysis import (
    Hygiene,
    calibrate_sigma,
    compare_scorers,
    evaluate_multilevel,
    support_union,
    tv_by_prefix,
    tv_by_repeats,
    tv_estimate,
    zero_mass_rates,
)
from tvjax.pools.analysis.__main__ import main as analysis_main
from tvjax.pools.report import main as report_main
from tvjax.pools.store import PoolWriter, create_pool, load_pool
from tvjax.pools.synthetic import write_synthetic_pool

SIGMA = 0.1
FEW = Hygiene(num_permutations=4)


@pytest.fixture(scope="module")
def block_pool(tmp_path_factory):
    """Binary block instance scored by Noisy(SIGMA) with a top-2 readout: sigma is known exactly."""
    pi, mu = block_pair(seed=10, n=64, block_bits=8, alpha=0.3)
    path = tmp_path_factory.mktemp("pools") / "block"
    write_synthetic_pool(jax.random.key(0), path, pi, mu, Noisy(SIGMA), num_per_side=1024, repeats=16, top_k=2,
                         metadata={"exact_tv": exact_tv(pi, mu)})
    return path


@pytest.fixture(scope="module")
def tabular_pool(tmp_path_factory):
    """Random tabular pair with top-k truncation (support mismatch), exact scoring, TV by enumeration."""
    pi, mu = random_tabular_pair(3, vocab_size=4, n=6, top_k=(2, 3))
    path = tmp_path_factory.mktemp("pools") / "tabular"
    write_synthetic_pool(jax.random.key(1), path, pi, mu, Exact(), num_per_side=2000, repeats=2)
    return path, exact_tv(pi, mu)


def multilevel_pool(path, sigma):
    pi, mu = block_pair(seed=10, n=128, block_bits=12, alpha=0.3)
    oracle = Noisy(sigma) if sigma else Exact()
    write_synthetic_pool(jax.random.key(2), path, pi, mu, oracle, num_per_side=512, repeats=32)
    return load_pool(path)


def test_symmetric_estimate_within_four_stderr_and_decomposition_sums(tabular_pool):
    path, truth = tabular_pool
    res = tv_estimate(load_pool(path))
    assert abs(res.value - truth) < 4 * res.stderr
    assert res.mismatch > 0.05 and res.shared > 0.05  # both parts present on a top-k truncated pair
    assert res.shared + res.mismatch == pytest.approx(res.value, abs=1e-12)
    assert (res.arm_pi + res.arm_mu) / 2 == pytest.approx(res.value, abs=1e-12)
    assert res.ci_low < res.value < res.ci_high
    assert res.ci_high - res.ci_low == pytest.approx(2 * 1.96 * res.stderr, rel=0.15)
    for lr in (res.lr_pi, res.lr_mu):  # Algorithm 1 arms are each unbiased for TV under exact scoring
        assert abs(lr - truth) < 0.05
    assert res.queries == 2000 * 2 * (6 + 2 * 6 * 2)


def test_prefix_curve_ends_at_the_estimate(tabular_pool):
    pool = load_pool(tabular_pool[0])
    curve, full = tv_by_prefix(pool), tv_estimate(pool)
    assert curve.lengths.tolist() == list(range(1, 7))
    assert curve.value[-1] == pytest.approx(full.value, abs=1e-12)
    assert curve.mismatch[-1] == pytest.approx(full.mismatch, abs=1e-12)
    assert np.all(np.diff(curve.mismatch) >= 0)  # zero mass, once hit, persists along the prefix


def test_block_estimate_and_own_token_zero_mass(block_pool):
    pool = load_pool(block_pool)
    res = tv_estimate(pool)
    # the plug-in bias at r = 16, sigma = 0.1 is positive and small; the truth lies within 4 stderr
    assert abs(res.value - pool.metadata["exact_tv"]) < 4 * res.stderr
    rates = zero_mass_rates(pool)
    assert rates.own == {"pi": 0.0, "mu": 0.0}


def test_sigma_calibration_recovers_the_noisy_oracle(block_pool):
    pool = load_pool(block_pool)
    for scorer in ("pi", "mu"):
        cal = calibrate_sigma(pool, scorer, FEW)
        assert abs(cal.union_sigma - SIGMA) < 0.1 * SIGMA
        assert abs(cal.union_sigma2 - SIGMA**2) < 4 * cal.union_sigma2_stderr
        # realized-token variant: sigma^2 (1 - p) per cell, smaller than the union-support value
        assert 0.5 * SIGMA < cal.realized_sigma < cal.union_sigma
        assert cal.union_percentiles[2] > cal.union_sigma2 > cal.union_median  # heavy right tail
        assert 0 < cal.nondegenerate_fraction < 0.5


def test_sigma_is_zero_for_exact_scoring(tabular_pool):
    cal = calibrate_sigma(load_pool(tabular_pool[0]), "pi", FEW)
    assert cal.realized_sigma == 0.0 and cal.union_sigma is None  # no top-k readout in this pool


def test_repeat_hygiene_removes_serial_drift(tmp_path):
    """Hand-made draws with a drift along the repeat axis: in serving order the half-split sees the
    drift as noise; after the per-cell permutation it is averaged like exchangeable noise."""
    num, length, repeats = 200, 8, 16
    drift = 1 + 0.05 * (np.arange(repeats) - (repeats - 1) / 2) / repeats
    lp = np.broadcast_to(np.log(0.5 * drift), (num, length, repeats)).astype(np.float32)
    w = create_pool(tmp_path / "drift", n=length, num_per_side=num, repeats=repeats)
    for side in ("pi", "mu"):
        w.write_tokens(side, 0, np.zeros((num, length), int))
        for sc in ("pi", "mu"):
            w.write_draws(side, sc, 0, 0, lp)
    pool = load_pool(tmp_path / "drift")
    served = calibrate_sigma(pool, "pi", Hygiene(permute=False))
    permuted = calibrate_sigma(pool, "pi", Hygiene(num_permutations=8))
    # serving order: every cell's halves differ by the same systematic amount
    half_gap = 0.5 * 0.05 * (repeats / 2) / repeats
    assert served.realized_sigma2 == pytest.approx((repeats / 4) * half_gap**2 / 0.5, rel=1e-3)
    assert permuted.realized_sigma2 < 0.5 * served.realized_sigma2
    # the full-R estimate does not depend on the order
    assert tv_estimate(pool).value == pytest.approx(0.0, abs=1e-12)


def test_self_noise_floor_of_identical_pair_falls_with_r(tmp_path):
    pi, _ = block_pair(seed=10, n=64, block_bits=8, alpha=0.3)
    write_synthetic_pool(jax.random.key(3), tmp_path / "same", pi, pi, Noisy(SIGMA), num_per_side=512, repeats=32)
    curve = tv_by_repeats(load_pool(tmp_path / "same"), hygiene=FEW)
    assert curve.repeats.tolist() == [1, 2, 4, 8, 16, 32] and curve.floor_repeats.tolist() == [1, 2, 4, 8, 16]
    for floor in curve.floor.values():
        assert np.all(np.diff(floor) < 0)
        assert floor[-1] < 0.4 * floor[0]  # Z ~ |noise| ~ 1/sqrt(r): ratio ~ 1/4 at r = 16
    assert np.all(np.diff(curve.value) < 0) and curve.value[-1] < 0.3 * curve.value[0]


def test_support_union_counts_distinct_positive_mass_ids(block_pool, tmp_path):
    union = support_union(load_pool(block_pool), "pi", FEW)
    cal = calibrate_sigma(load_pool(block_pool), "pi", Hygiene(num_permutations=1))
    # noisy binary draws keep both tokens in every pass of a non-degenerate cell
    np.testing.assert_allclose(union.mean, 1 + cal.nondegenerate_fraction)
    pi, mu = block_pair(seed=10, n=16, block_bits=4, alpha=0.3)
    write_synthetic_pool(jax.random.key(4), tmp_path / "s", pi, mu, Sampler(), num_per_side=400, repeats=8, top_k=2)
    grow = support_union(load_pool(tmp_path / "s"), "pi", FEW)
    assert grow.mean[0] == 1.0 and np.all(np.diff(grow.mean) >= 0) and grow.mean[-1] > 1.1
    assert grow.max[-1] == 2


def test_compare_scorers_reports_a_compressing_biased_scorer(tmp_path):
    num, length, repeats = 300, 4, 2
    rng = np.random.default_rng(5)
    w = create_pool(tmp_path / "cmp", n=length, num_per_side=num, repeats=repeats, scorers=("pi", "mu", "mu_api"))
    for side in ("pi", "mu"):
        w.write_tokens(side, 0, np.zeros((num, length), int))
        base = np.log(rng.uniform(0.2, 0.8, (num, length, 1))).repeat(repeats, axis=2)
        mu_lp = np.log(rng.uniform(0.2, 0.8, (num, length, 1))).repeat(repeats, axis=2)
        api = mu_lp + 0.2 * (base - mu_lp)  # shrinks L_pi - L_mu by exactly 0.8
        api[:30, 0, :] = -np.inf  # zero mass on the first 30 trajectories of each side
        for sc, lp in (("pi", base), ("mu", mu_lp), ("mu_api", api)):
            w.write_draws(side, sc, 0, 0, lp)
    pool = load_pool(tmp_path / "cmp")
    cmp = compare_scorers(pool, ("pi", "mu_api"))
    assert cmp.compression == pytest.approx(0.8, rel=1e-4)
    assert cmp.shift < 0 and cmp.mismatch_a == 0 and cmp.mismatch_b == pytest.approx(0.1)
    assert cmp.num_shared == 2 * (num - 30) and cmp.repeat_variance["mu_api"] == 0
    assert zero_mass_rates(pool).trajectory["mu"]["mu_api"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="pair must name two loaded scorers"):
        compare_scorers(pool, ("pi", "hf"))


def test_pilot_picks_multilevel_under_noise_and_one_level_without(tmp_path):
    noisy = evaluate_multilevel(multilevel_pool(tmp_path / "noisy", 0.04), num_pilots=20, hygiene=FEW)
    assert noisy.multilevel_fraction[-1] >= 0.75 and len(noisy.chosen[-1]) >= 2
    assert np.all(noisy.rmse_multilevel <= noisy.rmse_single_pilot * 1.001)
    assert noisy.bias[0] > noisy.bias[-1]  # plug-in bias falls with r
    exact = evaluate_multilevel(multilevel_pool(tmp_path / "exact", 0.0), num_pilots=20, hygiene=FEW)
    assert np.all(exact.multilevel_fraction == 0) and all(c == (1,) for c in exact.chosen)
    np.testing.assert_allclose(exact.rmse_multilevel, exact.rmse_single_pilot)


def test_report_and_commands(block_pool, tmp_path, capsys):
    out = tmp_path / "report"
    assert report_main([str(block_pool), "--out", str(out), "--permutations", "2", "--num-pilots", "5"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"summary.md", "results.json", "tv_by_prefix.png", "tv_by_repeats.png", "decomposition.png",
            "sigma.png", "support_union.png", "multilevel_rmse.png"} <= names
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"tv", "prefix", "repeats", "sigma", "support", "zero_mass", "multilevel"}
    assert results["tv"]["value"] == pytest.approx(tv_estimate(load_pool(block_pool)).value)
    assert "TV = " in (out / "summary.md").read_text()
    capsys.readouterr()
    assert analysis_main(["tv", str(block_pool)]) == 0
    assert json.loads(capsys.readouterr().out)["pair"] == ["pi", "mu"]
    assert analysis_main(["tv", str(tmp_path / "missing")]) == 2
    assert "not a pool" in capsys.readouterr().err


def test_fewer_repeats_average_over_permutations(block_pool):
    pool = load_pool(block_pool)
    curve = tv_by_repeats(pool, grid=[4], hygiene=FEW)
    assert tv_estimate(pool, repeats=4, hygiene=FEW).value == pytest.approx(curve.value[0], abs=1e-12)
    served = tv_estimate(pool, repeats=4, hygiene=Hygiene(permute=False))
    assert served.value != curve.value[0] and abs(served.value - curve.value[0]) < 2 * served.stderr
    with pytest.raises(ValueError, match=r"repeats must be in \[1, 16\], got 17"):
        tv_estimate(pool, repeats=17)


def test_synthetic_writer_resumes_identically_after_a_crash(tmp_path, monkeypatch):
    pi, mu = block_pair(seed=10, n=16, block_bits=4, alpha=0.3)
    args = dict(num_per_side=32, repeats=4, top_k=2, row_chunk=16)
    original, calls = PoolWriter._commit, {"n": 0}

    def crash_on_fifth(self, *a):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("killed between data write and commit")
        return original(self, *a)

    monkeypatch.setattr(PoolWriter, "_commit", crash_on_fifth)
    with pytest.raises(RuntimeError, match="killed"):
        write_synthetic_pool(jax.random.key(7), tmp_path / "a", pi, mu, Noisy(SIGMA), **args)
    monkeypatch.setattr(PoolWriter, "_commit", original)
    resumed = write_synthetic_pool(jax.random.key(7), tmp_path / "a", pi, mu, Noisy(SIGMA), **args)
    assert len(resumed.done_shards()) == 2 * 3 * 2  # sides x (tokens + 2 scorers) x row chunks
    write_synthetic_pool(jax.random.key(7), tmp_path / "b", pi, mu, Noisy(SIGMA), **args)
    a, b = load_pool(tmp_path / "a"), load_pool(tmp_path / "b")
    for side in ("pi", "mu"):
        np.testing.assert_array_equal(a.tokens[side], b.tokens[side])
        for sc in ("pi", "mu"):
            np.testing.assert_array_equal(a.logprobs[side][sc], b.logprobs[side][sc])
            np.testing.assert_array_equal(a.topk_logprobs[side][sc], b.topk_logprobs[side][sc])


def test_negative_oracle_draws_are_refused(tmp_path):
    pi, mu = block_pair(seed=10, n=16, block_bits=4, alpha=0.45)
    with pytest.raises(ValueError, match="negative probabilities; a pool stores log-probabilities"):
        write_synthetic_pool(jax.random.key(0), tmp_path / "neg", pi, mu, Noisy(1.0), num_per_side=32, repeats=4)


def test_report_skips_what_does_not_apply(tabular_pool, tmp_path):
    out = tmp_path / "report"
    assert report_main([str(tabular_pool[0]), "--out", str(out), "--permutations", "2"]) == 0
    summary = (out / "summary.md").read_text()
    assert "Skipped: the multilevel evaluation needs at least 4 stored repeats" in summary
    results = json.loads((out / "results.json").read_text())
    assert results["multilevel"] == {"skipped": "the multilevel evaluation needs at least 4 stored repeats "
                                                "(levels + held-out reference)"}
    assert not (out / "multilevel_rmse.png").exists() and (out / "tv_by_prefix.png").exists()


def test_multilevel_on_an_exactly_identical_pair_is_finite(tmp_path):
    num, length, repeats = 100, 4, 8
    w = create_pool(tmp_path / "same", n=length, num_per_side=num, repeats=repeats)
    for side in ("pi", "mu"):
        w.write_tokens(side, 0, np.zeros((num, length), int))
        for sc in ("pi", "mu"):
            w.write_draws(side, sc, 0, 0, np.full((num, length, repeats), np.log(0.5)))
    res = evaluate_multilevel(load_pool(tmp_path / "same"), pilot_size=20, num_pilots=3, hygiene=FEW)
    assert np.all(res.rmse_multilevel == 0) and res.rmse_ratio == 1.0 and res.saving_pilot is None
    json.dumps(to_jsonable(res), allow_nan=False)


STOP_SIGMA = 0.05  # additive noise: small against the table's smallest probabilities (0.07)


@pytest.fixture(scope="module")
def stopping_pool(tmp_path_factory):
    """A tabular pair whose outputs stop at EOS (token 3), noisy scoring with a full readout:
    TV over sequences of length <= n by enumeration."""
    from tvjax.core.instances import stopping_tabular_pair

    pi, mu = stopping_tabular_pair(seed=2, vocab_size=4, n=6, stop_prob=(0.2, 0.35), logit_scale=0.5)
    path = tmp_path_factory.mktemp("pools") / "stopping"
    write_synthetic_pool(jax.random.key(5), path, pi, mu, Noisy(STOP_SIGMA), num_per_side=2000, repeats=8, top_k=4)
    return path, exact_tv(pi, mu)


def test_stopping_pool_holds_lengths_and_the_tv_of_whole_outputs(stopping_pool):
    from tvjax.pools.store import padded_positions, stopped_lengths

    path, truth = stopping_pool
    pool = load_pool(path)
    assert pool.spec.eos_ids == (3,)
    for side in ("pi", "mu"):
        lengths = pool.lengths[side]
        assert np.array_equal(lengths, stopped_lengths(pool.tokens[side], (3,)))
        assert 0.3 < np.mean(lengths < 6) < 0.95  # many rows stop early, at different lengths
        padded = padded_positions(lengths, 6)
        assert np.all(pool.tokens[side][padded] == 3)
        for scorer in ("pi", "mu"):  # the pad is deterministic under every scorer, noise or not
            assert np.all(pool.logprobs[side][scorer][padded] == 0.0)
    res = tv_estimate(pool)
    assert abs(res.value - truth) < 4 * res.stderr  # the plug-in's bias at sigma 0.05, r = 8 is far below it
    positions = sum(int(pool.lengths[s].sum()) for s in ("pi", "mu"))
    assert res.queries == positions * (1 + 2 * 8)  # real positions only
    assert tv_by_prefix(pool).value[-1] == pytest.approx(res.value, abs=1e-12)


def test_stopping_pool_statistics_leave_the_pad_out(stopping_pool):
    pool = load_pool(stopping_pool[0])
    positions = sum(int(pool.lengths[s].sum()) for s in ("pi", "mu"))
    cal = calibrate_sigma(pool, "pi", FEW)
    assert cal.num_cells == positions and cal.nondegenerate_fraction == 1.0  # every real cell, no pad
    # over a full readout of V = 4 ids this oracle's covariance gives (V - 1) sigma^2 per cell
    assert abs(cal.union_sigma2 - 3 * STOP_SIGMA**2) < 4 * cal.union_sigma2_stderr
    union = support_union(pool, "pi", FEW)
    assert union.mean[0] == pytest.approx(4.0)  # four live ids at every real cell; the pad's single id stays out
    rates = zero_mass_rates(pool)
    assert rates.position["pi"]["pi"] == 0.0


def test_report_of_a_stopping_pool_states_the_lengths(stopping_pool, tmp_path):
    report_main([str(stopping_pool[0]), "--out", str(tmp_path), "--permutations", "2"])
    summary = (tmp_path / "summary.md").read_text()
    assert "Outputs stop at EOS [3]" in summary and "stopped before n" in summary
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["lengths"]["pi"]) == 2000
