"""Hydra app: coverage of the anytime-valid TV estimates, and what stopping early costs.

    .venv/bin/python experiments/coverage.py [smoke=true]

For each arm (an instance and an access model), `seeds` independent runs of
`tvjax.audit.sequential.anytime_tv` for `rounds` rounds of `round_size` observations: the share of
seeds whose interval holds the exact TV after every round (the sequence promises at least
1 - delta), and the interval's width. Then one run per seed stopped at the first round whose
half-width is at most eps (within `stop_within_rounds`), against the fixed-size `estimate_tv`
at the same eps and delta: its queries and its error.
"""

from functools import partial

import hydra
import numpy as np
from tqdm import tqdm

from tvjax.audit.sequential import anytime_tv
from tvjax.core.api import estimate_tv
from tvjax.core.instances import exact_tv
from tvjax.core.studies import job_key
from tvjax.studykit import StudyResult, build_pair, finish, run_study, subplots

READS = ("seed", "instance", "study")


def run_arm(cfg, arm_index, arm, pi, mu, truth):
    """(row, the interval widths [seeds, rounds]) of one arm."""
    s = cfg.study
    covered, widths, stopped_queries, stopped_errors = [], [], [], []
    for seed in range(s.seeds):
        key, inside, path = job_key(cfg.seed, arm_index, seed), True, []
        stop = None
        for estimate in anytime_tv(key, pi, mu, arm.access, s.delta, s.budget, s.round_size, arm.get("sigma")):
            inside &= estimate.low <= truth <= estimate.high
            path.append(estimate.high - estimate.low)
            if stop is None and (estimate.high - estimate.low) / 2 <= s.eps:
                stop = estimate
            if estimate.rounds >= s.rounds and (stop is not None or estimate.rounds >= s.stop_within_rounds):
                break
        covered.append(inside)
        widths.append(path[: s.rounds])
        stopped_queries.append(stop.queries if stop else np.nan)
        stopped_errors.append(abs(stop.value - truth) if stop else np.nan)
    fixed = estimate_tv(job_key(cfg.seed, arm_index, s.seeds), pi, mu, arm.access, eps=s.eps, delta=s.delta,
                        sigma=arm.get("sigma"))
    rate = float(np.mean(covered))
    row = {"arm": arm.label, "access": arm.access, "sigma": arm.get("sigma"), "truth": truth, "seeds": s.seeds,
           "rounds": s.rounds, "round_size": s.round_size, "delta": s.delta, "covered_every_round": rate,
           "covered_stderr": float(np.sqrt(rate * (1 - rate) / s.seeds)),
           "final_width": float(np.mean([w[-1] for w in widths])), "eps": s.eps,
           "stopped_queries_median": float(np.nanmedian(stopped_queries)),
           "stopped_abs_error_max": float(np.nanmax(stopped_errors)),
           "fixed_queries": float(fixed.queries), "fixed_abs_error": abs(float(fixed.value) - truth),
           "stopped_over_fixed": float(np.nanmedian(stopped_queries)) / float(fixed.queries)}
    return row, np.array([w + [np.nan] * (s.rounds - len(w)) for w in widths])


def study(cfg):
    rows, widths = [], {}
    for arm_index, arm in enumerate(tqdm(cfg.study.arms, desc="coverage arms")):
        pi, mu = build_pair(cfg.instance if arm.get("instance") is None else arm.instance)
        row, widths[arm.label] = run_arm(cfg, arm_index, arm, pi, mu, exact_tv(pi, mu))
        rows.append(row)
        print(f"{arm.label:32s} covered at every round {row['covered_every_round']:.3f} (need >= {1 - cfg.study.delta:g}); "
              f"stopped at half-width {cfg.study.eps}: {row['stopped_queries_median']:.3g} queries vs fixed "
              f"{row['fixed_queries']:.3g}")
    summary = {row["arm"]: {k: row[k] for k in ("covered_every_round", "final_width", "stopped_over_fixed")} for row in rows}
    return StudyResult(summary, rows, {"coverage": partial(plot, rows, widths, cfg.study.round_size)})


def plot(rows, widths, round_size):
    fig, ax = subplots(figsize=(6, 4.5))
    for row in rows:
        w = widths[row["arm"]]
        x = round_size * np.arange(1, w.shape[1] + 1)
        ax.loglog(x, np.nanmean(w, axis=0), "o-", label=f"{row['arm']} (covered {row['covered_every_round']:.3f})")
    from matplotlib.ticker import NullLocator  # matplotlib loads when a figure is drawn

    ax.xaxis.set_minor_locator(NullLocator())  # ticks at the doublings of a round: fewer than a decade's minor labels
    ticks = [round_size * 2**k for k in range(int(np.log2(w.shape[1])) + 1)]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("observations (one trajectory from each side)")
    ax.set_ylabel("interval width (mean over seeds)")
    ax.set_title("anytime-valid intervals: width by round")
    ax.legend(fontsize=7)
    return fig


@hydra.main(config_path="../configs", config_name="coverage", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
