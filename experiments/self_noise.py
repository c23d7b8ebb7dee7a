"""Hydra app: the self-noise floor (the idea of the paper's Figure 2).

    .venv/bin/python experiments/self_noise.py [smoke=true]

The single-level plug-in estimate against the repeat count r for (a) one process against itself,
each side behind an independent noisy oracle (true TV 0: the estimate is pure noise and falls to
0 as r grows) and (b) the instance's pair (levels off at the true TV).
"""


import itertools
from functools import partial

import hydra
import numpy as np
from tqdm import tqdm

from tvjax.core.estimators import lookup
from tvjax.core.instances import exact_tv
from tvjax.core.oracles import Noisy
from tvjax.core.studies import errors, job_key, replicate
from tvjax.studykit import StudyResult, build_pair, finish, run_study, subplots

READS = ("seed", "fast_compile", "instance", "study")


def study(cfg):
    s = cfg.study
    plugin = lookup("plugin")
    pi, mu = build_pair(cfg.instance)
    pairs = {"identical (pi vs pi)": (pi, pi, 0.0), "different (pi vs mu)": (pi, mu, exact_tv(pi, mu))}
    rows = []
    for index, r in enumerate(tqdm(s.repeats, desc="self-noise r")):
        for job, (sigma, (label, (a, b, truth))) in enumerate(itertools.product(s.sigmas, pairs.items())):
            sizes = plugin.sizes(np.int32(s.num_per_side), np.int32(r))
            values = replicate(plugin.fn, job_key(cfg.seed, index, job), s.reps, a, b, Noisy(sigma), sizes,
                               fast_compile=cfg.fast_compile).value
            _, rmse, bias = errors(values, truth)
            rows.append({"pair": label, "sigma": sigma, "r": r, "truth": truth, "mean": float(np.mean(values)),
                         "std": float(np.std(values, ddof=1)), "bias": bias, "rmse": rmse, "reps": s.reps})
    top = max(s.repeats)
    summary = {f"{row['pair']} sigma={row['sigma']} at r={top}": row["mean"] for row in rows if row["r"] == top}
    summary["truth_different"] = pairs["different (pi vs mu)"][2]
    return StudyResult(summary, rows, {"self_noise": partial(plot, rows, s.sigmas, pairs)})


def plot(rows, sigmas, pairs):
    fig, ax = subplots(figsize=(6, 4.5))
    for sigma in sigmas:
        for label in pairs:
            pts = sorted((r["r"], r["mean"], r["std"]) for r in rows if r["pair"] == label and r["sigma"] == sigma)
            x, m, sd = map(np.array, zip(*pts))
            ax.errorbar(x, m, yerr=sd, fmt="o-", capsize=3, label=f"{label}, sigma={sigma}")
    for _, _, truth in pairs.values():
        ax.axhline(truth, color="k", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("repeats r per position")
    ax.set_ylabel("plug-in TV estimate")
    ax.set_title("self-noise floor (dotted: true TV)")
    ax.legend(fontsize=7)
    return fig


@hydra.main(config_path="../configs", config_name="self_noise", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
