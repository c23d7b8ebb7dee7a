"""The front door: one call from (pi, mu, access model, eps, delta) to a TV estimate with a
confidence interval and a query count, using the paper's algorithm for that access model."""

import math
from statistics import NormalDist
from typing import NamedTuple

import jax
import jax.numpy as jnp

from tvjax.core.estimators import Estimate, lookup
from tvjax.core.oracles import ACCESS_MODELS, LogitNoise, Noisy
from tvjax.core.schedules import MAX_COUNT, Samples, groups_for_confidence, paper_schedule
from tvjax.core.validate import check_key, check_pair, check_range, is_concrete


class TVEstimate(NamedTuple):
    value: jax.Array
    stderr: jax.Array
    ci_low: jax.Array
    ci_high: jax.Array
    queries: jax.Array
    bias: jax.Array  # estimated bias left at the top level (0 for a single level), inside the CI
    estimate: Estimate  # the underlying estimator's result, with per-level diagnostics


def top_level_bias(levels):
    """Bias left at the finest level, extrapolated from the last coupled increment.

    The plug-in bias decays at least like r^(-1/2) (slower than the second-order r^(-1) of cells
    with a real difference), so with b(r) = C r^(-1/2), E[Y_L] = b(r_L) - b(r_{L-1}) gives
    b(r_L) = |E[Y_L]| / (sqrt(r_L / r_{L-1}) - 1): the conservative MLMC extrapolation.
    """
    if levels.repeats.shape[0] < 2:
        return jnp.zeros(())
    ratio = levels.repeats[-1] / levels.repeats[-2]
    return jnp.abs(levels.mean[-1]) / (jnp.sqrt(ratio) - 1.0)


def confidence_interval(estimate, delta):
    """Normal-approximation interval at level 1 - delta, widened by the estimated top-level bias
    of a multilevel estimate, clipped to [0, 1]."""
    z = NormalDist().inv_cdf(1 - delta / 2)
    bias = top_level_bias(estimate.levels)
    half_width = z * estimate.stderr + bias
    low = jnp.clip(estimate.value - half_width, 0.0, 1.0)
    high = jnp.clip(estimate.value + half_width, 0.0, 1.0)
    return TVEstimate(estimate.value, estimate.stderr, low, high, estimate.queries, bias, estimate)


def resolve_oracle(access, sigma=None, scale=None):
    """An oracle from a name ('exact', 'noisy', 'logit_noise', 'sampler') or an oracle instance."""
    if not isinstance(access, str):
        return access
    if access not in ACCESS_MODELS:
        raise ValueError(f"unknown access model {access!r}; choose one of {sorted(ACCESS_MODELS)}")
    if access == "noisy":
        if sigma is None:
            raise ValueError("access='noisy' needs sigma, the oracle's relative noise level")
        return Noisy(sigma)
    if access == "logit_noise":
        if scale is None:
            raise ValueError("access='logit_noise' needs scale, the logit noise standard deviation")
        return LogitNoise(scale)
    return ACCESS_MODELS[access]()


def _check_count(what, count, advice):
    """The sizes an (eps, delta, noise) asks for must be countable (int32) by the estimators."""
    if count > MAX_COUNT:
        raise ValueError(f"{what} needs {count:.3g} trajectories or repeats, more than tvjax counts "
                         f"({MAX_COUNT}, int32): {advice}")


def _finite_estimate(result):
    """A NaN estimate means a process gave NaN log-probabilities: refuse it, never return it."""
    if is_concrete(result.value) and not math.isfinite(float(result.value)):
        raise FloatingPointError("the estimate is NaN: a process returned NaN log-probabilities (check its "
                                 "path_logprobs; tvjax's own processes refuse such tables when built)")
    return result


def estimate_tv(key, pi, mu, access="exact", eps=0.05, delta=0.1, sigma=None, scale=None):
    """Estimate TV(pi, mu) to accuracy eps with probability 1 - delta.

    exact logits: Algorithm 1 with N = ceil(ln(2/delta) / (2 eps^2)) (Hoeffding on R in [0, 1]);
    noisy, logit-noise and sampler access: Algorithm 3 with the paper's schedule for that noise
    level and a median of ceil(8 ln(1/delta)) groups. Sizes beyond int32 (eps very small, sigma
    very large) are refused up front, naming eps and the noise level.
    """
    check_key(key)
    check_pair(pi, mu)
    check_range("eps", eps, 0.0, 1.0, low_open=True, high_open=True)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    eps, delta = float(eps), float(delta)
    oracle = resolve_oracle(access, sigma, scale)
    noise = oracle.noise_level(pi, mu)
    if noise == 0.0:
        num = max(2, math.ceil(math.log(2 / delta) / (2 * eps**2)))
        _check_count(f"eps={eps:g}, delta={delta:g}", num, "raise eps")
        return _finite_estimate(confidence_interval(lookup("likelihood_ratio").fn(key, pi, mu, oracle, Samples(num)), delta))
    schedule = paper_schedule(eps, noise, pi.n)
    _check_count(f"eps={eps:g} at noise level {noise:g} (n={pi.n})", max(max(part) for part in schedule),
                 "raise eps or lower the noise")
    groups = groups_for_confidence(delta)
    return _finite_estimate(confidence_interval(lookup("multilevel").fn(key, pi, mu, oracle, schedule, num_groups=groups),
                                                delta))
