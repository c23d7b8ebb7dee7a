"""tvjax.core.binomial against jax.random.binomial, side by side in one process.

The sample-only oracle draws one Binomial(count, p) per cell of a chunk: [256 rows, 2 models,
2 sums, 13 positions] cells on the paper's B.11 sampler arm, counts from 8 to 16384 by level.
Each scenario draws that shape with both samplers (jit, on the same counts and probabilities) and
prints the median run over the repeats and the ratio jax / tvjax, then each sampler's compile seconds
(the shape is the same throughout, so each compiles once).
Both are exact samplers; tests/test_binomial.py checks tvjax's law against scipy.

    python benchmarks/binomial_bench.py [--repeats 20]
"""

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from tvjax.core.binomial import binomial

SHAPE = (256, 2, 2, 13)


def scenarios(rng):
    """name -> (count, p): the cell mixes a sample-only chunk meets."""
    p_any = rng.uniform(0.0, 1.0, SHAPE)
    levels = 8 * 2 ** rng.integers(0, 12, (SHAPE[0], 1, 1, 1))  # one level per row: 8 .. 16384
    return {
        "fair coins (count 12, p = 1/2)": (np.full(SHAPE, 12.0), np.full(SHAPE, 0.5)),
        "small means (count 8, p ~ U(0, 1))": (np.full(SHAPE, 8.0), p_any),
        "large counts (count 16384, p ~ U(0, 1))": (np.full(SHAPE, 16384.0), p_any),
        "levels mixed by row (8 .. 16384)": (np.broadcast_to(levels, SHAPE).astype(np.float64), p_any),
    }


def timed_runs(fn, key, count, p, repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(key, count, p))
    first = time.perf_counter() - start
    runs = []
    for index in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(jax.random.fold_in(key, index), count, p))
        runs.append(time.perf_counter() - start)
    median = statistics.median(runs)
    return first - median, median


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    samplers = {
        "tvjax": jax.jit(lambda key, n, p: binomial(key, n, p)),
        "jax.random": jax.jit(lambda key, n, p: jax.random.binomial(key, n, p, dtype=jnp.float32)),
    }
    print(f"jax {jax.__version__}, {platform.processor() or platform.machine()}, {jax.device_count()} "
          f"{jax.devices()[0].platform} device(s), cells {SHAPE} = {int(np.prod(SHAPE))}")
    print(f"{'scenario':<42} {'run ms tvjax':>12} {'run ms jax':>11} {'jax / tvjax':>12}")
    key, compiles = jax.random.key(0), None
    for name, (count, p) in scenarios(np.random.default_rng(0)).items():
        count, p = jnp.asarray(count, jnp.float32), jnp.asarray(p, jnp.float32)
        (c_t, r_t), (c_j, r_j) = (timed_runs(fn, key, count, p, args.repeats) for fn in samplers.values())
        compiles = compiles or (c_t, c_j)
        print(f"{name:<42} {1e3 * r_t:>12.2f} {1e3 * r_j:>11.2f} {r_j / r_t:>11.1f}x", flush=True)
    print(f"compile (first call less a run): tvjax {compiles[0]:.2f} s, jax.random {compiles[1]:.2f} s")


if __name__ == "__main__":
    main()
