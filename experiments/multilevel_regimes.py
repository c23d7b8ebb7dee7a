"""Hydra app: multilevel regimes and the variance-ratio diagnostic (paper appendix B.2).

    .venv/bin/python experiments/multilevel_regimes.py [smoke=true]

At each sigma: rho_l = Var(Z_{r_l} - Z_{r_{l-1}}) / Var(Z_{r_l}) between consecutive levels on the
same trajectories with nested draws (ratio_trajectories per side), and the mean absolute error of
Algorithm 3 against its query budget over `reps` repetitions for 1..L levels (N_l = s * base_sizes;
fewer levels drop the coarsest), plus a single level at the finest r given the two-level budget.
Every schedule is padded to the deepest one's length, and the schedules that share their repeat
counts run as copies of one call (per-copy level sizes), so the study compiles one program for
its estimates and makes a handful of calls.
"""

import functools
import math
from functools import partial

import hydra
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from tvjax.core import cost
from tvjax.core.currency import mixture_z
from tvjax.core.estimators import lookup
from tvjax.core.instances import exact_tv
from tvjax.core.oracles import Noisy
from tvjax.core.programs import BRIEF_RUN_OPTIONS, compiler_options, saved_program
from tvjax.core.schedules import Samples, Schedule, pad_schedule
from tvjax.core.studies import errors, job_key, random_words, replicate
from tvjax.studykit import StudyResult, build_pair, finish, run_study, subplots

READS = ("seed", "fast_compile", "instance", "study")


def nested_z(key, pi, mu, oracle, repeats, num):
    """Z_{r_l}(X) for every level l on the same X with nested draws: [2 num, L], num from each side
    (both sides' trajectories drawn through one sampler, vmapped over the sides: one to compile)."""
    return _nested_z_program(tuple(repeats), num)(key, pi, mu, oracle)


@functools.cache
def _nested_z_program(repeats, num):
    # Its code is this file's and tvjax's: saved whole in the compilation cache, keyed on both.
    # It runs once per sigma on ratio_trajectories per side: compiled for a brief run.
    jitted = jax.jit(functools.partial(_nested_z, repeats=repeats, num=num), compiler_options=compiler_options(BRIEF_RUN_OPTIONS))
    return saved_program(jitted, ("nested_z", repeats, num), sources=(__file__,))


def _nested_z(key, pi, mu, oracle, repeats, num):
    k_sample, k_score = jax.random.split(key)
    draw = oracle.side_sampler((pi, mu))
    paths = jax.vmap(lambda k, side: draw(k, num, side))(jax.random.split(k_sample), jnp.arange(2))
    paths = jax.tree.map(lambda a: a.reshape((2 * num,) + a.shape[2:]), paths)
    return mixture_z(*oracle.nested_path_logprobs(k_score, (pi, mu), paths, repeats))


def variance_ratios(z):
    """rho_l = Var(Z_l - Z_{l-1}) / Var(Z_l) for l = 1..L-1 from [num, L] level values."""
    z = np.asarray(z, np.float64)
    return np.var(np.diff(z, axis=1), axis=0, ddof=1) / np.var(z[:, 1:], axis=0, ddof=1)


def depth_schedules(repeats, base_sizes, scale):
    """{levels: Schedule} for 1..L levels at scale s: fewer levels drop the coarsest ones."""
    sizes = [scale * b for b in base_sizes]
    return {d: Schedule(tuple(sizes[-d:]), tuple(repeats[-d:])) for d in range(1, len(repeats) + 1)}


def matched_single_level(schedule, n, repeats):
    """One level at `repeats` with (about) the queries of `schedule`."""
    budget = cost.schedule_queries(schedule, n)
    return Schedule((max(2, round(budget / cost.symmetric_queries(1, n, repeats))),), (repeats,))


def batched_jobs(schedules, levels):
    """Indices of `schedules` in batches that share their repeat counts padded to `levels`, every
    batch of one size (the greatest common divisor of the groups' sizes): each batch is then one
    call of one compiled program."""
    groups = {}
    for job, schedule in enumerate(schedules):
        groups.setdefault(pad_schedule(schedule, levels).repeats, []).append(job)
    size = math.gcd(*map(len, groups.values()))
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def batch_sizes(schedules, levels, reps):
    """Schedules sharing padded repeat counts as one Schedule of per-copy level sizes: `reps`
    copies of each schedule in turn, as runtime arrays."""
    padded = [pad_schedule(schedule, levels) for schedule in schedules]
    if len({p.repeats for p in padded}) != 1:
        raise ValueError(f"a batch's schedules must share their repeat counts, got {[p.repeats for p in padded]}")
    counts = np.repeat(np.array([p.num_samples for p in padded], np.int32), reps, axis=0)
    return Schedule(counts, np.asarray(padded[0].repeats, np.int32))


