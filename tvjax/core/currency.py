"""The shared currency: per-trajectory functionals of realized-token log-probabilities.

Every estimator, synthetic or pool-based, reduces to these few functions of
`L = sum_i log p_hat(x_i | x_<i)` for the two models. Zero mass is `-inf` and is handled
explicitly here, once: with top-k sampling a trajectory outside one model's support is the
common case, not an edge case.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Realized(NamedTuple):
    """Sampled trajectories as the oracles see them, without their tokens. Per model: the realized
    log-probs log p(x_i | x_<i) at the positions where a conditional can be random, and how many
    of the other positions (where every conditional is 0 or 1) have zero mass. A process that
    knows its trajectories compactly (`realized_sampler`) hands these over directly; no token
    array is formed."""

    logprobs: tuple  # per model: float32 [num, positions]
    zero_mass: tuple  # per model: int32 [num], deterministic positions with p(x_i | x_<i) = 0
    log_path: tuple  # per model: float32 [num], log p(x) (what exact logits give)

    def fixed_logprobs(self, floor=0.0):
        """Per model [num]: the deterministic positions' summed log-probs, each zero-mass position
        clipped to log(floor) (floor 0: -inf), as a draw there would be."""
        clip = lambda z: jnp.where(z > 0, -jnp.inf, 0.0) if floor == 0 else z * jnp.log(jnp.float32(floor))
        return [clip(z) for z in self.zero_mass]

    def shard(self, shard_rows):
        return jax.tree.map(shard_rows, self)


# The r-averaged noisy probability is clipped to [LOG_FLOOR, 1] before the log (paper, B.2).
LOG_FLOOR = 1e-12


def _nan_where_nan(term, log_p_pi, log_p_mu):
    """NaN wherever an input is NaN: the where()s above would turn a NaN score into 0 or 1 (a
    plausible number), so it is carried to the estimate, whose front doors refuse it."""
    return jnp.where(jnp.isnan(log_p_pi) | jnp.isnan(log_p_mu), jnp.nan, term)


def mixture_z(log_p_pi, log_p_mu):
    """Z = |pi - mu| / (pi + mu) = tanh(|L_pi - L_mu| / 2); E_{X~(pi+mu)/2}[Z] = TV.

    Exactly 1 where either side has zero mass (-inf): the support-mismatch part of TV, on which
    KL is infinite (paper, B.6).
    """
    log_p_pi, log_p_mu = jnp.asarray(log_p_pi), jnp.asarray(log_p_mu)
    either_zero = jnp.isneginf(log_p_pi) | jnp.isneginf(log_p_mu)
    # Substitute finite values before subtracting so -inf - -inf never forms a NaN.
    diff = jnp.where(either_zero, 0.0, log_p_pi - log_p_mu)
    return _nan_where_nan(jnp.where(either_zero, 1.0, jnp.tanh(jnp.abs(diff) / 2)), log_p_pi, log_p_mu)


def likelihood_ratio_term(log_p_pi, log_p_mu):
    """R = (1 - mu(X)/pi(X))_+ for X ~ pi (Algorithm 1); E_pi[R] = TV.

    1 where mu(X) = 0; 0 where pi(X) = 0 (X outside pi's support contributes nothing).
    """
    log_p_pi, log_p_mu = jnp.asarray(log_p_pi), jnp.asarray(log_p_mu)
    pi_zero = jnp.isneginf(log_p_pi)
    log_ratio = jnp.where(pi_zero, 0.0, log_p_mu - log_p_pi)
    term = jnp.maximum(1.0 - jnp.exp(jnp.minimum(log_ratio, 0.0)), 0.0)
    return _nan_where_nan(jnp.where(pi_zero, 0.0, term), log_p_pi, log_p_mu)


def log_clipped_mean(prob_sum, repeats, floor):
    """log of the r-average of probability draws, clipped to [floor, 1] (floor=0: a zero stays -inf)."""
    return jnp.log(jnp.clip(prob_sum / repeats, floor, 1.0))


def stopping_ids(process):
    """The EOS ids at which a process's trajectories stop: a language model's `stopping_eos` (none
    under eos="suppress"), a stopping table's `eos_ids`; () for a fixed-length process."""
    return tuple(getattr(process, "stopping_eos", getattr(process, "eos_ids", ())))


def trajectory_lengths(tokens, eos_ids):
    """Real positions of each trajectory [num]: up to and including the first EOS token, n when
    it never stops (or when eos_ids is empty). Positions after the EOS are padding, deterministic
    under both models, and cost no query."""
    tokens = jnp.asarray(tokens)
    n = tokens.shape[-1]
    if not eos_ids:
        return jnp.full(tokens.shape[:-1], n, jnp.int32)
    stops = jnp.isin(tokens, jnp.asarray(eos_ids))
    first = jnp.argmax(stops, axis=-1)
    return jnp.where(jnp.any(stops, axis=-1), first + 1, n).astype(jnp.int32)
