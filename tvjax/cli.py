"""`python -m tvjax`: the default estimate on the paper's instance under each access model.
`python -m tvjax gate ...`: is TV(pi, mu) below a tolerance? PASS / FAIL / INCONCLUSIVE, exit 0 / 1 / 2."""

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax

from tvjax._arguments import Parser, count, integer, nonnegative, output_file, positive, probability, random_seed
from tvjax._extras import MissingExtra
from tvjax.core.api import estimate_tv
from tvjax.core.instances import coin_pair, exact_tv, paper_block_pair, stopping_tabular_pair
from tvjax.core.jsonable import to_jsonable
from tvjax.core.programs import enable_compilation_cache

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


# the inputs each row's sample sizes and repeat counts depend on
ROW_INPUTS = {"exact": ("eps", "delta"), "noisy": ("eps", "delta", "sigma"), "sampler": ("eps", "delta")}


def check_reach(eps=0.05, delta=0.1, sigma=0.1):
    """Trace every row's estimate without running it (`jax.eval_shape`, a fraction of a second), so that
    the core's own checks refuse an eps, delta or sigma whose sample sizes or repeat counts tvjax cannot
    count (int32) before the first row runs, not after the rows before it: a ValueError naming the
    row, its flags and the core's reason."""
    pi, mu = paper_block_pair()
    values = {"eps": eps, "delta": delta, "sigma": sigma}
    for access, _ in ACCESS_ROWS:
        estimate = functools.partial(estimate_tv, pi=pi, mu=mu, access=access, eps=eps, delta=delta, sigma=sigma)
        try:
            jax.eval_shape(estimate, jax.random.PRNGKey(0))
        except (ValueError, OverflowError) as error:
            flags = " ".join(f"--{name} {values[name]:g}" for name in ROW_INPUTS[access])
            raise ValueError(f"{flags}: the {access} row cannot run: {error or type(error).__name__}") from error


def _model(text):
    """--model: 'smollm2', 'random:<arch>[:<vocab_size>]', or a .gguf file or Hugging Face folder that exists
    (checked before any work; `tvjax.models.pairs.load_model` reads it)."""
    if text == "smollm2" or text.startswith("random:") or Path(text).expanduser().exists():
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: no such file or folder (or use 'smollm2' or 'random:<arch>')")


def _json_object(text):
    """A JSON object (request fields) -> dict."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


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
    "stopping": "a tabular pair whose trajectories stop at EOS (n=6, EOS probability 0.2 vs 0.3)",
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


def _gate_pool(args, progress):
    from tvjax.audit.sequential import gate_pool
    from tvjax.pools.store import PoolError, load_pool  # zarr only for pools

    try:
        pool = load_pool(args.pool, load_topk=False)
    except PoolError as error:
        raise ValueError(str(error)) from error
    if pool.passes.size == 1:
        print("note: one replay pass per trajectory: the replay is taken as deterministic, unchecked "
              "(store R >= 2 passes to check it and to measure the A/A noise floor)", file=sys.stderr)
    return gate_pool(pool, args.tau, args.delta, args.budget, args.round_size, args.scorers, on_round=progress)


def verdict_line(result):
    """The gate's one line: verdict, interval, estimate, bias bound, support mismatch, spent."""
    e = result.estimate
    relation = {"PASS": "<", "FAIL": ">"}.get(result.verdict, "?")
    return (f"{result.verdict}  TV {relation} {result.tau:g} at {100 * (1 - result.delta):g}%: [{e.low:.4f}, {e.high:.4f}] "
            f"(estimate {e.value:.4f}, bias bound {e.bias_bound:.4f}, support mismatch {e.mismatch_share:.3f}) after "
            f"{e.observations} observations, {e.queries:.3g} queries")


