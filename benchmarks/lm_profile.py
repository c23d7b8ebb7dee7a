"""Where the JAX engine's time goes: one traced call of sampling and of top-k scoring, each XLA
operation's time attributed to the tvjax function whose source line it comes from.

    .venv/bin/python benchmarks/lm_profile.py                     # SmolLM2-135M, batch 128, n = 128, top-k 50
    .venv/bin/python benchmarks/lm_profile.py --batch 32 --n 32
    .venv/bin/python benchmarks/lm_profile.py --quick             # a tiny random Llama (CI size)

Each task is compiled and run once, then run once more under `jax.profiler.trace` (a Perfetto
trace); the profile covers that second call. Every event of the task's XLA module names its HLO
instruction; the compiled module's stack-frame tables (XLA's metadata; for a fusion, its root's)
give the innermost tvjax function it comes from, which names the row: `_scores` and `_mix` are
attention over the caches, `Linear.__call__` the weight matmuls, `_top_k_grouped` or
`_kth_largest_key` the top-k threshold, `draw_token` and `_pick` the draws. Prints per task the
wall time, the traced operations' total, and the functions by their share; writes JSON
(benchmarks/lm_profile.json unless --out).
"""

import argparse
import collections
import gzip
import json
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from tvjax.models import ModelConfig, language_model, load_smollm2, random_model

ROOT = Path(__file__).resolve().parent.parent
QUICK = ModelConfig("llama", vocab_size=1024, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, max_positions=64, tie_embeddings=True)
PROMPT = "Tell me a story about a robot learning to paint."
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*\bstack_frame_id=(\d+)")
_ENTRY = re.compile(r'^(\d+)\s+(?:"(.*)"|\{(.*)\})$')


def _tables(hlo_text):
    """The module text's FileNames, FunctionNames, FileLocations and StackFrames tables, each
    {id: a name or {field: int}}."""
    tables, current = {}, None
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = tables.setdefault(line, {})
            continue
        match = _ENTRY.match(line) if current is not None else None
        if match is None:
            current = None
            continue
        key, name, fields = match.groups()
        current[int(key)] = name if name is not None else {k: int(v) for k, v in (f.split("=") for f in fields.split())}
    return tables


def instruction_functions(hlo_text):
    """{HLO instruction name: 'file.py:function'}: the innermost tvjax frame of the instruction's
    stack (XLA's metadata; for a fusion, its root's), else 'jax/other'."""
    tables = _tables(hlo_text)
    files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
    locations, frames = tables.get("FileLocations", {}), tables.get("StackFrames", {})

    def name(frame):
        seen = set()
        while frame in frames and frame not in seen:
            seen.add(frame)
            location = locations[frames[frame]["file_location_id"]]
            path = files[location["file_name_id"]]
            if "/tvjax/" in path:
                return f"{Path(path).name}:{functions[location['function_name_id']].split('.<locals>')[0]}"
            frame = frames[frame]["parent_frame_id"]
        return "jax/other"

    out = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            out[match.group(1)] = name(int(match.group(2)))
    return out


def op_times(trace_dir):
    """{XLA module: {HLO instruction name: total microseconds}} over the trace's events."""
    (path,) = Path(trace_dir).rglob("perfetto_trace.json.gz")
    with gzip.open(path) as f:
        trace = json.load(f)
    out = collections.defaultdict(collections.Counter)
    for event in trace["traceEvents"] if isinstance(trace, dict) else trace:
        args = event.get("args") or {}
        if event.get("ph") == "X" and "hlo_module" in args and "hlo_op" in args:
            out[args["hlo_module"]][args["hlo_op"]] += event.get("dur", 0.0)
    return out


def profile(name, jitted, args):
    """{task, wall_s, traced_s, functions: [(function, seconds, share)]} of one traced call."""
    jax.block_until_ready(jitted(*args))  # compiles and warms up
    with tempfile.TemporaryDirectory() as trace_dir:
        started = time.perf_counter()
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            jax.block_until_ready(jitted(*args))
        wall = time.perf_counter() - started
        modules = op_times(trace_dir)
    module, ops = max(modules.items(), key=lambda item: sum(item[1].values()))  # the task's program
    functions = instruction_functions(jitted.lower(*args).compile().as_text())  # the same program, compiled again
    by_function = collections.Counter()
    for op, micros in ops.items():
        by_function[functions.get(op, "jax/other")] += micros / 1e6
    traced = sum(by_function.values())
    rows = [(fn, s, s / traced) for fn, s in by_function.most_common()]
    return {"task": name, "module": module, "wall_s": wall, "traced_s": traced, "functions": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="a tiny random Llama, batch 8, n = 8")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "lm_profile.json")
    args = parser.parse_args(argv)
    if args.quick:
        model, prompt, batch, n = random_model(QUICK, jax.random.key(0)), list(range(1, 9)), 8, 8
    else:
        model, prompt, batch, n = load_smollm2(), [{"role": "user", "content": PROMPT}], args.batch, args.n
    lm = language_model(model, prompt, n, top_k=args.top_k, dtype="float32")
    tokens = lm.sample(jax.random.key(0), batch)
    from tvjax.models.process import _path_logprobs, _sample

    reports = [profile("sample", _sample, (lm, jax.random.key(1), batch)),
               profile("score_topk", _path_logprobs, (lm, np.asarray(tokens)))]
    for report in reports:
        print(f"\n{report['task']}: batch {batch}, n = {n}, top-k {args.top_k}: wall {report['wall_s']:.3f} s, "
              f"XLA operations {report['traced_s']:.3f} s")
        for fn, seconds, share in report["functions"][:12]:
            print(f"  {share:6.1%} {seconds:8.3f} s  {fn}")
    meta = {"batch": batch, "n": n, "top_k": args.top_k, "model": "tiny random Llama" if args.quick else "SmolLM2-135M",
            "runtime": f"jax {jax.__version__}, {jax.default_backend()}"}
    args.out.write_text(json.dumps({**meta, "tasks": reports}, indent=1) + "\n")


if __name__ == "__main__":
    main()
