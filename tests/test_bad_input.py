"""Bad input to the processes, the front door, the estimators and the study configs: each case is
refused with an error naming the input (never a NaN or a number that is no TV), and a bounded
property test over the constructors finds the next such case."""

import dataclasses
import math
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvjax
from tvjax.core.instances import (
    BlockProcess,
    CoinProcess,
    RareEscapeProcess,
    TabularProcess,
    block_pair,
    coin_pair,
    exact_tv,
    random_tabular_pair,
    rare_escape_pair,
)
from tvjax.core.oracles import Exact
from tvjax.core.schedules import Schedule
from tvjax.core.validate import LOG_MASS_ATOL
from tvjax.studykit import ConfigError, study_view

ROOT = Path(__file__).resolve().parents[1]
KEY = jax.random.key(0)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def logits(shape=(3, 4, 4), seed=0):
    return np.random.default_rng(seed).normal(size=shape)


# --------------------------------------------------------------------------- process constructors


def test_from_logits_refuses_a_nan_logit_naming_its_row():
    bad = logits()
    bad[2, 1, 3] = np.nan
    with pytest.raises(ValueError, match=r"logits\[position, context\] has a NaN entry in row \(2, 1\)"):
        TabularProcess.from_logits(bad, 1)


def test_from_logits_refuses_plus_inf_and_a_row_of_all_minus_inf():
    bad = logits()
    bad[0, 3, 0] = np.inf
    with pytest.raises(ValueError, match=r"\+inf entry in row \(0, 3\)"):
        TabularProcess.from_logits(bad, 1)
    bad = logits()
    bad[1, 2, :] = -np.inf
    with pytest.raises(ValueError, match=r"row \(1, 2\) is all -inf: no token has positive probability"):
        TabularProcess.from_logits(bad, 1)


def test_from_logits_keeps_minus_inf_entries_as_zero_mass():
    table = logits()
    table[0, 0, 1] = -np.inf  # support mismatch is the common case, not an error
    process = TabularProcess.from_logits(table, 1)
    assert np.asarray(process.logprobs)[0, 0, 1] == -np.inf
    assert np.allclose(np.exp(np.asarray(process.logprobs, np.float64)).sum(-1), 1.0, atol=1e-6)


def test_raw_tabular_logprobs_must_normalise():
    raw = logits().astype(np.float32)  # logits, not log-probabilities: gave "TV" 127.5
    with pytest.raises(ValueError, match=r"row \(0, 0\) does not normalise: its probabilities sum to"):
        TabularProcess(raw, 3, 4, 1, 4)
    good = np.asarray(TabularProcess.from_logits(logits(), 1).logprobs)
    off = good.copy()
    off[2, 3] += 2 * LOG_MASS_ATOL  # just past the stated tolerance
    with pytest.raises(ValueError, match=r"row \(2, 3\) does not normalise"):
        TabularProcess(off, 3, 4, 1, 4)
    within = good.copy()
    within[2, 3] += LOG_MASS_ATOL / 2
    TabularProcess(within, 3, 4, 1, 4)


