"""The benchmark harness runs end to end at its CI size and reports every workload for both
implementations (speed is read from its table, never asserted here)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmark_reports_every_workload(tmp_path):
    out = tmp_path / "bench.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, timeout=900)
    report = json.loads(out.read_text())
    assert report["true_tv"] == 0.3883154296875
    for workload in ("convergence", "multilevel", "access"):
        sides = report["workloads"][workload]
        for impl in ("numpy", "tvjax"):
            assert sides[impl]["queries"] > 0 and sides[impl]["peak_mib"] > 0
    # both implementations estimate the same quantity: at the largest N their errors agree in scale
    convergence = report["workloads"]["convergence"]
    numpy_error, tvjax_error = (convergence[impl]["mean_abs_error"][-1] for impl in ("numpy", "tvjax"))
    assert tvjax_error < 3 * numpy_error + 0.01 and numpy_error < 3 * tvjax_error + 0.01
