"""The benchmark workloads through tvjax's public estimators, one compiled program per estimator
and access model of a workload (convergence: 1; multilevel: 1; access: 3).

Everything that differs between the tasks sharing a program is a runtime argument: level sizes,
repeat counts, sigma, the number of repetitions (the estimator's `copies`, padded with empty
copies to the workload's largest count) and, for multilevel schedules of different depths,
empty padding levels (`pad_schedule`). Each program is
compiled ahead of the runs (`lower().compile()`), timed apart.

Run by benchmarks/run.py as `python tvjax_bench.py plan.json workload out.json`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import tvjax
from tvjax.core.estimators import lookup
from tvjax.core.programs import enable_compilation_cache, jit_program
from tvjax.core.schedules import Samples, Schedule, pad_schedule

from measure import timed, worker_main

ORACLES = {"exact": lambda sigma: tvjax.Exact(), "noisy": tvjax.Noisy, "sampler": lambda sigma: tvjax.Sampler()}


def program_key(task):
    return task["estimator"], task["oracle"], task["n"]


def repetitions(estimator, kind, copies):
    """(pair, key, reps, sigma, counts [L], repeats [L]) -> values [copies], level variances
    [copies, L]: the first `reps` copies run the task's sizes, the rest are empty (zero sizes cost
    nothing). All repetitions are copies of one estimator call, sharing one stream of chunks."""

    def run(pair, key, reps, sigma, counts, repeats):
        per_copy = jnp.where((jnp.arange(copies) < reps)[:, None], counts[None, :], 0)
        sizes = Samples(per_copy[:, 0]) if estimator == "likelihood_ratio" else Schedule(per_copy, repeats)
        e = lookup(estimator).fn(key, *pair, ORACLES[kind](sigma), sizes, copies=copies)
        return e.value, e.levels.variance

    return jit_program(run)


def arguments(pairs, task, levels):
    """The task as runtime arguments of its workload's program."""
    counts, repeats = pad_schedule(Schedule(task["num_samples"], task["repeats"]), levels)
    return (pairs(task["n"]), jax.random.key(task["seed"]), task["reps"], np.float32(task["sigma"]),
            np.asarray(counts, np.int32), np.asarray(repeats, np.int32))


def prepare(pairs, tasks):
    """Compile one program per (estimator, access model, n) of the workload, ahead of the runs."""
    groups = {}
    for task in tasks:
        groups.setdefault(program_key(task), []).append(task)
    programs = {}
    for (estimator, kind, n), members in groups.items():
        copies, levels = max(t["reps"] for t in members), max(len(t["repeats"]) for t in members)
        args = arguments(pairs, members[0], levels)
        programs[estimator, kind, n] = repetitions(estimator, kind, copies).lower(*args).compile(), levels
    return [(programs[program_key(task)], task, pairs) for task in tasks]


def run_task(runnable, task):
    (program, levels), _, pairs = runnable
    args = arguments(pairs, task, levels)
    (values, variances), seconds = timed(lambda: jax.block_until_ready(program(*args)))
    reps, levels = task["reps"], len(task["repeats"])
    level_variance = np.mean(np.asarray(variances)[:reps, :levels], axis=0).tolist()
    return {"label": task["label"], "run": seconds, "reps_run": reps,
            "values": np.asarray(values)[:reps].tolist(), "level_variance": level_variance}


def setup(plan):
    """n -> the plan's block pair at sequence length n (the scaling workload varies n)."""
    return functools.lru_cache(lambda n: tvjax.block_pair(**{**plan["instance"], "n": n}))


if __name__ == "__main__":
    enable_compilation_cache()  # the compile column is then a cache load after the first run
    worker_main(setup, prepare, run_task)
