"""Shared plumbing of the Hydra experiment apps (experiments/*.py): config -> objects, repeated
runs over PRNG keys, log-log fits, result writing and skip-if-complete.

Each study is a pure function `study(cfg) -> StudyResult`; `run_study` wraps it with timing,
seed/version records, the done-marker that lets a re-run multirun skip finished jobs, and the
writing of results.json, results.csv and the PNG figures into the job's output folder.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.metadata
import json
import math
import platform
import time
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import matplotlib.pyplot as plt
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tvjax import estimators
from tvjax.estimators import Schedule
from tvjax.instances import rare_escape_pair

DONE_MARKER = "done.json"
# Config keys that name where a run goes, not what it computes: excluded from the done-marker hash.
LOCATION_KEYS = ("sweep_id",)
VERSIONED_PACKAGES = ("tvjax", "jax", "jaxlib", "numpy", "hydra-core", "omegaconf", "matplotlib")


class StudyResult(NamedTuple):
    """What a study returns: a JSON summary, CSV rows (one dict per row) and named figures."""

    summary: dict
    rows: list
    figures: dict


class Fit(NamedTuple):
    """Least-squares line log(y) = intercept + slope * log(x)."""

    slope: float
    intercept: float
    points: int


class ConfigError(ValueError):
    """A configuration that cannot be run, with the reason."""


# --------------------------------------------------------------------------- configs -> objects


def build_pair(instance_cfg, **overrides):
    """(pi, mu) from an instance config (`_target_` plus keyword arguments); overrides replace
    keywords, e.g. build_pair(cfg.instance, n=64) for a grid over n."""
    if "_target_" not in instance_cfg:
        raise ConfigError(f"instance config needs a _target_, got keys {sorted(instance_cfg)}")
    unknown = [key for key in overrides if key not in instance_cfg]
    if unknown:
        raise ConfigError(f"instance {instance_cfg._target_} has no parameter(s) {unknown} to sweep")
    return tuple(instantiate(instance_cfg, _convert_="all", **overrides))


def build_oracle(oracle_cfg):
    return instantiate(oracle_cfg)


def rare_escape_instance(K=8, n=64, tv_outcomes=0.5, escape_scale=1.0):
    """The rare-escape pair (paper 4.4) over K outcomes: P uniform, Q moves tv_outcomes of mass
    from the second half of the outcomes to the first, so TV(P, Q) = tv_outcomes."""
    if K < 2 or K % 2:
        raise ConfigError(f"rare_escape_instance needs an even K >= 2, got K={K}")
    if not 0.0 <= tv_outcomes <= 0.5:
        raise ConfigError(f"tv_outcomes must be in [0, 0.5], got {tv_outcomes}")
    P = np.full(K, 1.0 / K)
    shift = np.where(np.arange(K) < K // 2, 1.0, -1.0) * 2.0 * tv_outcomes / K
    return rare_escape_pair(P, P + shift, n, escape_scale=escape_scale)


def _estimator_call(name, kwargs):
    """fn(key, pi, mu, oracle) -> Estimate for a named estimator with static sizes."""
    if name == "multilevel":
        schedule = Schedule(tuple(kwargs["num_samples"]), tuple(kwargs["repeats"]))
        groups = kwargs.get("num_groups", 1)
        return lambda key, pi, mu, oracle: estimators.multilevel(key, pi, mu, oracle, schedule, num_groups=groups)
    if name == "sample_only":
        schedule = Schedule(tuple(kwargs["num_samples"]), tuple(kwargs["repeats"]))
        groups = kwargs.get("num_groups", 1)
        return lambda key, pi, mu, oracle: estimators.sample_only(key, pi, mu, schedule, num_groups=groups)
    fn = getattr(estimators, name)
    return lambda key, pi, mu, oracle: fn(key, pi, mu, oracle, **kwargs)


ESTIMATOR_PARAMETERS = {
    "likelihood_ratio": {"num_samples"},
    "mixture": {"num_per_side"},
    "plugin": {"num_per_side", "repeats"},
    "multilevel": {"num_samples", "repeats", "num_groups"},
    "sample_only": {"num_samples", "repeats", "num_groups"},
    "plugin_kl": {"num_samples", "repeats"},
    "k3_pinsker": {"num_samples", "repeats"},
    "naive_noisy_plugin": {"num_samples"},
}


def build_estimator(estimator_cfg):
    """fn(key, pi, mu, oracle) -> Estimate from an estimator config {name: ..., <sizes>}."""
    config = dict(estimator_cfg)
    name = config.pop("name", None)
    if name not in ESTIMATOR_PARAMETERS:
        raise ConfigError(f"unknown estimator {name!r}; choose one of {sorted(ESTIMATOR_PARAMETERS)}")
    unknown = set(config) - ESTIMATOR_PARAMETERS[name]
    if unknown:
        raise ConfigError(f"estimator {name} takes {sorted(ESTIMATOR_PARAMETERS[name])}, not {sorted(unknown)}")
    return _estimator_call(name, {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in config.items()})


# --------------------------------------------------------------------------- repetitions


@functools.lru_cache(maxsize=None)
def sized(name):
    """fn(key, pi, mu, oracle, *sizes, copies) for estimator `name`, its sizes as trailing
    arguments: `replicate` passes them as runtime values, so one compiled program serves every
    size of a study (and every schedule of one length; pad shorter ones with
    `estimators.pad_schedule`). Sizes: (num_samples,) for likelihood_ratio and the KL / naive
    baselines; (num_per_side, repeats) for plugin; (num_samples array, repeats array) for
    multilevel (sample-only access is multilevel with the Sampler oracle)."""
    fn = getattr(estimators, name)
    if name == "multilevel":
        return lambda key, pi, mu, oracle, counts, repeats, copies: fn(key, pi, mu, oracle, Schedule(counts, repeats), copies=copies)
    if name == "plugin":
        return lambda key, pi, mu, oracle, num, repeats, copies: fn(key, pi, mu, oracle, num, repeats, copies=copies)
    if name in ("likelihood_ratio", "plugin_kl", "k3_pinsker", "naive_noisy_plugin"):
        return lambda key, pi, mu, oracle, num, copies: fn(key, pi, mu, oracle, num_samples=num, copies=copies)
    raise ConfigError(f"no sized form for estimator {name!r}")


def schedule_sizes(schedule):
    """A schedule as the runtime size arguments of `sized("multilevel")`: (counts, repeats) int32
    arrays, so schedules of one length share one compiled program."""
    return tuple(np.asarray(part, np.int32) for part in schedule)


def replicate(fn, key, reps, *args, fast_compile=False):
    """fn(key, *args, copies=reps): `reps` independent estimates from one stream of rows, stacked
    along a leading axis (numpy). The compiled program is cached per (fn, reps) and the shapes of
    args, so keep fn the same object and pass sizes as args (see `sized`).
    fast_compile lowers XLA's backend optimization (about 2x faster compiles, slower runs)."""
    return jax.tree_util.tree_map(np.asarray, _replicated(fn, reps, fast_compile)(key, *args))


