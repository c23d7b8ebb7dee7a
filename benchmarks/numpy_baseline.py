"""The benchmark workloads as plain vectorized NumPy, the way the paper's synthetic experiments are
written: realized-token probability draws are built as arrays [rows, r, n] with NumPy's
default_rng, then reduced. Rows are (repetition, trajectory) pairs, vectorized together; an array
is split into row chunks only where it would exceed MAX_ELEMENTS (1 GiB of float64).

Run by benchmarks/run.py as `python numpy_baseline.py plan.json workload out.json`.
"""

import numpy as np

from measure import timed, worker_main

MAX_ELEMENTS = 2**27
LOG_FLOOR = 1e-12


class Block:
    """The paper's block instance, from the arrays tvjax built (so both sides use one instance)."""

    def __init__(self, arrays):
        self.hidden = arrays["hidden_paths"]
        self.final_p1 = {"pi": arrays["pi_final_p1"].astype(np.float64), "mu": arrays["mu_final_p1"].astype(np.float64)}
        self.block_bits = int(arrays["block_bits"])
        self.weights = 2 ** np.arange(self.block_bits - 1, -1, -1)
        self.n = self.block_bits + self.hidden.shape[1] + 1

    def sample(self, rng, side, rows):
        bits = rng.integers(0, 2, size=(rows, self.block_bits), dtype=np.int8)
        u = bits @ self.weights
        final = (rng.random(rows) < self.final_p1[side][u]).astype(np.int8)
        return np.concatenate([bits, self.hidden[u], final[:, None]], axis=1)

    def realized_probs(self, side, tokens):
        """p(x_i | x_<i) for every position [rows, n]."""
        u = tokens[:, : self.block_bits] @ self.weights
        on_path = (tokens[:, self.block_bits : -1] == self.hidden[u]).astype(np.float64)
        p1 = self.final_p1[side][u]
        final = np.where(tokens[:, -1] == 1, p1, 1.0 - p1)
        return np.concatenate([np.full((len(tokens), self.block_bits), 0.5), on_path, final[:, None]], axis=1)


def draws(rng, p, oracle, sigma, r):
    """[rows, r, n] realized-token probability draws of one model."""
    if oracle == "noisy":
        return p[:, None, :] + sigma * np.sqrt(p * (1.0 - p))[:, None, :] * rng.standard_normal((p.shape[0], r, p.shape[1]))
    return rng.random((p.shape[0], r, p.shape[1])) < p[:, None, :]


def path_logprobs(rng, p, oracle, sigma, repeats):
    """[rows, len(repeats)]: sum_i log of the mean of the first r draws, nested (one draw array)."""
    with np.errstate(divide="ignore"):
        if oracle == "exact":
            return np.repeat(np.sum(np.log(p), axis=1)[:, None], len(repeats), axis=1)
        d = draws(rng, p, oracle, sigma, max(repeats))
        return np.stack([np.sum(np.log(np.clip(d[:, :r].mean(axis=1), LOG_FLOOR, 1.0)), axis=1) for r in repeats], axis=1)


def mixture_z(log_pi, log_mu):
    either_zero = np.isneginf(log_pi) | np.isneginf(log_mu)
    diff = np.where(either_zero, 0.0, log_pi - log_mu)
    return np.where(either_zero, 1.0, np.tanh(np.abs(diff) / 2))


def likelihood_ratio_term(log_pi, log_mu):
    pi_zero = np.isneginf(log_pi)
    log_ratio = np.where(pi_zero, 0.0, log_mu - log_pi)
    return np.where(pi_zero, 0.0, np.maximum(1.0 - np.exp(np.minimum(log_ratio, 0.0)), 0.0))


def scored(rng, block, side, rows, oracle, sigma, repeats):
    """Sample `rows` trajectories from `side`; (L_pi, L_mu) [rows, len(repeats)], chunked by memory."""
    chunk = max(1, MAX_ELEMENTS // (max(repeats) * block.n))
    parts = []
    for start in range(0, rows, chunk):
        tokens = block.sample(rng, side, min(chunk, rows - start))
        parts.append([path_logprobs(rng, block.realized_probs(s, tokens), oracle, sigma, repeats) for s in ("pi", "mu")])
    return [np.concatenate([part[i] for part in parts]) for i in (0, 1)]


def likelihood_ratio(rng, block, task, reps):
    num = task["num_samples"][0]
    log_pi, log_mu = scored(rng, block, "pi", reps * num, task["oracle"], task["sigma"], [1])
    return likelihood_ratio_term(log_pi[:, 0], log_mu[:, 0]).reshape(reps, num).mean(axis=1), None


def level_increments(rng, block, side, rows, oracle, sigma, coarse, fine):
    """Y = Z_fine - Z_coarse on one trajectory with nested draws (Y = Z_fine when coarse = 0)."""
    repeats = [coarse, fine] if coarse else [fine]
    z = mixture_z(*scored(rng, block, side, rows, oracle, sigma, repeats))
    return z[:, -1] - (z[:, 0] if coarse else 0.0)


def multilevel(rng, block, task, reps):
    """Algorithm 3, stratified: N_l trajectories per side and level; the per-rep estimate and the
    per-level variance of Y_l (pooled over sides)."""
    value = np.zeros(reps)
    variances = []
    coarse = [0] + task["repeats"][:-1]
    for num, c, f in zip(task["num_samples"], coarse, task["repeats"]):
        y = [level_increments(rng, block, s, reps * num, task["oracle"], task["sigma"], c, f).reshape(reps, num)
             for s in ("pi", "mu")]
        value += (y[0].mean(axis=1) + y[1].mean(axis=1)) / 2
        # One trajectory per side has no within-side spread: 0, as tvjax reports it.
        spread = [side.var(axis=1, ddof=1).mean() if num > 1 else 0.0 for side in y]
        variances.append(float(sum(spread) / 2))
    return value, variances


ESTIMATORS = {"likelihood_ratio": likelihood_ratio, "multilevel": multilevel}


def setup(plan):
    return Block(np.load(plan["instance_file"]))


def prepare(block, tasks):
    return [block] * len(tasks)


def run_task(block, task):
    rng = np.random.default_rng(task["seed"])
    reps = task["numpy_reps"]
    (values, variances), seconds = timed(ESTIMATORS[task["estimator"]], rng, block, task, reps)
    return {"label": task["label"], "run": seconds, "reps_run": reps, "values": values.tolist(), "level_variance": variances}


if __name__ == "__main__":
    worker_main(setup, prepare, run_task)
