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
import importlib.abc
import importlib.util
import sys
import warnings

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

# Modules of tvjax 0.1.0's flat layout and their homes now (CHANGELOG.md): the old names still
# import, as the same module objects, with a DeprecationWarning naming the new home.
MOVED = {
    **{f"tvjax.{name}": f"tvjax.core.{name}" for name in ("instances", "oracles", "programs", "streaming", "schedules",
                                                         "currency", "cost", "validate", "sharding", "jsonable",
                                                         "binomial", "studies", "api", "estimators")},
    "tvjax.synthetic_pool": "tvjax.pools.synthetic",
    "tvjax.analysis": "tvjax.pools.analysis",
    "tvjax.report": "tvjax.pools.report",
    "tvjax.sequential": "tvjax.audit.sequential",
    "tvjax.distinguish": "tvjax.audit.distinguish",
    "tvjax.jax_engine": "tvjax.models.jax_engine",
}


def _moved(old):
    warnings.warn(f"{old} moved to {MOVED[old]}; import it from there", DeprecationWarning, stacklevel=3)
    return importlib.import_module(MOVED[old])


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import tvjax.sequential` (and its submodules) gives the module at its new home."""

    @staticmethod
    def _target(fullname):
        head = next((old for old in MOVED if fullname == old or fullname.startswith(old + ".")), None)
        return None if head is None else MOVED[head] + fullname[len(head):]

    def find_spec(self, fullname, path=None, target=None):
        new = self._target(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        return importlib.util.spec_from_loader(fullname, self, is_package=real.submodule_search_locations is not None)

    def get_code(self, fullname):  # what `python -m tvjax.report` runs
        new = self._target(fullname)
        old, run = (name.removesuffix(".__main__") for name in (fullname, new))
        warnings.warn(f"{old} moved to {run}; run python -m {run}", FutureWarning, stacklevel=2)
        return importlib.util.find_spec(new).loader.get_code(new)

    def create_module(self, spec):
        new = self._target(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._real_spec = module.__spec__  # the import system sets __spec__ to the alias's next
        return module

    def exec_module(self, module):
        module.__spec__ = self._real_spec


sys.meta_path.insert(0, _MovedModules())  # before the path finder, which would load a second copy

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in SUBPACKAGES:
        return importlib.import_module(f"tvjax.{name}")
    if f"tvjax.{name}" in MOVED:
        return _moved(f"tvjax.{name}")
    raise AttributeError(f"module 'tvjax' has no attribute {name!r}")


def __dir__():
    return sorted(__all__ + list(SUBPACKAGES))
