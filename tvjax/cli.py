"""`python -m tvjax`: the default estimate on the paper's instance under each access model.
`python -m tvjax gate ...`: is TV(pi, mu) below a tolerance? PASS / FAIL / INCONCLUSIVE, exit 0 / 1 / 2."""

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax

from tvjax._arguments import (
    Parser,
    count,
    integer,
    nonnegative,
    output_file,
    output_folder,
    positive,
    probability,
    random_seed,
)
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
    parser.add_argument("--tau", type=nonnegative, default=None,
                        help="the TV tolerance, in (0, 1) (with --reference: in [0, 1), default 0: any difference)")
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
    audit = parser.add_argument_group("reference-model audit of a text-only endpoint (--reference MODEL --endpoint URL)")
    audit.add_argument("--reference", type=_model, default=None, metavar="MODEL",
                       help="the authentic model, run locally: smollm2, a .gguf file or a Hugging Face folder")
    audit.add_argument("--endpoint", default=None, metavar="URL", help="the target's OpenAI-compatible base URL (.../v1)")
    audit.add_argument("--served-model", default=None, help="the target's model name (default: ask /models)")
    audit.add_argument("--prompts", default=None, metavar="FILE", help="prompts, one a line (a line of JSON: chat "
                       "messages); default --prompt alone")
    audit.add_argument("--system", default=None, help="a system message before every prompt")
    audit.add_argument("--max-tokens", type=count, default=32, help="the answers' length limit (the reference's n)")
    audit.add_argument("--temperature", type=nonnegative, default=1.0, help="sampling temperature, both sides")
    audit.add_argument("--top-p", type=probability, default=1.0, help="top-p, both sides")
    audit.add_argument("--m", type=count, default=15, help="reference samples per target call")
    audit.add_argument("--score", choices=("logprob", "mean_logprob", "length", "log_rank"), default="logprob")
    audit.add_argument("--answers", type=output_folder, default="endpoint_answers", metavar="FOLDER",
                       help="the target's answers, written as they arrive: a rerun asks only for what is missing")
    audit.add_argument("--api-key-env", default="OPENAI_API_KEY", help="the environment variable holding the key")
    audit.add_argument("--requests-per-second", type=positive, default=10.0)
    audit.add_argument("--extra", type=_json_object, default={}, metavar="JSON",
                       help='more request fields, a JSON object (e.g. {"return_tokens_as_token_ids": true} for vLLM)')
    audit.add_argument("--floor-endpoint", default=None, metavar="URL",
                       help="grey-box mode: a second deployment of the authentic model (the noise floor); both "
                            "endpoints must return log-probabilities, and delta is split between the rank gate and "
                            "the grey-box test")
    audit.add_argument("--floor-model", default=None, help="the floor endpoint's model name (default: ask /models)")
    return parser


def read_prompts(path, prompt, system):
    """Chat messages per prompt: the lines of `path` (plain text, or JSON chat messages), else `prompt`."""
    lines = [prompt] if path is None else [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no prompts")
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("["):
            try:
                messages = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON chat messages: {error}") from error
            if not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages):
                raise ValueError(f"{path}:{number}: chat messages must be {{'role', 'content'}} objects")
        else:
            messages = [{"role": "user", "content": line}]
        prompts.append(([{"role": "system", "content": system}] if system else []) + messages)
    return prompts


def reference_gate_main(parser, args, progress):
    """`tvjax gate --reference MODEL --endpoint URL`: rounds of target calls until the anytime bound
    certifies TV > tau (FAIL) or the budget of calls is spent (PASS: nothing detected)."""
    import numpy as np

    from tvjax.audit.reference.audit import round_ranks
    from tvjax.audit.reference.endpoint import canonical_rows, endpoint_calls
    from tvjax.audit.reference.sequential import rank_gate
    from tvjax.engines.answers import collect_answers  # httpx, no JAX
    from tvjax.models.pairs import load_model
    from tvjax.models.process import prompt_processes

    tau = 0.0 if args.tau is None else args.tau
    if tau >= 1:
        parser.error(f"--tau must lie in [0, 1), got {tau}")
    budget = 256 if args.budget is None else int(args.budget)
    if budget < 1:
        parser.error("--budget (target calls, with --reference) must be >= 1")
    round_size = min(args.round_size, budget)
    prompts = read_prompts(args.prompts, args.prompt, args.system)
    loaded = load_model(args.reference)
    if loaded.tokenizer is None:
        raise ValueError(f"--reference {args.reference}: the model has no tokenizer, so its texts cannot be compared")
    references = prompt_processes(loaded, prompts, args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                  eos="stop")
    eos_ids = references[0].eos_ids
    config = {"base_url": args.endpoint, "served_model": args.served_model, "api_key_env": args.api_key_env,
              "temperature": args.temperature, "top_p": args.top_p, "max_requests": budget,
              "requests_per_second": args.requests_per_second, "extra_body": args.extra}
    grey = args.floor_endpoint is not None
    delta = args.delta / 2 if grey else args.delta
    top_logprobs = 1 if grey else None
    draws = np.random.default_rng(args.seed).integers(len(prompts), size=budget)
    plan, seen = [], {}
    for p in draws.tolist():
        plan.append((p, seen.get(p, 0)))
        seen[p] = seen.get(p, 0) + 1

    def call_rounds():
        for start in range(0, budget, round_size):
            answers = collect_answers(args.answers, config, prompts, plan[start : start + round_size], args.max_tokens,
                                      args.seed, top_logprobs)
            yield endpoint_calls(loaded.tokenizer, answers, args.max_tokens, eos_ids)

    ranks = round_ranks(jax.random.key(args.seed), references, call_rounds(), args.m, args.score,
                        canonical_rows(loaded.tokenizer, args.max_tokens, eos_ids))
    result = rank_gate(ranks, args.m, tau, delta, budget, on_round=progress)
    if not grey:
        return result, None
    used = plan[: result.bound.calls]
    floor_config = {**config, "base_url": args.floor_endpoint, "served_model": args.floor_model}
    floor_folder = Path(args.answers).with_name(Path(args.answers).name + "-floor")
    sides = [collect_answers(folder, side_config, prompts, used, args.max_tokens, args.seed, top_logprobs)
             for folder, side_config in ((args.answers, config), (floor_folder, floor_config))]
    return result, greybox_result(references, loaded.tokenizer, sides, args.max_tokens, eos_ids)


