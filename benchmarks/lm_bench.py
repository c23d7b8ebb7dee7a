"""Language models, side by side: tvjax (`tvjax.models`) against transformers on the same CPU.

    .venv/bin/python benchmarks/lm_bench.py            # SmolLM2-135M, n = 32 and 128, 3 processes each
    .venv/bin/python benchmarks/lm_bench.py --quick    # CI size: a tiny random Llama, n = 8, 1 process

Same model on both sides (SmolLM2-135M-Instruct, float32 weights dequantized from the same Q4_1
GGUF; with --quick a tiny random Llama written once as a Hugging Face folder), same chat prompt
(the token ids tvjax's tokenizer renders, passed to transformers), same batch and lengths:

  sample      32 continuations of n tokens, top-k, EOS suppressed. tvjax: `LanguageModel.sample`
              (a jitted KV-cache decode loop); transformers: `model.generate(do_sample=True, top_k,
              max_new_tokens=n, min_new_tokens=n, suppress_tokens=EOS, use_cache=True)`.
  score       log-probabilities of the 32 x n tokens tvjax sampled (raw log-softmax gathered at the
              realized tokens). tvjax: `path_logprobs` of a language model without top-k or EOS
              suppression (one teacher-forced pass over the cached prompt); transformers: one
              forward pass over prompt + continuation under `torch.inference_mode`.
  score_topk  tvjax only: `path_logprobs` of the sampling distribution itself (top-k, EOS
              suppressed), what the estimators call.

Each (implementation, n) runs in its own process, `--runs` times, alternating the two sides; a
process times the first call of each task (for tvjax it includes compilation) and then `--calls`
more, reporting their median. Tokens per second = batch x n / median seconds; compile s (tvjax) =
first call - median. Memory: every process's peak RSS, and per task its working memory (the
high-water mark after resetting it at the task's start, less the resident size then). A last pair
of tvjax processes runs `tvjax.core.estimators.likelihood_ratio` (exact oracle) on two variants
(temperature 1 and 1.25, no top-k) with Samples(N) for N = 64 and 256 at the smallest n, chunked by
the default policy (`max_chunk_rows`), and reports their working memory (compilation included, the
same program for both): it should not grow with N. Speed is reported, never asserted.

Prints a table and writes JSON (benchmarks/lm_results.json unless --out). Helpers here are shared
by the two worker scripts (lm_bench_tvjax.py, lm_bench_transformers.py) and import nothing heavy.
"""

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 2**20
IMPLEMENTATIONS = ("tvjax", "transformers")
WORKERS = {"tvjax": "lm_bench_tvjax.py", "transformers": "lm_bench_transformers.py"}
COMPARED = ("sample", "score")
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Tell me a story about a robot learning to paint."}]
# --quick: a tiny random Llama (no tokenizer: the prompt is token ids).
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4,
        "num_kv_heads": 2, "head_dim": 16, "max_positions": 256}
TINY_PROMPT = [1, 17, 42, 99, 7, 311, 256, 5, 64, 128, 3, 200]


# --------------------------------------------------------------------------- shared with the workers


_PEAK_BEFORE_RESETS = [0]


def reset_peak():
    """Reset this process's resident high-water mark (VmHWM) to its current RSS (Linux >= 4.0),
    remembering the mark it had (the reset lowers getrusage's ru_maxrss too: see `process_peak`).
    False where the kernel refuses: then only the whole-process peak is known."""
    mark = hwm_bytes()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    _PEAK_BEFORE_RESETS[0] = max(_PEAK_BEFORE_RESETS[0], mark)
    return True


def process_peak(peak_rss_bytes):
    """The whole process's peak RSS, across `reset_peak`s (`peak_rss_bytes` is measure.py's)."""
    return max(_PEAK_BEFORE_RESETS[0], peak_rss_bytes(), hwm_bytes())


