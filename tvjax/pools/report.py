"""`python -m tvjax.pools.report POOL --out DIR`: every pool analysis as a folder of markdown, JSON and PNGs.

DIR/summary.md     short human summary with the headline numbers
DIR/results.json   all numbers (NamedTuples as objects, arrays as lists; never NaN)
DIR/*.png          tv_by_prefix, tv_by_repeats, decomposition, sigma, support_union, multilevel_rmse
"""

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tvjax._arguments import Parser, count, integer, output_folder, random_seed, scorer_pair
from tvjax._extras import require
from tvjax.core.jsonable import to_jsonable
from tvjax.pools import analysis as A
from tvjax.pools.analysis.currency import check_hygiene, default_pair
from tvjax.pools.store import PoolError, load_pool


class Skipped(NamedTuple):
    """An analysis that does not apply to this pool (e.g. multilevel with R < 4), and why."""

    skipped: str


def _attempt(analysis, *args, **kwargs):
    """The analysis' result, or Skipped(reason) when it refuses this pool with a ValueError."""
    try:
        return analysis(*args, **kwargs)
    except ValueError as e:
        return Skipped(str(e))


def _ok(result) -> bool:
    return not isinstance(result, Skipped)


def _figure(path: Path, draw, xlabel: str, ylabel: str, title: str, logx: int | None = None, logy=False) -> str:
    """Draw one labeled plot with a legend into `path` (logx: the base of a log x axis, or None)."""
    matplotlib = require("matplotlib", "plot", "the pool report's figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    draw(ax)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log", base=logx)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


def _plots(out: Path, res: dict) -> list[str]:
    tv, prefix, rep, ml = res["tv"], res["prefix"], res["repeats"], res["multilevel"]
    names = []

    def prefix_plot(ax):
        ax.plot(prefix.lengths, prefix.value, label="TV estimate (symmetric)")
        ax.fill_between(prefix.lengths, prefix.value - 2 * prefix.stderr, prefix.value + 2 * prefix.stderr,
                        alpha=0.25, label="±2 stderr")
        ax.plot(prefix.lengths, prefix.mismatch, "--", label="support-mismatch part")
    names.append(_figure(out / "tv_by_prefix.png", prefix_plot, "prefix length t", "TV of length-t prefixes",
                         "TV against prefix length"))

    def decomposition_plot(ax):
        labels = ["pi arm", "mu arm", "symmetric"]
        shared = [tv.arm_pi - tv.mismatch_rate_pi, tv.arm_mu - tv.mismatch_rate_mu, tv.shared]
        mismatch = [tv.mismatch_rate_pi, tv.mismatch_rate_mu, tv.mismatch]
        ax.bar(labels, shared, label="shared support")
        ax.bar(labels, mismatch, bottom=shared, label="support mismatch (Z = 1)")
    names.append(_figure(out / "decomposition.png", decomposition_plot, "estimator", "TV", "TV decomposition"))

    if _ok(rep):
        def repeats_plot(ax):
            ax.errorbar(rep.repeats, rep.value, 2 * rep.stderr, marker="o", capsize=3,
                        label=f"TV {rep.pair[0]} vs {rep.pair[1]}")
            for s, floor in rep.floor.items():
                ax.plot(rep.floor_repeats, floor, "--", marker=".", label=f"self-noise floor of {s}")
        names.append(_figure(out / "tv_by_repeats.png", repeats_plot, "repetitions r (repeats per position)",
                             "estimated TV", "TV against repetition count", logx=2))

    sigma = {s: c for s, c in res["sigma"].items() if _ok(c)}
    if sigma:
        def sigma_plot(ax):
            pct = ["p50", "p90", "p99", "max"]
            for s, cal in sigma.items():
                ax.plot(pct, np.sqrt(cal.realized_percentiles), marker="o",
                        label=f"{s} realized-token (mean {cal.realized_sigma:.3g})")
                if cal.union_percentiles is not None:
                    ax.plot(pct, np.sqrt(cal.union_percentiles), marker="s",
                            label=f"{s} union-support (mean {cal.union_sigma:.3g})")
        positive = any(np.any(c.realized_percentiles > 0) for c in sigma.values())
        names.append(_figure(out / "sigma.png", sigma_plot, "percentile across cells", "per-cell sigma",
                             "sigma calibration (half-split chi-square)", logy=positive))

    support = {s: u for s, u in res["support"].items() if _ok(u)}
    if support:
        def support_plot(ax):
            for s, u in support.items():
                ax.plot(u.repeats, u.mean, label=f"{s} mean")
                ax.plot(u.repeats, u.p99, ":", label=f"{s} p99")
            ax.axhline(next(iter(support.values())).top_k, color="k", lw=0.8, label="stated k")
        names.append(_figure(out / "support_union.png", support_plot, "repetitions r (repeats per position)",
                             "top-k support union size", "empirical top-k support", logx=2))

    if _ok(ml):
        def ml_plot(ax):
            for curve in ml.rmse_single:
                ax.plot(ml.budgets, curve, color="0.7", ls="--", lw=0.8)
            ax.plot([], [], color="0.7", ls="--", label="fixed single levels")
            ax.plot(ml.budgets, ml.rmse_hindsight, "k--", label="hindsight-best single level")
            ax.plot(ml.budgets, ml.rmse_single_pilot, marker="s", label="pilot-chosen single level")
            ax.plot(ml.budgets, ml.rmse_multilevel, marker="o", label="pilot-chosen multilevel")
        names.append(_figure(out / "multilevel_rmse.png", ml_plot, "budget (queries)", "RMSE",
                             "multilevel evaluation (B.7)", logx=10, logy=True))
    return names


