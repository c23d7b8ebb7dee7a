"""Hydra app: RMSE against query budget under the three access models (paper appendix B.11).

    .venv/bin/python experiments/access_models.py [smoke=true]

Exact logits use Algorithm 1 with as many trajectories as the budget buys (`tvjax.cost`); noisy logits (one arm per sigma) and
sample-only access use Algorithm 3 with fixed repeat levels, each level taking an equal share of
the budget. RMSE over `reps` repetitions; the x axis is the queries actually spent.
"""

import hydra
import jax
import matplotlib.pyplot as plt
import numpy as np
from tqdm import tqdm

from tvjax import cost
from tvjax.estimators import lookup
from tvjax.instances import exact_tv
from tvjax.oracles import Exact, Noisy, Sampler
from tvjax.schedules import as_runtime, equal_share_schedule
from tvjax.studies import errors, replicate

from studykit import StudyResult, build_pair, run_study

READS = ("seed", "fast_compile", "instance", "study")


def arms(s, n):
    """(label, oracle, budget -> (estimator fn, its sizes) or None when the budget is too small).
    Sizes are runtime arguments: each arm compiles once for all its budgets."""
    likelihood_ratio, multilevel = lookup("likelihood_ratio"), lookup("multilevel")

    def exact(budget):
        num = cost.trajectories_for_budget(budget, n)
        return (likelihood_ratio.fn, likelihood_ratio.sizes(np.int32(num))) if num >= 2 else None

    def leveled(repeats):
        def make(budget):
            schedule = equal_share_schedule(budget, n, tuple(repeats))
            return (multilevel.fn, as_runtime(schedule)) if min(schedule.num_samples) >= 1 else None

        return make

    out = [("exact logits", Exact(), exact)]
    out += [(f"noisy sigma={a.sigma}, r={tuple(a.repeats)}", Noisy(a.sigma), leveled(a.repeats)) for a in s.noisy]
    out.append((f"sample-only, r={tuple(s.sample_only_repeats)}", Sampler(), leveled(s.sample_only_repeats)))
    return out


def study(cfg):
    s = cfg.study
    pi, mu = build_pair(cfg.instance)
    truth = exact_tv(pi, mu)
    jobs = [(label, oracle, budget, make(budget)) for label, oracle, make in arms(s, pi.n) for budget in s.budgets]
    jobs = [job for job in jobs if job[3] is not None]
    rows = []
    keys = jax.random.split(jax.random.key(cfg.seed), len(jobs))
    for (label, oracle, budget, (fn, sizes)), key in zip(tqdm(jobs, desc="access models"), keys):
        est = replicate(fn, key, s.reps, pi, mu, oracle, sizes, fast_compile=cfg.fast_compile)
        mae, rmse, bias = errors(est.value, truth)
        rows.append({"arm": label, "budget": budget, "queries": float(est.queries[0]), "rmse": rmse, "mae": mae,
                     "bias": bias, "reps": s.reps})
    summary = {"truth": truth, "reps": s.reps, "arms": sorted({r["arm"] for r in rows})}
    return StudyResult(summary, rows, {"rmse_vs_budget": plot(rows, truth)})


def plot(rows, truth):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for arm in dict.fromkeys(r["arm"] for r in rows):
        pts = sorted((r["queries"], r["rmse"]) for r in rows if r["arm"] == arm)
        ax.loglog(*zip(*pts), "o-", label=arm)
    ax.set_xlabel("queries")
    ax.set_ylabel("RMSE")
    ax.set_title(f"three access models (TV = {truth:.3f})")
    ax.legend(fontsize=7)
    return fig


@hydra.main(config_path="../configs", config_name="access_models", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
