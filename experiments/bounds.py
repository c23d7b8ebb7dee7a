"""Hydra app: empirical query-complexity bounds (paper Theorems 1-3 against their lower bounds).

    .venv/bin/python experiments/bounds.py [experiment=bounds_rare_escape] [smoke=true]

For each access model and each grid axis (n, eps, sigma, K; the others held at `base`), the budget
each estimator needs to reach RMSE = eps: `reps` runs at a pilot scale c give the bias b and the
variance v of the estimate; since the variance falls as 1/c, RMSE^2(c') = b^2 + v c / c' and the
needed scale is c' = c v / (eps^2 - b^2) (infinite when |b| >= eps). Least-squares exponents of
the needed budget on log-log axes are printed next to the exponents of the theory over the same
grid: exact n/eps^2, noisy (n + n^2 sigma^2)/eps^2, sampler n^2 K/eps^2 (eps enters as 1/eps).
"""

import math
from functools import partial
from typing import Callable, NamedTuple

import hydra
import numpy as np
from tqdm import tqdm

from tvjax.estimators import lookup
from tvjax.instances import exact_tv
from tvjax.oracles import Exact, Noisy, Sampler
from tvjax.schedules import Level, Samples, as_runtime, paper_schedule
from tvjax.studies import errors, job_key, loglog_fit, replicate

from studykit import ConfigError, StudyResult, build_pair, finish, run_study, subplots

READS = ("seed", "fast_compile", "instance", "study")
ORACLES = {"exact": lambda p: Exact(), "noisy": lambda p: Noisy(p.sigma), "sampler": lambda p: Sampler()}


class Arm(NamedTuple):
    """One estimator of a grid: its label in tables, its registry name, and its sizes at a point
    from (paper schedule, single-level trajectory count)."""

    label: str
    estimator: str
    sizes: Callable


ONE_SIDED = lambda schedule, single: Samples(np.int32(single))
PAPER = {
    "exact": Arm("likelihood_ratio", "likelihood_ratio", ONE_SIDED),
    "noisy": Arm("multilevel", "multilevel", lambda schedule, single: as_runtime(schedule)),
    "sampler": Arm("multilevel (sample-only)", "multilevel", lambda schedule, single: as_runtime(schedule)),
}
# The plug-in at the paper schedule's finest r: one level, no multilevel telescoping.
TOP_LEVEL_PLUGIN = Arm("plugin at r_L", "plugin",
                       lambda schedule, single: Level(np.int32(single), np.int32(schedule.repeats[-1])))
BASELINES = {
    "exact": (Arm("plugin_kl", "plugin_kl", ONE_SIDED), Arm("k3_pinsker", "k3_pinsker", ONE_SIDED)),
    "noisy": (TOP_LEVEL_PLUGIN, Arm("likelihood_ratio (naive)", "likelihood_ratio", ONE_SIDED)),
    "sampler": (TOP_LEVEL_PLUGIN,),
}


class Point(NamedTuple):
    n: int
    eps: float
    sigma: float
    K: int


def theory_budget(access, p, support):
    """The paper's upper bounds without constants or logarithms."""
    if access == "exact":
        return p.n / p.eps**2
    if access == "noisy":
        return (p.n + p.n**2 * p.sigma**2) / p.eps**2
    return p.n**2 * support / p.eps**2


def needed_scale(values, truth, eps, scale):
    """Pilot scale c -> scale c' at which RMSE = eps, from repeated estimates at scale c."""
    _, _, bias = errors(values, truth)
    variance = float(np.var(np.asarray(values, np.float64), ddof=1))
    slack = eps**2 - bias**2
    return scale * variance / slack if slack > 0 else math.inf


def estimator_at(access, arm, p, pi, mu, scale):
    """(fn, sizes, oracle) for one arm at point p; the sizes are runtime arguments, so the points
    of a grid at one n share compiled programs."""
    oracle = ORACLES[access](p)
    single = max(2, math.ceil(scale / p.eps**2))
    schedule = paper_schedule(p.eps, oracle.noise_level(pi, mu), p.n, budget_constant=scale)
    return lookup(arm.estimator).fn, arm.sizes(schedule, single), oracle


def grid_points(s):
    base = Point(s.base.n, s.base.eps, s.base.sigma, s.base.K)
    for grid in s.grids:
        if grid.access not in PAPER:
            raise ConfigError(f"unknown access model {grid.access!r} in bounds grids; use one of {sorted(PAPER)}")
        if grid.axis not in Point._fields:
            raise ConfigError(f"unknown grid axis {grid.axis!r}; use one of {Point._fields}")
        for value in grid["values"]:
            yield grid.access, grid.axis, value, base._replace(**{grid.axis: value})


