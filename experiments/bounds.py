"""Hydra app: the paper's query-complexity bounds checked by measurement (Theorems 1-3, 5, 7).

    .venv/bin/python experiments/bounds.py [experiment=bounds_rare_escape|bounds_coins] [smoke=true]
    .venv/bin/python experiments/bounds.py -m study.point='range(0,35)' hydra/launcher=joblib

For each access model and each grid axis (n, eps, sigma, K; the others held at `base`), the
budget each estimator needs to reach RMSE = eps (`tvjax.core.studies.needed_budget`: `reps` runs at a
pilot budget give the bias and the variance, the variance falls as 1/budget). The log-log slope
of that budget along the axis is fitted with a 95% bootstrap interval
(`tvjax.core.studies.bootstrap_exponent`) and compared with the theory's slope over the same grid
(`bound_verdict`): the upper bounds (exact n/eps^2; noisy (n + n^2 sigma^2)/eps^2 and sampler
n^2 K/eps^2, each times log^2(1/eps)) for the paper's estimators, and on the paper's hard
instances the lower bounds (n/eps^2; n (1 v sigma^2) / (eps^2 log K); n K / (eps^2 log K)) for
every estimator that reaches eps.

One process runs every point and fits; with `study.point=<index>` a process runs one grid point
(all its estimators), so a multirun spreads the points over a launcher's workers, and the
`BoundsSummary` callback fits the exponents from the sweep folder when the multirun ends
(`python experiments/bounds.py --summarize SWEEP_DIR` does the same by hand). Both forms draw
every estimate from the same key, job_key(seed, point, arm), so they give the same numbers.
"""

import json
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple

import hydra
import numpy as np
from hydra.experimental.callback import Callback
from tqdm import tqdm

from tvjax.core.estimators import lookup
from tvjax.core.instances import exact_tv
from tvjax.core.jsonable import to_jsonable
from tvjax.core.oracles import Exact, Noisy, Sampler
from tvjax.core.schedules import Level, Samples, as_runtime, paper_schedule
from tvjax.core.studies import bootstrap_exponent, bound_verdict, job_key, loglog_fit, needed_budget, replicate
from tvjax.studykit import ConfigError, StudyResult, build_pair, csv_text, finish, run_study, save_figures, subplots, write_csv

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


class GridPoint(NamedTuple):
    """One point of one grid: the access model, the axis it moves along, and every coordinate."""

    access: str
    axis: str
    value: float
    point: Point


# --------------------------------------------------------------------------- theory


def support_monomials(p, support):
    """The largest support K of Theorem 1 as a sum of monomials in the grid's variables. On the
    rare-escape grids it is K + 1 outcomes (the stay token beside the K of P): the terms K and 1,
    so the ceiling on the K axis is the theorem's exponent of K, 1. Taken whole, K + 1 has a slope
    of 0.87 over K = 2..32, and a budget growing exactly like K (within the bound) would exceed it."""
    if p.K is not None and support > p.K:
        return [p.K, support - p.K]
    return [support]


def upper_terms(access, p, support):
    """The terms of the paper's upper bounds (Theorems 2, 3 and 1), each without its constant:
    the bound is their sum, so over a grid its slope lies between the terms' slopes."""
    if access == "exact":
        return [p.n / p.eps**2]
    if access == "noisy":
        return [p.n / p.eps**2, p.n**2 * p.sigma**2 / p.eps**2]
    return [p.n**2 * k / p.eps**2 for k in support_monomials(p, support)]


def upper_log_factor(access, p):
    """The log^2(1/eps) Theorems 3 and 1 carry (Theorem 2 has none)."""
    return 1.0 if access == "exact" else math.log(1 / p.eps) ** 2


