"""The benchmark workloads through tvjax's public estimators: every repetition of a task runs inside
one compiled program (`lax.map` over repetition keys), and every program is compiled ahead of the
runs (`lower().compile()`), timed apart.

Run by benchmarks/run.py as `python tvjax_bench.py plan.json workload out.json`.
"""

import functools

import jax
import numpy as np

import tvjax
from tvjax.estimators import Schedule
from measure import timed, worker_main


def make_oracle(task):
    if task["oracle"] == "noisy":
        return tvjax.Noisy(task["sigma"])
    return tvjax.Exact() if task["oracle"] == "exact" else tvjax.Sampler()


def estimator(task, oracle):
    """(key, pi, mu) -> Estimate of one repetition of the task."""
    if task["estimator"] == "likelihood_ratio":
        return lambda key, pi, mu: tvjax.likelihood_ratio(key, pi, mu, oracle, num_samples=task["num_samples"][0])
    schedule = Schedule(tuple(task["num_samples"]), tuple(task["repeats"]))
    return lambda key, pi, mu: tvjax.multilevel(key, pi, mu, oracle, schedule)


def repetitions(task):
    """(pair, keys) -> (values, per-level variances) of every repetition, one after another."""
    one = estimator(task, make_oracle(task))

    def run(pair, keys):
        return jax.lax.map(lambda key: (lambda e: (e.value, e.levels.variance))(one(key, *pair)), keys)

    return run


def compile_task(pairs, task):
    # The pair is an argument, not a closed-over constant: its arrays must not be folded into the program.
    args = (pairs(task["n"]), jax.random.split(jax.random.key(task["seed"]), task["reps"]))
    return jax.jit(repetitions(task)).lower(*args).compile(), args


def prepare(pairs, tasks):
    """Compile every task's program ahead of the runs."""
    return [compile_task(pairs, task) for task in tasks]


def run_task(compiled, task):
    program, args = compiled
    (values, variances), seconds = timed(lambda: jax.block_until_ready(program(*args)))
    level_variance = np.mean(np.asarray(variances), axis=0).tolist()
    return {"label": task["label"], "run": seconds, "reps_run": task["reps"],
            "values": np.asarray(values).tolist(), "level_variance": level_variance}


def setup(plan):
    """n -> the plan's block pair at sequence length n (the scaling workload varies n)."""
    return functools.lru_cache(lambda n: tvjax.block_pair(**{**plan["instance"], "n": n}))


if __name__ == "__main__":
    worker_main(setup, prepare, run_task)
