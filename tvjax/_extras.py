"""Optional dependencies: each feature outside the core imports its extra here, on first use.

The core (`pip install tvjax`: jax, jaxlib, numpy, ml_dtypes) runs `python -m tvjax` alone. A feature
that needs more asks `require`, which returns the module or raises `MissingExtra`: one line naming
what is missing and the command that installs it. Imports nothing beyond the standard library, so
the engine bridges (which run without JAX) can use it too.
"""

import importlib

# extra -> the command that installs it (the engine bridges have their own environments, not extras)
INSTALL = {
    "pools": "pip install 'tvjax[pools]'",
    "plot": "pip install 'tvjax[plot]'",
    "models": "pip install 'tvjax[models]'",
    "experiments": "pip install 'tvjax[experiments]'",
    "endpoints": "pip install 'tvjax[endpoints]'",
    "engines": "bash .ci/engines_setup.sh (one environment per engine: transformers, vllm)",
}


class MissingExtra(ImportError):
    """An optional feature's package is not installed; the message says how to install it."""


def require(module, extra, feature):
    """`importlib.import_module(module)`, or MissingExtra("<package> is not installed, and <feature> need it: <install command>").

    Only a missing `module` (or a parent package of it) becomes MissingExtra; an installed package that
    fails on import of something else keeps its own error, which is the one to read."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        parts = module.split(".")
        if error.name not in {".".join(parts[: i + 1]) for i in range(len(parts))}:
            raise
        raise MissingExtra(f"{parts[0]} is not installed, and {feature} need it: {INSTALL[extra]}") from None
