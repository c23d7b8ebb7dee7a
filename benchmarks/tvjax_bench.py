"""The benchmark workloads through tvjax's public estimators, one compiled program per estimator
and access model of a workload (convergence: 1; multilevel: 1; access: 3).

Everything that differs between the tasks sharing a program is a runtime argument: level sizes,
repeat counts, sigma, the number of repetitions (a loop over a padded key array) and, for
multilevel schedules of different depths, empty padding levels (`pad_schedule`). Each program is
compiled ahead of the runs (`lower().compile()`), timed apart.

Run by benchmarks/run.py as `python tvjax_bench.py plan.json workload out.json`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import tvjax
from tvjax.estimators import Schedule, pad_schedule
from measure import timed, worker_main

ORACLES = {"exact": lambda sigma: tvjax.Exact(), "noisy": tvjax.Noisy, "sampler": lambda sigma: tvjax.Sampler()}


def program_key(task):
    return task["estimator"], task["oracle"], task["n"]


def one_estimate(estimator, kind, key, pair, sigma, counts, repeats):
    oracle = ORACLES[kind](sigma)
    if estimator == "likelihood_ratio":
        return tvjax.likelihood_ratio(key, *pair, oracle, num_samples=counts[0])
    return tvjax.multilevel(key, *pair, oracle, Schedule(counts, repeats))


def repetitions(estimator, kind):
    """(pair, keys [R], reps, sigma, counts [L], repeats [L]) -> values [R], level variances [R, L]
    of the first `reps` repetitions (the rest stay zero)."""

    def run(pair, keys, reps, sigma, counts, repeats):
        def body(i, out):
            e = one_estimate(estimator, kind, keys[i], pair, sigma, counts, repeats)
            return out[0].at[i].set(e.value), out[1].at[i].set(e.levels.variance)

        zeros = (jnp.zeros(keys.shape[0]), jnp.zeros((keys.shape[0], counts.shape[0])))
        return jax.lax.fori_loop(0, reps, body, zeros)

    return jax.jit(run)


def arguments(pairs, task, max_reps, levels):
    """The task as runtime arguments of its workload's program."""
    counts, repeats = pad_schedule(Schedule(task["num_samples"], task["repeats"]), levels)
    keys = jax.random.split(jax.random.key(task["seed"]), max_reps)
    return (pairs(task["n"]), keys, task["reps"], np.float32(task["sigma"]), np.asarray(counts, np.int32),
            np.asarray(repeats, np.int32))


def prepare(pairs, tasks):
    """Compile one program per (estimator, access model, n) of the workload, ahead of the runs."""
    groups = {}
    for task in tasks:
        groups.setdefault(program_key(task), []).append(task)
    programs = {}
    for (estimator, kind, n), members in groups.items():
        shape = (max(t["reps"] for t in members), max(len(t["repeats"]) for t in members))
        args = arguments(pairs, members[0], *shape)
        programs[estimator, kind, n] = repetitions(estimator, kind).lower(*args).compile(), shape
    return [(programs[program_key(task)], task, pairs) for task in tasks]


def run_task(runnable, task):
    (program, shape), _, pairs = runnable
    args = arguments(pairs, task, *shape)
    (values, variances), seconds = timed(lambda: jax.block_until_ready(program(*args)))
    reps, levels = task["reps"], len(task["repeats"])
    level_variance = np.mean(np.asarray(variances)[:reps, :levels], axis=0).tolist()
    return {"label": task["label"], "run": seconds, "reps_run": reps,
            "values": np.asarray(values)[:reps].tolist(), "level_variance": level_variance}


def setup(plan):
    """n -> the plan's block pair at sequence length n (the scaling workload varies n)."""
    return functools.lru_cache(lambda n: tvjax.block_pair(**{**plan["instance"], "n": n}))


if __name__ == "__main__":
    worker_main(setup, prepare, run_task)
