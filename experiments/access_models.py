"""Hydra app: RMSE against query budget under the three access models (paper appendix B.11).

    .venv/bin/python experiments/access_models.py [smoke=true]
    .venv/bin/python experiments/access_models.py experiment=access_models_paper   # the paper's B.11 sizes

Exact logits, noisy logits (one arm per sigma) and sample-only access (Algorithm 3 through prefix
samplers, fixed repeat levels, each level an equal share of the queries) over a grid of budgets
or the paper's own sizes (see `arms`). RMSE over `reps` repetitions; the x axis is the queries
actually spent.
"""

from functools import partial

import hydra
import numpy as np
from tqdm import tqdm

from tvjax.core import cost
from tvjax.core.estimators import lookup
from tvjax.core.instances import exact_tv
from tvjax.core.oracles import Exact, Noisy, Sampler
from tvjax.core.programs import release_programs
from tvjax.core.schedules import as_runtime, equal_share_schedule
from tvjax.core.studies import errors, job_key, random_words, replicate
from tvjax.studykit import StudyResult, build_pair, finish, run_study, subplots

READS = ("seed", "fast_compile", "instance", "study")


def arms(s, n):
    """(label, oracle, [(fn, sizes)] per point of the arm's grid). Sizes are runtime arguments:
    each arm compiles once for all its points.

    Two protocols. `budgets`: at each budget, the exact arm is Algorithm 1 with as many
    trajectories as it buys, and each leveled arm gives every level an equal share (points where
    a level gets no trajectory are left out). `paper_sizes` (the paper's B.11 runner): the exact
    arm is the plug-in at r = 1 with `exact_per_side` trajectories per side, and each leveled arm
    runs at `base_sizes` N_base, N_l = round(N_base L w_l / sum w), w_l = 1 / (1 + 2 r_l): an
    equal share of 2 n N_base L^2 / sum w queries per level, rounded to the nearest size."""
    likelihood_ratio, multilevel, plugin = lookup("likelihood_ratio"), lookup("multilevel"), lookup("plugin")
    paper = s.get("paper_sizes")
    if paper:
        exact = [(plugin.fn, plugin.sizes(np.int32(num), np.int32(1))) for num in paper.exact_per_side]
    else:
        exact = [(likelihood_ratio.fn, likelihood_ratio.sizes(np.int32(num)))
                 for num in (cost.trajectories_for_budget(budget, n) for budget in s.budgets) if num >= 2]

    def leveled(repeats):
        repeats = tuple(repeats)
        if paper:
            weights = sum(1 / (1 + 2 * r) for r in repeats)
            budgets = [cost.symmetric_queries(base, n, 0) * len(repeats) ** 2 / weights for base in paper.base_sizes]
        else:
            budgets = s.budgets
        schedules = [equal_share_schedule(budget, n, repeats, nearest=bool(paper)) for budget in budgets]
        return [(multilevel.fn, as_runtime(schedule)) for schedule in schedules if min(schedule.num_samples) >= 1]

    out = [("exact logits", Exact(), exact)]
    out += [(f"noisy sigma={a.sigma}, r={tuple(a.repeats)}", Noisy(a.sigma), leveled(a.repeats)) for a in s.noisy]
    out.append((f"sample-only, r={tuple(s.sample_only_repeats)}", Sampler(), leveled(s.sample_only_repeats)))
    return out


def study(cfg):
    s = cfg.study
    pi, mu = build_pair(cfg.instance)
    truth = exact_tv(pi, mu)
    jobs = [(label, oracle, fn, sizes) for label, oracle, points in arms(s, pi.n) for fn, sizes in points]
    rows, words = [], 0
    for job, (label, oracle, fn, sizes) in enumerate(tqdm(jobs, desc="access models")):
        if job and (fn, type(oracle)) != (jobs[job - 1][2], type(jobs[job - 1][1])):
            # The previous arm's program is done with: dropped, it leaves room for the next
            # arm's compile, and the peak memory is the largest arm's, not their sum.
            release_programs(share=0)
        est = replicate(fn, job_key(cfg.seed, job), s.reps, pi, mu, oracle, sizes, fast_compile=cfg.fast_compile)
        words += random_words(pi, oracle, sizes, s.reps)
        mae, rmse, bias = errors(est.value, truth)
        rows.append({"arm": label, "sizes": [np.asarray(part).tolist() for part in sizes], "queries": float(est.queries[0]),
                     "rmse": rmse, "mae": mae, "bias": bias, "reps": s.reps})
    summary = {"truth": truth, "reps": s.reps, "arms": sorted({r["arm"] for r in rows})}
    return StudyResult(summary, rows, {"rmse_vs_budget": partial(plot, rows, truth)}, words)


def plot(rows, truth):
    fig, ax = subplots(figsize=(6, 4.5))
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
    finish()  # results written: skip Python's teardown
