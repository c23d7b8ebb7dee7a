"""The bound checks can fail: needed budgets against their Gaussian ground truth, bootstrap
exponents that recover a known slope and exclude wrong ones, verdicts that say unreachable,
exceeds and below, and the multirun form of the bounds app giving the single-process numbers."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from tvjax.core.studies import ExponentFit, bootstrap_exponent, bound_verdict, needed_budget
from tvjax.studykit import ConfigError, run_study, study_view

ROOT = Path(__file__).resolve().parents[1]
FAST_ENV = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "HYDRA_FULL_ERROR": "1"}
EPS_GRID = [0.3, 0.17, 0.095, 0.053, 0.03]


def load_bounds():
    import importlib.util

    spec = importlib.util.spec_from_file_location("app_bounds", ROOT / "experiments" / "bounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bounds_config(overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="bounds", overrides=list(overrides))


def bounds_view(overrides):
    return study_view(bounds_config(overrides), load_bounds().READS)


def test_needed_budget_of_gaussian_estimates():
    """Estimates with bias b and sd s at Q queries reach RMSE = eps at Q s^2 / (eps^2 - b^2):
    within 5 standard errors of the sample variance (relative SE sqrt(2 / reps))."""
    rng = np.random.default_rng(0)
    reps, b, sd, eps, queries = 100_000, 0.02, 0.05, 0.1, 3000.0
    values = 0.4 + b + sd * rng.standard_normal(reps)
    needed = needed_budget(values, 0.4, eps, queries)
    expected = queries * sd**2 / (eps**2 - b**2)
    assert abs(needed.budget / expected - 1) < 5 * math.sqrt(2 / reps)
    assert abs(needed.bias - b) < 5 * sd / math.sqrt(reps) and abs(needed.stderr - sd) < 0.01 * sd
    assert needed_budget(values, 0.4 - 0.1, eps, queries).budget == math.inf  # bias 0.12 > eps: never


def test_squared_bias_is_estimated_without_its_upward_bias():
    """The squared mean error overstates b^2 by v / reps; the b^2 implied by needed_budget
    (eps^2 - Q v / budget) is unbiased: over 20000 small studies (8 repetitions, b = 0.07,
    sd 0.05, so the clip at 0 almost never acts) its mean is within 3 standard errors of b^2,
    where the uncorrected squared error is off by more than 10."""
    rng = np.random.default_rng(1)
    b, sd, eps, reps = 0.07, 0.05, 0.2, 8
    values = b + sd * rng.standard_normal((20_000, reps))
    variance = values.var(axis=1, ddof=1)
    budgets = np.array([needed_budget(v, 0.0, eps, 1.0).budget for v in values])
    implied = eps**2 - variance / budgets
    raw = values.mean(axis=1) ** 2
    standard_error = implied.std() / math.sqrt(implied.size)
    assert abs(implied.mean() - b**2) < 3 * standard_error
    assert raw.mean() - b**2 > 10 * standard_error


def gaussian_grid(slope, rng, reps=128, x=(1, 2, 4, 8, 16)):
    """Unbiased estimates with sd eps / 2 at pilot budgets x^slope: the needed budget is
    x^slope / 4 exactly (the pilots sit where the studies' pilots do, RMSE well below eps)."""
    eps = 0.1
    values = [0.3 + 0.5 * eps * rng.standard_normal(reps) for _ in x]
    return list(x), values, [0.3] * len(x), [eps] * len(x), [float(xi) ** slope for xi in x]


@pytest.mark.parametrize("slope", [1.0, 2.0])
def test_bootstrap_interval_covers_the_true_slope_at_its_stated_rate(slope):
    """Over 200 independent grids of Gaussian estimates, the 95% interval holds the true slope
    in 95% of them, within 4 binomial standard errors (sd 1.5%; a percentile bootstrap of a
    variance undercovers slightly: 93-94% over 600 grids at 128 repetitions)."""
    rng = np.random.default_rng(2)
    hits = []
    for _ in range(200):
        fit = bootstrap_exponent(*gaussian_grid(slope, rng), rng, resamples=400)
        hits.append(fit.low <= slope <= fit.high)
    assert abs(np.mean(hits) - 0.95) < 4 * math.sqrt(0.95 * 0.05 / 200)


def test_known_answer_likelihood_ratio_needs_budget_like_one_over_eps_squared():
    """Algorithm 1 at exact logits: N trajectories give variance Var(R) / N, so the budget for
    RMSE = eps is n Var(R) / eps^2 exactly, a slope of 2 in 1/eps. The bounds app on the block
    instance at CI size: the 95% interval holds 2 and excludes 1.5 and 2.5."""
    bounds = load_bounds()
    view = bounds_view(["study.reps=96", "study.bootstrap=1000", "study.baseline_axes=[]",
                        f"study.grids=[{{access: exact, axis: eps, values: {EPS_GRID}}}]"])
    result = bounds.study(view)
    (row,) = result.summary["exponents"]
    assert row["ci_low"] < 2.0 < row["ci_high"] and row["ci_low"] > 1.5 and row["ci_high"] < 2.5, row
    assert row["verdict"] == "consistent" and row["lower_bound"] == pytest.approx(2.0)


def test_negative_control_a_biased_estimator_is_reported_unreachable():
    """The likelihood ratio's estimates shifted by +0.125: an estimator with bias 0.125, which no
    budget brings to RMSE = eps for eps <= 0.1 (3 of the 5 grid points). The table says
    unreachable, with the bias relative to eps, and fits no slope. The shift stands clear of both
    neighbouring grid points, 0.095 and 0.17, by more than 4 standard errors of the mean of 128
    repetitions there (0.004 and 0.007): the count is the bias's, not the draw's."""
    bounds = load_bounds()
    view = bounds_view(["study.reps=128", "study.baseline_axes=[]",
                        f"study.grids=[{{access: exact, axis: eps, values: {EPS_GRID}}}]"])
    records = bounds.study(view).summary["records"]
    biased = [{**r, "values": [v + 0.125 for v in r["values"]], "estimator": "biased by +0.125"} for r in records]
    (row,) = bounds.exponent_table(biased, seed=0, resamples=200, hard_instance=True)
    assert row["verdict"] == "unreachable" and row["unreachable"] == 3 and math.isnan(row["fitted"])
    assert row["max_abs_bias_over_eps"] == pytest.approx(0.125 / 0.03, rel=0.1)
    (clean,) = bounds.exponent_table(records, seed=0, resamples=200, hard_instance=True)
    assert clean["verdict"] == "consistent" and clean["unreachable"] == 0


def test_verdicts_against_known_slopes():
    rng = np.random.default_rng(3)
    steep = bootstrap_exponent(*gaussian_grid(3.0, rng, reps=256), rng, resamples=500)
    assert steep.low > 2.5
    assert bound_verdict(steep, upper=2.0, upper_with_logs=2.2) == "exceeds the upper bound"
    assert bound_verdict(steep, upper=2.0, upper_with_logs=3.0) == "consistent up to the log factor"
    assert bound_verdict(steep, upper=3.5) == "consistent"
    flat = bootstrap_exponent(*gaussian_grid(0.5, rng, reps=256), rng, resamples=500)
    assert bound_verdict(flat, upper=2.0, lower=1.0) == "below the lower bound"
    assert bound_verdict(ExponentFit(math.nan, math.nan, math.nan, 2, 1.0), upper=2.0) == "unreachable"
    assert bound_verdict(ExponentFit(1.0, math.nan, math.nan, 0, 0.2), upper=2.0) == "undetermined"


def test_theory_slopes_over_a_grid():
    """(n + n^2 sigma^2) bends between slope 1 and 2 over n in [32, 512] at sigma = 0.5; its
    steepest term is the ceiling; log^2(1/eps) steepens the eps axis; the floor of the noisy
    lower bound on the sigma axis is the flat n term."""
    bounds = load_bounds()
    record = lambda access, p, x: {"x": x, "upper_terms": bounds.upper_terms(access, p, 4),
                                   "upper_log_factor": bounds.upper_log_factor(access, p),
                                   "lower_terms": bounds.lower_terms(access, p, 4)}
    base = bounds.Point(64, 0.1, 0.5, 4)
    on_n = bounds.theory_slopes([record("noisy", base._replace(n=n), n) for n in (32, 64, 128, 256, 512)])
    assert 1.9 < on_n.theory < 2.0 and on_n.ceiling == pytest.approx(2.0) and on_n.floor == pytest.approx(1.0)
    on_eps = bounds.theory_slopes([record("sampler", base._replace(eps=e), 1 / e) for e in EPS_GRID])
    assert on_eps.ceiling == pytest.approx(2.0) and 2.8 < on_eps.ceiling_with_logs < 3.0
    on_sigma = bounds.theory_slopes([record("noisy", base._replace(sigma=s), s) for s in (0.1, 0.32, 1.0)])
    assert on_sigma.floor == pytest.approx(0.0, abs=1e-9) and on_sigma.ceiling == pytest.approx(2.0)
    # Rare escape: the support is K + 1 (the stay token): the bound's slope bends below 1 over
    # K = 2..32, its ceiling is the exponent of K.
    rare = lambda K: {"x": K, "upper_terms": bounds.upper_terms("sampler", base._replace(K=K), K + 1),
                      "upper_log_factor": 1.0, "lower_terms": bounds.lower_terms("sampler", base._replace(K=K), K + 1)}
    on_k = bounds.theory_slopes([rare(K) for K in (2, 4, 8, 16, 32)])
    assert 0.85 < on_k.theory < 0.88 and on_k.ceiling == pytest.approx(1.0)


def run_bounds(args, cwd):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "bounds.py"), *args], cwd=cwd, env=FAST_ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_multirun_over_points_gives_the_single_process_exponents(tmp_path):
    """One job per grid point (joblib, 2 workers), fitted by the callback when the multirun
    ends; the same from `--summarize`; and both equal the single-process run's table."""
    single, sweep = tmp_path / "single", tmp_path / "sweep"
    run_bounds(["smoke=true", "plots=false", f"hydra.run.dir={single}"], tmp_path)
    run_bounds(["-m", "smoke=true", "plots=false", "study.point=range(0,6)", "hydra/launcher=joblib",
                "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}"], tmp_path)
    expected = json.loads((single / "results.json").read_text())["results"]["exponents"]
    fitted = json.loads((sweep / "exponents.json").read_text())
    labels = lambda table: [(r["axis"], r["estimator"], r["verdict"]) for r in table]
    assert labels(fitted) == labels(expected)
    for got, want in zip(fitted, expected):
        for key in ("fitted", "ci_low", "ci_high", "theory", "ceiling"):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-9), (key, got, want)
    assert all((sweep / f"bounds_{access}.png").stat().st_size > 0 for access in ("exact", "noisy", "sampler"))
    (sweep / "exponents.json").unlink()
    run_bounds(["--summarize", str(sweep)], tmp_path)
    assert json.loads((sweep / "exponents.json").read_text())[0]["fitted"] == pytest.approx(expected[0]["fitted"], rel=1e-6)


def test_a_sweep_with_missing_points_or_a_bad_index_fails_clearly(tmp_path):
    bounds = load_bounds()
    with pytest.raises(ConfigError, match=r"this grid has 6 .*range\(0,6\)"):
        bounds.study(bounds_view(["smoke=true", "study.point=6"]))
    one_point = bounds_config(["smoke=true", "study.point=0", "plots=false"])
    run_study(one_point, bounds.study, bounds.READS, out_dir=tmp_path / "job0")
    with pytest.raises(ConfigError, match=r"holds 1 of the grid's 6 points; missing \[1, 2, 3, 4, 5\]"):
        bounds.summarize_sweep(tmp_path)
    with pytest.raises(ConfigError, match="no single-point bounds jobs"):
        bounds.summarize_sweep(tmp_path / "empty")
