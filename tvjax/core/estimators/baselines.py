"""Baselines the paper compares against: KL estimators followed by Pinsker's bound.

They share Algorithm 1's one-sided core (X ~ pi) and its sizes, Samples(num, repeats=1), and
show why KL is the wrong tool here: it is infinite as soon as the supports differ.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tvjax.core.estimators.paper import LevelStats, one_sided, unbatched


class KLEstimate(NamedTuple):
    """KL-based baselines: `value` is the Pinsker route min(1, sqrt(KL / 2)) on the TV scale."""

    value: jax.Array
    stderr: jax.Array
    queries: jax.Array
    levels: LevelStats
    kl: jax.Array  # +inf under support mismatch
    kl_stderr: jax.Array


def _kl_estimate(key, pi, mu, oracle, sizes, chunk, term, copies):
    num, m, queries = one_sided(key, pi, mu, oracle, sizes, chunk, term, copies)
    kl = m.mean[:, 0]
    mismatch = jnp.isinf(kl) | jnp.isnan(kl)
    kl = jnp.where(mismatch, jnp.inf, kl)
    kl_stderr = jnp.where(mismatch, jnp.inf, jnp.sqrt(m.variance[:, 0] / num))
    tv = jnp.minimum(1.0, jnp.sqrt(jnp.maximum(kl, 0.0) / 2))
    # Delta method for sqrt(KL / 2); infinite KL gives the vacuous bound 1 with no spread.
    tv_stderr = jnp.where(mismatch | (tv >= 1.0), 0.0, kl_stderr / (4 * jnp.maximum(tv, 1e-12)))
    column = lambda x, dtype=None: jnp.broadcast_to(jnp.asarray(x, dtype), num.shape)[:, None]
    levels = LevelStats(column(sizes.repeats, jnp.int32), column(num, jnp.float32), m.mean, m.variance, queries[:, None])
    return unbatched(KLEstimate(tv, tv_stderr, queries, levels, kl, kl_stderr), copies)


def _plugin_kl_term(log_pi, log_mu):
    # log pi - log mu, +inf where mu has zero mass: KL is infinite under support mismatch.
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, log_pi - jnp.where(jnp.isneginf(log_mu), 0.0, log_mu))


def _k3_term(log_pi, log_mu):
    # k3 = (rho - 1) - log rho with rho = mu/pi: nonnegative, unbiased for KL(pi || mu) at exact access.
    log_rho = log_mu - log_pi
    return jnp.where(jnp.isneginf(log_mu), jnp.inf, jnp.expm1(log_rho) - log_rho)


def plugin_kl(key, pi, mu, oracle, sizes, *, copies=None, chunk=None):
    """Baseline: plug-in KL(pi || mu) = E_pi[log pi - log mu] and Pinsker's sqrt(KL / 2)."""
    return _kl_estimate(key, pi, mu, oracle, sizes, chunk, _plugin_kl_term, copies)


def k3_pinsker(key, pi, mu, oracle, sizes, *, copies=None, chunk=None):
    """Baseline: the k3 KL estimator followed by Pinsker's bound."""
    return _kl_estimate(key, pi, mu, oracle, sizes, chunk, _k3_term, copies)