def test_raw_tabular_shape_nan_and_eos_are_checked():
    good = np.asarray(TabularProcess.from_logits(logits(), 1).logprobs)
    with pytest.raises(ValueError, match=r"must have shape \[n, V\*\*context_len, V\] = \[3, 16, 4\]"):
        TabularProcess(good, 3, 4, 2, 4)
    nan = good.copy()
    nan[1, 0, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN entry in row \(1, 0\)"):
        TabularProcess(nan, 3, 4, 1, 4)
    with pytest.raises(ValueError, match=r"eos_ids \(7,\) must be token ids in \[0, 4\)"):
        TabularProcess(good, 3, 4, 1, 4, eos_ids=(7,))


def test_from_probs_names_the_bad_probabilities():
    probs = np.full((2, 2, 2), 0.5)
    probs[1, 0] = (0.7, 0.7)
    with pytest.raises(ValueError, match="does not sum to 1"):
        TabularProcess.from_probs(probs, 1)
    probs[1, 0] = (np.nan, 0.5)
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        TabularProcess.from_probs(probs, 1)


def test_other_processes_check_their_parameters():
    with pytest.raises(ValueError, match=r"p1 must be <= 1.0"):
        CoinProcess(np.float64(1.5), 4)
    with pytest.raises(ValueError, match="p1 must be finite"):
        CoinProcess(np.float64(np.nan), 4)
    with pytest.raises(ValueError, match="outcome_probs does not sum to 1"):
        RareEscapeProcess(np.array([0.5, 0.6]), np.float64(0.1), 8, 3)
    with pytest.raises(ValueError, match=r"escape_prob must be > 0.0"):
        RareEscapeProcess(np.array([0.5, 0.5]), np.float64(0.0), 8, 3)
    pi, _ = block_pair(n=16, block_bits=4)
    with pytest.raises(ValueError, match=r"final_p1 must be <= 1.0"):
        dataclasses.replace(pi, final_p1=np.asarray(pi.final_p1) + 2.0)
    with pytest.raises(ValueError, match=r"hidden_paths must have shape \[num_blocks, n - block_bits - 1\]"):
        BlockProcess(np.asarray(pi.hidden_paths)[:, :-1], pi.final_p1, pi.n, pi.block_bits)


def test_checks_skip_traced_values_and_pytree_placeholders():
    pi, mu = random_tabular_pair(0, logit_noise=0.5)
    mapped = jax.tree.map(lambda a: a, pi)  # a concrete unflatten is checked again, and passes
    assert mapped.n == pi.n
    total = jax.jit(lambda p: jnp.sum(jnp.exp(p.logprobs)))(pi)  # traced: no check, no error
    assert math.isclose(float(total), pi.n * pi.vocab_size**pi.context_len, rel_tol=1e-5)
    spec = dataclasses.replace(pi, logprobs=0)  # an in_axes spec: a placeholder leaf, not a table
    rows = jax.vmap(lambda p: p.logprobs.sum(), in_axes=(spec,))(dataclasses.replace(pi, logprobs=jnp.stack([pi.logprobs] * 2)))
    assert rows.shape == (2,)


# --------------------------------------------------------------------------- the front door


@pytest.fixture(scope="module")
def pair():
    return random_tabular_pair(0, logit_noise=0.5)


@pytest.mark.parametrize("key, message", [(0, "key must be a JAX PRNG key"), (None, "key must be a JAX PRNG key"),
                                          (np.zeros(3, np.uint32), "key must be a JAX PRNG key")])
def test_estimate_tv_wants_one_prng_key(pair, key, message):
    with pytest.raises(TypeError, match=message):
        tvjax.estimate_tv(key, *pair)
    with pytest.raises(ValueError, match=r"key must be one PRNG key, got a batch of shape \(3,\)"):
        tvjax.estimate_tv(jax.random.split(KEY, 3), *pair)


def test_estimate_tv_names_bad_arguments(pair):
    with pytest.raises(TypeError, match="eps must be a number, got '0.1'"):
        tvjax.estimate_tv(KEY, *pair, eps="0.1")
    with pytest.raises(TypeError, match="pi must be a process .* got NoneType"):
        tvjax.estimate_tv(KEY, None, pair[1])
    with pytest.raises(ValueError, match="delta must be finite"):
        tvjax.estimate_tv(KEY, *pair, delta=float("nan"))


def test_estimate_tv_refuses_budgets_beyond_int32_up_front(pair):
    with pytest.raises(ValueError, match=r"eps=1e-09, delta=0.1 needs 1.5e\+18 trajectories .* raise eps"):
        tvjax.estimate_tv(KEY, *pair, eps=1e-9)
    with pytest.raises(ValueError, match=r"at noise level 1e\+06 .* raise eps or lower the noise"):
        tvjax.estimate_tv(KEY, *pair, access="noisy", sigma=1e6)


@dataclasses.dataclass(frozen=True)
class NaNScorer:
    """A user's process whose scores go NaN: the front door must not return a NaN estimate."""

    inner: TabularProcess
    n: int = 6
    vocab_size: int = 4
    max_support: int = 4

    def sample(self, key, num):
        return self.inner.sample(key, num)

    def path_logprobs(self, tokens):
        return jnp.full(tokens.shape, jnp.nan)


jax.tree_util.register_dataclass(NaNScorer, data_fields=["inner"], meta_fields=["n", "vocab_size", "max_support"])


def test_a_nan_estimate_is_an_error_not_a_result(pair):
    with pytest.raises(FloatingPointError, match="NaN log-probabilities"):
        tvjax.estimate_tv(KEY, NaNScorer(pair[0]), pair[1], eps=0.2)


# --------------------------------------------------------------------------- multilevel sizes


def test_chunk_must_be_a_positive_row_count(pair):
    with pytest.raises(ValueError, match=r"chunk \(rows per step\) must be an integer >= 1, got 0"):
        tvjax.multilevel(KEY, *pair, Exact(), Schedule((64,), (1,)), chunk=0)
    with pytest.raises(ValueError, match="chunk"):
        tvjax.likelihood_ratio(KEY, *pair, Exact(), tvjax.Samples(64), chunk=-2)


def test_a_chunk_that_does_not_divide_the_batch_uses_every_row_once(pair):
    """chunk=3 on 301 rows per side: the last step takes the remainder; the estimate counts exactly
    the scheduled rows and is within 4 stderr of the exact TV."""
    truth = exact_tv(*pair)
    estimate = tvjax.multilevel(KEY, *pair, Exact(), Schedule((301,), (1,)), chunk=3)
    assert float(estimate.levels.num_samples[0]) == 602
    assert abs(float(estimate.value) - truth) < 4 * float(estimate.stderr)


def test_each_median_group_runs_the_whole_schedule(pair):
    """More groups than trajectories per level is allowed: every group is a full copy of the
    schedule, and the queries say so."""
    one = tvjax.multilevel(KEY, *pair, Exact(), Schedule((10,), (1,)))
    many = tvjax.multilevel(KEY, *pair, Exact(), Schedule((10,), (1,)), num_groups=1001)
    assert float(many.queries) == 1001 * float(one.queries)
    assert float(many.levels.num_samples[0]) == 1001 * 20
    truth = exact_tv(*pair)
    assert abs(float(many.value) - truth) < 4 * float(many.stderr)
    with pytest.raises(ValueError, match="level sizes times num_groups must be at most"):
        tvjax.multilevel(KEY, *pair, Exact(), Schedule((2**20,), (1,)), num_groups=2**12)


# --------------------------------------------------------------------------- study configs


def composed(app, overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name=app, overrides=overrides)


@pytest.mark.parametrize("overrides, message", [
    (["study.rounds=-1"], "study.rounds must be a count >= 1, got -1"),
    (["smoke=true", "study.rounds=-1"], "study.rounds must be a count >= 1, got -1"),
    (["smoke=true", "study_smoke.seeds=0"], "study_smoke.seeds must be a count >= 1, got 0"),
    (["study.arms.1.sigma=-0.3"], r"study.arms\[1\].sigma must be a finite number >= 0"),
    (["study.delta=nan"], "study.delta must be a finite number >= 0, got nan"),
])
def test_study_configs_refuse_bad_counts_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        study_view(composed("coverage", overrides), ("study",))


def test_every_shipped_study_config_passes_the_checks():
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        for smoke in ("false", "true"):
            cfg = composed(config.stem, [f"++smoke={smoke}"])
            if "study" in cfg:
                study_view(cfg, ("study",))


def test_a_hydra_app_says_one_line_and_exits_2(tmp_path):
    for overrides, message in ((["study.rounds=-1"], "study.rounds must be a count >= 1"),
                               (["smoke=true", "study.rounds=5"], "study.rounds=5 has no effect under smoke=true")):
        run = subprocess.run([sys.executable, str(ROOT / "experiments/coverage.py"), *overrides,
                              f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=300)
        assert run.returncode == 2, run.stderr
        assert run.stderr.strip() == f"coverage.py: error: {message}" + run.stderr.strip().split(message, 1)[1]
        assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- moved modules


def test_every_listed_name_resolves():
    for name in dir(tvjax):
        assert getattr(tvjax, name) is not None, name


def test_old_module_homes_alias_the_new_ones():
    from tvjax.audit import sequential

    with pytest.warns(DeprecationWarning, match="tvjax.sequential moved to tvjax.audit.sequential"):
        assert tvjax.sequential is sequential
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import tvjax.analysis.calibration as old
        from tvjax.report import main as old_main
    import tvjax.pools.analysis.calibration as new
    from tvjax.pools.report import main

    assert old is new and new.__spec__.name == "tvjax.pools.analysis.calibration"
    assert old_main is main
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        tvjax.nonexistent  # noqa: B018


# --------------------------------------------------------------------------- property tests

odd_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                       st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-30, 1e30, float("nan"), float("inf"), -float("inf")]))