def gate_parser():
    parser = Parser(error_status=3, prog="tvjax gate", description="Is TV(pi, mu) below tau at confidence 1 - delta? "
                                     "Samples in rounds until a confidence sequence decides: PASS (exit 0), FAIL (1) "
                                     "or INCONCLUSIVE when the budget is spent (2); bad input exits 3.")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="block",
                        help="; ".join(f"{k}: {v}" for k, v in PAIRS.items()))
    parser.add_argument("--tau", type=probability, required=True, help="the TV tolerance, in (0, 1)")
    parser.add_argument("--delta", type=probability, default=0.05, help="error probability, in (0, 1)")
    parser.add_argument("--budget", type=positive, default=None, help="query budget, > 0 (default 1e9; a pool: its rows)")
    parser.add_argument("--access", choices=("exact", "noisy", "sampler"), default="exact")
    parser.add_argument("--sigma", type=nonnegative, default=None, help="the noisy oracle's relative noise, >= 0")
    parser.add_argument("--round-size", type=count, default=256, help="observations per round, >= 1")
    parser.add_argument("--seed", type=random_seed, default=0)
    parser.add_argument("--json", type=output_file, default=None, metavar="PATH", help="write the whole record here")
    parser.add_argument("--model", type=_model, default="smollm2", help="lm pair: smollm2, a .gguf file or a Hugging Face folder")
    parser.add_argument("--prompt", default="Write a short poem about the sea.", help="lm pair: a user message")
    parser.add_argument("--n", type=count, default=16, help="lm pair: continuation length (at most, with --eos stop)")
    parser.add_argument("--eos", choices=("suppress", "stop"), default="suppress",
                        help="lm pair: suppress EOS (the paper's n tokens) or stop a continuation at it, as served")
    parser.add_argument("--pi", type=_keyword, nargs="*", default=[], metavar="KEY=VALUE", help="lm pair: pi's variant")
    parser.add_argument("--mu", type=_keyword, nargs="*", default=[], metavar="KEY=VALUE", help="lm pair: mu's variant")
    parser.add_argument("--pool", default=None, metavar="PATH",
                        help="gate a score pool's stored rows instead of sampling a pair (its replay passes: "
                             "deterministic = exact; otherwise the plug-in and the A/A noise floor)")
    parser.add_argument("--scorers", nargs=2, default=None, metavar=("PI", "MU"),
                        help="pool: the two scorers to compare (default the pool's samplers)")
    parser.add_argument("--compilation-cache", default=None, metavar="FOLDER|off")
    return parser


def gate_main(argv):
    parser = gate_parser()
    args = parser.parse_args(argv)
    if args.access == "noisy" and args.sigma is None:
        parser.error("--access noisy needs --sigma")
    enable_compilation_cache(args.compilation_cache)
    progress = lambda e: print(f"round {e.rounds}: [{e.low:.4f}, {e.high:.4f}] after {e.observations} observations, "
                               f"{e.queries:.3g} queries", file=sys.stderr, flush=True)
    try:
        if args.pool is not None:
            result = _gate_pool(args, progress)
        else:
            from tvjax.audit.sequential import gate  # the audit layer (and the pools extra) only for the gate

            pi, mu = gate_pair(args)
            budget = 1e9 if args.budget is None else args.budget
            result = gate(jax.random.key(args.seed), pi, mu, args.tau, args.delta, budget, args.access,
                          args.round_size, args.sigma, on_round=progress)
    except (ValueError, OSError) as error:  # OSError: a model or pool file that cannot be read
        parser.exit(3, f"tvjax gate: error: {error}\n")
    print(verdict_line(result), flush=True)
    for scorer, floor in (result.noise_floor or {}).items():
        print(f"A/A noise floor of {scorer} (its replay passes split in two halves, true TV 0): "
              f"[{floor.low:.4f}, {floor.high:.4f}] (estimate {floor.value:.4f})", flush=True)
    if args.json:
        source = {"pool": args.pool, "scorers": args.scorers} if args.pool else {
            "pair": args.pair, "access": args.access, "sigma": args.sigma, "seed": args.seed, "eos": args.eos,
            "pi": dict(args.pi), "mu": dict(args.mu)}
        record = {**source, **result._asdict()}
        with open(args.json, "w") as handle:
            json.dump(to_jsonable(record), handle, indent=2)
    return result.exit_code


def text_tokenizer(spec):
    """'bytes' (UTF-8 bytes: any endpoint) or a model spec whose tokenizer tvjax.models loads."""
    from tvjax.audit.distinguish import ByteTokenizer

    if spec == "bytes":
        return ByteTokenizer()
    from tvjax.models.pairs import load_model

    return load_model(spec).tokenizer


