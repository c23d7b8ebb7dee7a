"""Timing and memory of one benchmark process (imports neither NumPy nor JAX).

Each implementation runs in its own process; it reports wall and CPU time (the machine may be
shared, and CPU seconds are what other processes' load does not inflate),  its resident memory after imports and
setup (`rss_bytes`) and the high-water mark at the end (`peak_rss_bytes`), so the table can show
both the whole-process peak and the working memory the computation added on top of its imports.
"""

import json
import os
import resource
import sys
import time


def rss_bytes():
    """Current resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes():
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(fn, *args):
    """(fn(*args), {"wall": seconds, "cpu": CPU seconds of this process, all threads})."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def worker_main(setup, prepare, run_task):
    """Entry point shared by both implementations: argv = plan.json workload out.json.

    setup(plan) -> context (the instance); prepare(context, tasks) -> one runnable per task (tvjax
    compiles here, timed as the workload's compile time); run_task(runnable, task) -> dict.
    """
    started = time.perf_counter()
    plan_path, workload, out_path = sys.argv[1:4]
    with open(plan_path) as f:
        plan = json.load(f)
    context = setup(plan)
    tasks = plan["workloads"][workload]
    report = {"setup_s": time.perf_counter() - started, "rss_after_setup": rss_bytes(), "tasks": []}
    runnables, report["compile"] = timed(prepare, context, tasks)
    for runnable, task in zip(runnables, tasks):
        report["tasks"].append(run_task(runnable, task))
    report["peak_rss"] = peak_rss_bytes()
    with open(out_path, "w") as f:
        json.dump(report, f)