@functools.lru_cache(maxsize=None)
def _replicated(fn, copies, fast_compile):
    options = {**estimators.COMPILER_OPTIONS, **({"xla_backend_optimization_level": 0} if fast_compile else {})}
    return jax.jit(lambda key, *args: fn(key, *args, copies=copies), compiler_options=options)


def per_trajectory_queries(n, repeats):
    """Queries one symmetric-level trajectory pair costs (one from each side): sampling (n) plus
    scoring under both models at r repeats (2 n r), for each side: 2 n (1 + 2 r). This is the
    accounting of tvjax.estimators."""
    return 2 * n * (1 + 2 * repeats)


def equal_share_schedule(budget, n, repeats):
    """Level sizes giving each level an equal share of `budget` queries (per side counts)."""
    share = budget / len(repeats)
    return Schedule(tuple(int(share // per_trajectory_queries(n, r)) for r in repeats), tuple(repeats))


def errors(values, truth):
    """(mean absolute error, root mean squared error, bias) of repeated estimates."""
    deviation = np.asarray(values, np.float64) - truth
    return float(np.mean(np.abs(deviation))), float(np.sqrt(np.mean(deviation**2))), float(np.mean(deviation))


# --------------------------------------------------------------------------- fits


def loglog_fit(x, y):
    """Least-squares slope of log y against log x over the finite, positive points."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if keep.sum() < 2:
        return Fit(math.nan, math.nan, int(keep.sum()))
    slope, intercept = np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)
    return Fit(float(slope), float(intercept), int(keep.sum()))


# --------------------------------------------------------------------------- results on disk


def package_versions():
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["jax_backend"] = jax.default_backend()
    versions["jax_devices"] = [str(d) for d in jax.devices()]
    return versions


def config_digest(cfg):
    """Hash of the resolved config (less location-only keys): the identity of a job's work."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for key in LOCATION_KEYS:
        resolved.pop(key, None)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_complete(out_dir, digest):
    marker = Path(out_dir) / DONE_MARKER
    return marker.exists() and json.loads(marker.read_text()).get("config_digest") == digest


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.generic, np.ndarray, jax.Array)):
        return _json_safe(np.asarray(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_csv(path, rows):
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(_json_safe(rows))


def save_figures(out_dir, figures):
    paths = []
    for name, fig in figures.items():
        path = Path(out_dir) / f"{name}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path.name)
    return paths


def run_study(cfg, study: Callable, out_dir=None):
    """Run study(cfg) once into out_dir (the Hydra job folder by default); skip it when a
    done-marker with the same config digest is there. Returns the results.json content."""
    if out_dir is None:
        out_dir = HydraConfig.get().runtime.output_dir
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = config_digest(cfg)
    if is_complete(out_dir, digest):
        print(f"[skip] {out_dir} is complete for config {digest}")
        return json.loads((out_dir / "results.json").read_text())
    (out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    start = time.perf_counter()
    result = study(cfg)
    wall = time.perf_counter() - start
    record = {
        "study": cfg.get("study", {}).get("name", "estimate"),
        "seed": cfg.seed,
        "smoke": bool(cfg.get("smoke", False)),
        "wall_seconds": wall,
        "versions": package_versions(),
        "results": result.summary,
    }
    (out_dir / "results.json").write_text(json.dumps(_json_safe(record), indent=2))
    write_csv(out_dir / "results.csv", result.rows)
    record["figures"] = save_figures(out_dir, result.figures)
    (out_dir / DONE_MARKER).write_text(json.dumps({"config_digest": digest, "wall_seconds": wall}))
    print(f"[done] {record['study']} in {wall:.1f} s -> {out_dir}")
    return record


def study_config(cfg):
    """cfg.study with cfg.study_smoke merged over it when smoke=true."""
    if "study" not in cfg:
        raise ConfigError("this app needs a study config: pick one with experiment=<name>")
    if cfg.get("smoke", False):
        return OmegaConf.merge(cfg.study, cfg.get("study_smoke", {}))
    return cfg.study


# --------------------------------------------------------------------------- multirun summary


def collect_sweep(sweep_dir):
    """One row per finished job under sweep_dir: its overrides and its scalar results."""
    rows = []
    for path in sorted(Path(sweep_dir).glob("**/results.json")):
        record = json.loads(path.read_text())
        scalars = {k: v for k, v in record["results"].items() if isinstance(v, (int, float, str))}
        rows.append({"job": str(path.parent.relative_to(sweep_dir)) or ".", "wall_seconds": record["wall_seconds"], **scalars})
    return rows


def plot_sweep(rows):
    """Estimate with its interval per job, against the true TV (estimate-app sweeps)."""
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rows) + 2), 4))
    x = np.arange(len(rows))
    value = np.array([row["value"] for row in rows])
    low = np.array([row["ci_low"] for row in rows])
    high = np.array([row["ci_high"] for row in rows])
    ax.errorbar(x, value, yerr=[value - low, high - value], fmt="o", capsize=3, label="estimate (CI)")
    ax.scatter(x, [row["truth"] for row in rows], marker="_", s=400, color="k", label="true TV")
    ax.set_xticks(x, [row["job"] for row in rows], rotation=30, ha="right", fontsize=7)
    ax.set_xlabel("job (overrides)")
    ax.set_ylabel("TV")
    ax.legend()
    return fig


class SweepSummary(Callback):
    """Hydra callback: after a multirun, write sweep_summary.csv (and a plot for estimate sweeps)
    into the sweep folder, from the results.json of every finished job."""

    def on_multirun_end(self, config, **kwargs):
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = collect_sweep(sweep_dir)
        if not rows:
            return
        write_csv(sweep_dir / "sweep_summary.csv", rows)
        if all({"value", "ci_low", "ci_high", "truth"} <= set(row) for row in rows):
            save_figures(sweep_dir, {"sweep_summary": plot_sweep(rows)})
        print(f"[sweep] {len(rows)} jobs summarized in {sweep_dir / 'sweep_summary.csv'}")
