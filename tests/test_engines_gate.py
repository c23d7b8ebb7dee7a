"""experiments/engine_gate.py: two engine configurations gated in rounds of campaigns, on the tiny
model through the transformers bridge (CPU replay: deterministic, so exact scoring)."""

import json
import subprocess
import sys

import pytest
from _engine_envs import ROOT, build_tiny_model, engine_python

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models


def gate_cmd(model, run_dir, tau, mu_top_k, max_rounds=3) -> list[str]:
    t = engine_python("transformers")
    return [sys.executable, "experiments/engine_gate.py", "experiment=engine_fp32_vs_bf16",
            f"campaign.model={model}", "campaign.n=6", "campaign.repeats=2", "pi.top_k=8", f"mu.top_k={mu_top_k}",
            "mu.dtype=float32", "mu.attn_implementation=eager", "mu.name=hf_eager", f"pi.python={t}", f"mu.python={t}",
            f"campaign.convert_python={t}", f"gate.tau={tau}", "gate.round_size=16", f"gate.max_rounds={max_rounds}",
            f"hydra.run.dir={run_dir}"]


def test_engine_gate_fails_a_truncated_engine_and_resumes_its_rounds(tmp_path):
    """top-k 8 against top-k 1 (greedy): most continuations leave the other's support, TV near 1,
    so the gate FAILs tau = 0.3 in its first rounds; a rerun reuses the rounds' pools."""
    model = build_tiny_model(tmp_path / "model")
    run = tmp_path / "far"
    first = subprocess.run(gate_cmd(model, run, 0.3, 1), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 1 and "FAIL" in first.stdout, first.stdout + first.stderr[-3000:]
    record = json.loads((run / "gate.json").read_text())
    assert record["verdict"] == "FAIL" and record["noise_floor"] is None  # CPU replay repeats itself: exact
    assert record["estimate"]["mismatch_share"] > 0.4 and record["estimate"]["low"] > 0.3  # pi's rows leave greedy's support
    rounds = record["estimate"]["rounds"]
    assert 1 <= rounds <= 3 and all((run / f"round-{k}" / "pool").is_dir() for k in range(rounds))
    again = subprocess.run(gate_cmd(model, run, 0.3, 1), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 1 and json.loads((run / "gate.json").read_text())["estimate"] == record["estimate"]
    small = subprocess.run(gate_cmd(model, tmp_path / "small", 0.3, 1) + ["gate.budget=10"], cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
    assert small.returncode == 3 and "less than one round" in small.stderr  # an error is never a verdict's code
