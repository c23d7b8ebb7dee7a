"""The three workloads of the paper's appendix (B.2, B.11) as explicit task lists shared by both
implementations, with schedules, query counts and the true TV computed once by tvjax."""

import math

import numpy as np

import tvjax
from tvjax.core import cost
from tvjax.core.schedules import paper_schedule

INSTANCE = {"seed": 10, "n": 128, "block_bits": 12, "p_active": 0.4, "alpha": 0.49}
# Accuracy grid for fitting a paper schedule to a query budget (smallest feasible eps wins).
EPS_GRID = (0.5, 0.35, 0.25, 0.18, 0.125, 0.09, 0.0625, 0.044, 0.03125)
FULL = {
    "convergence": {"reps": 512, "sizes": [2**k for k in range(5, 15)]},
    "multilevel": {"reps": 24, "sigmas": [0.04, 0.5, 0.8], "repeats": [1, 8, 32, 256],
                   "base": [171, 30, 8, 1], "scales": [1, 2, 4, 8, 16, 32], "ratio_samples": 4096},
    "access": {"reps": 64, "sigmas": [0.04, 0.16, 0.5], "budgets": [1e5, 1e6, 1e7, 1e8]},
    "scaling": {"sizes": [2**k for k in range(10, 19, 2)], "lengths": [32, 128, 512, 2048],
                "repeats": [1, 16, 256, 4096], "num": 4096},
}
QUICK = {
    "convergence": {"reps": 16, "sizes": [2**k for k in range(5, 12)]},
    "multilevel": {"reps": 2, "sigmas": [0.04, 0.5, 0.8], "repeats": [1, 8, 32, 256],
                   "base": [171, 30, 8, 1], "scales": [1, 2], "ratio_samples": 512},
    "access": {"reps": 2, "sigmas": [0.04, 0.16, 0.5], "budgets": [1e5, 1e6]},
    "scaling": {"sizes": [2**10, 2**12], "lengths": [32, 128], "repeats": [1, 16], "num": 512},
}


def fit_schedule(budget, sigma, n):
    """The deepest paper schedule whose level sizes, scaled to spend `budget`, stay >= 2 per side;
    if none fits, the first level of the shallowest one with 2 trajectories per side."""
    for eps in sorted(EPS_GRID):
        base = paper_schedule(eps, sigma, n)
        scale = budget / cost.schedule_queries(base, n)
        counts = [round(num * scale) for num in base.num_samples]
        if min(counts) >= 2:
            return counts, list(base.repeats)
    return [2], [paper_schedule(max(EPS_GRID), sigma, n).repeats[0]]


def task(label, estimator, oracle, sigma, num_samples, repeats, reps, seed, n=INSTANCE["n"]):
    if estimator == "likelihood_ratio":
        queries = cost.trajectory_queries(num_samples[0], n, 1)
    else:
        queries = cost.schedule_queries((num_samples, repeats), n)
    return {"label": label, "estimator": estimator, "oracle": oracle, "sigma": sigma, "num_samples": num_samples,
            "repeats": repeats, "reps": reps, "seed": seed, "n": n, "queries": queries}


def convergence(cfg):
    return [task(f"N={num}", "likelihood_ratio", "exact", 0.0, [num], [1], cfg["reps"], i)
            for i, num in enumerate(cfg["sizes"])]


def multilevel(cfg):
    tasks = []
    for sigma in cfg["sigmas"]:
        for s in cfg["scales"]:
            counts = [s * b for b in cfg["base"]]
            tasks.append(task(f"sigma={sigma} s={s}", "multilevel", "noisy", sigma, counts, cfg["repeats"], cfg["reps"],
                              len(tasks)))
        counts = [cfg["ratio_samples"]] * len(cfg["repeats"])
        tasks.append(task(f"sigma={sigma} variance ratio", "multilevel", "noisy", sigma, counts, cfg["repeats"], 1, len(tasks)))
    return tasks


def access(cfg, n=INSTANCE["n"], support=2):
    tasks = []
    for budget in cfg["budgets"]:
        num = max(2, cost.trajectories_for_budget(budget, n))
        tasks.append(task(f"exact B={budget:.0e}", "likelihood_ratio", "exact", 0.0, [num], [1], cfg["reps"], len(tasks)))
        for sigma in cfg["sigmas"]:
            tasks.append(task(f"noisy {sigma} B={budget:.0e}", "multilevel", "noisy", sigma,
                              *fit_schedule(budget, sigma, n), cfg["reps"], len(tasks)))
        tasks.append(task(f"sample-only B={budget:.0e}", "multilevel", "sampler", 0.0,
                          *fit_schedule(budget, math.sqrt(support), n), cfg["reps"], len(tasks)))
    return tasks


def scaling(cfg):
    """tvjax only: throughput against N (exact), n (noisy, r = 8) and r (noisy and sampler)."""
    num = cfg["num"]
    tasks = [task(f"N={size}", "likelihood_ratio", "exact", 0.0, [size], [1], 1, 0) for size in cfg["sizes"]]
    tasks += [task(f"n={n}", "multilevel", "noisy", 0.5, [num], [8], 1, 0, n=n) for n in cfg["lengths"]]
    for oracle in ("noisy", "sampler"):
        tasks += [task(f"{oracle} r={r}", "multilevel", oracle, 0.5, [num], [r], 1, 0) for r in cfg["repeats"]]
    return tasks


def build(quick, numpy_query_cap, instance_file):
    """The plan (JSON-able) and the instance arrays written for the NumPy side."""
    cfg = QUICK if quick else FULL
    pi, mu = tvjax.block_pair(**INSTANCE)
    np.savez(instance_file, hidden_paths=np.asarray(pi.hidden_paths), pi_final_p1=np.asarray(pi.final_p1),
             mu_final_p1=np.asarray(mu.final_p1), block_bits=INSTANCE["block_bits"])
    workloads = {"convergence": convergence(cfg["convergence"]), "multilevel": multilevel(cfg["multilevel"]),
                 "access": access(cfg["access"]), "scaling": scaling(cfg["scaling"])}
    for tasks in workloads.values():
        for t in tasks:
            capped = math.isfinite(numpy_query_cap)
            t["numpy_reps"] = min(t["reps"], max(1, int(numpy_query_cap // t["queries"]))) if capped else t["reps"]
    return {"instance": INSTANCE, "instance_file": str(instance_file), "true_tv": tvjax.exact_tv(pi, mu),
            "quick": quick, "workloads": workloads}
