"""`python -m tvjax.pools.analysis COMMAND POOL [options]`: one analysis of a pool, printed as JSON."""

import argparse
import json
import sys

from tvjax._arguments import Parser, count, integer, random_seed, scorer_pair
from tvjax.core.jsonable import to_jsonable
from tvjax.pools.analysis import (
    Hygiene,
    calibrate_sigma,
    compare_scorers,
    evaluate_multilevel,
    support_union,
    tv_by_prefix,
    tv_by_repeats,
    tv_estimate,
    zero_mass_rates,
)
from tvjax.pools.store import PoolError, load_pool


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m tvjax.pools.analysis", description=__doc__)
    parser.add_argument("command", choices=["tv", "prefix", "repeats", "sigma", "support", "zero-mass",
                                            "compare", "multilevel"])
    parser.add_argument("pool")
    parser.add_argument("--pair", type=scorer_pair, default=None, help="scorers of pi and mu, 'A,B' (default: samplers)")
    parser.add_argument("--against", type=scorer_pair, help="compare: the second pair 'A,B'")
    parser.add_argument("--scorer", help="sigma/support: one scorer (default: every scorer)")
    parser.add_argument("--repeats", type=count, default=None, help="tv/prefix: passes to average, >= 1 (default all)")
    parser.add_argument("--serving-order", action="store_true", help="disable the repeat-axis permutation")
    parser.add_argument("--permutations", type=count, default=8, help="repeat permutations to average over, >= 1")
    parser.add_argument("--pilot-size", type=integer(2), default=64, help="multilevel: pilot samples, >= 2")
    parser.add_argument("--num-pilots", type=count, default=40, help="multilevel: pilot draws, >= 1")
    parser.add_argument("--arm", default="symmetric", choices=["symmetric", "pi", "mu"])
    parser.add_argument("--seed", type=random_seed, default=0)
    parser.add_argument("--partial", action="store_true", help="analyze the committed part of an unfinished pool")
    return parser


def run(args) -> object:
    pool = load_pool(args.pool, partial=args.partial, load_topk=args.command in ("sigma", "support"))
    hygiene = Hygiene(not args.serving_order, args.permutations, args.seed)
    scorers = [args.scorer] if args.scorer else list(pool.spec.scorers)
    if args.command == "tv":
        return tv_estimate(pool, args.pair, args.repeats, hygiene, seed=args.seed)
    if args.command == "prefix":
        return tv_by_prefix(pool, args.pair, args.repeats, hygiene)
    if args.command == "repeats":
        return tv_by_repeats(pool, args.pair, hygiene=hygiene)
    if args.command == "sigma":
        return {s: calibrate_sigma(pool, s, hygiene) for s in scorers}
    if args.command == "support":
        return {s: support_union(pool, s, hygiene) for s in scorers}
    if args.command == "zero-mass":
        return zero_mass_rates(pool)
    if args.command == "compare":
        return compare_scorers(pool, args.against, args.pair)
    return evaluate_multilevel(pool, args.pair, pilot_size=args.pilot_size, num_pilots=args.num_pilots,
                               arm=args.arm, hygiene=hygiene._replace(num_permutations=args.permutations),
                               seed=args.seed)


def main(argv=None) -> int:
    """Usage errors (a bad flag value, compare without --against) exit 2 through argparse; a pool that
    cannot be read or an analysis that refuses it (unknown scorers, too few repeats) returns 2 with one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "compare" and args.against is None:
        parser.error("compare needs --against A,B")
    try:
        result = run(args)
    except (PoolError, ValueError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(to_jsonable(result), indent=1, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
