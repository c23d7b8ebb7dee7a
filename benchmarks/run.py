"""Benchmarks: tvjax against a plain vectorized NumPy implementation of the same workloads.

    python benchmarks/run.py            # the full sizes of the paper's appendix
    python benchmarks/run.py --quick    # CI-sized

Each (workload, implementation) runs in its own process, so its time covers interpreter start,
imports, compilation and the run, and peak memory is that process's own. Times are CPU seconds
(user + system, all threads) and wall seconds; on a shared machine the CPU seconds are the ones
other processes' load does not inflate. Prints a table and writes JSON (benchmarks/results.json
unless --out).
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import plan as plan_module  # noqa: E402

IMPLEMENTATIONS = {"numpy": "numpy_baseline.py", "tvjax": "tvjax_bench.py"}
COMPARED = ("convergence", "multilevel", "access")
MIB = 2**20
CLOCKS = ("cpu", "wall")


def run_process(script, plan_path, workload, out_path):
    """Run one implementation on one workload in a fresh process: its report plus the process's
    own wall and CPU (user + system) seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, str(HERE / script), str(plan_path), workload, str(out_path)], check=True, env=env)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    with open(out_path) as f:
        return {**json.load(f), "process": {"wall": wall, "cpu": cpu}}


def median_process(script, plan_path, workload, out_path, runs):
    """The median (by whole-process wall time) of `runs` fresh processes, with every run's
    whole-process times: on a shared VM one process can run 1.5x slower than the next."""
    reports = sorted((run_process(script, plan_path, workload, out_path) for _ in range(runs)),
                     key=lambda report: report["process"]["wall"])
    return {**reports[len(reports) // 2], "process_runs": [report["process"] for report in reports]}


def summarize(report, tasks, true_tv):
    """Totals for one (workload, implementation) on both clocks. Runs of a subset of repetitions are
    scaled up linearly to the full count (repetitions are independent and identical work)."""
    out = {}
    for clock in CLOCKS:
        measured = sum(t["run"][clock] for t in report["tasks"])
        run = sum(t["run"][clock] * spec["reps"] / t["reps_run"] for t, spec in zip(report["tasks"], tasks))
        out[clock] = {"whole": report["process"][clock] + run - measured, "compile": report["compile"][clock], "run": run}
    queries = sum(spec["queries"] * spec["reps"] for spec in tasks)
    extrapolated = any(t["reps_run"] < spec["reps"] for t, spec in zip(report["tasks"], tasks))
    errors = [float(np.mean(np.abs(np.asarray(t["values"]) - true_tv))) for t in report["tasks"]]
    return {
        **out, "process_runs": report.get("process_runs"), "extrapolated": extrapolated, "queries": queries,
        "queries_per_cpu_s": queries / out["cpu"]["whole"],
        "peak_mib": report["peak_rss"] / MIB, "working_mib": (report["peak_rss"] - report["rss_after_setup"]) / MIB,
        "mean_abs_error": errors,
        "tasks": [{**t, "reps": spec["reps"], "queries_per_rep": spec["queries"]} for t, spec in zip(report["tasks"], tasks)],
    }


def ratios(numpy, tvjax):
    out = {f"speedup_{part}_{clock}": numpy[clock][part] / tvjax[clock][part] for clock in CLOCKS for part in ("whole", "run")}
    out["memory_fraction"] = tvjax["peak_mib"] / numpy["peak_mib"]
    out["working_memory_fraction"] = tvjax["working_mib"] / numpy["working_mib"]
    return out


HEADER = (f"{'workload':<12} {'impl':<6} {'wall s':>9} {'cpu s':>9} {'compile':>8} {'run':>8} {'peak MiB':>9} "
          f"{'work MiB':>9} {'queries':>9} {'q/cpu s':>9} | {'speedup':>8} {'cpu spd':>8} {'run spd':>8} {'mem':>6} "
          f"{'workmem':>7}")


def format_row(workload, impl, s, ratio=None):
    """Whole-process wall and CPU seconds, compile and run CPU seconds, memory; for tvjax the
    ratios to NumPy: whole-process wall (the issue's target), whole-process CPU, runs only (wall)."""
    star = "*" if s["extrapolated"] else " "
    cpu = s["cpu"]
    cells = (f"{workload:<12} {impl:<6} {s['wall']['whole']:8.1f}{star} {cpu['whole']:8.1f}{star} {cpu['compile']:8.1f} "
             f"{cpu['run']:8.1f} {s['peak_mib']:9.0f} {s['working_mib']:9.0f} {s['queries']:9.3g} "
             f"{s['queries_per_cpu_s']:9.3g} |")
    if ratio:
        cells += (f" {ratio['speedup_whole_wall']:7.1f}x {ratio['speedup_whole_cpu']:7.1f}x {ratio['speedup_run_wall']:7.1f}x "
                  f"{ratio['memory_fraction']:6.3f} {ratio['working_memory_fraction']:7.3f}")
    return cells


def scaling_rows(summary):
    return [f"  {t['label']:<16} {t['queries_per_rep'] / t['run']['cpu']:10.3g} queries per CPU second" for t in summary["tasks"]]


def backend():
    """The device the tvjax processes ran on, as JAX names it."""
    probe = "import jax; print(jax.default_backend(), jax.devices()[0].device_kind, jax.device_count())"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI-sized workloads")
    parser.add_argument("--workloads", nargs="+", default=list(COMPARED) + ["scaling"])
    parser.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS), choices=list(IMPLEMENTATIONS))
    parser.add_argument("--numpy-query-cap", type=float, default=math.inf,
                        help="NumPy runs at most this many queries per task (default: all); more repetitions are "
                             "extrapolated, and NumPy's peak memory is then that of the smaller run")
    parser.add_argument("--tvjax-runs", type=int, default=None,
                        help="fresh tvjax processes per workload (default 5, 1 with --quick); the median by wall time "
                             "is reported (NumPy runs once: its minutes-long runs average the machine's bursts out)")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args(argv)
    results = {"workloads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_module.build(args.quick, args.numpy_query_cap, Path(tmp) / "instance.npz")
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(json.dumps(plan))
        print(HEADER)
        for workload in args.workloads:
            entry = {}
            for impl in args.implementations if workload in COMPARED else ["tvjax"]:
                runs = (args.tvjax_runs or (1 if args.quick else 5)) if impl == "tvjax" else 1
                report = median_process(IMPLEMENTATIONS[impl], plan_path, workload, Path(tmp) / f"{workload}-{impl}.json", runs)
                entry[impl] = summarize(report, plan["workloads"][workload], plan["true_tv"])
            if len(entry) == 2:
                entry["ratio"] = ratios(entry["numpy"], entry["tvjax"])
            for impl, summary in entry.items():
                if impl in IMPLEMENTATIONS:
                    print(format_row(workload, impl, summary, entry.get("ratio") if impl == "tvjax" else None), flush=True)
            if workload == "scaling":
                print("\n".join(scaling_rows(entry["tvjax"])))
            results["workloads"][workload] = entry
    results.update(quick=args.quick, true_tv=plan["true_tv"], cpu_count=os.cpu_count(), backend=backend(),
                   note="* = NumPy repetitions beyond --numpy-query-cap extrapolated linearly from the measured ones")
    Path(args.out).write_text(json.dumps(results, indent=1))
    print("speedup = NumPy / tvjax wall seconds, whole process; cpu spd: the same on CPU seconds; run spd: runs only "
          "(wall); mem: peak RSS fraction; workmem: fraction of the memory added after imports and setup")
    if math.isfinite(args.numpy_query_cap):
        print(f"* NumPy time extrapolated from a subset of repetitions (cap {args.numpy_query_cap:.0e} queries per task)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
