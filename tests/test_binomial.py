"""tvjax.core.binomial: the law of the draws against scipy, exact cells, traced and broadcast counts,
determinism. Fixed seeds; every distribution case is drawn in one call, so the module compiles a
handful of programs only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import tvjax.core.binomial as tb
from tvjax.core.binomial import binomial

DRAWS = 200_000

# (count, p): both algorithms, the switch at count * q = 10 from both sides (float32 q), reflection
# (p > 1/2) on both sides of it, count = 1, count = 10_000, a tiny p.
CASES = [
    (1, 0.3),
    (16, 0.5),
    (20, 0.5),
    (21, 0.5),
    (1000, 0.00999),
    (1000, 0.01001),
    (48, 0.5),
    (768, 0.5),
    (10_000, 0.5),
    (10_000, 1e-4),
    (100, 0.9),
    (300, 0.97),
    (40, 0.99),
]


def _mean_q(count, p):
    p = np.float32(p)
    return np.float32(count) * min(p, np.float32(1) - p)


def test_cases_straddle_the_switch():
    means = [_mean_q(count, p) for count, p in CASES]
    assert 10 in means and any(9.9 < m < 10 for m in means) and any(10 < m < 10.1 for m in means)


# Exact cells (float counts here, int32 counts in the grid below): count = 0, p = 0, p = 1.
EXACT = [(0, 0.5), (0, 0.0), (0, 1.0), (7, 0.0), (7, 1.0), (10_000, 1.0)]


def _draw(key, cases, draws):
    count = jnp.asarray([c for c, _ in cases], jnp.float32)[:, None]
    p = jnp.broadcast_to(jnp.asarray([p for _, p in cases], jnp.float32)[:, None], (len(cases), draws))
    # A fresh function each time: a test that patches the module's constants must retrace.
    return np.asarray(jax.jit(lambda k, c, q: binomial(k, c, q))(key, count, p), np.float64)


@pytest.fixture(scope="module")
def draws():
    return _draw(jax.random.key(20240611), CASES + EXACT, DRAWS)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(EXACT)), ids=[f"n={c}-p={p}" for c, p in EXACT])
def test_exact_cells(draws, case):
    count, p = EXACT[case]
    assert np.all(draws[len(CASES) + case] == count * p)


def _check_law(x, count, p):
    """Mean and variance within 5 standard errors, and a chi-square over bins with >= 5 expected."""
    law = stats.binom(count, p)
    mean, var = law.mean(), law.var()
    # Central fourth moment of the binomial: var (1 + 3 (n - 2) p q) for a single n, p.
    q = 1.0 - p
    mu4 = count * p * q * (1 + 3 * (count - 2) * p * q)
    assert abs(x.mean() - mean) <= 5 * np.sqrt(var / len(x)), (count, p, x.mean(), mean)
    assert abs(x.var() - var) <= 5 * np.sqrt((mu4 - var**2) / len(x)), (count, p, x.var(), var)
    assert np.all(x == np.floor(x)) and x.min() >= 0 and x.max() <= count
    ks = np.arange(count + 1)
    observed = np.bincount(x.astype(np.int64), minlength=count + 1)
    expected = law.pmf(ks) * len(x)
    # Merge neighbours until each bin expects >= 5 draws; the last bin takes the remainder.
    edges = [0]
    acc = 0.0
    for k, e in enumerate(expected):
        acc += e
        if acc >= 5:
            edges.append(k + 1)
            acc = 0.0
    edges[-1] = count + 1
    obs = np.add.reduceat(observed, edges[:-1])
    exp = np.add.reduceat(expected, edges[:-1])
    assert len(obs) >= 2 or count <= 1
    if len(obs) >= 2:
        pvalue = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
        assert pvalue > 1e-4, (count, p, pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"n={c}-p={p}" for c, p in CASES])
def test_law(draws, case):
    count, p = CASES[case]
    _check_law(draws[case], count, float(np.float32(p)))


@pytest.mark.slow
def test_rare_paths(monkeypatch):
    """The paths a call rarely takes, made common: a window of 6 sends most small-mean draws through
    the geometric envelope (accept/reject, redraw), and tiny retry buffers with one trial in the
    last make BTRS cells overflow and wait for further passes. The law must not change."""
    monkeypatch.setattr(tb, "_WINDOW", 6)
    monkeypatch.setattr(tb, "_FIRST_TIER", 64)
    monkeypatch.setattr(tb, "_LAST_TRIALS", 1)
    cases = [(1000, 0.004), (12, 0.3), (8, 0.5), (48, 0.5), (768, 0.5)]  # rho = (n - 6) q / (7 (1 - q)) < 1
    x = _draw(jax.random.key(5), cases, DRAWS)
    for row, (count, p) in zip(x, cases):
        assert _mean_q(count, p) > 10 or np.mean(row >= 6) > 0.05
        _check_law(row, count, float(np.float32(p)))


@pytest.mark.parametrize("count, q", [(1000, 0.01), (20, 0.5), (10**6, 1e-5), (10_000, 1e-4), (3, 0.1)])
def test_window_tail_probabilities_are_relatively_accurate(count, q):
    """X >= k exactly when e <= s_k / s_0: the switch points match the binomial's tail probabilities
    to 1e-5 relative, down to tails of 1e-30 (the envelope stands for the mass past 32)."""
    q = float(np.float32(q))
    law = stats.binom(count, q)
    rho = max(count - 32, 0) * q / (1 - q) / 33
    envelope = law.pmf(32) / (1 - rho)
    ks = np.arange(1, 33)
    switch = (law.sf(ks - 1) - law.sf(31) + envelope) / (1 - law.sf(31) + envelope)
    n, qq = jnp.full(len(ks), count, jnp.float32), jnp.full(len(ks), q, jnp.float32)
    below = np.asarray(WINDOW(jnp.asarray(switch * (1 - 1e-5), jnp.float32), n, qq))
    above = np.asarray(WINDOW(jnp.asarray(switch * (1 + 1e-5), jnp.float32), n, qq))
    checked = switch > 1e-30
    assert checked.sum() >= min(count, 10)
    assert np.all((below >= ks)[checked]) and np.all((above < ks)[checked])


WINDOW = jax.jit(tb._window)

# A grid that broadcasts count [5, 1] against p [1, 6], exact cells included, and invalid ones.
COUNTS = [0, 1, 7, 300, -1]
PS = [0.0, 1.0, 0.5, 0.99, 1e-4, 1.5]
GRID_TRACES = []


@pytest.fixture(scope="module")
def grid():
    p = jnp.asarray(PS, jnp.float32)[None, :]

    def draw(key, count):
        GRID_TRACES.append(count.dtype)
        return binomial(key, count, p)

    return jax.jit(draw)


def test_exact_cells_broadcast_and_traced_count(grid):
    count = jnp.asarray(COUNTS, jnp.int32)[:, None]
    x = np.asarray(grid(jax.random.key(1), count))
    assert x.shape == (len(COUNTS), len(PS)) and x.dtype == np.float32
    n = np.asarray(COUNTS, np.float64)[:, None]
    invalid = (n < 0) | (np.asarray(PS)[None, :] > 1)
    assert np.array_equal(np.isnan(x), np.broadcast_to(invalid, x.shape))
    ok = ~invalid
    assert np.all(x[ok] == np.floor(x[ok])) and np.all((x >= 0)[ok]) and np.all((x <= n)[ok])
    assert np.all(x[:-1, 0] == 0)  # p = 0
    assert np.array_equal(x[:-1, 1], n[:-1, 0])  # p = 1
    assert np.all(x[0, :-1] == 0)  # count = 0
    # The count is an argument of the compiled program: other values run without a retrace.
    y = np.asarray(grid(jax.random.key(1), 2 * jnp.abs(count)))
    assert np.array_equal(y[:, 1], 2 * np.abs(n[:, 0])) and len(GRID_TRACES) == 1


def test_determinism(grid):
    count = jnp.asarray(COUNTS, jnp.int32)[:, None] * 40
    a, b = grid(jax.random.key(3), count), grid(jax.random.key(3), count)
    c = grid(jax.random.key(4), count)
    assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    assert not np.array_equal(np.asarray(a), np.asarray(c), equal_nan=True)


def test_vmap_matches_single_calls(grid):
    keys = jax.random.split(jax.random.key(9), 3)
    count = jnp.asarray([[0, 5, 30, 400, 2], [2, 64, 1000, 8, 0], [16, 16, 700, 1, 3]], jnp.int32)[:, :, None]
    p = jnp.asarray(PS, jnp.float32)[None, :]
    batched = np.asarray(jax.jit(jax.vmap(lambda k, c: binomial(k, c, p)))(keys, count))
    for i in range(3):
        assert np.array_equal(batched[i], np.asarray(grid(keys[i], count[i])), equal_nan=True)


def _sparse_layout(cases, rows=32, draws=65_536):
    """Fair cells (16, 1/2) on every row but the last few, which hold the (count, p) cases: the
    inversion cells fill at most 1/16 of the blocks, so the sparse path draws them, from the call's
    shared words."""
    counts = np.full((rows, draws), 16, np.int32)
    probs = np.full((rows, draws), 0.5, np.float32)
    for row, (count, p) in enumerate(cases, start=rows - len(cases)):
        counts[row], probs[row] = count, p
    return jnp.asarray(counts), jnp.asarray(probs)


@pytest.mark.slow
def test_sparse_inversion_and_single_piece_fair_coins():
    cases = [(16, 0.05), (300, 0.97)]
    counts, probs = _sparse_layout(cases)
    small = jnp.where((probs == 0.5) | (probs == 1.0), 0.0, jnp.minimum(probs, 1 - probs))
    assert bool(tb._blocks(small).sparse)  # the path under test is the one taken
    x = np.asarray(jax.jit(binomial)(jax.random.key(7), counts, probs), np.float64)
    for row, (count, p) in zip(x[-len(cases):], cases):  # each block back in its place
        _check_law(row, count, float(np.float32(p)))
    # The fair rows: one 16-bit piece each, the low and high halves of one word in different cells.
    fair = x[:-len(cases)]
    _check_law(fair[:, :8192].reshape(-1), 16, 0.5)
    _check_law(fair[:, -8192:].reshape(-1), 16, 0.5)
    assert np.corrcoef(fair[0, :32_768], fair[0, 32_768:])[0, 1] < 0.02


@pytest.mark.parametrize("count", [2, 5, 16])  # (count 1 at p = 1/2: a variance with no spread to test)
def test_fair_coins_one_piece(count):
    """Every count at most 16: one 16-bit piece per cell, two cells per word."""
    x = np.asarray(jax.jit(binomial)(jax.random.key(count), jnp.full((DRAWS,), count), 0.5), np.float64)
    _check_law(x, count, 0.5)


def test_fair_coins_past_64_take_btrs_and_below_take_set_bits():
    counts = jnp.asarray([[64], [65]]) * jnp.ones((2, DRAWS), jnp.int32)
    x = np.asarray(jax.jit(binomial)(jax.random.key(11), counts, 0.5), np.float64)
    _check_law(x[0], 64, 0.5)
    _check_law(x[1], 65, 0.5)


@pytest.mark.slow
def test_sparse_rare_paths(monkeypatch):
    """The envelope path of cells drawn by the sparse path (a window of 6 makes it common)."""
    monkeypatch.setattr(tb, "_WINDOW", 6)
    counts, probs = _sparse_layout([(12, 0.3)])
    x = np.asarray(jax.jit(lambda k, c, q: binomial(k, c, q))(jax.random.key(8), counts, probs), np.float64)
    assert np.mean(x[-1] >= 6) > 0.05
    _check_law(x[-1], 12, float(np.float32(0.3)))
