"""transformers' side of benchmarks/lm_bench.py (run with .venv-transformers/bin/python; imports no
JAX): `python lm_bench_transformers.py JOB.json OUT.json`.

JOB: model ({"smollm2": true} or {"folder"}), gguf (the file tvjax loaded, for the record),
prompt_ids and eos_ids (from tvjax's process), n, batch, top_k, calls, tokens (.npy [batch, n]
that tvjax sampled: the tokens scored), logprobs_out (optional .npy).
"""

import json
import os
import sys
import time

import numpy as np
import torch
from lm_bench import hwm_bytes, process_peak, run_task, write_json
from transformers import AutoModelForCausalLM

from tvjax.engines.models import resolve  # tvjax imports lazily: no JAX here

from measure import peak_rss_bytes, rss_bytes, timed


def load(spec):
    folder, gguf = resolve("smollm2") if spec.get("smollm2") else resolve(spec["folder"])
    kwargs = {"gguf_file": gguf} if gguf else {}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()
    return model, str(folder / gguf) if gguf else None


def main(job_path, out_path):
    started = time.perf_counter()
    with open(job_path) as f:
        job = json.load(f)
    torch.set_num_threads(os.cpu_count())
    model, gguf = load(job["model"])
    n, batch, prompt, eos = job["n"], job["batch"], job["prompt_ids"], job["eos_ids"]
    prompt_ids = torch.tensor([prompt] * batch, dtype=torch.long)
    tokens = torch.from_numpy(np.load(job["tokens"]).astype(np.int64))
    assert tokens.shape == (batch, n), tokens.shape
    report = {"setup_s": time.perf_counter() - started, "rss_after_setup": rss_bytes(), "setup_hwm": hwm_bytes(),
              "gguf": gguf, "tasks": [],
              "runtime": f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
                         f"transformers {__import__('transformers').__version__}"}
    # Every setting explicit (the GGUF's generation config may carry its own): exactly n new tokens,
    # the EOS ids suppressed as tvjax suppresses them, plain top-k sampling at temperature 1.
    options = dict(do_sample=True, top_k=job["top_k"], top_p=1.0, temperature=1.0, max_new_tokens=n, min_new_tokens=n,
                   use_cache=True, suppress_tokens=eos or None, pad_token_id=eos[0] if eos else 0,
                   eos_token_id=eos or None, attention_mask=torch.ones_like(prompt_ids))

    def sample(i):
        torch.manual_seed(i)
        with torch.inference_mode():
            out = model.generate(prompt_ids, **options)
        assert out.shape == (batch, len(prompt) + n), out.shape
        return out

    def score(i):
        # prompt + continuation but its last token, whose next-token logits nobody reads; logits
        # only where a continuation token is predicted (positions P-1 .. P+n-2)
        with torch.inference_mode():
            logits = model(torch.cat([prompt_ids, tokens[:, :-1]], dim=1), use_cache=False, logits_to_keep=n).logits
            return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None])[..., 0]

    _, task = run_task("sample", sample, job["calls"], rss_bytes, timed)
    report["tasks"].append(task)
    logprobs, task = run_task("score", score, job["calls"], rss_bytes, timed)
    report["tasks"].append(task)
    if job.get("logprobs_out"):
        np.save(job["logprobs_out"], logprobs.numpy().astype(np.float32))
    report["peak_rss"] = process_peak(peak_rss_bytes)
    write_json(out_path, report)


if __name__ == "__main__":
    main(*sys.argv[1:3])
