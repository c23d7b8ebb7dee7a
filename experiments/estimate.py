"""Hydra app: one TV estimate for the composed (instance, oracle, estimator).

    .venv/bin/python experiments/estimate.py                                 # paper block, exact logits
    .venv/bin/python experiments/estimate.py instance=tabular_top_k estimator=plugin estimator.sizes.repeats=1
    .venv/bin/python experiments/estimate.py -m oracle=noisy estimator=multilevel oracle.sigma=0.04,0.16,0.5

Writes the truth, the estimate, its (1 - delta) normal interval, the query count and the
per-level diagnostics (results.json / results.csv) and a plot of the estimate against the truth.
"""

from functools import partial

import hydra
import jax
import numpy as np

from tvjax.core.api import confidence_interval
from tvjax.core.instances import exact_tv
from tvjax.studykit import StudyResult, build, build_pair, finish, run_study, subplots

READS = ("seed", "delta", "instance", "oracle", "estimator")


def study(cfg):
    pi, mu = build_pair(cfg.instance)
    oracle = build(cfg.oracle)
    estimate = build(cfg.estimator)(jax.random.key(cfg.seed), pi, mu, oracle)
    interval = confidence_interval(estimate, cfg.delta)
    truth = exact_tv(pi, mu)
    summary = {
        "truth": truth,
        "value": float(interval.value),
        "stderr": float(interval.stderr),
        "ci_low": float(interval.ci_low),
        "ci_high": float(interval.ci_high),
        "bias": float(interval.bias),
        "queries": float(interval.queries),
        "error": float(interval.value) - truth,
        "estimator": cfg.estimator.name,
        "oracle": type(oracle).__name__,
    }
    levels = estimate.levels
    rows = [
        {"level": l, "repeats": int(r), "num_samples": float(num), "mean": float(m), "variance": float(v), "queries": float(q)}
        for l, (r, num, m, v, q) in enumerate(zip(*(np.atleast_1d(np.asarray(a)) for a in levels)))
    ]
    print(f"TV = {truth:.4f}; estimate {summary['value']:.4f} [{summary['ci_low']:.4f}, {summary['ci_high']:.4f}] "
          f"with {summary['queries']:.3g} queries")
    return StudyResult(summary, rows, {"estimate": partial(plot_estimate, summary, cfg.delta)})


def plot_estimate(summary, delta):
    fig, ax = subplots(figsize=(4, 3.5))
    value = summary["value"]
    ax.errorbar([0], [value], yerr=[[value - summary["ci_low"]], [summary["ci_high"] - value]], fmt="o", capsize=4,
                label=f"{summary['estimator']} ({1 - delta:.0%} CI)")
    ax.axhline(summary["truth"], color="k", ls="--", label="true TV")
    ax.set_xticks([0], [f"{summary['oracle']}, {summary['queries']:.2g} queries"])
    ax.set_ylabel("TV")
    ax.set_xlabel("access model")
    ax.legend()
    return fig


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
