"""Repeated estimates and their summaries, for studies in Hydra apps, notebooks or scripts
(no Hydra, no plotting: those live beside the apps in experiments/).

    spec = REGISTRY["likelihood_ratio"]
    est = replicate(spec.fn, key, 512, pi, mu, Exact(), Samples(np.int32(4096)))
    mae, rmse, bias = errors(est.value, exact_tv(pi, mu))
"""

import functools
import math
from typing import NamedTuple

import jax
import numpy as np

from tvjax.programs import jit_program


class Fit(NamedTuple):
    """Least-squares line log(y) = intercept + slope * log(x)."""

    slope: float
    intercept: float
    points: int


def replicate(fn, key, reps, pi, mu, oracle, sizes, fast_compile=False):
    """fn(key, pi, mu, oracle, sizes, copies=reps) as numpy: `reps` independent estimates from
    one stream of rows, stacked along a leading axis. `sizes` (the estimator's NamedTuple) is a
    runtime argument, so one compiled program, cached per (fn, reps, fast_compile) and the
    shapes of the arguments, serves every size of a study; pass numpy arrays (e.g.
    `schedules.as_runtime`) for sizes that change between calls. fast_compile lowers XLA's
    backend optimization (about 2x faster compiles, slower runs)."""
    return jax.tree.map(np.asarray, _replicated(fn, reps, fast_compile)(key, pi, mu, oracle, sizes))


@functools.lru_cache(maxsize=None)
def _replicated(fn, copies, fast_compile):
    return jit_program(lambda key, pi, mu, oracle, sizes: fn(key, pi, mu, oracle, sizes, copies=copies), fast_compile)


def errors(values, truth):
    """(mean absolute error, root mean squared error, bias) of repeated estimates."""
    deviation = np.asarray(values, np.float64) - truth
    return float(np.mean(np.abs(deviation))), float(np.sqrt(np.mean(deviation**2))), float(np.mean(deviation))


def loglog_fit(x, y):
    """Least-squares slope of log y against log x over the finite, positive points."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if keep.sum() < 2:
        return Fit(math.nan, math.nan, int(keep.sum()))
    slope, intercept = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
    return Fit(float(slope), float(intercept), int(keep.sum()))