def hwm_bytes():
    """VmHWM: the resident high-water mark since the last `reset_peak` (or the process's start)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_task(name, call, calls, rss_bytes, timed):
    """Time `call(i)` (i = 0 first, then 1..calls) and the task's working memory. Returns (the
    first call's output, its report). `rss_bytes` and `timed` are benchmarks/measure.py's."""
    rss = rss_bytes()
    resettable = reset_peak()
    out, first = timed(call, 0)
    steady = [timed(call, i)[1] for i in range(1, calls + 1)]
    working = hwm_bytes() - rss if resettable else None
    wall = statistics.median(t["wall"] for t in steady)
    return out, {"task": name, "first": first, "steady": steady, "steady_wall": wall,
                 "compile_s": first["wall"] - wall, "rss_before": rss, "working_bytes": working}


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=1))


# --------------------------------------------------------------------------- driver


def default_python(venv, env_var):
    path = os.environ.get(env_var) or str(ROOT / venv / "bin" / "python")
    return path if Path(path).is_file() else None


def run_worker(python, impl, job, tmp, tag):
    """One worker process on one job: its report, plus the process's own wall and CPU seconds."""
    job_path, out_path = Path(tmp) / f"job-{tag}.json", Path(tmp) / f"out-{tag}.json"
    write_json(job_path, job)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run([python, str(HERE / WORKERS[impl]), str(job_path), str(out_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} worker ({tag}) exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    report = json.loads(out_path.read_text())
    report["process"] = {"wall": wall, "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}
    return report


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summarize(reports, batch):
    """Rows (implementation, task, n): medians over the processes of each one's steady median."""
    rows = {}
    for report in reports:
        for task in report["tasks"]:
            rows.setdefault((report["impl"], task["task"], report["n"]), []).append((report, task))
    out = []
    for (impl, name, n), entries in rows.items():
        walls = [task["steady_wall"] for _, task in entries]
        working = [task["working_bytes"] for _, task in entries if task["working_bytes"] is not None]
        out.append({
            "impl": impl, "task": name, "n": n, "batch": batch, "tokens": batch * n,
            "tokens_per_s": batch * n / statistics.median(walls),
            "tokens_per_s_runs": [batch * n / w for w in walls],
            "steady_s": statistics.median(walls),
            "first_s": statistics.median(task["first"]["wall"] for _, task in entries),
            "compile_s": statistics.median(task["compile_s"] for _, task in entries) if impl == "tvjax" else None,
            "steady_cpu_s": statistics.median(statistics.median(t["cpu"] for t in task["steady"]) for _, task in entries),
            "peak_mib": max(report["peak_rss"] for report, _ in entries) / MIB,
            "working_mib": max(working) / MIB if working else None,
            "setup_s": statistics.median(report["setup_s"] for report, _ in entries),
        })
    return out


def ratios(rows):
    by = {(r["impl"], r["task"], r["n"]): r for r in rows}
    out = []
    for (impl, task, n), row in by.items():
        other = by.get(("transformers", task, n))
        if impl == "tvjax" and other:
            out.append({"task": task, "n": n, "tvjax_over_transformers": row["tokens_per_s"] / other["tokens_per_s"]})
    return out


def agreement(tmp, ns):
    """Max |tvjax - transformers| of the scored log-probs (the same tokens): the same model on both sides."""
    import numpy as np

    out = {}
    for n in ns:
        paths = [Path(tmp) / f"logprobs-{impl}-{n}.npy" for impl in IMPLEMENTATIONS]
        if all(p.is_file() for p in paths):
            a, b = (np.load(p) for p in paths)
            out[str(n)] = float(np.max(np.abs(a - b)))
    return out


def fmt(value, spec, width):
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def print_table(rows, ratio_rows):
    ratio = {(r["task"], r["n"]): r["tvjax_over_transformers"] for r in ratio_rows}
    print(f"{'impl':<13} {'task':<11} {'n':>4} {'batch':>5} {'tokens/s':>10} {'steady s':>9} {'first s':>8} "
          f"{'compile s':>9} {'peak MiB':>9} {'work MiB':>9} {'tvjax/tf':>9}")
    order = {name: i for i, name in enumerate(("sample", "score", "score_topk"))}
    for r in sorted(rows, key=lambda r: (r["n"], order.get(r["task"], 9), r["impl"])):
        shown = ratio.get((r["task"], r["n"])) if r["impl"] == "tvjax" else None
        print(f"{r['impl']:<13} {r['task']:<11} {r['n']:>4} {r['batch']:>5} {r['tokens_per_s']:10.4g} "
              f"{r['steady_s']:9.3f} {r['first_s']:8.3f} {fmt(r['compile_s'], '.3f', 9)} {r['peak_mib']:9.0f} "
              f"{fmt(r['working_mib'], '.0f', 9)} {fmt(shown, '.2f', 8)}{'x' if shown else ' '}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI size: a tiny random Llama, n = 8, 1 process")
    parser.add_argument("--n", type=int, nargs="+", default=None, help="continuation lengths (default 32 128; quick 8)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--runs", type=int, default=None, help="processes per (implementation, n) (default 3; quick 1)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls after the first, per task (median)")
    parser.add_argument("--no-score-topk", action="store_true", help="skip tvjax's score_topk task")
    parser.add_argument("--memory-rows", type=int, nargs="*", default=[64, 256],
                        help="N of the tvjax memory check (likelihood_ratio, Samples(N)); none to skip")
    parser.add_argument("--memory-n", type=int, default=None, help="n of the memory check (default: the smallest --n)")
    parser.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS), choices=IMPLEMENTATIONS)
    parser.add_argument("--tvjax-python", default=default_python(".venv", "TVJAX_PYTHON") or sys.executable)
    parser.add_argument("--transformers-python", default=default_python(".venv-transformers", "TVJAX_TRANSFORMERS_PYTHON"))
    parser.add_argument("--out", default=str(HERE / "lm_results.json"))
    args = parser.parse_args(argv)
    ns = args.n or ([8] if args.quick else [32, 128])
    runs = args.runs or (1 if args.quick else 3)
    if "transformers" in args.implementations and not args.transformers_python:
        parser.error("no transformers Python: create .venv-transformers or pass --transformers-python")
    pythons = {"tvjax": args.tvjax_python, "transformers": args.transformers_python}
    base = {"batch": args.batch, "top_k": args.top_k, "calls": args.calls}
    reports, memory = [], []
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            folder = Path(tmp) / "tiny-llama"
            run_worker(pythons["tvjax"], "tvjax", {"mode": "make_tiny", "folder": str(folder), "config": TINY}, tmp, "tiny")
            model, prompt = {"folder": str(folder)}, TINY_PROMPT
        else:
            model, prompt = {"smollm2": True}, MESSAGES
        shared = {}  # from tvjax's first process per n: prompt ids, EOS ids, the sampled tokens to score
        for run in range(runs):
            for n in ns:
                tokens = Path(tmp) / f"tokens-{n}.npy"
                jobs = {
                    "tvjax": {**base, "mode": "bench", "model": model, "prompt": prompt, "n": n,
                              "score_topk": not args.no_score_topk,
                              "tokens_out": str(tokens) if run == 0 else None,
                              "logprobs_out": str(Path(tmp) / f"logprobs-tvjax-{n}.npy") if run == 0 else None},
                    "transformers": {**base, "model": model, "n": n, "tokens": str(tokens),
                                     "logprobs_out": str(Path(tmp) / f"logprobs-transformers-{n}.npy") if run == 0 else None},
                }
                for impl in IMPLEMENTATIONS:  # tvjax first: it renders the prompt and samples the tokens to score
                    if impl not in args.implementations and not (impl == "tvjax" and n not in shared):
                        continue
                    job = jobs[impl] if impl == "tvjax" else {**jobs[impl], **shared[n]}
                    report = run_worker(pythons[impl], impl, job, tmp, f"{impl}-{n}-{run}")
                    if impl == "tvjax" and n not in shared:
                        shared[n] = {"prompt_ids": report["prompt_ids"], "eos_ids": report["eos_ids"],
                                     "gguf": report.get("gguf")}
                    if impl in args.implementations:
                        reports.append({**report, "impl": impl, "n": n, "run": run})
                        print(f"  {impl:<12} n={n:<4} run {run}: {report['process']['wall']:.1f} s wall", file=sys.stderr)
        for rows in args.memory_rows if "tvjax" in args.implementations else []:
            job = {**base, "mode": "memory", "model": model, "prompt": prompt, "n": args.memory_n or min(ns), "rows": rows}
            memory.append(run_worker(pythons["tvjax"], "tvjax", job, tmp, f"memory-{rows}"))
        agree = agreement(tmp, ns)
    rows = summarize(reports, args.batch)
    ratio_rows = ratios(rows)
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()}
    ggufs = {r["impl"]: r["gguf"] for r in reports if r.get("gguf")}
    for report in reports:
        machine.setdefault(f"{report['impl']}_runtime", report.get("runtime"))
    results = {"quick": args.quick, "model": "tiny random Llama" if args.quick else "SmolLM2-135M-Instruct (Q4_1 GGUF, float32)",
               "machine": machine, "batch": args.batch, "top_k": args.top_k, "ns": ns, "runs": runs, "calls": args.calls,
               "prompt_tokens": len(next(iter(shared.values()))["prompt_ids"]) if shared else None,
               "gguf_sha256": {impl: sha256(path) for impl, path in ggufs.items()},
               "results": rows, "ratios": ratio_rows, "score_max_abs_diff": agree, "memory_check": [], "processes": reports}
    print(f"{machine['cpu']}, {machine['cores']} cores; model: {results['model']}; batch {args.batch}, "
          f"prompt {results['prompt_tokens']} tokens, top_k {args.top_k}; {runs} process(es) per row, median of "
          f"{args.calls} calls after the first")
    print_table(rows, ratio_rows)
    if len(set(results["gguf_sha256"].values())) > 1:
        print(f"WARNING: the two sides loaded different GGUF files: {ggufs}")
    if agree:
        print("score: max |tvjax - transformers| log-prob on the same tokens: "
              + ", ".join(f"n={n}: {d:.2g}" for n, d in agree.items()))
    for m in memory:
        entry = {"rows": m["rows"], "n": m["n"], "chunk_rows": m["chunk_rows"], "peak_mib": m["peak_rss"] / MIB,
                 "working_mib": None if m["working_bytes"] is None else m["working_bytes"] / MIB,
                 "wall_s": m["call"]["wall"], "estimate": m["estimate"]}
        results["memory_check"].append(entry)
    if len(results["memory_check"]) >= 2:
        lo, hi = results["memory_check"][0], results["memory_check"][-1]
        if lo["working_mib"] and hi["working_mib"] is not None:
            results["memory_growth"] = hi["working_mib"] / lo["working_mib"]
        for m in results["memory_check"]:
            print(f"memory check (tvjax likelihood_ratio, Samples({m['rows']}), n={m['n']}, chunks of {m['chunk_rows']} "
                  f"rows): peak {m['peak_mib']:.0f} MiB, working {fmt(m['working_mib'], '.0f', 0)} MiB, "
                  f"{m['wall_s']:.2f} s with compilation")
        if "memory_growth" in results:
            print(f"  working memory at N={hi['rows']} / N={lo['rows']}: {results['memory_growth']:.2f}")
    write_json(args.out, results)
    print("tokens/s: batch x n / median steady seconds; compile s (tvjax): first call - median; peak MiB: the "
          "process's peak RSS; work MiB: the task's high-water mark above the RSS at its start; tvjax/tf: tokens/s ratio")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