def greybox_result(references, tokenizer, sides, n, eos_ids):
    """The grey-box test of the target's answers (sides[0]) against the floor's (sides[1])."""
    import numpy as np

    from tvjax.audit.reference.endpoint import greybox_deviations, greybox_test, reported_rows

    deviations = []
    for answers in sides:
        tokens, reported, lengths = reported_rows(tokenizer, answers, n, eos_ids)
        deviations.append(greybox_deviations(references, np.array([a.prompt for a in answers]), tokens, reported, lengths))
    return greybox_test(*deviations)


def reference_verdict_line(result, args):
    b = result.bound
    if result.verdict == "FAIL":
        return (f"FAIL  TV > {result.tau:g} certified at {100 * (1 - result.delta):g}%: TV >= {b.lower_bound:.4f} "
                f"({args.score} score, m={args.m}; largest CDF gap {b.estimate:.4f}) after {b.calls} target calls")
    return (f"PASS  no difference above tau={result.tau:g} detected within {b.calls} target calls: TV >= "
            f"{b.lower_bound:.4f} at {100 * (1 - result.delta):g}% ({args.score} score, m={args.m}; largest CDF gap "
            f"{b.estimate:.4f}); a score-based audit bounds TV from below only, this is not a certificate that TV <= tau")


def gate_main(argv):
    parser = gate_parser()
    args = parser.parse_args(argv)
    if (args.reference is None) != (args.endpoint is None):
        parser.error("the reference-model audit needs both --reference MODEL and --endpoint URL")
    if args.reference is not None:
        return _reference_gate(parser, args)
    if args.tau is None:
        parser.error("the following arguments are required: --tau")
    if not 0 < args.tau < 1:
        parser.error(f"--tau must lie in (0, 1), got {args.tau}")
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


def _reference_gate(parser, args):
    from tvjax.engines.protocol import EngineError

    enable_compilation_cache(args.compilation_cache)
    progress = lambda b: print(f"{b.calls} target calls: TV >= {b.lower_bound:.4f} (largest CDF gap {b.estimate:.4f})",
                               file=sys.stderr, flush=True)
    try:
        result, grey = reference_gate_main(parser, args, progress)
    except (ValueError, OSError, EngineError) as error:
        parser.exit(3, f"tvjax gate: error: {error}\n")
    print(reference_verdict_line(result, args), flush=True)
    exit_code = result.exit_code
    if grey is not None:
        differs = grey.pvalue < args.delta / 2
        exit_code = max(exit_code, int(differs))
        print(f"{'FAIL' if differs else 'PASS'}  grey-box: the target's log-probs deviate from the reference's by "
              f"{grey.target_median:.3g} nats a token (median), the noise floor by {grey.floor_median:.3g}: p = "
              f"{grey.pvalue:.3g} (one-sided, at {args.delta / 2:g}: delta split with the rank gate)", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            record = {"args": vars(args), **result._asdict(), "greybox": None if grey is None else grey._asdict()}
            json.dump(to_jsonable(record), handle, indent=2)
    return exit_code


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
    parser.add_argument("--samples", type=output_folder, default="endpoint_samples", metavar="FOLDER",
                        help="the completions, kept as they arrive (an answer store per side): a rerun reuses them "
                             "and asks only for what is missing")
    parser.add_argument("--json", type=output_file, default=None, metavar="PATH", help="write the whole record here")
    return parser


def distinguish_main(argv):
    parser = distinguish_parser()
    args = parser.parse_args(argv)
    from tvjax.audit.distinguish import distinguish_texts
    from tvjax.engines.answers import stored_texts  # no JAX, no torch: httpx and numpy
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