def lower_terms(access, p, support):
    """The terms of the paper's lower bounds on its hard instances (Theorems 5 and 7,
    Corollary 2), without constants: n/eps^2 for every access model, and n sigma^2 (1 v sigma^2
    is within 2 of 1 + sigma^2) or n K over eps^2 log K for noisy or sampled draws."""
    log_k = math.log(max(support, 2))  # the theorems take K >= 3; a support of 1 would divide by 0
    if access == "exact":
        return [p.n / p.eps**2]
    if access == "noisy":
        return [p.n / (p.eps**2 * log_k), p.n * p.sigma**2 / (p.eps**2 * log_k)]
    return [p.n * support / (p.eps**2 * log_k)]


class TheorySlopes(NamedTuple):
    """The bounds' slopes over one grid: `theory`, the upper bound with every constant 1;
    `ceiling`, its steepest term's (the bound's constants are not known, so a slope up to the
    steepest term's is consistent with it); the same with the log factor; `floor`, the lower
    bound's flattest term's."""

    theory: float
    ceiling: float
    ceiling_with_logs: float
    floor: float


def theory_slopes(records):
    x = [r["x"] for r in records]
    slope = lambda values: loglog_fit(x, values).slope
    upper = np.array([r["upper_terms"] for r in records])  # [points, terms]
    logs = np.array([r["upper_log_factor"] for r in records])[:, None]
    lower = np.array([r["lower_terms"] for r in records])
    return TheorySlopes(slope(upper.sum(1)), max(slope(t) for t in upper.T), max(slope(t) for t in (upper * logs).T),
                        min(slope(t) for t in lower.T))


# --------------------------------------------------------------------------- one grid point


def grid_points(s):
    base = Point(s.base.n, s.base.eps, s.base.sigma, s.base.K)
    points = []
    for grid in s.grids:
        if grid.access not in PAPER:
            raise ConfigError(f"unknown access model {grid.access!r} in bounds grids; use one of {sorted(PAPER)}")
        if grid.axis not in Point._fields:
            raise ConfigError(f"unknown grid axis {grid.axis!r}; use one of {Point._fields}")
        points += [GridPoint(grid.access, grid.axis, value, base._replace(**{grid.axis: value})) for value in grid["values"]]
    return points


def arms_at(s, grid_point):
    baselines = BASELINES[grid_point.access] if grid_point.axis in s.baseline_axes else ()
    return (PAPER[grid_point.access],) + baselines


def instance_at(instance_cfg, p):
    sizes = {"n": p.n} if p.K is None else {"n": p.n, "K": p.K}
    return build_pair(instance_cfg, **sizes)


def estimator_at(access, arm, p, pi, mu, scale):
    """(fn, sizes, oracle) for one arm at point p; the sizes are runtime arguments, so the points
    of a grid at one n share compiled programs."""
    oracle = ORACLES[access](p)
    single = max(2, math.ceil(scale / p.eps**2))
    schedule = paper_schedule(p.eps, oracle.noise_level(pi, mu), p.n, budget_constant=scale)
    return lookup(arm.estimator).fn, arm.sizes(schedule, single), oracle


def measure_point(cfg, index, grid_point):
    """Every arm's repeated estimates at one grid point, with what the fit needs to place them."""
    s, (access, axis, value, p) = cfg.study, grid_point
    pi, mu = instance_at(cfg.instance, p)
    truth, support = exact_tv(pi, mu), max(pi.max_support, mu.max_support)
    records = []
    for arm_index, arm in enumerate(arms_at(s, grid_point)):
        fn, sizes, oracle = estimator_at(access, arm, p, pi, mu, s.pilot_scale)
        started = time.perf_counter()
        est = replicate(fn, job_key(cfg.seed, index, arm_index), s.reps, pi, mu, oracle, sizes, fast_compile=cfg.fast_compile)
        seconds = time.perf_counter() - started
        records.append({
            "point": index, "access": access, "axis": axis, "x": 1 / value if axis == "eps" else value, **p._asdict(),
            "estimator": arm.label, "paper": arm is PAPER[access], "truth": truth, "support": support,
            "pilot_queries": float(est.queries[0]), "values": [float(v) for v in est.value],
            "upper_terms": upper_terms(access, p, support), "upper_log_factor": upper_log_factor(access, p),
            "lower_terms": lower_terms(access, p, support), "seconds": seconds,
        })
    return records


