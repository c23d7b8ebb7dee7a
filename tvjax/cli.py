"""`python -m tvjax`: the default estimate on the paper's instance under each access model."""

import argparse
import math
import time

import jax

from tvjax.api import estimate_tv
from tvjax.instances import exact_tv, paper_block_pair
from tvjax.programs import enable_compilation_cache

ACCESS_ROWS = (("exact", "exact logits"), ("noisy", "noisy logits, sigma={sigma}"), ("sampler", "sample-only"))


def header(truth, delta):
    level = f"{100 * (1 - delta):g}% CI"
    return "\n".join(
        [
            "Paper block instance (n=128, block_bits=12, p_active=0.4, alpha=0.49, seed 10)",
            f"true TV = {truth:.10g}",
            "",
            f"{'access':<26} {'estimate':>9} {level:>17} {'stderr':>8} {'bias':>8} {'queries':>10} {'|error|':>8} {'time':>7}",
        ]
    )


def format_row(label, result, truth, seconds):
    ci = f"[{float(result.ci_low):.4f}, {float(result.ci_high):.4f}]"
    return (
        f"{label:<26} {float(result.value):>9.4f} {ci:>17} {float(result.stderr):>8.4f} {float(result.bias):>8.4f} "
        f"{float(result.queries):>10.3g} {abs(float(result.value) - truth):>8.4f} {seconds:>6.1f}s"
    )


def run(seed=0, eps=0.05, delta=0.1, sigma=0.1, emit=print):
    """Print (through `emit`) the table row by row as each access model finishes; return the rows."""
    pi, mu = paper_block_pair()
    truth = exact_tv(pi, mu)
    key = jax.random.PRNGKey(seed)
    emit(header(truth, delta))
    rows = []
    for access, label in ACCESS_ROWS:
        start = time.perf_counter()
        result = jax.block_until_ready(estimate_tv(key, pi, mu, access, eps=eps, delta=delta, sigma=sigma))
        rows.append((access, result))
        emit(format_row(label.format(sigma=sigma), result, truth, time.perf_counter() - start))
    return truth, rows


def _number(low, high=None):
    """An argparse type: a finite float in (low, high), or >= low when high is None."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        inside = math.isfinite(value) and (low < value < high if high is not None else value >= low)
        if not inside:
            raise argparse.ArgumentTypeError(f"{text} is not in {f'({low}, {high})' if high is not None else f'[{low}, inf)'}")
        return value

    return parse


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eps", type=_number(0.0, 1.0), default=0.05, help="target accuracy, in (0, 1)")
    parser.add_argument("--delta", type=_number(0.0, 1.0), default=0.1, help="failure probability, in (0, 1)")
    parser.add_argument("--sigma", type=_number(0.0), default=0.1, help="relative noise of the noisy oracle, >= 0")
    parser.add_argument("--compilation-cache", default=None, metavar="FOLDER|off",
                        help="JAX's persistent compilation cache (default: $TVJAX_COMPILATION_CACHE, else "
                             "~/.cache/tvjax/jax-compilation); off to opt out")
    args = parser.parse_args(argv)
    enable_compilation_cache(args.compilation_cache)
    run(args.seed, args.eps, args.delta, args.sigma, emit=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
