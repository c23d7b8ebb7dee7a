"""tvjax against the paper's own code: its synthetic runners and tvjax's Hydra studies at the same
protocol, each a whole process (interpreter start to exit), side by side in one command.

    .venv/bin/python benchmarks/anchors.py            # the paper's sizes (about 25 minutes: the runners')
    .venv/bin/python benchmarks/anchors.py --quick    # the runners' smaller sizes, for CI (B.11 left out)

| study | the paper's runner                   | tvjax                                                   |
|-------|--------------------------------------|---------------------------------------------------------|
| fig5  | exact_logit_convergence (Figure 5)   | experiments/convergence.py, 512 repetitions, N 32..16384 |
| fig6  | plot_rho_regime_convergence (Fig. 6) | experiments/multilevel_regimes.py (its defaults)         |
| b11   | three_oracle_comparison (B.11)       | experiments/access_models.py experiment=access_models_paper |

Each tvjax study runs in `--runs` (3) fresh processes on a cold compilation cache (an empty cache
folder each) and 3 on a warm one (a folder filled by one unmeasured run first); the median by wall
time of each is reported. The runner runs once (its runs take minutes; `--anchor-runs` for more).
Wall seconds, CPU seconds (user + system, the process and its threads) and peak RSS come from
`os.wait4` on each process. One more tvjax process (unmeasured, warm cache, no figures) runs the
study, then runs it 3 times more, each between two draws of its random-number floor
(`measure_floor=true`, `tvjax.core.studies.runs_over_floor`): the "same process" line is the median of
those runs over the floor beside each. The runners
are found at $TVJAX_ANCHORS or ../shared/anchors beside the project; where they are not, the table
has tvjax's side only and says so. A full run ends with issue 13's targets, each met or not
(`target_checks`: speedups against the runner, peak RSS, runs over the floor). Writes JSON
(benchmarks/anchors.json unless --out), the targets included.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
FIG5_SIZES = "32,64,128,256,512,1024,2048,4096,8192,16384"


class Study(NamedTuple):
    runner: str
    runner_args: tuple
    quick_runner_args: tuple  # None: not run with --quick
    app: str
    overrides: tuple
    quick_overrides: tuple


STUDIES = {
    "fig5": Study("exact_logit_convergence", (), ("--reps", "16", "--N_grid", "32,64,128"),
                  "convergence", ("study.reps=512", f"study.sizes=[{FIG5_SIZES}]"),
                  ("study.reps=16", "study.sizes=[32,64,128]")),
    "fig6": Study("plot_rho_regime_convergence", (),
                  ("--reps", "2", "--sigmas", "0.5", "--scales", "1,2", "--diag_N_each", "256"),
                  "multilevel_regimes", (),
                  ("study.reps=2", "study.sigmas=[0.5]", "study.scales=[1,2]", "study.ratio_trajectories=256")),
    # three_oracle_comparison takes no arguments: it has no quick form.
    "b11": Study("three_oracle_comparison", (), None, "access_models", ("experiment=access_models_paper",), None),
}


def find_anchors(path=None):
    """The anchors folder (holding run.sh), or None."""
    for candidate in (path, os.environ.get("TVJAX_ANCHORS"), ROOT.parent / "shared" / "anchors"):
        if candidate and (Path(candidate) / "run.sh").is_file():
            return Path(candidate).resolve()
    return None


def measure(command, env=None, cwd=None):
    """Run `command` as a fresh process: wall and CPU seconds and peak RSS (MiB) of that process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    output = process.stdout.read().decode(errors="replace")
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"{command[:3]} exited with {process.returncode}:\n{output[-3000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss * 1024 / MIB}


def run_anchor(anchors, study, quick, tmp):
    args = study.quick_runner_args if quick else study.runner_args
    command = ["bash", str(anchors / "run.sh"), sys.executable, study.runner, str(Path(tmp) / study.runner), *args]
    return measure(command)


def tvjax_command(study, quick, out_dir, extra=()):
    overrides = study.quick_overrides if quick else study.overrides
    return [sys.executable, str(ROOT / "experiments" / f"{study.app}.py"), *overrides, f"hydra.run.dir={out_dir}", *extra]


def run_tvjax(study, quick, tmp, cache, label, extra=()):
    """One measured tvjax process with compilation cache folder `cache`; its results.json too."""
    out_dir = Path(tmp) / f"{study.app}-{label}-{time.monotonic_ns()}"
    env = {**os.environ, "TVJAX_COMPILATION_CACHE": str(cache)}
    timing = measure(tvjax_command(study, quick, out_dir, extra), env=env, cwd=ROOT)
    record = json.loads((out_dir / "results.json").read_text())
    floor = {key: record[key] for key in ("random_floor_seconds", "runs_over_floor", "floor_pairs") if key in record}
    return {**timing, "seconds": record["seconds"], "random_words": record["random_words"], **floor}


