"""tvjax: total variation distance between autoregressive models.

The public API is flat and loaded lazily, so that `tvjax.pools` and `tvjax.engines`
(which run inside inference engines' own Python environments) import without JAX.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # instances
    "BlockProcess": "tvjax.instances",
    "RareEscapeProcess": "tvjax.instances",
    "CoinProcess": "tvjax.instances",
    "TabularProcess": "tvjax.instances",
    "paper_block_pair": "tvjax.instances",
    "block_pair": "tvjax.instances",
    "rare_escape_pair": "tvjax.instances",
    "rare_escape_uniform_pair": "tvjax.instances",
    "coin_pair": "tvjax.instances",
    "stopping_tabular_pair": "tvjax.instances",
    "random_tabular_pair": "tvjax.instances",
    "exact_tv": "tvjax.instances",
    # oracles
    "Exact": "tvjax.oracles",
    "Noisy": "tvjax.oracles",
    "LogitNoise": "tvjax.oracles",
    "Sampler": "tvjax.oracles",
    # currency
    "mixture_z": "tvjax.currency",
    "likelihood_ratio_term": "tvjax.currency",
    # sizes and schedules
    "Samples": "tvjax.schedules",
    "Level": "tvjax.schedules",
    "Schedule": "tvjax.schedules",
    "paper_schedule": "tvjax.schedules",
    "pad_schedule": "tvjax.schedules",
    # estimators
    "REGISTRY": "tvjax.estimators",
    "lookup": "tvjax.estimators",
    "configured": "tvjax.estimators",
    "Estimate": "tvjax.estimators",
    "LevelStats": "tvjax.estimators",
    "KLEstimate": "tvjax.estimators",
    "likelihood_ratio": "tvjax.estimators",
    "plugin": "tvjax.estimators",
    "multilevel": "tvjax.estimators",
    "plugin_kl": "tvjax.estimators",
    "k3_pinsker": "tvjax.estimators",
    "summarize_levels": "tvjax.estimators",
    # repeated estimates
    "replicate": "tvjax.studies",
    # pools and their analyses
    "create_pool": "tvjax.pools",
    "load_pool": "tvjax.pools",
    "PoolError": "tvjax.pools",
    "write_synthetic_pool": "tvjax.synthetic_pool",
    # front door
    "TVEstimate": "tvjax.api",
    "confidence_interval": "tvjax.api",
    "estimate_tv": "tvjax.api",
}

MODULES = {"instances", "oracles", "currency", "cost", "schedules", "streaming", "programs", "estimators", "studies",
           "api", "pools", "synthetic_pool", "analysis", "report", "engines", "jsonable", "sharding", "validate", "models"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in MODULES:
        return importlib.import_module(f"tvjax.{name}")
    raise AttributeError(f"module 'tvjax' has no attribute {name!r}")


def __dir__():
    return __all__
