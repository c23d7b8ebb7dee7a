"""`python -m tvjax`: the default estimate on the paper's instance under each access model.
`python -m tvjax gate ...`: is TV(pi, mu) below a tolerance? PASS / FAIL / INCONCLUSIVE, exit 0 / 1 / 2."""

import argparse
import json
import math
import sys
import time

import jax

from tvjax.api import estimate_tv
from tvjax.instances import coin_pair, exact_tv, paper_block_pair, stopping_tabular_pair
from tvjax.jsonable import to_jsonable
from tvjax.programs import enable_compilation_cache
from tvjax.sequential import gate

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


def _keyword(text):
    """KEY=VALUE -> (key, value) with an int, float, None or string value (LanguageModel.variant keywords)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    for convert in (int, float):
        try:
            return key, convert(raw)
        except ValueError:
            pass
    return key, None if raw.lower() in ("none", "null") else raw


PAIRS = {
    "block": "the paper's block pair (TV 0.388)",
    "identical": "the paper block's pi against itself (TV 0)",
    "coins": "64 independent coins Bern(1/2 +- 0.25/8) (TV 0.382)",
    "stopping": "a tabular pair whose trajectories stop at EOS (n=6, stop 0.2 vs 0.3)",
    "lm": "two serving variants of a language model (--model, --pi/--mu KEY=VALUE)",
}


def gate_pair(args):
    if args.pair == "block":
        return paper_block_pair()
    if args.pair == "identical":
        pi, _ = paper_block_pair()
        return pi, pi
    if args.pair == "coins":
        return coin_pair(64)
    if args.pair == "stopping":
        return stopping_tabular_pair()
    from tvjax.models.pairs import lm_pair  # flax and the weights only for this pair

    return lm_pair(args.model, args.prompt, args.n, dict(args.pi), dict(args.mu), eos=args.eos)


class _GateParser(argparse.ArgumentParser):
    """Usage errors exit 3, not argparse's 2: 2 is the gate's INCONCLUSIVE."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(3, f"{self.prog}: error: {message}\n")


def gate_main(argv):
    parser = _GateParser(prog="tvjax gate", description="Is TV(pi, mu) below tau at confidence 1 - delta? "
                                     "Samples in rounds until a confidence sequence decides: PASS (exit 0), FAIL (1) "
                                     "or INCONCLUSIVE when the budget is spent (2); bad input exits 3.")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="block",
                        help="; ".join(f"{k}: {v}" for k, v in PAIRS.items()))
    parser.add_argument("--tau", type=_number(0.0, 1.0), required=True, help="the TV tolerance, in (0, 1)")
    parser.add_argument("--delta", type=_number(0.0, 1.0), default=0.05, help="error probability, in (0, 1)")
    parser.add_argument("--budget", type=_number(0.0), default=1e9, help="query budget")
    parser.add_argument("--access", choices=("exact", "noisy", "sampler"), default="exact")
    parser.add_argument("--sigma", type=_number(0.0), default=None, help="the noisy oracle's relative noise")
    parser.add_argument("--round-size", type=int, default=256, help="observations per round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="write the whole record here")
    parser.add_argument("--model", default="smollm2", help="lm pair: smollm2, a .gguf file or a Hugging Face folder")
    parser.add_argument("--prompt", default="Write a short poem about the sea.", help="lm pair: a user message")
    parser.add_argument("--n", type=int, default=16, help="lm pair: continuation length (at most, with --eos stop)")
    parser.add_argument("--eos", choices=("suppress", "stop"), default="suppress",
                        help="lm pair: suppress EOS (the paper's n tokens) or stop a continuation at it, as served")
    parser.add_argument("--pi", type=_keyword, nargs="*", default=[], metavar="KEY=VALUE", help="lm pair: pi's variant")
    parser.add_argument("--mu", type=_keyword, nargs="*", default=[], metavar="KEY=VALUE", help="lm pair: mu's variant")
    parser.add_argument("--compilation-cache", default=None, metavar="FOLDER|off")
    args = parser.parse_args(argv)
    if args.access == "noisy" and args.sigma is None:
        parser.error("--access noisy needs --sigma")
    enable_compilation_cache(args.compilation_cache)
    try:
        pi, mu = gate_pair(args)
        progress = lambda e: print(f"round {e.rounds}: [{e.low:.4f}, {e.high:.4f}] after {e.observations} observations, "
                                   f"{e.queries:.3g} queries", file=sys.stderr, flush=True)
        result = gate(jax.random.key(args.seed), pi, mu, args.tau, args.delta, args.budget, args.access, args.round_size,
                      args.sigma, on_round=progress)
    except ValueError as error:
        parser.exit(3, f"tvjax gate: error: {error}\n")
    e = result.estimate
    relation = {"PASS": "<", "FAIL": ">"}.get(result.verdict, "?")
    print(f"{result.verdict}  TV {relation} {args.tau:g} at {100 * (1 - args.delta):g}%: [{e.low:.4f}, {e.high:.4f}] "
          f"(estimate {e.value:.4f}, bias bound {e.bias_bound:.4f}, support mismatch {e.mismatch_share:.3f}) after "
          f"{e.observations} observations, {e.queries:.3g} queries", flush=True)
    if args.json:
        record = {"pair": args.pair, "access": args.access, "sigma": args.sigma, "seed": args.seed, "eos": args.eos,
                  "pi": dict(args.pi), "mu": dict(args.mu), **result._asdict()}
        with open(args.json, "w") as handle:
            json.dump(to_jsonable(record), handle, indent=2)
    return result.exit_code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gate"]:
        sys.exit(gate_main(argv[1:]))
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
