"""tvjax's side of benchmarks/lm_bench.py (run with .venv/bin/python): `python lm_bench_tvjax.py JOB.json OUT.json`.

Modes (JOB["mode"]):
  bench      sample, score and score_topk at one n (see lm_bench.py); writes the first sampled
             tokens (the ones every process scores) and their log-probs when asked
  memory     one likelihood_ratio call with Samples(JOB["rows"]) (chunks by the default policy)
  matmul     the machine's float32 matmul peak: a plain jnp.dot of two [size, size] matrices
"""

import json
import sys
import time

import jax
import numpy as np
from lm_bench import hwm_bytes, process_peak, reset_peak, run_task, working_bytes, write_json

from tvjax.core.programs import enable_compilation_cache
from tvjax.models import language_model, load_hf_folder, load_smollm2

from measure import peak_rss_bytes, rss_bytes, timed


def load(spec):
    """(LoadedModel, GGUF path or None)."""
    if spec.get("smollm2"):
        from tvjax.engines.models import smollm2_gguf

        return load_smollm2(), str(smollm2_gguf())
    return load_hf_folder(spec["folder"]), None


def bench(job, started):
    model, gguf = load(job["model"])
    n, batch = job["n"], job["batch"]
    lm = language_model(model, job["prompt"], n, top_k=job["top_k"], dtype="float32")
    # transformers' scoring is the raw log-softmax: the same model without top-k or EOS suppression
    raw = language_model(model, list(lm.prompt), n, eos_ids=(), dtype="float32")
    del model
    config = {field: getattr(lm.config, field) for field in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                                      "num_heads", "num_kv_heads", "head_dim")}
    report = {"setup_s": time.perf_counter() - started, "rss_after_setup": rss_bytes(), "setup_hwm": hwm_bytes(),
              "prompt_ids": list(lm.prompt), "eos_ids": list(lm.eos_ids), "gguf": gguf, "tasks": [], "config": config,
              "runtime": f"jax {jax.__version__}, {jax.default_backend()} ({jax.device_count()} device(s))"}
    tokens, task = run_task("sample", lambda i: jax.block_until_ready(lm.sample(jax.random.key(i), batch)),
                            job["calls"], rss_bytes, timed)
    report["tasks"].append(task)
    tokens = np.asarray(tokens)
    assert tokens.shape == (batch, n), tokens.shape
    if job.get("tokens_out"):
        np.save(job["tokens_out"], tokens)
    logprobs, task = run_task("score", lambda i: jax.block_until_ready(raw.path_logprobs(tokens)), job["calls"],
                              rss_bytes, timed)
    report["tasks"].append(task)
    if job.get("logprobs_out"):
        np.save(job["logprobs_out"], np.asarray(logprobs, np.float32))
    if job.get("score_topk", True):
        _, task = run_task("score_topk", lambda i: jax.block_until_ready(lm.path_logprobs(tokens)), job["calls"],
                           rss_bytes, timed)
        report["tasks"].append(task)
    return report


def memory(job, started):
    from tvjax.core.estimators import likelihood_ratio
    from tvjax.core.oracles import Exact
    from tvjax.core.schedules import Samples
    from tvjax.core.streaming import stream_chunk

    model, _ = load(job["model"])
    # no top-k: jax.lax.top_k is most of a CPU run's time (docs/benchmarks/language-models.md) and changes no memory;
    # max_chunk_rows: the default policy
    pi = language_model(model, job["prompt"], job["n"])
    mu = pi.variant(temperature=1.25)
    del model
    report = {"setup_s": time.perf_counter() - started, "rss_after_setup": rss_bytes(), "setup_hwm": hwm_bytes(),
              "rows": job["rows"], "n": job["n"], "chunk_rows": stream_chunk(pi, Exact(), np.asarray([job["rows"]]))}
    base = reset_peak()
    estimate, report["call"] = timed(
        lambda: jax.block_until_ready(likelihood_ratio(jax.random.key(0), pi, mu, Exact(), Samples(job["rows"]))))
    report["working_bytes"] = working_bytes(base)
    report["estimate"] = float(estimate.value)
    return report


def matmul(job, calls=5):
    """GFLOP/s of jnp.dot on float32 [size, size] x [size, size] (median of `calls` after a warm-up)."""
    size = job["size"]
    a, b = (jax.random.normal(jax.random.key(i), (size, size), jax.numpy.float32) for i in range(2))
    dot = jax.jit(jax.numpy.dot)
    jax.block_until_ready(dot(a, b))
    walls = [timed(lambda: jax.block_until_ready(dot(a, b)))[1]["wall"] for _ in range(calls)]
    wall = float(np.median(walls))
    return {"matmul": {"size": size, "calls": calls, "wall_s": wall, "gflops": 2 * size**3 / wall / 1e9}}


def main(job_path, out_path):
    started = time.perf_counter()
    with open(job_path) as f:
        job = json.load(f)
    mode = job["mode"]
    modes = {"bench": lambda: bench(job, started), "memory": lambda: memory(job, started),
             "matmul": lambda: matmul(job)}
    report = modes[mode]()
    report["peak_rss"] = process_peak(peak_rss_bytes)
    write_json(out_path, report)


if __name__ == "__main__":
    enable_compilation_cache()
    main(*sys.argv[1:3])