def median_run(runs):
    """The run with the median wall time, with every run's wall seconds."""
    ordered = sorted(runs, key=lambda run: run["wall"])
    return {**ordered[len(ordered) // 2], "walls": [run["wall"] for run in ordered]}


def run_study(name, study, anchors, args, tmp, reused=None):
    entry = {}
    if reused is not None:
        entry["paper"] = {**reused, "reused": True}
    elif anchors is not None:
        anchor_runs = [run_anchor(anchors, study, args.quick, tmp) for _ in range(args.anchor_runs)]
        entry["paper"] = median_run(anchor_runs)
    cold = [run_tvjax(study, args.quick, tmp, Path(tmp) / f"cold-{name}-{i}", "cold") for i in range(args.runs)]
    warm_cache = Path(tmp) / f"warm-{name}"
    run_tvjax(study, args.quick, tmp, warm_cache, "fill")
    warm = [run_tvjax(study, args.quick, tmp, warm_cache, "warm") for _ in range(args.runs)]
    floor = run_tvjax(study, args.quick, tmp, warm_cache, "floor", ("measure_floor=true", "plots=false"))
    entry["tvjax_cold"], entry["tvjax_warm"] = median_run(cold), median_run(warm)
    entry["random_words"] = floor["random_words"]
    entry["random_floor_seconds"] = floor["random_floor_seconds"]
    # The study's runs repeated in that process between draws of its floor (this VM's speed moves
    # between processes and within one): the median of the repeats' ratios. Its first run too.
    entry["floor_process_runs"] = floor["seconds"]["runs"]
    entry["floor_pairs"] = floor["floor_pairs"]
    entry["runs_over_floor"] = floor["runs_over_floor"]
    if "paper" in entry:
        for cache in ("cold", "warm"):
            side = entry[f"tvjax_{cache}"]
            entry[f"speedup_{cache}"] = {clock: entry["paper"][clock] / side[clock] for clock in ("wall", "cpu")}
    return entry


HEADER = (f"{'study':<6} {'side':<12} {'wall s':>8} {'cpu s':>8} {'peak MiB':>9} | {'speedup':>8} {'cpu spd':>8} | "
          f"{'imports':>7} {'hydra':>6} {'trace':>6} {'lower':>6} {'compile':>7} {'runs':>6} {'figures':>7} | "
          f"{'floor s':>7} {'runs/floor':>10}")


def format_rows(name, entry):
    rows = []
    if "paper" in entry:
        paper = entry["paper"]
        label = "paper*" if paper.get("reused") else "paper"
        rows.append(f"{name:<6} {label:<12} {paper['wall']:8.2f} {paper['cpu']:8.2f} {paper['peak_mib']:9.0f} |")
    for cache in ("cold", "warm"):
        side = entry[f"tvjax_{cache}"]
        cells = f"{name:<6} {'tvjax ' + cache:<12} {side['wall']:8.2f} {side['cpu']:8.2f} {side['peak_mib']:9.0f} |"
        speedup = entry.get(f"speedup_{cache}")
        cells += f" {speedup['wall']:7.1f}x {speedup['cpu']:7.1f}x |" if speedup else f" {'-':>8} {'-':>8} |"
        s = side["seconds"]
        cells += (f" {s['startup_and_imports']:7.2f} {s['hydra_composition']:6.2f} {s['tracing']:6.2f} {s['lowering']:6.2f} "
                  f"{s['compiling']:7.2f} {s['runs']:6.2f} {s['figures']:7.2f} |")
        floor = entry["random_floor_seconds"]
        cells += f" {floor:7.3f} {s['runs'] / floor:9.1f}x" if floor else f" {'-':>7} {'-':>10}"
        rows.append(cells)
    pairs = entry["floor_pairs"]
    ratios = ", ".join(f"{r / f:.2f}" for r, f in zip(pairs["runs"], pairs["floors"]))
    rows.append(f"{name:<6} {'same process':<12} runs {statistics.median(pairs['runs']):.2f} s between floor draws "
                f"{entry['random_floor_seconds']:.3f} s: runs/floor {entry['runs_over_floor']:.2f}x (median of {ratios}; "
                f"warm cache, no figures, the first run {entry['floor_process_runs']:.2f} s)")
    return rows


class Target(NamedTuple):
    """One of issue 13's targets against one run: what was measured, the bound, and whether it holds."""

    name: str
    measured: float
    bound: float
    at_least: bool  # the measured value must reach the bound (else stay at or under it)
    met: bool


# The targets, at the paper's protocol (not --quick): speedups against the paper's runner (whole
# process, wall) on a cold and a warm compilation cache, peak RSS, and the runs over their floor
# in the same process.
SPEEDUP_TARGETS = {"fig5": (5.0, 5.0), "fig6": (60.0, 100.0), "b11": (60.0, 100.0)}
PEAK_TARGET_MIB = 400e6 / MIB  # 400 MB
FLOOR_TARGET = 2.0


def _target(name, measured, bound, at_least):
    return Target(name, measured, bound, at_least, measured >= bound if at_least else measured <= bound)


def target_checks(studies):
    """The targets for each study of a full run's results["studies"] (speedups only where the
    paper's runner ran)."""
    checks = []
    for name, entry in studies.items():
        for cache, bound in zip(("cold", "warm"), SPEEDUP_TARGETS[name]):
            speedup = entry.get(f"speedup_{cache}")
            if speedup:
                checks.append(_target(f"{name} speedup, {cache} cache (x)", speedup["wall"], bound, True))
        peak = max(entry[f"tvjax_{cache}"]["peak_mib"] for cache in ("cold", "warm"))
        checks.append(_target(f"{name} peak RSS (MiB)", peak, PEAK_TARGET_MIB, False))
        checks.append(_target(f"{name} runs / floor, same process (x)", entry["runs_over_floor"], FLOOR_TARGET, False))
    return checks


def format_targets(checks):
    return [f"target {c.name:<40} {c.measured:9.2f} {'>=' if c.at_least else '<='} {c.bound:7.2f}  "
            f"{'met' if c.met else 'NOT MET'}" for c in checks]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the runners' smaller sizes (B.11 has none: left out)")
    parser.add_argument("--studies", nargs="+", choices=list(STUDIES), default=None)
    parser.add_argument("--runs", type=int, default=3, help="tvjax processes per cache state (median reported)")
    parser.add_argument("--anchor-runs", type=int, default=1, help="runs of each paper runner (median reported)")
    parser.add_argument("--anchors", default=None, help="the anchors folder (default: $TVJAX_ANCHORS or ../shared/anchors)")
    parser.add_argument("--reuse-paper", default=None, metavar="JSON",
                        help="take the paper runners' measurements from a previous run's JSON (they take minutes and do not "
                             "depend on tvjax); the rows are marked as reused")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "anchors.json"))
    args = parser.parse_args(argv)
    names = args.studies or [name for name, study in STUDIES.items() if not args.quick or study.quick_runner_args is not None]
    if args.quick and any(STUDIES[name].quick_runner_args is None for name in names):
        parser.error("b11 has no quick form (three_oracle_comparison takes no arguments)")
    anchors = find_anchors(args.anchors)
    results = {"quick": args.quick, "cpu_count": os.cpu_count(), "anchors": str(anchors) if anchors else None, "studies": {}}
    if anchors is None:
        print("the paper's runners were not found ($TVJAX_ANCHORS, ../shared/anchors): tvjax's side only")
    print(HEADER, flush=True)
    previous = json.loads(Path(args.reuse_paper).read_text())["studies"] if args.reuse_paper else {}
    if previous:
        results["paper_reused_from"] = str(args.reuse_paper)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            reused = previous.get(name, {}).get("paper")
            entry = run_study(name, STUDIES[name], anchors, args, tmp, reused)
            results["studies"][name] = entry
            print("\n".join(format_rows(name, entry)), flush=True)
    if args.quick:
        print("targets: set for the paper's sizes, not checked with --quick")
    else:
        checks = target_checks(results["studies"])
        results["targets"] = [c._asdict() for c in checks]
        print("\n".join(format_targets(checks)))
    Path(args.out).write_text(json.dumps(results, indent=1))
    print("speedup: the paper's runner / tvjax, whole-process wall seconds (cpu spd: CPU seconds); tvjax is the median of "
          f"{args.runs} processes per cache state. Seconds of the tvjax process: imports (interpreter start to the app's "
          "imports done), Hydra composition, JAX tracing, lowering and compiling, runs (the study's rest), figures. "
          "floor: drawing the study's random words in one more process (warm cache, no figures); runs/floor: how far the "
          "runs are above it, per row (the row's runs over that floor) and in that process (same process: the study "
          "run 3 times more, each between two floor draws, the median of the ratios).")
    if previous:
        print(f"paper*: the runner's measurement reused from {args.reuse_paper}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
