"""Where an estimator's program is compiled, and with which XLA options.

With its classic loop emitters XLA's CPU backend compiles the estimator programs 20-30% faster
than with its newer fusion emitters, with a third less peak memory, and runs them within about
20% (benchmarks/README.md); other backends ignore the option. JAX accepts compiler options on the
outermost jit only (a nested jit that names them is an error), so an estimator core is jitted
twice: with the options when called from Python, plainly when traced inside a caller's jit, which
then decides the options (pass COMPILER_OPTIONS to your own jax.jit around estimator calls).
"""

import functools

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