def study(cfg):
    s = cfg.study
    multilevel = lookup("multilevel")
    pi, mu = build_pair(cfg.instance)
    truth = exact_tv(pi, mu)
    repeats = tuple(s.repeats)
    rows, rho = [], {}
    # The diagnostic draws every level's sum on one set of trajectories: a one-sided estimate's
    # words (sample and first sums, per side) plus L - 1 more sums per drawn cell.
    one_sided = random_words(pi, Noisy(0.0), Samples(s.ratio_trajectories), 2)
    cells = 2 * 2 * s.ratio_trajectories * len(getattr(pi, "stochastic_positions", range(pi.n)))
    words = len(s.sigmas) * (one_sided + cells * (len(repeats) - 1))
    for index, sigma in enumerate(s.sigmas):
        rho[sigma] = variance_ratios(nested_z(job_key(cfg.seed, 0, index), pi, mu, Noisy(sigma), repeats, s.ratio_trajectories))
        rows += [{"kind": "rho", "sigma": sigma, "level": l + 1, "r_coarse": repeats[l], "r_fine": repeats[l + 1], "rho": v}
                 for l, v in enumerate(rho[sigma])]
        print(f"sigma={sigma}: rho = {np.round(rho[sigma], 4).tolist()}")
    jobs = []
    for scale in s.scales:
        schedules = depth_schedules(repeats, s.base_sizes, scale)
        jobs += [(f"{d} level{'s' * (d > 1)}", scale, sched) for d, sched in schedules.items()]
        jobs.append((f"single r={repeats[-1]} at 2-level budget", scale, matched_single_level(schedules[2], pi.n, repeats[-1])))
    # Jobs that share (padded) repeat counts run as copies of one call: fewer, longer streams.
    estimates = {}
    for batch_index, batch in enumerate(tqdm(batched_jobs([job[2] for job in jobs], len(repeats)), desc="multilevel batches")):
        sizes = batch_sizes([jobs[job][2] for job in batch], len(repeats), s.reps)
        for index, sigma in enumerate(s.sigmas):
            est = replicate(multilevel.fn, job_key(cfg.seed, 1, batch_index, index), s.reps * len(batch), pi, mu,
                            Noisy(sigma), sizes, fast_compile=cfg.fast_compile)
            for position, job in enumerate(batch):
                part = slice(position * s.reps, (position + 1) * s.reps)
                estimates[job, sigma] = jax.tree.map(lambda a, part=part: a[part], est)
    for job, (label, scale, schedule) in enumerate(jobs):
        for sigma in s.sigmas:
            est = estimates[job, sigma]
            words += random_words(pi, Noisy(sigma), schedule, s.reps)
            mae, rmse, bias = errors(est.value, truth)
            rows.append({"kind": "mae", "sigma": sigma, "method": label, "scale": scale, "queries": float(est.queries[0]),
                         "mae": mae, "rmse": rmse, "bias": bias, "reps": s.reps,
                         "num_samples": list(schedule.num_samples), "repeats": list(schedule.repeats)})
    summary = {"truth": truth, "rho": {str(k): v.tolist() for k, v in rho.items()}, "repeats": list(repeats),
               "reps": s.reps}
    figures = {"mae_vs_budget": partial(plot_mae, rows, s.sigmas, truth), "variance_ratios": partial(plot_rho, rho, repeats)}
    return StudyResult(summary, rows, figures, words)


def plot_mae(rows, sigmas, truth):
    fig, axes = subplots(1, len(sigmas), figsize=(4.5 * len(sigmas), 4), squeeze=False)
    for ax, sigma in zip(axes[0], sigmas):
        mine = [r for r in rows if r["kind"] == "mae" and r["sigma"] == sigma]
        for label in dict.fromkeys(r["method"] for r in mine):
            pts = sorted((r["queries"], r["mae"]) for r in mine if r["method"] == label)
            ax.loglog(*zip(*pts), "o-" if "single" not in label else "s--", label=label)
        ax.set_title(f"sigma = {sigma} (TV = {truth:.3f})")
        ax.set_xlabel("queries")
        ax.set_ylabel("mean absolute error")
        ax.legend(fontsize=7)
    return fig


def plot_rho(rho, repeats):
    fig, ax = subplots(figsize=(5, 4))
    labels = [f"{a}->{b}" for a, b in zip(repeats, repeats[1:])]
    width = 0.8 / len(rho)
    for i, (sigma, values) in enumerate(rho.items()):
        ax.bar(np.arange(len(labels)) + i * width, values, width, label=f"sigma = {sigma}")
    ax.set_xticks(np.arange(len(labels)) + width * (len(rho) - 1) / 2, labels)
    ax.set_yscale("log")
    ax.set_xlabel("levels r_{l-1} -> r_l")
    # Plain text, not mathtext: the parser costs a short study more than its figures.
    ax.set_ylabel("\N{GREEK SMALL LETTER RHO}_l = Var(Z(r_l) \N{MINUS SIGN} Z(r_l-1)) / Var(Z(r_l))")
    ax.legend()
    return fig


@hydra.main(config_path="../configs", config_name="multilevel_regimes", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