def _length_lines(pool) -> list[str]:
    """A stopping pool's output lengths per side (outputs end at EOS; TV is over whole outputs)."""
    if not pool.spec.stops:
        return ["Fixed-length outputs (EOS suppressed)."]
    parts = [f"{s}: mean {np.mean(pool.lengths[s]):.1f}, {np.mean(pool.lengths[s] < pool.spec.n):.1%} stopped before n"
             for s in ("pi", "mu")]
    return [f"Outputs stop at EOS {list(pool.spec.eos_ids)} (lengths: {'; '.join(parts)})."]


def _summary(pool, res: dict, figures: list[str]) -> str:
    tv, ml, rep = res["tv"], res["multilevel"], res["repeats"]
    spec, meta = pool.spec, pool.metadata
    lines = ["# Pool report", "",
             f"n = {spec.n}, N = {spec.num_per_side} per side, R = {spec.repeats} passes, scorers {list(spec.scorers)}, "
             f"samplers {list(spec.samplers)}, top-k {spec.top_k}"
             + "".join(f"; {k} {meta[k]}" for k in ("engine", "engine_version", "model", "dtype") if k in meta)
             + ".", *_length_lines(pool), "",
             "## TV (symmetric scoring)", "",
             f"TV = {tv.value:.4g} ± {tv.stderr:.2g} (95% bootstrap CI [{tv.ci_low:.4g}, {tv.ci_high:.4g}]) at r = {tv.repeats}; "
             f"arms: pi {tv.arm_pi:.4f} ± {tv.arm_pi_stderr:.4f}, mu {tv.arm_mu:.4f} ± {tv.arm_mu_stderr:.4f}; "
             f"likelihood-ratio arms {tv.lr_pi:.4f} / {tv.lr_mu:.4f}.",
             f"Shared support {tv.shared:.4f} + support mismatch {tv.mismatch:.4f} "
             f"(mismatch on {tv.mismatch_rate_pi:.1%} of pi and {tv.mismatch_rate_mu:.1%} of mu trajectories)."]
    if "exact_tv" in meta:
        lines.append(f"Known exact TV: {meta['exact_tv']:.4f}.")
    lines += ["", "## Repetitions", ""]
    if _ok(rep):
        lines.append(f"TV at r = {rep.repeats.tolist()}: {np.round(rep.value, 4).tolist()}; self-noise floor at r = "
                     f"{rep.floor_repeats.tolist()}: "
                     + "; ".join(f"{s} {np.round(v, 4).tolist()}" for s, v in rep.floor.items())
                     + f" (repeats {'permuted per cell' if rep.permuted else 'in serving order'}).")
    else:
        lines.append(f"Skipped: {rep.skipped}")
    lines += ["", "## Oracle noise and support", ""]
    for s, cal in res["sigma"].items():
        if not _ok(cal):
            lines.append(f"* {s}: sigma calibration skipped: {cal.skipped}")
            continue
        union = f"union-support sigma {cal.union_sigma:.4g}" if cal.union_sigma is not None else "no top-k readout"
        lines.append(f"* {s}: {union}; realized-token sigma {cal.realized_sigma:.4g} "
                     f"({cal.nondegenerate_fraction:.1%} of cells non-degenerate).")
    for s, u in res["support"].items():
        lines.append(f"* {s}: top-k union at r = {int(u.repeats[-1])}: mean {u.mean[-1]:.3f}, p99 {u.p99[-1]:.2f}, "
                     f"max {int(u.max[-1])} (k = {u.top_k})." if _ok(u) else f"* {s}: support union skipped: {u.skipped}")
    zm = res["zero_mass"]
    lines += ["", "## Zero mass and scorer comparisons", "",
              "Own-token zero-mass trajectory rate: " + ", ".join(f"{s} {v:.2%}" for s, v in zm.own.items()) + "."]
    for cmp in res["compare"]:
        lines.append(f"* {list(cmp.pair_b)} against {list(cmp.pair_a)}: TV {cmp.tv_b.value:.4f} vs {cmp.tv_a.value:.4f}, "
                     f"mismatch {cmp.mismatch_b:.2%} vs {cmp.mismatch_a:.2%}, mean |Δ log p| shift "
                     f"{cmp.shift:+.4f} ± {cmp.shift_stderr:.4f}, slope {cmp.compression:.3f}."
                     if _ok(cmp) else f"* comparison skipped: {cmp.skipped}")
    lines += ["", "## Multilevel evaluation (B.7)", ""]
    if _ok(ml):
        saving = lambda x: "n/a" if x is None else f"{x:.2f}x"
        lines.append(f"Grid {ml.grid.tolist()}, pilot {ml.pilot_size} samples x {ml.num_pilots} draws; schedule chosen "
                     f"at the largest budget: {list(ml.chosen[-1])} (multilevel in {ml.multilevel_fraction[-1]:.0%} of "
                     f"pilot draws); RMSE ratio vs pilot-chosen single level {ml.rmse_ratio:.3f}; peak equal-accuracy "
                     f"saving {saving(ml.saving_pilot)} vs pilot-chosen single level, {saving(ml.saving_hindsight)} "
                     "vs hindsight-best.")
    else:
        lines.append(f"Skipped: {ml.skipped}")
    lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def write_report(pool_path, out, *, compare=(), permutations: int = 8, pilot_size: int | None = None,
                 num_pilots: int = 40, seed: int = 0) -> Path:
    """Run every analysis on the pool at `pool_path` and write summary.md, results.json and PNGs to `out`.

    Analyses that do not apply to the pool (too few repeats, no top-k readout) are reported as
    skipped with the reason; the TV estimate, prefix curve and zero-mass rates always run."""

    out = Path(out)
    if out.resolve().is_relative_to(Path(pool_path).resolve()):
        raise ValueError(f"out {str(out)!r} is inside the pool {str(pool_path)!r}: the report would write into its store")
    pool = load_pool(pool_path)
    for pair in compare:  # asked for by name: an unknown scorer refuses the report (the pool's own pairs may skip)
        try:
            default_pair(pool, pair)
        except ValueError as error:
            raise ValueError(f"compare {','.join(pair)}: {error}") from None
    out.mkdir(parents=True, exist_ok=True)
    hygiene = check_hygiene(A.Hygiene(True, permutations, seed))
    compare = list(compare) or [tuple(p) for p in pool.metadata.get("comparison_pairs", [])]
    pilot = max(2, min(64, pool.spec.num_per_side // 4)) if pilot_size is None else pilot_size
    res = {
        "tv": A.tv_estimate(pool, seed=seed),
        "prefix": A.tv_by_prefix(pool),
        "repeats": _attempt(A.tv_by_repeats, pool, hygiene=hygiene),
        "sigma": {s: _attempt(A.calibrate_sigma, pool, s, hygiene) for s in pool.spec.scorers},
        "support": {s: _attempt(A.support_union, pool, s, hygiene) for s in pool.spec.scorers} if pool.spec.top_k else {},
        "zero_mass": A.zero_mass_rates(pool),
        "compare": [_attempt(A.compare_scorers, pool, pair) for pair in compare],
        "multilevel": _attempt(A.evaluate_multilevel, pool, pilot_size=pilot, num_pilots=num_pilots,
                               hygiene=hygiene, seed=seed),
    }
    figures = _plots(out, res)
    payload = {"pool": str(pool_path), "spec": to_jsonable(pool.spec), "metadata": pool.metadata,
               "lengths": {s: pool.lengths[s].tolist() for s in pool.lengths}, **to_jsonable(res)}
    (out / "results.json").write_text(json.dumps(payload, indent=1, allow_nan=False))
    (out / "summary.md").write_text(_summary(pool, res, figures))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m tvjax.pools.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pool")
    parser.add_argument("--out", type=output_folder, required=True, metavar="DIR",
                        help="the report's folder (created; an earlier report there is replaced)")
    parser.add_argument("--compare", type=scorer_pair, action="append", default=[], metavar="A,B",
                        help="also compare the scorer pair A,B against the samplers (repeatable)")
    parser.add_argument("--permutations", type=count, default=8, help="repeat permutations to average over, >= 1")
    parser.add_argument("--pilot-size", type=integer(2), default=None, help="multilevel: pilot samples, >= 2")
    parser.add_argument("--num-pilots", type=count, default=40, help="multilevel: pilot draws, >= 1")
    parser.add_argument("--seed", type=random_seed, default=0)
    return parser


def main(argv=None) -> int:
    """Usage errors (a bad flag value, --out a file) exit 2 through argparse before the pool is read; a pool
    that cannot be read or a --compare pair it does not hold returns 2 with one line, before any analysis."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = write_report(args.pool, args.out, compare=args.compare, permutations=args.permutations,
                           pilot_size=args.pilot_size, num_pilots=args.num_pilots, seed=args.seed)
    except (PoolError, ValueError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"report written to {out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
