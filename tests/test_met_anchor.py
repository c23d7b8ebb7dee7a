"""benchmarks/met_anchor.py, the model-equality-testing anchor of experiments/blackbox.py, in its
own environment (.venv-met): its one-Gram-matrix mode gives the package's own statistic (checked
inside against `mmd_hamming` to 1e-9) and the same test as the package's `run_two_sample_test`,
and the test tells a far pair from an identical one."""

import json

import numpy as np
import pytest
from _engine_envs import ROOT, engine_python, run_in

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models


def test_met_anchor_matches_the_package_and_separates_pairs(tmp_path):
    rng = np.random.default_rng(0)
    same = rng.integers(0, 4, (2, 60, 5))
    far = np.stack([rng.integers(0, 4, (60, 5)), rng.integers(2, 6, (60, 5))])
    padded = far.copy()
    padded[1, :10, 3:] = -1  # rows that ended early, padded as the package pads
    jobs = {"jobs": 3, "pi_0": same[0], "mu_0": same[1], "pi_1": far[0], "mu_1": far[1], "pi_2": padded[0], "mu_2": padded[1]}
    np.savez(tmp_path / "samples.npz", **jobs)
    records = {}
    for mode in ("gram", "package"):
        out = tmp_path / f"{mode}.json"
        run_in(engine_python("met"), [str(ROOT / "benchmarks" / "met_anchor.py"), str(tmp_path / "samples.npz"), str(out),
                                      "--permutations", "50", "--mode", mode], timeout=600)
        records[mode] = json.loads(out.read_text())
    gram, package = records["gram"], records["package"]
    assert np.allclose(gram["statistics"], package["statistics"], atol=1e-9)
    assert gram["pvalues"][0] > 0.05 and package["pvalues"][0] > 0.05  # identical laws: no detection here
    assert max(gram["pvalues"][1:]) <= 0.02 and max(package["pvalues"][1:]) <= 0.02  # disjoint supports
