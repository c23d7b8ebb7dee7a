"""Run one job (see tvjax.engines.protocol) in one engine session:

    python -m tvjax.engines.worker JOB.json

Run it with the engine environment's Python and PYTHONPATH=<tvjax repo root>. Progress is one JSON
line per committed or skipped shard on stdout; any failure exits non-zero with the exception.
Bridges are named by module path and imported only when a job needs them, so importing the
worker imports no engine (and kind "jax", run with the base venv's Python, is the only one that
imports JAX).
"""

from __future__ import annotations

import argparse
import importlib

from tvjax import pools
from tvjax.engines.protocol import load_job, run_tasks
from tvjax.engines.tokens import prompt_ids

BRIDGES = {
    "transformers": ("tvjax.engines.hf", "TransformersBridge"),
    "vllm": ("tvjax.engines.vllm_bridge", "VLLMBridge"),
    "sglang": ("tvjax.engines.sglang_bridge", "SGLangBridge"),
    "openai": ("tvjax.engines.openai_bridge", "OpenAIBridge"),
    "jax": ("tvjax.jax_engine", "JaxBridge"),  # the JAX model (tvjax.models), outside tvjax.engines: it imports JAX
}


def make_bridge(config: dict, width: int):
    """Open an engine session for an engine config (its `kind` selects the bridge)."""
    if config["kind"] not in BRIDGES:
        raise ValueError(f"unknown engine kind {config['kind']!r}; known: {sorted(BRIDGES)}")
    module, cls = BRIDGES[config["kind"]]
    return getattr(importlib.import_module(module), cls)(config, width)


def run(job_path: str) -> None:
    job = load_job(job_path)
    spec, meta = pools.read_spec(job["pool"])
    bridge = make_bridge(job["engine"], spec.top_k)
    try:
        writer = pools.open_pool_writer(job["pool"])
        engines = dict(meta.get("engines", {}))
        engines[job["engine"]["name"]] = {**job["engine"], **bridge.describe()}
        writer.update_metadata(engines=engines)
        run_tasks(job, bridge, prompt_ids(bridge.tokenizer, job["messages"]))
    finally:
        bridge.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", help="job JSON file")
    run(parser.parse_args(argv).job)


if __name__ == "__main__":
    main()
