"""tvjax: total variation distance between autoregressive models.

The package is grouped by role:

* `tvjax.core`: the estimation core in JAX (processes with known TV, access models, sizes,
  estimators, `estimate_tv`, repeated estimates);
* `tvjax.pools`: the on-disk currency (`store`, no JAX), pools from synthetic processes
  (`synthetic`), the appendix-B analyses (`analysis`) and the pool report (`report`);
* `tvjax.audit`: decisions about a pair: anytime-valid estimates and the gate (`sequential`),
  text-only lower bounds (`distinguish`);
* `tvjax.models`: real language models in Flax NNX and the JAX engine that scores them into pools;
* `tvjax.engines`: replay-scoring bridges that run inside torch engines' own environments (no JAX);
* `tvjax.studykit`: what the Hydra apps of experiments/ share; `tvjax.cli`: `python -m tvjax`.

The public names below are re-exported here explicitly and loaded on first use, so that
`tvjax.pools.store` and `tvjax.engines` import without JAX and a bare install imports no extra.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {  # module -> the names it exports here
    "tvjax.core.instances": ("BlockProcess", "RareEscapeProcess", "CoinProcess", "TabularProcess", "paper_block_pair",
                             "block_pair", "rare_escape_pair", "rare_escape_uniform_pair", "coin_pair",
                             "stopping_tabular_pair", "random_tabular_pair", "exact_tv"),
    "tvjax.core.oracles": ("Exact", "Noisy", "LogitNoise", "Sampler"),
    "tvjax.core.currency": ("mixture_z", "likelihood_ratio_term"),
    "tvjax.core.schedules": ("Samples", "Level", "Schedule", "paper_schedule", "pad_schedule"),
    "tvjax.core.estimators": ("REGISTRY", "lookup", "configured", "Estimate", "LevelStats", "KLEstimate", "likelihood_ratio",
                              "plugin", "multilevel", "plugin_kl", "k3_pinsker", "summarize_levels"),
    "tvjax.core.studies": ("replicate",),
    "tvjax.pools.store": ("create_pool", "load_pool", "PoolError"),
    "tvjax.pools.synthetic": ("write_synthetic_pool",),
    "tvjax.core.api": ("TVEstimate", "confidence_interval", "estimate_tv"),
    "tvjax.audit.sequential": ("anytime_tv", "gate", "gate_pool"),
}
_EXPORTS = {name: module for module, names in _PUBLIC.items() for name in names}

SUBPACKAGES = ("core", "pools", "audit", "models", "engines", "studykit", "cli")

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in SUBPACKAGES:
        return importlib.import_module(f"tvjax.{name}")
    raise AttributeError(f"module 'tvjax' has no attribute {name!r}")


def __dir__():
    return sorted(__all__ + list(SUBPACKAGES))
