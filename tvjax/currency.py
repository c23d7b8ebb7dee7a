"""The shared currency: per-trajectory functionals of realized-token log-probabilities.

Every estimator, synthetic or pool-based, reduces to these few functions of
`L = sum_i log p_hat(x_i | x_<i)` for the two models. Zero mass is `-inf` and is handled
explicitly here, once: with top-k sampling a trajectory outside one model's support is the
common case, not an edge case.
"""

import jax.numpy as jnp

# The r-averaged noisy probability is clipped to [LOG_FLOOR, 1] before the log (paper, B.2).
LOG_FLOOR = 1e-12


def mixture_z(log_p_pi, log_p_mu):
    """Z = |pi - mu| / (pi + mu) = tanh(|L_pi - L_mu| / 2); E_{X~(pi+mu)/2}[Z] = TV.

    Exactly 1 where either side has zero mass (-inf): the support-mismatch part of TV, on which
    KL is infinite (paper, B.6).
    """
    log_p_pi, log_p_mu = jnp.asarray(log_p_pi), jnp.asarray(log_p_mu)
    either_zero = jnp.isneginf(log_p_pi) | jnp.isneginf(log_p_mu)
    # Substitute finite values before subtracting so -inf - -inf never forms a NaN.
    diff = jnp.where(either_zero, 0.0, log_p_pi - log_p_mu)
    return jnp.where(either_zero, 1.0, jnp.tanh(jnp.abs(diff) / 2))


def likelihood_ratio_term(log_p_pi, log_p_mu):
    """R = (1 - mu(X)/pi(X))_+ for X ~ pi (Algorithm 1); E_pi[R] = TV.

    1 where mu(X) = 0; 0 where pi(X) = 0 (X outside pi's support contributes nothing).
    """
    log_p_pi, log_p_mu = jnp.asarray(log_p_pi), jnp.asarray(log_p_mu)
    pi_zero = jnp.isneginf(log_p_pi)
    log_ratio = jnp.where(pi_zero, 0.0, log_p_mu - log_p_pi)
    term = jnp.maximum(1.0 - jnp.exp(jnp.minimum(log_ratio, 0.0)), 0.0)
    return jnp.where(pi_zero, 0.0, term)


def log_clipped_mean(prob_sum, repeats, floor):
    """log of the r-average of probability draws, clipped to [floor, 1] (floor=0: a zero stays -inf)."""
    return jnp.log(jnp.clip(prob_sum / repeats, floor, 1.0))