def point_row(record):
    """A CSV row of one measured (point, estimator): the needed budget and the pilot's error."""
    needed = needed_budget(record["values"], record["truth"], record["eps"], record["pilot_queries"])
    deviation = np.asarray(record["values"]) - record["truth"]
    return {**{k: v for k, v in record.items() if k != "values"}, "reps": len(record["values"]),
            "pilot_rmse": float(np.sqrt(np.mean(deviation**2))), "bias": needed.bias, "budget_needed": needed.budget}


# --------------------------------------------------------------------------- fits and verdicts


def exponent_table(records, seed, resamples, hard_instance):
    """One row per (access, axis, estimator): fitted exponent with its bootstrap interval, the
    theory's slopes over the same grid, and the verdict."""
    table = []
    groups = dict.fromkeys((r["access"], r["axis"], r["estimator"]) for r in records)
    for group_index, group in enumerate(groups):
        mine = sorted((r for r in records if (r["access"], r["axis"], r["estimator"]) == group), key=lambda r: r["x"])
        x = [r["x"] for r in mine]
        rng = np.random.default_rng([seed, group_index])
        fit = bootstrap_exponent(x, [r["values"] for r in mine], [r["truth"] for r in mine], [r["eps"] for r in mine],
                                 [r["pilot_queries"] for r in mine], rng, resamples)
        theory, paper = theory_slopes(mine), mine[0]["paper"]
        lower = theory.floor if hard_instance else None
        verdict = bound_verdict(fit, theory.ceiling if paper else None, theory.ceiling_with_logs if paper else None, lower)
        biases = [point_row(r)["bias"] for r in mine]
        table.append({"access": group[0], "axis": group[1], "estimator": group[2], "paper": paper,
                      "fitted": fit.slope, "ci_low": fit.low, "ci_high": fit.high, **theory._asdict(), "lower_bound": lower,
                      "verdict": verdict, "points": len(mine), "unreachable": fit.unreachable,
                      "undetermined": fit.undetermined, "reps": min(len(r["values"]) for r in mine),
                      "max_abs_bias_over_eps": max(abs(b) / r["eps"] for b, r in zip(biases, mine))})
    return table


def print_table(table):
    print(f"{'access':8s} {'axis':6s} {'estimator':26s} {'fitted':>7s} {'95% interval':>17s} {'theory':>7s} "
          f"{'ceil':>6s} {'+logs':>6s} {'floor':>6s}  verdict")
    for f in table:
        interval = f"[{f['ci_low']:6.3f}, {f['ci_high']:6.3f}]" if math.isfinite(f["ci_low"]) else "-"
        lower = f"{f['lower_bound']:6.3f}" if f["lower_bound"] is not None else "     -"
        verdict = f["verdict"] + (f" (|bias| up to {f['max_abs_bias_over_eps']:.2f} eps)" if f["unreachable"] else "")
        print(f"{f['access']:8s} {f['axis']:6s} {f['estimator']:26s} {f['fitted']:7.3f} {interval:>17s} "
              f"{f['theory']:7.3f} {f['ceiling']:6.3f} {f['ceiling_with_logs']:6.3f} {lower}  {verdict}")


def summarize(records, seed, resamples, hard_instance):
    """(exponent table, one CSV row per measured point and estimator, figures) from the measured
    points of a whole grid."""
    table = exponent_table(records, seed, resamples, hard_instance)
    rows = [point_row(r) for r in records]
    figures = {f"bounds_{a}": partial(plot, rows, table, a)
               for a in dict.fromkeys(r["access"] for r in records)}
    return table, rows, figures


