"""Hydra experiment apps: every study composed (Hydra compose API) and run end to end at smoke
size, multiruns through the joblib and submitit_local launchers, skip-if-complete on re-run, and
the bounds app's checks live in test_bounds.py."""

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from tvjax.core import cost
from tvjax.core.estimators import Configured, plugin
from tvjax.core.instances import exact_tv, random_tabular_pair
from tvjax.core.oracles import Exact, LogitNoise, Noisy, Sampler
from tvjax.core.schedules import Level, equal_share_schedule
from tvjax.studykit import ConfigError, build, build_pair, config_digest, run_study, study_view

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# experiment -> app (primary config and script of the same name). engine_* experiments belong to
# experiments/engine_campaign.py and are tested with it.
STUDIES = {
    "convergence": "convergence",
    "multilevel_regimes": "multilevel_regimes",
    "access_models": "access_models",
    "access_models_paper": "access_models",
    "self_noise": "self_noise",
    "bounds": "bounds",
    "bounds_rare_escape": "bounds",
    "bounds_coins": "bounds",
    "coverage": "coverage",
    "model_variants": "model_variants",
    "blackbox": "blackbox",
}
# Subprocess jobs are tiny: skip the expensive XLA backend passes to keep compiles short.
FAST_ENV = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "HYDRA_FULL_ERROR": "1"}


def load_app(name):
    spec = importlib.util.spec_from_file_location(f"app_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def composed(config_name, overrides=()):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def group_options(group):
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def test_study_table_lists_every_experiment():
    mine = {name for name in group_options("experiment") if not name.startswith("engine_")}
    assert mine == set(STUDIES)


def check_outputs(out_dir, record):
    assert (out_dir / "results.json").exists() and (out_dir / "results.csv").exists()
    assert (out_dir / "resolved_config.yaml").exists() and (out_dir / "done.json").exists()
    saved = json.loads((out_dir / "results.json").read_text())
    assert saved["seed"] == 0 and saved["versions"]["jax"] and saved["results"]
    assert record["figures"] and all((out_dir / name).stat().st_size > 0 for name in record["figures"])
    assert len((out_dir / "results.csv").read_text().splitlines()) >= 2
    phases = {"startup_and_imports", "hydra_composition", "tracing", "lowering", "compiling", "runs", "figures", "writing"}
    assert set(saved["seconds"]) == phases and all(v >= 0 for v in saved["seconds"].values())


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(STUDIES))
def test_every_experiment_runs_at_smoke_size(experiment, tmp_path):
    app = STUDIES[experiment]
    cfg = composed(app, [f"experiment={experiment}", "smoke=true"])
    assert cfg.study.name == app and cfg.smoke
    module = load_app(app)
    record = run_study(cfg, module.study, module.READS, out_dir=tmp_path)
    check_outputs(tmp_path, record)
    results = record["results"]
    if app == "convergence":  # Var(R) of the block instance is a sum over its outcomes, not sampled
        assert results["slope"] < 0 and results["variance_R_from"] == "exact"
        assert results["variance_R"] == pytest.approx(0.23360418, rel=1e-6)
    if app in ("convergence", "multilevel_regimes", "access_models"):
        assert record["random_words"] > 0
    if experiment == "access_models_paper":  # the runner's N_l = round(N_base L w_l / sum w), at least 1
        rows = list(csv.DictReader((tmp_path / "results.csv").open()))
        sizes = {r["arm"]: json.loads(r["sizes"]) for r in rows}
        assert sizes["noisy sigma=0.5, r=(16, 64)"] == [[25, 7], [16, 64]] and sizes["exact logits"] == [64, 1]
    if app == "multilevel_regimes":
        assert all(len(v) == len(cfg.study_smoke.repeats) - 1 for v in results["rho"].values())
    if app == "bounds":
        assert {row["access"] for row in results["exponents"]} == {g.access for g in cfg.study_smoke.grids}
        assert all(row["verdict"] and row["reps"] == cfg.study_smoke.reps for row in results["exponents"])
        assert (tmp_path / "exponents.csv").read_text().startswith("access,axis,estimator")
    if app == "model_variants":  # a tiny random model: every row has its exact TV by enumeration
        labels = {v.label for v in cfg.study_smoke.variants}
        assert set(results["variants"]) | set(results["skipped"]) == labels and results["variants"]
        assert "int3 weights" in results["skipped"]  # a weight format variant() refuses is skipped, not run
        rows = list(csv.DictReader((tmp_path / "results.csv").open()))
        assert {r["estimator"] for r in rows} == {"exact", "noisy", "sample-only"}
        assert all(r["truth"] and float(r["ci_low"]) <= float(r["ci_high"]) for r in rows)
        assert {int(r["n"]) for r in rows if r["estimator"] == "exact"} == set(cfg.study_smoke.sizes)



