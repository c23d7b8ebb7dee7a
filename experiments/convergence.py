"""Hydra app: exact-logit convergence of Algorithm 1 (paper Figure 5, appendix B.2).

    .venv/bin/python experiments/convergence.py [smoke=true]

For each N: mean absolute error of the likelihood-ratio estimator over `reps` repetitions
(vmapped over PRNG keys), the Gaussian-asymptotic reference sqrt(2/pi) sqrt(Var(R)/N) and the
least-squares slope of log MAE against log N (theory -0.5; paper -0.493).
"""

import math
from functools import partial

import hydra
import numpy as np
from tqdm import tqdm

from tvjax.core.estimators import lookup
from tvjax.core.instances import exact_tv, likelihood_ratio_moments
from tvjax.core.oracles import Exact
from tvjax.core.studies import errors, job_key, loglog_fit, random_words, replicate
from tvjax.studykit import StudyResult, build, build_pair, finish, run_study, subplots

READS = ("seed", "fast_compile", "instance", "oracle", "study")


def ratio_variance(key, pi, mu, oracle, estimator, samples):
    """(Var(R), how it was found): exact where the instance allows (a sum over the block
    instance's 8192 outcomes, or enumeration), else sampled from `samples` trajectories."""
    if isinstance(oracle, Exact):
        try:
            return likelihood_ratio_moments(pi, mu).variance, "exact"
        except ValueError:  # too many sequences to enumerate
            pass
    sampled = estimator.fn(key, pi, mu, oracle, estimator.sizes(samples)).levels.variance[0]
    return float(sampled), f"sampled from {samples} trajectories"


def study(cfg):
    s = cfg.study
    pi, mu = build_pair(cfg.instance)
    oracle = build(cfg.oracle)
    truth = exact_tv(pi, mu)
    estimator = lookup("likelihood_ratio")
    variance_r, variance_source = ratio_variance(job_key(cfg.seed, 0), pi, mu, oracle, estimator, s.variance_samples)
    rows = []
    for index, size in enumerate(tqdm(s.sizes, desc="convergence N")):
        key = job_key(cfg.seed, 1, index)
        # Sizes as runtime arguments: every N runs in one compiled program.
        est = replicate(estimator.fn, key, s.reps, pi, mu, oracle, estimator.sizes(np.int32(size)),
                        fast_compile=cfg.fast_compile)
        mae, rmse, bias = errors(est.value, truth)
        reference = math.sqrt(2 / math.pi) * math.sqrt(variance_r / size)
        rows.append({"N": size, "mae": mae, "rmse": rmse, "bias": bias, "gaussian_reference": reference, "reps": s.reps})
    fit = loglog_fit([r["N"] for r in rows], [r["mae"] for r in rows])
    summary = {"truth": truth, "variance_R": variance_r, "variance_R_from": variance_source, "slope": fit.slope,
               "theory_slope": -0.5, "paper_slope": -0.493, "reps": s.reps}
    print(f"exact-logit MAE slope {fit.slope:.3f} (theory -0.500, paper -0.493); Var(R) = {variance_r:.4f}")
    words = sum(random_words(pi, oracle, estimator.sizes(size), s.reps) for size in s.sizes)
    return StudyResult(summary, rows, {"convergence": partial(plot, rows, fit)}, words)


def plot(rows, fit):
    fig, ax = subplots(figsize=(5, 4))
    N = np.array([r["N"] for r in rows], float)
    ax.loglog(N, [r["mae"] for r in rows], "o-", label=f"empirical MAE (slope {fit.slope:.3f})")
    reference = "\N{SQUARE ROOT}(2/\N{GREEK SMALL LETTER PI}) \N{SQUARE ROOT}(Var(R)/N)"  # plain text: no mathtext parser
    ax.loglog(N, [r["gaussian_reference"] for r in rows], "k--", label=reference)
    ax.set_xlabel("N (trajectories)")
    ax.set_ylabel("mean absolute error")
    ax.set_title("Algorithm 1, exact logits")
    ax.legend()
    return fig


@hydra.main(config_path="../configs", config_name="convergence", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