def study(cfg):
    s = cfg.study
    points = grid_points(s)
    if s.point is not None and not 0 <= s.point < len(points):
        raise ConfigError(f"study.point={s.point} is not a grid point: this grid has {len(points)} "
                          f"(run them as a multirun with study.point='range(0,{len(points)})')")
    chosen = range(len(points)) if s.point is None else [s.point]
    records = [r for index in tqdm(chosen, desc="bounds points") for r in measure_point(cfg, index, points[index])]
    common = {"reps": s.reps, "pilot_scale": s.pilot_scale, "bootstrap": s.bootstrap, "hard_instance": s.hard_instance,
              "grid_points": len(points)}
    if s.point is not None:  # one job of a multirun: the summary step fits the exponents
        return StudyResult({**common, "point": s.point, "records": records}, [point_row(r) for r in records], {})
    table, rows, figures = summarize(records, cfg.seed, s.bootstrap, s.hard_instance)
    print_table(table)
    return StudyResult({**common, "exponents": table, "records": records}, rows, figures,
                       files={"exponents.csv": csv_text(table)})


# --------------------------------------------------------------------------- multirun summary


def single_point_jobs(sweep_dir):
    """The results.json records of the single-point bounds jobs under sweep_dir."""
    jobs = [json.loads(path.read_text()) for path in sorted(Path(sweep_dir).glob("**/results.json"))]
    return [job for job in jobs if job.get("study") == "bounds" and job["results"].get("point") is not None]


def summarize_sweep(sweep_dir, jobs=None):
    """Fit the exponents from a multirun folder of single-point jobs (their records, when the
    caller has read them): exponents.json, exponents.csv, points.csv and the figures, beside the
    jobs. Returns the exponent table."""
    sweep_dir = Path(sweep_dir)
    jobs = single_point_jobs(sweep_dir) if jobs is None else jobs
    if not jobs:
        raise ConfigError(f"no single-point bounds jobs (study.point=<index>) under {sweep_dir}")
    settings = {key: {job["results"][key] for job in jobs} for key in ("bootstrap", "hard_instance", "grid_points")}
    seeds = {job["seed"] for job in jobs}
    if len(seeds) > 1 or any(len(v) > 1 for v in settings.values()):
        raise ConfigError(f"the jobs under {sweep_dir} are from different studies (seeds {sorted(seeds)}, {settings})")
    (total,), found = settings["grid_points"], sorted({job["results"]["point"] for job in jobs})
    if len(found) != total:
        missing = sorted(set(range(total)) - set(found))
        raise ConfigError(f"{sweep_dir} holds {len(found)} of the grid's {total} points; missing {missing}")
    records = sorted((r for job in jobs for r in job["results"]["records"]), key=lambda r: r["point"])
    (resamples,), (hard,) = settings["bootstrap"], settings["hard_instance"]
    table, rows, figures = summarize(records, seeds.pop(), resamples, hard)
    print_table(table)
    (sweep_dir / "exponents.json").write_text(json.dumps(to_jsonable(table, nonfinite_as_string=True), indent=2))
    (sweep_dir / "exponents.csv").write_text(csv_text(table))
    write_csv(sweep_dir / "points.csv", rows)
    save_figures(sweep_dir, figures)
    print(f"[bounds] {len(table)} exponents from {len(jobs)} jobs: {sweep_dir / 'exponents.csv'}")
    return table


class BoundsSummary(Callback):
    """Hydra callback: after a multirun of single-point jobs, fit the exponents from its folder
    (a multirun over whole grids, e.g. experiment=bounds,bounds_coins, has nothing to add)."""

    def on_multirun_end(self, config, **kwargs):
        jobs = single_point_jobs(config.hydra.sweep.dir)
        if jobs:
            summarize_sweep(config.hydra.sweep.dir, jobs)


# --------------------------------------------------------------------------- figures


def line_through_centre(x, y, slope):
    """The line of `slope` on log-log axes through the geometric centre of the points (x, y)."""
    return np.exp(np.mean(np.log(y)) + slope * (np.log(x) - np.mean(np.log(x))))


