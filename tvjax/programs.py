"""Where an estimator's program is compiled, and with which XLA options.

With its classic loop emitters XLA's CPU backend compiles the estimator programs 20-30% faster
than with its newer fusion emitters, with a third less peak memory, and runs them within about
20% (benchmarks/README.md); other backends ignore the option. JAX accepts compiler options on the
outermost jit only (a nested jit that names them is an error), so an estimator core is jitted
twice: with the options when called from Python, plainly when traced inside a caller's jit, which
then decides the options (pass COMPILER_OPTIONS to your own jax.jit around estimator calls).
"""

import functools
import os
from pathlib import Path

import jax

from tvjax.validate import all_concrete

COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


def program(static_argnames=()):
    """Decorator: jit `fn` with COMPILER_OPTIONS at the top level, plainly inside a trace."""

    def wrap(fn):
        top = jax.jit(fn, static_argnames=static_argnames, compiler_options=COMPILER_OPTIONS)
        nested = jax.jit(fn, static_argnames=static_argnames)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return (top if all_concrete((args, kwargs)) else nested)(*args, **kwargs)

        call.top = top
        return call

    return wrap


def jit_program(fn, fast_compile=False):
    """jax.jit(fn) with COMPILER_OPTIONS, for callers that jit their own loops over estimators.
    fast_compile lowers XLA's backend optimization (about 2x faster compiles, slower runs)."""
    options = {**COMPILER_OPTIONS, **({"xla_backend_optimization_level": 0} if fast_compile else {})}
    return jax.jit(fn, compiler_options=options)


# --------------------------------------------------------------------------- persistent compilation cache

CACHE_ENV = "TVJAX_COMPILATION_CACHE"  # a folder, or "off" to opt out
CACHE_OFF = ("0", "off", "false", "no", "none")
CACHE_MAX_BYTES = 2 * 2**30  # least recently used entries go first beyond this


def default_cache_dir():
    """$XDG_CACHE_HOME/tvjax/jax-compilation (~/.cache/tvjax/jax-compilation)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tvjax" / "jax-compilation"


def enable_compilation_cache(path=None):
    """Turn on JAX's persistent compilation cache for this process and return its folder (None
    when opted out). `path` or $TVJAX_COMPILATION_CACHE choose the folder (default
    `default_cache_dir()`); TVJAX_COMPILATION_CACHE=off opts out; a cache folder already set in
    JAX's own config (JAX_COMPILATION_CACHE_DIR) is kept.

    The CLI, the study apps and the benchmarks call this before their first compile (JAX fixes
    the folder at its first compile). Invalidation is by content: an entry's key hashes the
    program's HLO, the compile options, the devices and the jax/jaxlib versions, so any code
    change that changes a program misses, and a program that did not change is reused. Entries
    live in one subfolder per jax/jaxlib version, so an upgrade starts afresh instead of
    accumulating dead entries. Every program is cached, however short its compile: the studies
    are many sub-second compiles."""
    setting = str(path) if path is not None else os.environ.get(CACHE_ENV, "")
    if setting.strip().lower() in CACHE_OFF:
        return None
    if jax.config.jax_compilation_cache_dir and path is None:
        return Path(jax.config.jax_compilation_cache_dir)
    import jaxlib

    base = Path(setting).expanduser() if setting else default_cache_dir()
    folder = base / f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}"
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return folder