@pytest.mark.slow
def test_access_models_drops_each_arms_program_before_the_next(tmp_path, monkeypatch):
    """B.11's arms run one after another: the programs of each are dropped before the next arm's
    compile (its peak memory is then the largest arm's), once per change of arm, not per job."""
    module = load_app("access_models")
    released = []
    monkeypatch.setattr(module, "release_programs", lambda share: released.append(share))
    # The paper's 45 jobs at 2 repetitions: 9 exact, 3 noisy arms of 9 (one program: sigma is data),
    # 9 sample-only.
    cfg = composed("access_models", ["experiment=access_models_paper", "study.reps=2", "plots=false"])
    record = run_study(cfg, module.study, module.READS, out_dir=tmp_path)
    assert len(record["results"]["arms"]) == 5 and len(list(csv.DictReader((tmp_path / "results.csv").open()))) == 45
    assert released == [0, 0]  # exact -> noisy, noisy -> sample-only


def test_matplotlib_import_waits_for_the_first_program_lowered(tmp_path, monkeypatch):
    """run_study starts matplotlib's import thread once the study's first program is lowered (its
    compile, which releases the GIL, follows), not beside the tracing and lowering that hold the
    GIL; once only, and not after the study."""
    from tvjax import studykit

    started = []  # the lowering seconds seen when the import started
    monkeypatch.setattr(studykit, "preload_matplotlib", lambda: started.append(studykit._compile_seconds["lowering"]))
    lowered_before = []

    def study(view):
        lowered_before.append(studykit._compile_seconds["lowering"])
        assert not started  # armed, not started: nothing lowered yet
        jax.jit(lambda x: x * 3.0 + 1.0)(np.float32(2.0)).block_until_ready()
        assert len(started) == 1 and started[0] > lowered_before[0]  # right after that lowering
        jax.jit(lambda x: x - 5.0)(np.float32(2.0)).block_until_ready()
        return studykit.StudyResult({"value": 1.0}, [{"value": 1.0}], {})

    cfg = composed("convergence", ["smoke=true"])
    run_study(cfg, study, ("seed", "study"), out_dir=tmp_path)
    assert len(started) == 1
    jax.jit(lambda x: x / 7.0)(np.float32(2.0)).block_until_ready()  # after the study: disarmed
    assert len(started) == 1


def test_multilevel_regimes_batches_map_every_copy_to_its_schedule(tmp_path):
    # Jobs sharing padded repeat counts run as copies of one call (here two batches of two jobs
    # at r = (32, 32) and one at r = (8, 32)): each job's estimates must be the copies that ran
    # its own level sizes, which its queries show, and be independent of the other jobs'.
    module = load_app("multilevel_regimes")
    schedules = [module.Schedule((4,), (32,)), module.Schedule((16, 4), (8, 32)), module.Schedule((8,), (32,)),
                 module.Schedule((2,), (32,)), module.Schedule((32, 8), (8, 32)), module.Schedule((6,), (32,))]
    batches = module.batched_jobs(schedules, 2)
    assert sorted(map(len, batches)) == [2, 2, 2] and sorted(j for b in batches for j in b) == list(range(6))
    assert all(len({module.pad_schedule(schedules[j], 2).repeats for j in batch}) == 1 for batch in batches)
    sizes = module.batch_sizes([schedules[0], schedules[2]], 2, 3)
    np.testing.assert_array_equal(sizes.num_samples, [[4, 0]] * 3 + [[8, 0]] * 3)
    with pytest.raises(ValueError, match="share their repeat counts"):
        module.batch_sizes([schedules[0], schedules[1]], 2, 3)
    cfg = composed("multilevel_regimes", ["study.sigmas=[0.5]", "study.repeats=[8,32]", "study.base_sizes=[4,1]",
                                          "study.scales=[1,2]", "study.reps=3", "study.ratio_trajectories=64"])
    record = run_study(cfg, module.study, module.READS, out_dir=tmp_path)
    n = build_pair(cfg.instance)[0].n
    rows = [r for r in csv.DictReader((tmp_path / "results.csv").open()) if r["kind"] == "mae"]
    assert len(rows) == 6 and record["results"]["reps"] == 3
    for row in rows:
        schedule = (json.loads(row["num_samples"]), json.loads(row["repeats"]))
        assert float(row["queries"]) == pytest.approx(cost.schedule_queries(schedule, n))
    assert len({row["mae"] for row in rows}) == len(rows)