def plot(rows, table, access):
    """Per axis: each estimator's needed budgets, its fitted line and 95% band, the theory's
    upper bound and (hard instances) lower bound drawn through the paper estimator's points."""
    from matplotlib.ticker import NullLocator  # matplotlib loads when a figure is drawn

    axes_names = list(dict.fromkeys(r["axis"] for r in rows if r["access"] == access))
    fig, axes = subplots(1, len(axes_names), figsize=(4.8 * len(axes_names), 4.2), squeeze=False)
    for ax, axis in zip(axes[0], axes_names):
        fits = [f for f in table if f["access"] == access and f["axis"] == axis]
        for color, f in zip(("C0", "C1", "C2", "C3"), fits):
            mine = sorted((r for r in rows if (r["access"], r["axis"], r["estimator"]) == (access, axis, f["estimator"])),
                          key=lambda r: r["x"])
            x, needed = np.array([r["x"] for r in mine]), np.array([r["budget_needed"] for r in mine])
            if f["unreachable"]:
                ok = np.isfinite(needed)
                ax.loglog(x[ok], needed[ok], "x", color=color,
                          label=f"{f['estimator']}: unreachable at {f['unreachable']}/{f['points']} (|bias| up to "
                                f"{f['max_abs_bias_over_eps']:.2f} eps)")
                continue
            ax.loglog(x, needed, "o", color=color)
            through_centre = partial(line_through_centre, x, needed)
            ax.loglog(x, through_centre(f["fitted"]), "-", color=color,
                      label=f"{f['estimator']}: {f['fitted']:.2f} [{f['ci_low']:.2f}, {f['ci_high']:.2f}]")
            if math.isfinite(f["ci_low"]):  # the band: lines at the interval's slopes through the same centre
                low, high = through_centre(f["ci_low"]), through_centre(f["ci_high"])
                ax.fill_between(x, np.minimum(low, high), np.maximum(low, high), color=color, alpha=0.2, lw=0)
        paper = sorted((r for r in rows if r["access"] == access and r["axis"] == axis and r["paper"]), key=lambda r: r["x"])
        x, needed = np.array([r["x"] for r in paper]), np.array([r["budget_needed"] for r in paper])
        upper = [sum(r["upper_terms"]) for r in paper]
        terms = np.array([r["lower_terms"] for r in paper]).T  # the flattest term, as TheorySlopes.floor
        lower = min(terms, key=lambda term: loglog_fit(x, term).slope)
        bounds = [("k--", "upper bound, unit constants", upper)]
        if fits[0]["lower_bound"] is not None:
            bounds.append(("k:", "lower bound", lower))
        ok = np.isfinite(needed) & (needed > 0)
        for style, name, bound in bounds:
            bound = np.asarray(bound)
            if ok.any():  # through the paper estimator's points (geometric mean): slopes compare, not constants
                bound = bound * np.exp(np.mean(np.log(needed[ok] / bound[ok])))
            ax.loglog(x, bound, style, label=f"{name} (slope {loglog_fit(x, bound).slope:.2f})")
        ax.xaxis.set_minor_locator(NullLocator())  # the grid's own values as ticks: a decade or so has few labels
        ax.set_xticks(x, [f"{value:.3g}" for value in x])
        ax.set_xlabel("1/eps" if axis == "eps" else axis)
        ax.set_ylabel("queries for RMSE = eps")
        ax.set_title(f"{access} access: budget vs {'1/eps' if axis == 'eps' else axis}")
        ax.legend(fontsize=6.5)
    return fig


@hydra.main(config_path="../configs", config_name="bounds", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--summarize"]:
        if len(sys.argv) != 3:
            sys.exit("usage: python experiments/bounds.py --summarize SWEEP_DIR")
        summarize_sweep(sys.argv[2])
    else:
        main()
        finish()  # results written: skip Python's teardown