def assert_valid_table(process):
    table = np.asarray(process.logprobs, np.float64)
    assert not np.isnan(table).any() and not (table == np.inf).any()
    with np.errstate(divide="ignore"):
        assert np.allclose(np.log(np.exp(table).sum(-1)), 0.0, atol=LOG_MASS_ATOL)


@FUZZ
@given(entries=st.lists(odd_floats, min_size=12, max_size=12), temperature=odd_floats,
       top_k=st.one_of(st.none(), st.integers(-2, 5)))
def test_from_logits_either_refuses_or_builds_a_distribution(entries, temperature, top_k):
    table = np.asarray(entries, np.float64).reshape(3, 1, 4)
    try:
        process = TabularProcess.from_logits(table, 0, temperature, top_k)
    except ValueError as e:
        assert str(e)
        return
    assert_valid_table(process)


@FUZZ
@given(entries=st.lists(odd_floats, min_size=8, max_size=8))
def test_raw_tables_either_refuse_or_hold_a_distribution(entries):
    table = np.asarray(entries, np.float32).reshape(2, 1, 4)
    try:
        process = TabularProcess(table, 2, 4, 0, 4)
    except ValueError as e:
        assert "row" in str(e)
        return
    assert_valid_table(process)


@FUZZ
@given(p=st.lists(odd_floats, min_size=3, max_size=3), q=st.lists(odd_floats, min_size=3, max_size=3),
       n=st.integers(-2, 40), scale=odd_floats)
