"""The anchor of the black-box study: model equality testing's MMD two-sample test (the PyPI package
`model-equality-testing`, Gao, Liang and Guestrin 2024), run in its own environment on tvjax's samples.

    .venv-met/bin/python benchmarks/met_anchor.py samples.npz pvalues.json [--permutations 200] [--mode gram]

The environment is `bash .ci/engines_setup.sh met` (torch, which tvjax never imports). Input: an .npz
holding, per job j, `pi_<j>` and `mu_<j>`: int [N, n] token ids, -1 at positions after a row's end
(the package's own padding); `jobs` = the number of jobs. Output: JSON with per-job `pvalues`,
`statistics`, and the seconds spent. The statistic is the package's `mmd_hamming` (its MMD with the
Hamming kernel K(x, y) = #{t: x_t = y_t}, normalized to unit diagonal, self-pairs left out), all
rows under one prompt; the p-value is the package's permutation p-value (the share of permuted
statistics >= the observed one, as its EmpiricalPvalueCalculator computes it). Two modes:

* `package`: `model_equality_testing.algorithm.run_two_sample_test(..., pvalue_type="permutation_pvalue",
  stat_type="mmd_hamming", b=permutations)`, as the package's README runs it (it recomputes the
  kernel for every permutation: seconds per test at N = 1000).
* `gram` (default): the observed and the permuted statistics from one Gram matrix of the same kernel
  over the pooled rows, the permutations as index sets (the same numbers, one matrix product for all
  permutations). On the first `--checked-jobs` jobs the package's `mmd_hamming` recomputes the
  observed and the first permuted statistic, which must agree to 1e-9.
"""

import argparse
import json
import sys
import time

import numpy as np


def package_test(pi, mu, permutations):
    import torch
    from model_equality_testing.algorithm import run_two_sample_test
    from model_equality_testing.distribution import CompletionSample

    torch.manual_seed(0)
    sample = lambda x: CompletionSample(prompts=np.zeros(len(x), np.int64), completions=x.astype(np.int64), m=1)
    return run_two_sample_test(sample(pi), sample(mu), pvalue_type="permutation_pvalue", stat_type="mmd_hamming",
                               b=permutations)


def gram_statistics(gram, in_x):
    """MMD statistics [b] of the label sets in_x [b, N + M] (1 for the first sample) from a Gram
    matrix with unit diagonal: self-pairs left out, as the package's _mmd does."""
    in_y = 1.0 - in_x
    n_x, n_y = in_x[0].sum(), in_y[0].sum()
    off = gram - np.eye(len(gram))
    gx, gy = in_x @ off, in_y @ off
    return (np.sum(gx * in_x, 1) / (n_x * (n_x - 1)) - 2 * np.sum(gx * in_y, 1) / (n_x * n_y)
            + np.sum(gy * in_y, 1) / (n_y * (n_y - 1)))


def gram_test(pi, mu, permutations, rng, check):
    """(p-value, statistic) from one Gram matrix of the package's Hamming kernel; with `check`, the
    observed and the first permuted statistic are recomputed by the package's mmd_hamming."""
    pooled = np.concatenate([pi, mu]).astype(np.int64)
    gram = np.zeros((len(pooled), len(pooled)))
    for t in range(pooled.shape[1]):  # one position at a time: N^2 memory, not N^2 n
        gram += pooled[:, t, None] == pooled[None, :, t]
    gram /= pooled.shape[1]  # unit diagonal: every row matches itself at all positions
    n_x = len(pi)
    orders = np.stack([np.arange(len(pooled))] + [rng.permutation(len(pooled)) for _ in range(permutations)])
    in_x = np.zeros(orders.shape)
    np.put_along_axis(in_x, orders[:, :n_x], 1.0, axis=1)
    stats = gram_statistics(gram, in_x)
    observed, permuted = float(stats[0]), stats[1:]
    if check:
        from model_equality_testing.distribution import CompletionSample
        from model_equality_testing.tests import mmd_hamming

        sample = lambda x: CompletionSample(prompts=np.zeros(len(x), np.int64), completions=x, m=1)
        for order, mine in ((orders[0], observed), (orders[1], permuted[0])):
            theirs = float(mmd_hamming(sample(pooled[order[:n_x]]), sample(pooled[order[n_x:]])))
            if abs(theirs - mine) > 1e-9:
                raise AssertionError(f"Gram-matrix statistic {mine} != the package's mmd_hamming {theirs}")
    return float(np.mean(permuted >= observed)), observed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples")
    parser.add_argument("out")
    parser.add_argument("--permutations", type=int, default=200)
    parser.add_argument("--mode", choices=("gram", "package"), default="gram")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checked-jobs", type=int, default=5, help="gram mode: jobs whose statistics the package recomputes")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    import model_equality_testing  # noqa: F401  (its import, torch and transformers included, is timed apart)

    imported = time.perf_counter()
    data = np.load(args.samples)
    rng = np.random.default_rng(args.seed)
    pvalues, statistics = [], []
    for j in range(int(data["jobs"])):
        pi, mu = data[f"pi_{j}"], data[f"mu_{j}"]
        if args.mode == "package":
            pvalue, statistic = package_test(pi, mu, args.permutations)
        else:
            pvalue, statistic = gram_test(pi, mu, args.permutations, rng, check=j < args.checked_jobs)
        pvalues.append(float(pvalue))
        statistics.append(float(statistic))
    import importlib.metadata

    record = {"pvalues": pvalues, "statistics": statistics, "mode": args.mode, "permutations": args.permutations,
              "stat_type": "mmd_hamming", "import_seconds": imported - started,
              "test_seconds": time.perf_counter() - imported,
              "version": importlib.metadata.version("model-equality-testing")}
    with open(args.out, "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    sys.exit(main())
