"""Exact binomial confidence bounds (Clopper-Pearson) and the TV lower bound they give.

For X ~ Binomial(trials, p), the one-sided Clopper-Pearson bounds at level 1 - alpha are

    lower(k) = the p with P_p(X >= k) = alpha   (0 when k = 0)
    upper(k) = the p with P_p(X <= k) = alpha   (1 when k = trials)

so that P(lower(X) > p) <= alpha and P(upper(X) < p) <= alpha for every p (the tails are monotone
in p). They are the beta quantiles Beta(alpha; k, trials - k + 1) and Beta(1 - alpha; k + 1,
trials - k), computed by scipy (a dependency of JAX itself) in float64.
"""

from scipy.stats import beta

from tvjax.core.validate import check_range


def _check_counts(successes, trials, alpha):
    check_range("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True)
    if isinstance(trials, bool) or int(trials) != trials or trials < 1:
        raise ValueError(f"trials must be an integer >= 1, got {trials!r}")
    if isinstance(successes, bool) or int(successes) != successes or not 0 <= successes <= trials:
        raise ValueError(f"successes must be an integer in [0, trials={trials}], got {successes!r}")
    return int(successes), int(trials)


def clopper_pearson_lower(successes, trials, alpha):
    """One-sided lower confidence bound at level 1 - alpha for p from successes ~ Binomial(trials, p):
    P(bound > p) <= alpha. 0 when successes = 0."""
    successes, trials = _check_counts(successes, trials, alpha)
    if successes == 0:
        return 0.0
    return float(beta.ppf(alpha, successes, trials - successes + 1))


def clopper_pearson_upper(successes, trials, alpha):
    """One-sided upper confidence bound at level 1 - alpha for p: P(bound < p) <= alpha. 1 when
    successes = trials."""
    successes, trials = _check_counts(successes, trials, alpha)
    if successes == trials:
        return 1.0
    return float(beta.ppf(1 - alpha, successes + 1, trials - successes))


def tv_lower_bound(pi_hits, pi_trials, mu_hits, mu_trials, delta):
    """Lower confidence bound at level 1 - delta for pi(A) - mu(A) <= TV(pi, mu), from the counts of
    an event A fixed in advance on independent samples: pi_hits ~ Binomial(pi_trials, pi(A)) and
    mu_hits ~ Binomial(mu_trials, mu(A)). Clopper-Pearson lower for pi(A) at delta / 2 minus
    Clopper-Pearson upper for mu(A) at delta / 2; by the union bound both hold at once with
    probability >= 1 - delta. May be negative (then it certifies only TV >= 0)."""
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    return clopper_pearson_lower(pi_hits, pi_trials, delta / 2) - clopper_pearson_upper(mu_hits, mu_trials, delta / 2)
