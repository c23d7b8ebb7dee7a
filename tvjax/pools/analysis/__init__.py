"""Analyses of score pools (paper, appendix B), each a function of a loaded `tvjax.pools.store.Pool`.

* `tv_estimate`         symmetric TV, both arms, bootstrap CI, shared-support / mismatch split (B.6)
* `tv_by_prefix`        TV against prefix length t = 1..n (Figure 3a)
* `tv_by_repeats`       TV against the repetition count r with each scorer's self-noise floor (Figure 2b)
* `Hygiene`             repeat-axis permutation (on by default) used by every repeat-axis statistic (B.1)
* `calibrate_sigma`     union-support and realized-token half-split chi-square (B.3)
* `support_union`       empirical top-k support union against r (B.4)
* `zero_mass_rates`, `compare_scorers`   own-token zero mass and scorer bias report (B.5, Figure 8)
* `evaluate_multilevel` pilot-selected multilevel schedule against single levels (B.7, Figure 4)

Commands: `python -m tvjax.pools.analysis {tv,prefix,repeats,sigma,support,zero-mass,compare,multilevel} POOL`
print JSON; `python -m tvjax.pools.report POOL --out DIR` writes the full report.
"""

from tvjax.pools.analysis.calibration import SigmaCalibration, SupportUnion, calibrate_sigma, support_union
from tvjax.pools.analysis.currency import Hygiene, shuffle_repeats
from tvjax.pools.analysis.multilevel import MultilevelEvaluation, evaluate_multilevel
from tvjax.pools.analysis.scorers import ScorerComparison, ZeroMassRates, compare_scorers, zero_mass_rates
from tvjax.pools.analysis.tv import PrefixCurve, RepeatCurve, TVReport, tv_by_prefix, tv_by_repeats, tv_estimate

__all__ = [
    "Hygiene", "MultilevelEvaluation", "PrefixCurve", "RepeatCurve", "ScorerComparison", "SigmaCalibration",
    "SupportUnion", "TVReport", "ZeroMassRates", "calibrate_sigma", "compare_scorers", "evaluate_multilevel",
    "shuffle_repeats", "support_union", "tv_by_prefix", "tv_by_repeats", "tv_estimate",
    "zero_mass_rates",
]