def test_rare_escape_pairs_either_refuse_or_have_a_tv_in_the_unit_interval(p, q, n, scale):
    try:
        pi, mu = rare_escape_pair(np.asarray(p), np.asarray(q), n, scale)
    except ValueError as e:
        assert str(e)
        return
    assert 0.0 <= exact_tv(pi, mu) <= 1.0


@FUZZ
@given(n=st.one_of(st.integers(-3, 64), st.floats(allow_nan=True), st.just(2**60)), shift=odd_floats)
def test_coin_pairs_either_refuse_or_have_a_tv_in_the_unit_interval(n, shift):
    try:
        pi, mu = coin_pair(n, shift)
    except (ValueError, TypeError) as e:
        assert str(e)
        return
    assert 0.0 <= exact_tv(pi, mu) <= 1.0


@FUZZ
@given(vocab=st.integers(-1, 5), n=st.integers(-1, 4), context=st.integers(-1, 2),
       top_k=st.tuples(st.one_of(st.none(), st.integers(-1, 6)), st.one_of(st.none(), st.integers(-1, 6))),
       temperature=st.tuples(odd_floats, odd_floats), noise=odd_floats)
def test_random_tabular_pairs_either_refuse_or_hold_distributions(vocab, n, context, top_k, temperature, noise):
    try:
        pair = random_tabular_pair(0, vocab, n, context, top_k, temperature, noise)
    except ValueError as e:
        assert str(e)
        return
    for process in pair:
        assert_valid_table(process)


@FUZZ
@given(eps=st.one_of(odd_floats, st.floats(0.15, 0.5)), delta=st.one_of(odd_floats, st.floats(0.01, 0.5)),
       access=st.sampled_from(["exact", "noisy", "sampler", "logit_noise", "bogus"]),
       sigma=st.one_of(st.none(), odd_floats, st.floats(0.0, 0.3)))
def test_estimate_tv_either_refuses_or_gives_an_interval_in_the_unit_interval(eps, delta, access, sigma):
    pi, mu = random_tabular_pair(0, vocab_size=3, n=3, context_len=1, logit_noise=0.5)
    # A valid small eps or a valid large sigma is a long run, not bad input (past int32 it is refused).
    eps = 0.15 if 1e-5 <= eps < 0.15 else eps
    sigma = 0.3 if sigma is not None and 0.3 < sigma < 1e5 else sigma
    try:
        result = tvjax.estimate_tv(KEY, pi, mu, access, eps, delta, sigma=sigma, scale=sigma)
    except (ValueError, TypeError) as e:
        assert str(e)
        return
    assert 0.0 <= float(result.ci_low) <= float(result.ci_high) <= 1.0
    assert math.isfinite(float(result.value)) and math.isfinite(float(result.stderr))
