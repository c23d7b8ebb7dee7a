"""Run one job (see tvjax.engines.protocol) in one engine session:

    python -m tvjax.engines.worker JOB.json
    python -m tvjax.engines.worker --describe-eos ENGINE.json   # {"eos_ids": [...]} of its model

Run it with the engine environment's Python and PYTHONPATH=<tvjax repo root>. Progress is one JSON
line per committed or skipped shard on stdout; any failure exits non-zero with the exception.
Bridges are named by module path and imported only when a job needs them, so importing the
worker imports no engine (and kind "jax", run with the base venv's Python, is the only one that
imports JAX).

`--describe-eos` prints the EOS ids of an engine config's model (its tokenizer and declared
generation config; kind "jax": tvjax.models' tokenizer) without opening the engine: the campaign
creates a pool whose outputs stop at EOS (`campaign.eos=stop`) with them. Every engine session
checks its own EOS ids against the pool's (tvjax.engines.protocol.check_eos).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from tvjax.engines.protocol import check_eos, load_job, run_tasks
from tvjax.engines.tokens import prompt_ids
from tvjax.pools import store as pools

BRIDGES = {
    "transformers": ("tvjax.engines.hf", "TransformersBridge"),
    "vllm": ("tvjax.engines.vllm_bridge", "VLLMBridge"),
    "sglang": ("tvjax.engines.sglang_bridge", "SGLangBridge"),
    "openai": ("tvjax.engines.openai_bridge", "OpenAIBridge"),
    "jax": ("tvjax.models.jax_engine", "JaxBridge"),  # the JAX model (tvjax.models), outside tvjax.engines: it imports JAX
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
        check_eos(spec, job["engine"]["name"], bridge.eos)  # before the engine leaves any trace in the pool
        writer = pools.open_pool_writer(job["pool"])
        engines = dict(meta.get("engines", {}))
        engines[job["engine"]["name"]] = {**job["engine"], **bridge.describe()}
        writer.update_metadata(engines=engines)
        run_tasks(job, bridge, prompt_ids(bridge.tokenizer, job["messages"]))
    finally:
        bridge.close()


def describe_eos(config: dict) -> list[int]:
    """The EOS ids of an engine config's model, without opening the engine (see module doc)."""
    if config["kind"] not in BRIDGES:
        raise ValueError(f"unknown engine kind {config['kind']!r}; known: {sorted(BRIDGES)}")
    if config["kind"] == "jax":
        return importlib.import_module("tvjax.models.jax_engine").model_eos_ids(str(config["model"]))
    from tvjax.engines.tokens import model_eos_ids

    return model_eos_ids(str(config["model"]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", nargs="?", help="job JSON file")
    parser.add_argument("--describe-eos", metavar="ENGINE_JSON",
                        help="print {\"eos_ids\": [...]} of an engine config's model (a JSON file or string) and exit")
    args = parser.parse_args(argv)
    if args.describe_eos is not None:
        text = args.describe_eos
        config = json.loads(Path(text).read_text() if not text.lstrip().startswith("{") else text)
        print(json.dumps({"eos_ids": describe_eos(config)}))
    elif args.job is None:
        parser.error("give a job file (or --describe-eos ENGINE_JSON)")
    else:
        run(args.job)


if __name__ == "__main__":
    main()