def test_model_variants_exact_logits_match_enumeration():
    """On the tiny random pair (lm_tiny: float32 vs temperature 1.5 of a vocabulary-8 model), the
    study's exact-logit arm at the smoke size lies within 4 standard errors of the TV by
    enumeration of V**n sequences."""
    app = load_app("model_variants")
    view = study_view(composed("model_variants", ["smoke=true", "instance=lm_tiny"]), app.READS)
    pi, mu = build_pair(view.instance)
    truth = exact_tv(pi, mu)
    assert pi.vocab_size**pi.n <= view.study.enumerate_max and 0.1 < truth < 0.9
    row = app.measure("exact", jax.random.key(view.seed), pi, mu, view.study, view.delta)
    assert row["queries"] > 0 and 0 < row["stderr"] < 0.05
    assert abs(row["value"] - truth) <= 4 * row["stderr"], (row, truth)
    assert row["ci_low"] <= row["value"] <= row["ci_high"]


@pytest.mark.slow
def test_estimate_app_runs_and_every_group_option_builds(tmp_path):
    cfg = composed("config", ["instance=random_tabular", "estimator=plugin", "estimator.sizes.num_per_side=64"])
    estimate = load_app("estimate")
    check_outputs(tmp_path, run_study(cfg, estimate.study, estimate.READS, out_dir=tmp_path))
    saved = json.loads((tmp_path / "results.json").read_text())["results"]
    assert saved["ci_low"] <= saved["value"] <= saved["ci_high"]
    assert saved["queries"] == 2 * 64 * cost.trajectory_queries(1, 6, 64)
    for option in group_options("instance"):
        if option == "lm_pair":  # SmolLM2: V**n sequences cannot be enumerated (lm_tiny can)
            continue
        pi, mu = build_pair(composed("config", [f"instance={option}"]).instance)
        assert 0.0 < exact_tv(pi, mu) <= 1.0, option
    oracles = {"exact": Exact, "noisy": Noisy, "sampler": Sampler, "logit_noise": LogitNoise}
    assert set(group_options("oracle")) == set(oracles)
    for option, kind in oracles.items():
        oracle = build(composed("config", [f"oracle={option}"]).oracle)
        assert type(oracle) is kind and oracle.noise_level(pi, mu) >= 0, option
    # Every estimator option builds a registered estimator that runs and spends what it says.
    pi, mu = random_tabular_pair(seed=1, n=3)
    for option in group_options("estimator"):
        estimator = build(composed("config", [f"estimator={option}"]).estimator)
        assert isinstance(estimator, Configured) and estimator.name == option
        result = estimator(jax.random.key(0), pi, mu, Noisy(0.1))
        assert 0.0 <= float(result.value) <= 1.0 and float(result.queries) == estimator.queries(pi.n), option


def test_bad_configs_fail_clearly():
    with pytest.raises(ConfigError, match="unknown estimator"):
        build({"_target_": "tvjax.core.estimators.configured", "name": "magic", "sizes": {}})
    with pytest.raises(ConfigError, match="takes sizes"):
        build({"_target_": "tvjax.core.estimators.configured", "name": "plugin", "sizes": {"num_samples": 3}})
    with pytest.raises(ConfigError, match="no parameter"):
        build_pair(composed("config").instance, K=4)
    with pytest.raises(ConfigError, match=r"needs the config key\(s\) \['study'\]: pick one"):
        study_view(composed("config"), ("seed", "study"))
    bounds = load_app("bounds")
    cfg = composed("bounds", ["smoke=true", "study_smoke.grids=[{access: exact, axis: width, values: [1]}]"])
    with pytest.raises(ConfigError, match="unknown grid axis"):
        bounds.study(study_view(cfg, bounds.READS))


def test_a_study_reads_only_what_it_declares():
    """The view a study gets holds its declared keys only: reading another one is an error, so a
    done-marker over that view cannot miss a key the study uses."""
    cfg = composed("convergence", ["smoke=true"])
    view = study_view(cfg, load_app("convergence").READS)
    assert view.study.reps == cfg.study_smoke.reps  # smoke merged over the study
    with pytest.raises(Exception, match="estimator"):
        _ = view.estimator


def test_query_accounting_matches_the_estimators():
    pi, mu = random_tabular_pair(seed=1, n=3)
    est = plugin(jax.random.key(0), pi, mu, Noisy(0.1), Level(4, 3))
    assert float(est.queries) == 4 * cost.symmetric_queries(1, pi.n, 3)
    schedule = equal_share_schedule(1e6, 128, (16, 64))
    spent = [cost.symmetric_queries(N, 128, r) for N, r in zip(*schedule)]
    assert max(spent) <= 0.5e6 and min(spent) > 0.49e6


def run_app(args, cwd):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "estimate.py"), *args], cwd=cwd, env=FAST_ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


TINY = ["instance=random_tabular", "estimator=plugin", "estimator.sizes.repeats=1"]