def instance_at(instance_cfg, p):
    sizes = {"n": p.n} if p.K is None else {"n": p.n, "K": p.K}
    return build_pair(instance_cfg, **sizes)


def study(cfg):
    s = cfg.study
    arms = lambda access, axis: (PAPER[access],) + (BASELINES[access] if axis in s.baseline_axes else ())
    jobs = [(access, axis, value, p, arm) for access, axis, value, p in grid_points(s) for arm in arms(access, axis)]
    rows = []
    for job, (access, axis, value, p, arm) in enumerate(tqdm(jobs, desc="bounds")):
        key = job_key(cfg.seed, job)
        pi, mu = instance_at(cfg.instance, p)
        truth = exact_tv(pi, mu)
        fn, sizes, oracle = estimator_at(access, arm, p, pi, mu, s.pilot_scale)
        est = replicate(fn, key, s.reps, pi, mu, oracle, sizes, fast_compile=cfg.fast_compile)
        scale = needed_scale(est.value, truth, p.eps, s.pilot_scale)
        rows.append({"access": access, "axis": axis, "x": 1 / value if axis == "eps" else value, **p._asdict(),
                     "estimator": arm.label, "paper": arm is PAPER[access], "truth": truth,
                     "pilot_queries": float(est.queries[0]), "pilot_rmse": errors(est.value, truth)[1],
                     "budget_needed": float(est.queries[0]) * scale / s.pilot_scale,
                     "theory": theory_budget(access, p, pi.max_support)})
    fits = exponent_table(rows)
    for f in fits:
        print(f"{f['access']:8s} {f['axis']:6s} {f['estimator']:20s} fitted {f['fitted']:7.3f}   theory {f['theory']:6.3f}"
              f"   ({f['reachable']}/{f['points']} points reach eps)")
    summary = {"exponents": fits, "reps": s.reps, "pilot_scale": s.pilot_scale}
    figures = {f"bounds_{a}": partial(plot, rows, fits, a) for a in dict.fromkeys(r["access"] for r in rows)}
    return StudyResult(summary, rows, figures)


def exponent_table(rows):
    """Fitted exponent of budget_needed and of the theory along each (access, axis, estimator)."""
    table = []
    for group in dict.fromkeys((r["access"], r["axis"], r["estimator"]) for r in rows):
        mine = [r for r in rows if (r["access"], r["axis"], r["estimator"]) == group]
        x = [r["x"] for r in mine]
        fitted = loglog_fit(x, [r["budget_needed"] for r in mine])
        theory = loglog_fit(x, [r["theory"] for r in mine])
        table.append({"access": group[0], "axis": group[1], "estimator": group[2], "fitted": fitted.slope,
                      "theory": theory.slope, "reachable": fitted.points, "points": len(mine)})
    return table


def plot(rows, fits, access):
    axes_names = list(dict.fromkeys(r["axis"] for r in rows if r["access"] == access))
    fig, axes = subplots(1, len(axes_names), figsize=(4.5 * len(axes_names), 4), squeeze=False)
    for ax, axis in zip(axes[0], axes_names):
        mine = [r for r in rows if r["access"] == access and r["axis"] == axis]
        for f in (f for f in fits if f["access"] == access and f["axis"] == axis):
            pts = sorted((r["x"], r["budget_needed"]) for r in mine
                         if r["estimator"] == f["estimator"] and math.isfinite(r["budget_needed"]))
            if pts:
                ax.loglog(*zip(*pts), "o-", label=f"{f['estimator']} (slope {f['fitted']:.2f})")
        paper = sorted((r["x"], r["theory"], r["budget_needed"]) for r in mine if r["paper"])
        x, theory, needed = map(np.array, zip(*paper))
        ok = np.isfinite(needed) & (needed > 0)
        if ok.any():  # theory line through the paper estimator's points (geometric mean)
            theory = theory * np.exp(np.mean(np.log(needed[ok] / theory[ok])))
        theory_slope = next(f["theory"] for f in fits if f["access"] == access and f["axis"] == axis)
        ax.loglog(x, theory, "k--", label=f"theory (slope {theory_slope:.2f})")
        ax.set_xlabel("1/eps" if axis == "eps" else axis)
        ax.set_ylabel("queries for RMSE = eps")
        ax.set_title(f"{access} access: budget vs {'1/eps' if axis == 'eps' else axis}")
        ax.legend(fontsize=7)
    return fig


@hydra.main(config_path="../configs", config_name="bounds", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
