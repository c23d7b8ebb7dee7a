"""Importing an engine module changes no process state and imports no JAX, in each Python that runs
it (the base venv and the engine venvs); the OpenAI bridge, an HTTP client, imports without torch.
Each import runs in a fresh subprocess, so what one module pulls in cannot hide another's."""

import json
import sys

import pytest
from _engine_envs import engine_python, run_in

# Imports the modules named on the command line; prints which environment variables changed and
# which heavy packages got imported.
PROBE = """
import importlib, json, os, sys
before = dict(os.environ)
for name in sys.argv[1:]:
    importlib.import_module(name)
changed = sorted(k for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k))
print(json.dumps({"changed": changed, "imported": [m for m in ("jax", "torch", "vllm") if m in sys.modules]}))
"""

LIGHT = ["tvjax.engines.protocol", "tvjax.engines.tokens", "tvjax.engines.readouts", "tvjax.engines.models",
         "tvjax.engines.worker", "tvjax.engines.openai_bridge"]
CASES = [("base", module) for module in LIGHT] + \
    [("transformers", module) for module in LIGHT + ["tvjax.engines.replay", "tvjax.engines.hf",
                                                     "tvjax.engines.sglang_bridge", "tvjax.engines.tiny_model"]] + \
    [("vllm", module) for module in ["tvjax.engines.worker", "tvjax.engines.vllm_bridge", "tvjax.engines.openai_bridge"]]
TORCH_FREE = set(LIGHT)


def probe(venv: str, module: str) -> dict:
    python = sys.executable if venv == "base" else engine_python(venv)
    return json.loads(run_in(python, ["-c", PROBE, module], timeout=300).stdout.splitlines()[-1])


@pytest.mark.parametrize("venv, module", CASES)
def test_importing_an_engine_module_changes_no_process_state(venv, module):
    result = probe(venv, module)
    assert result["changed"] == [], f"importing {module} changed os.environ: {result['changed']}"
    assert "jax" not in result["imported"], f"{module} imports JAX"
    assert "vllm" not in result["imported"], f"{module} imports vLLM, which sets environment variables"
    if module in TORCH_FREE:
        assert "torch" not in result["imported"], f"{module} imports torch"