@pytest.mark.slow
def test_joblib_multirun_completes_and_rerun_skips_finished_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}", *TINY,
            "estimator.sizes.num_per_side=32,64"]
    run_app(args, tmp_path)
    results = sorted(sweep.glob("*/results.json"))
    assert len(results) == 2 and (sweep / "sweep_summary.csv").exists() and (sweep / "sweep_summary.png").exists()
    before = {path: path.stat().st_mtime_ns for path in results}
    run_app(args, tmp_path)
    assert {path: path.stat().st_mtime_ns for path in results} == before


def test_submitit_local_multirun_completes(tmp_path):
    sweep = tmp_path / "sweep"
    run_app(["-m", "hydra/launcher=local_cluster", "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}", *TINY,
             "estimator.sizes.num_per_side=32"], tmp_path)
    (result,) = sweep.glob("*/results.json")
    assert json.loads(result.read_text())["results"]["estimator"] == "plugin"


def test_done_marker_is_keyed_by_the_config_the_study_reads(tmp_path):
    reads = load_app("estimate").READS
    digest = lambda overrides, reads=reads: config_digest(study_view(composed("config", [*TINY, *overrides]), reads))
    assert digest([]) != digest(["seed=1"])
    assert digest([]) != digest(["estimator.sizes.num_per_side=7"])
    assert digest([]) == digest(["sweep_id=elsewhere"])
    # A group the study does not read changes nothing: a finished job is not re-run for it.
    convergence = composed("convergence", ["smoke=true"])
    unused = composed("convergence", ["smoke=true", "estimator=multilevel", "delta=0.2"])
    assert config_digest(study_view(convergence, load_app("convergence").READS)) == \
        config_digest(study_view(unused, load_app("convergence").READS))


@pytest.mark.slow
def test_blackbox_language_model_rows_resume_from_their_store(tmp_path, monkeypatch):
    """The LM rows' continuations live in a resumable pool per pair: a run interrupted after one
    shard resumes and stores exactly what an uninterrupted run stores; seeds read disjoint blocks;
    a rerun draws nothing. A tiny random Llama stands in for SmolLM2."""
    module = load_app("blackbox")
    lm = {"enabled": True, "only": True, "model": "random:llama", "prompt": [1, 2, 3], "n": 4, "sizes": [4, 8],
          "seeds": 3, "shard": 8, "transformer_seeds": 1, "store": str(tmp_path / "store"),
          "pairs": [{"label": "tiny t1 vs t1.5", "pi": {}, "mu": {"temperature": 1.5}, "tv": 0.325, "tv_interval": [0.3, 0.35]}]}
    cfg = composed("blackbox", ["experiment=blackbox", "smoke=true", "study.met.python=missing"])
    cfg.study.lm = lm
    cfg.study_smoke.lm = lm  # smoke=true merges study_smoke over study
    view = study_view(cfg, module.READS)
    pair = view.study.lm.pairs[0]
    from tvjax.models.pairs import lm_pair

    pi, mu = lm_pair("random:llama", [1, 2, 3], 4, pi={}, mu={"temperature": 1.5})
    whole, _, drawn = module.lm_store(view, 0, pair, pi, mu)
    assert drawn == 2 * 24 and whole[0].tokens.shape == (24, 4)

    view.study.lm.store = str(tmp_path / "interrupted")
    real, calls = module.sample_process, []

    def fail_after_one_shard(*args):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(module, "sample_process", fail_after_one_shard)
    with pytest.raises(KeyboardInterrupt):
        module.lm_store(view, 0, pair, pi, mu)
    monkeypatch.setattr(module, "sample_process", real)
    resumed, _, drawn = module.lm_store(view, 0, pair, pi, mu)
    assert drawn == 2 * 24 - 8  # the committed shard is not drawn again
    for a, b in zip(whole, resumed):
        np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    _, _, drawn = module.lm_store(view, 0, pair, pi, mu)
    assert drawn == 0
    # Shards have their own keys: the seed blocks are not copies of one another.
    tokens = np.asarray(whole[0].tokens)
    assert not np.array_equal(tokens[:8], tokens[8:16]) and not np.array_equal(tokens[8:16], tokens[16:24])

    record = run_study(cfg, module.study, module.READS, out_dir=tmp_path / "run")
    rows = list(csv.DictReader((tmp_path / "run" / "lm.csv").open()))
    expected = {("ngram", 4, 3), ("ngram", 8, 3), ("transformer", 8, 1)}
    assert {(r["classifier"], int(r["size"]), int(r["seeds"])) for r in rows} == expected
    assert record["results"]["lm"]["seconds"]["tiny t1 vs t1.5"]["continuations_drawn"] == 0  # the store was full
