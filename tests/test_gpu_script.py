"""benchmarks/gpu.sh, the paper's GPU case study in one call: its dry run on the CPU writes every
step of the GPU run to one JSON, and on a machine without a GPU it stops at once (exit 2) with one
line, having installed and written nothing."""

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"
STEPS = ["environment", "machine", "synthetic", "model", "case_study", "sglang"]
NO_GPU = "use --dry-run to check the script on a CPU"


def without_sglang() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("SGLANG_PYTHON", "SGLANG_MODEL")}


@pytest.mark.slow  # the three synthetic studies and an engine campaign, in subprocesses (about a minute)
def test_the_dry_run_runs_every_step_and_writes_one_json(tmp_path):
    out = tmp_path / "case-study.json"
    start = time.monotonic()
    subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--work", str(tmp_path / "work")],
                   cwd=ROOT, env=without_sglang(), check=True, timeout=600)
    elapsed = time.monotonic() - start
    report = json.loads(out.read_text())
    assert report["mode"] == "dry-run" and report["ok"] is True and 0 < report["wall_s"] <= elapsed
    assert report["machine"]["backend"] == "cpu" and report["machine"]["jax"] and report["machine"]["devices"]
    steps = {s["name"]: s for s in report["steps"]}
    assert [s["name"] for s in report["steps"]] == STEPS
    for name in STEPS[:-1]:
        assert steps[name]["status"] == "ok", f"{name}: {steps[name]['reason']}\n{steps[name]['log_tail']}"
        assert steps[name]["wall_s"] > 0 and steps[name]["result"]
    assert steps["sglang"]["status"] == "skipped"
    assert steps["sglang"]["reason"] == "no SGLang environment (SGLANG_PYTHON)"
    assert steps["environment"]["result"]["installed"] is False

    synthetic = steps["synthetic"]["result"]
    assert synthetic["quick"] is True and synthetic["true_tv"] == 0.3883154296875
    assert set(synthetic["workloads"]) == {"convergence", "multilevel", "access"}
    for row in synthetic["workloads"].values():
        assert row["wall_s"] > 0 and row["queries"] > 0 and row["mean_abs_error"]
        assert all(math.isfinite(e) for e in row["mean_abs_error"].values())

    case = steps["case_study"]["result"]
    tv = case["tv"]
    assert math.isfinite(tv["value"]) and 0 <= tv["value"] <= 1 and tv["ci_low"] <= tv["value"] <= tv["ci_high"]
    assert tv["value"] == pytest.approx(tv["shared"] + tv["mismatch"])  # the TV and its two parts
    assert tv["pair"] == ["jax_fp32", "jax_bf16"]
    assert {e["dtype"] for e in case["engines"].values()} == {"float32", "bfloat16"}
    assert case["sizes"] == report["sizes"]["case_study"]
    assert (Path(case["report"]) / "summary.md").is_file()


def run_without_gpu(tmp_path, path: str, python: str) -> subprocess.CompletedProcess:
    env = {**without_sglang(), "PATH": path, "TVJAX_BASE_PYTHON": python}
    start = time.monotonic()
    proc = subprocess.run([shutil.which("bash"), str(SCRIPT), "--venv", str(tmp_path / "venv-gpu"), "--out",
                           str(tmp_path / "out.json"), "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 10, "gpu.sh took more than a few seconds to find there is no GPU"
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not any(tmp_path.glob("*")), "gpu.sh installed or wrote something without a GPU"
    return proc


def test_without_nvidia_smi_it_stops_at_once(tmp_path):
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    proc = run_without_gpu(tmp_path, path, sys.executable)
    assert proc.stderr.strip() == f"gpu.sh: no NVIDIA GPU (nvidia-smi not found); {NO_GPU}"


def test_an_nvidia_smi_that_lists_no_gpu_stops_it_at_once(tmp_path):
    fake = tmp_path.parent / f"{tmp_path.name}-bin"  # outside tmp_path, which must stay empty
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (fake / "nvidia-smi").chmod(0o755)
    proc = run_without_gpu(tmp_path, os.pathsep.join([str(fake), os.environ["PATH"]]), sys.executable)
    assert proc.stderr.strip() == f"gpu.sh: no NVIDIA GPU (nvidia-smi lists no device); {NO_GPU}"
