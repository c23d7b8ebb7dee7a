"""Certified lower bounds on TV(target, reference) from the ranks of the target's scores.

For one prompt, the target's continuation X and the reference's m continuations Y_1..Y_m are a
draw of (X, Y) under target x ref^m, and of ref^(m+1) when the target is the reference; the
rank is a function of (X, Y) and a tie-breaking coin, so for every event A of ranks

    TV(target, ref) = TV(target x ref^m, ref^(m+1)) >= P_target(rank in A) - P_ref(rank in A),

and P_ref(rank <= k) = F_k = (k + 1) / (m + 1) exactly. With prompts drawn independently from a
prompt distribution, the same holds for the average TV over prompts (the ranks of different
prompts pooled: TV of the joint (prompt, continuation) laws, which is E_prompt TV). As m grows,
sup_k |G_k - F_k| tends to sup_t |F_target(t) - F_ref(t)| of the score. The reference side is
exact: only the target's rank CDF G is estimated, from the N calls.

* dkw: by the Dvoretzky-Kiefer-Wolfowitz inequality (Massart's constant; valid for discrete
  laws), sup_k |G_hat_k - G_k| <= sqrt(log(2 / delta) / (2 N)) with probability >= 1 - delta,
  so max_k |G_hat_k - F_k| minus that is a lower bound at level 1 - delta, at every k at once.
* binomial: the first `train_share` of the calls picks the threshold k and the side; the rest
  count #{rank <= k} ~ Binomial(N_test, G_k), and a one-sided Clopper-Pearson bound at delta
  gives G_k (or 1 - G_k) exactly: tighter than dkw for a clear-cut difference at one threshold.
"""

import math
from typing import NamedTuple

import numpy as np

from tvjax.audit.bounds import clopper_pearson_lower, clopper_pearson_upper
from tvjax.audit.reference.ranks import check_ranks, rank_cdf_gaps
from tvjax.core.validate import check_range

METHODS = ("dkw", "binomial")


class RankBound(NamedTuple):
    """TV >= lower_bound with probability >= 1 - delta. estimate: max_k |G_hat_k - F_k| on the
    calls the bound used; threshold: the k it used (dkw: the maximizing one), side +1 when the
    target's ranks run low (G_k > F_k), -1 when high."""

    lower_bound: float
    estimate: float
    threshold: int
    side: int
    calls: int  # calls the bound counted (binomial: the held-out ones)
    method: str
    delta: float


def _counts(ranks, m):
    return np.bincount(ranks, minlength=m + 1)


def _largest_gap(ranks, m):
    gaps = rank_cdf_gaps(_counts(ranks, m))
    k = int(np.argmax(np.abs(gaps)))
    return k, float(gaps[k])


def dkw_bound(ranks, m, delta):
    """The DKW lower bound at level 1 - delta from all the ranks (see the module doc)."""
    ranks, m = check_ranks(ranks, m)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    k, gap = _largest_gap(ranks, m)
    width = math.sqrt(math.log(2 / delta) / (2 * ranks.shape[0]))
    return RankBound(max(0.0, abs(gap) - width), abs(gap), k, 1 if gap >= 0 else -1, int(ranks.shape[0]), "dkw",
                     float(delta))


def binomial_bound(ranks, m, delta, train_share=0.5):
    """The split Clopper-Pearson lower bound at level 1 - delta: the first train_share of the
    ranks (in call order) choose k and the side, the rest are counted. 0 with too few calls."""
    ranks, m = check_ranks(ranks, m)
    check_range("delta", delta, 0.0, 1.0, low_open=True, high_open=True)
    check_range("train_share", train_share, 0.0, 1.0, low_open=True, high_open=True)
    train = int(round(train_share * ranks.shape[0]))
    if train < 1 or train >= ranks.shape[0]:
        return RankBound(0.0, 0.0, 0, 1, 0, "binomial", float(delta))
    k, gap = _largest_gap(ranks[:train], m)
    test = ranks[train:]
    hits, trials = int((test <= k).sum()), int(test.shape[0])
    level = (k + 1) / (m + 1)
    if gap >= 0:
        bound, side = clopper_pearson_lower(hits, trials, delta) - level, 1
    else:
        bound, side = level - clopper_pearson_upper(hits, trials, delta), -1
    return RankBound(max(0.0, bound), abs(hits / trials - level), k, side, trials, "binomial", float(delta))


def rank_bound(ranks, m, delta, method="binomial", train_share=0.5):
    """The certified lower bound of `method` ('dkw' or 'binomial')."""
    if method == "dkw":
        return dkw_bound(ranks, m, delta)
    if method == "binomial":
        return binomial_bound(ranks, m, delta, train_share)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def per_prompt_bounds(ranks, m, groups, delta, method="dkw"):
    """{prompt label: RankBound} from each prompt's own calls, each at level 1 - delta (for all the
    prompts at once, pass delta / number of prompts)."""
    ranks, m = check_ranks(ranks, m)
    groups = np.asarray(groups)
    if groups.shape != ranks.shape:
        raise ValueError(f"groups must have the shape of ranks {ranks.shape}, got {groups.shape}")
    return {label.item() if hasattr(label, "item") else label: rank_bound(ranks[groups == label], m, delta, method)
            for label in np.unique(groups)}