def distinguish_parser():
    parser = Parser(error_status=3, prog="tvjax distinguish", description="A certified lower bound on the TV between two "
                                           "text-only chat endpoints (OpenAI-compatible, no log-probabilities): a "
                                           "classifier trained on half of their completions, counted on the other half.")
    for side in ("pi", "mu"):
        parser.add_argument(f"--{side}-url", required=True, help=f"{side}'s base URL, e.g. http://127.0.0.1:8000/v1")
        parser.add_argument(f"--{side}-model", default=None, help=f"{side}'s served model (default: ask /models)")
        parser.add_argument(f"--{side}-extra", type=_json_object, default={}, metavar="JSON",
                            help=f"more request fields for {side}, a JSON object")
    parser.add_argument("--prompt", default="Write a short poem about the sea.", help="the user message")
    parser.add_argument("--system", default=None, help="a system message")
    parser.add_argument("--num", type=integer(2), default=1000, help="completions per side (half of them test the classifier)")
    parser.add_argument("--max-tokens", type=count, default=64)
    parser.add_argument("--temperature", type=nonnegative, default=1.0)
    parser.add_argument("--tokenizer", default="bytes", help="bytes (UTF-8, any endpoint) or a model: smollm2, .gguf, folder")
    parser.add_argument("--classifier", choices=("ngram", "transformer"), default="ngram")
    parser.add_argument("--delta", type=probability, default=0.05)
    parser.add_argument("--seed", type=random_seed, default=0)
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="the environment variable holding the key")
    parser.add_argument("--requests-per-second", type=positive, default=10.0)
    parser.add_argument("--samples", type=output_file, default="endpoint_samples.jsonl", metavar="PATH",
                        help="the completions, kept: a rerun reuses them and asks only for what is missing")
    parser.add_argument("--json", type=output_file, default=None, metavar="PATH", help="write the whole record here")
    return parser


def distinguish_main(argv):
    parser = distinguish_parser()
    args = parser.parse_args(argv)
    from tvjax.audit.distinguish import distinguish_texts
    from tvjax.engines.openai_bridge import stored_texts  # no JAX, no torch: httpx and numpy
    from tvjax.engines.protocol import EngineError

    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.prompt}]
    config = lambda side: {"base_url": getattr(args, f"{side}_url"), "served_model": getattr(args, f"{side}_model"),
                           "api_key_env": args.api_key_env, "temperature": args.temperature,
                           "extra_body": getattr(args, f"{side}_extra"), "max_requests": args.num,
                           "requests_per_second": args.requests_per_second}
    try:
        texts = [stored_texts(Path(args.samples), side, config(side), messages, args.num, args.max_tokens,
                              2 * args.seed + index) for index, side in enumerate(("pi", "mu"))]
        result = distinguish_texts(jax.random.key(args.seed), *texts, text_tokenizer(args.tokenizer),
                                   classifier=args.classifier, delta=args.delta)
    except (ValueError, OSError, EngineError) as error:  # OSError: a tokenizer's model file that cannot be read
        parser.exit(3, f"tvjax distinguish: error: {error}\n")
    print(f"TV >= {result.lower_bound:.4f} at {100 * (1 - args.delta):g}% (estimate {result.estimate:.4f}; "
          f"{result.pi_test} + {result.mu_test} held-out completions, {args.classifier} classifier)", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(to_jsonable({"args": vars(args), **result._asdict()}), handle, indent=2)
    return 0


def main_parser():
    parser = Parser(prog="tvjax", description=__doc__)
    parser.add_argument("--seed", type=random_seed, default=0)
    parser.add_argument("--eps", type=probability, default=0.05, help="target accuracy, in (0, 1)")
    parser.add_argument("--delta", type=probability, default=0.1, help="failure probability, in (0, 1)")
    parser.add_argument("--sigma", type=nonnegative, default=0.1, help="relative noise of the noisy oracle, >= 0")
    parser.add_argument("--compilation-cache", default=None, metavar="FOLDER|off",
                        help="JAX's persistent compilation cache (default: $TVJAX_COMPILATION_CACHE, else "
                             "~/.cache/tvjax/jax-compilation); off to opt out")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    subcommands = {"gate": gate_main, "distinguish": distinguish_main}
    if argv[:1] and argv[0] in subcommands:
        try:
            sys.exit(subcommands[argv[0]](argv[1:]))
        except MissingExtra as error:  # an optional feature without its extra: one line, the bad-input exit 3
            print(f"tvjax {argv[0]}: error: {error}", file=sys.stderr)
            sys.exit(3)
    parser = main_parser()
    args = parser.parse_args(argv)
    enable_compilation_cache(args.compilation_cache)
    try:
        check_reach(args.eps, args.delta, args.sigma)
    except ValueError as error:
        parser.error(str(error))
    run(args.seed, args.eps, args.delta, args.sigma, emit=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
