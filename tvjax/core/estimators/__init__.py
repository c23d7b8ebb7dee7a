"""TV estimators: the paper's (Algorithms 1 and 3, Lemma 8) and the KL baselines, behind one
signature and one registry.

Every estimator is `fn(key, pi, mu, oracle, sizes, *, copies=None, chunk=None)` (multilevel adds
`num_groups`), where `sizes` is the estimator's NamedTuple from `tvjax.core.schedules`. `REGISTRY` is
the only place a name becomes a function: studies, the CLI, the benchmarks and Hydra's
`estimator/` configs look estimators up here.

    spec = REGISTRY["multilevel"]
    spec.fn(key, pi, mu, Noisy(0.5), spec.sizes((2000, 500), (8, 64)))
"""

import inspect
from typing import Callable, NamedTuple

from tvjax.core.estimators.baselines import KLEstimate, k3_pinsker, plugin_kl
from tvjax.core.estimators.paper import (
    Estimate,
    LevelStats,
    likelihood_ratio,
    median_of_means,
    multilevel,
    plugin,
    summarize_levels,
)
from tvjax.core.schedules import Level, Samples, Schedule


class EstimatorSpec(NamedTuple):
    """A registered estimator: its function, the NamedTuple type of its sizes, and what it is."""

    fn: Callable
    sizes: type
    summary: str

    def queries(self, sizes, n, num_groups=1):
        """Queries the estimator spends on sizes of length-n trajectories (`tvjax.core.cost`); a
        median of num_groups groups (multilevel's option) spends num_groups times that."""
        if not isinstance(sizes, self.sizes):
            raise TypeError(f"{self.fn.__name__} takes {self.sizes.__name__} sizes, got {sizes!r}")
        return sizes.queries(n) * num_groups


REGISTRY = {
    "likelihood_ratio": EstimatorSpec(likelihood_ratio, Samples, "Algorithm 1: E_pi[(1 - mu/pi)_+]"),
    "plugin": EstimatorSpec(plugin, Level, "Lemma 8: single-level plug-in Z_r on X ~ (pi + mu)/2"),
    "multilevel": EstimatorSpec(multilevel, Schedule, "Algorithm 3: multilevel coupled increments"),
    "plugin_kl": EstimatorSpec(plugin_kl, Samples, "baseline: plug-in KL(pi || mu), then Pinsker"),
    "k3_pinsker": EstimatorSpec(k3_pinsker, Samples, "baseline: k3 KL estimator, then Pinsker"),
}


def lookup(name):
    """The registered estimator `name`, or a ValueError listing the names."""
    if name not in REGISTRY:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]


class Configured(NamedTuple):
    """A registered estimator with its sizes and options bound: `est(key, pi, mu, oracle)`."""

    name: str
    sizes: tuple
    options: dict

    def __call__(self, key, pi, mu, oracle, **kwargs):
        return lookup(self.name).fn(key, pi, mu, oracle, self.sizes, **self.options, **kwargs)

    def queries(self, n):
        return lookup(self.name).queries(self.sizes, n, self.options.get("num_groups", 1))


def configured(name, sizes, **options):
    """Configured(name, sizes, options) from plain values (a Hydra `estimator/` config):
    `sizes` is a dict of the estimator's size fields, lists standing for per-level tuples."""
    spec = lookup(name)
    if not isinstance(sizes, dict) or not set(sizes) <= set(spec.sizes._fields):
        raise ValueError(f"estimator {name} takes sizes {spec.sizes.__name__}{spec.sizes._fields}, got {sizes!r}")
    keywords = {p.name for p in inspect.signature(spec.fn).parameters.values() if p.kind is p.KEYWORD_ONLY}
    if set(options) - keywords:
        raise ValueError(f"estimator {name} takes options {sorted(keywords)}, not {sorted(set(options) - keywords)}")
    fields = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in sizes.items()}
    try:
        bound = spec.sizes(**fields)
    except TypeError as e:
        raise ValueError(f"estimator {name}: {e}") from e
    return Configured(name, bound, dict(options))


__all__ = [
    "REGISTRY", "Configured", "EstimatorSpec", "configured", "Estimate", "KLEstimate", "LevelStats", "k3_pinsker",
    "likelihood_ratio", "lookup",
    "median_of_means", "multilevel", "plugin", "plugin_kl", "summarize_levels",
]
