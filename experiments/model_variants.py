"""Hydra app: TV between serving variants of a real language model (SmolLM2-135M-Instruct by
default) against the continuation length n: the paper's estimators on real conditionals.

    .venv/bin/python experiments/model_variants.py [smoke=true] [instance.model=/path/to/Qwen3-0.6B]

For each variant of `study.variants` (a label and `LanguageModel.variant` keywords for mu; pi is
`study.reference`, float32, unless the entry says `pi:`) and each n of `study.sizes`: Algorithm 1
(`likelihood_ratio` from the registry, exact logits, `num` trajectories from pi) with the normal
interval of `tvjax.core.api.confidence_interval`. At the n of `study.access_sizes` the same pair is
also measured through a Noisy(sigma) oracle and through a prefix sampler (sample-only), both with
Algorithm 3 on the fixed schedule `study.schedule`; their intervals are widened by the estimated
bias left at the top level. A variant that `variant()` refuses (a dtype or keyword it does not
support yet) is reported as skipped. On tiny models (V**n <= enumerate_max) each row also has
the exact TV by enumeration.
"""

import time
from functools import partial

import hydra
import jax
import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from tvjax.core.api import confidence_interval
from tvjax.core.estimators import lookup
from tvjax.core.instances import enumerate_tv
from tvjax.core.oracles import Exact, Noisy, Sampler
from tvjax.core.schedules import Samples, Schedule, as_runtime
from tvjax.studykit import ConfigError, StudyResult, build_pair, finish, run_study, subplots

READS = ("seed", "fast_compile", "delta", "instance", "study")
ARMS = ("exact", "noisy", "sample-only")
ESTIMATOR_NAMES = {"exact": "likelihood_ratio", "noisy": "multilevel", "sample-only": "multilevel"}


def variant_sides(entry, reference):
    """(label, pi keywords, mu keywords) of one `study.variants` entry."""
    entry = dict(entry)
    if "label" not in entry:
        raise ConfigError(f"every study.variants entry needs a label, got {entry}")
    label = str(entry.pop("label"))
    pi = dict(entry.pop("pi", None) or reference)
    return label, pi, {**reference, **entry}


def pair_at(instance_cfg, **replace):
    """(pi, mu) of the instance with keywords replaced (not merged: a variant dict replaces the
    instance's whole pi / mu dict)."""
    plain = OmegaConf.to_container(instance_cfg, resolve=True)
    unknown = [key for key in replace if key not in plain]
    if unknown:
        raise ConfigError(f"instance {plain.get('_target_')} has no parameter(s) {unknown}")
    return build_pair(OmegaConf.create({**plain, **replace}))


def measure(arm, key, pi, mu, s, delta):
    """One estimate of an arm with its interval, as a row (wall seconds include compilation)."""
    spec = lookup(ESTIMATOR_NAMES[arm])
    if arm == "exact":
        oracle, sizes = Exact(), Samples(np.int32(s.num))
    else:
        oracle = Noisy(float(s.noisy_sigma)) if arm == "noisy" else Sampler()
        sizes = as_runtime(Schedule(tuple(s.schedule.num_samples), tuple(s.schedule.repeats)))
    start = time.perf_counter()
    ci = confidence_interval(spec.fn(key, pi, mu, oracle, sizes), delta)
    ci = jax.tree.map(lambda a: float(np.asarray(a)) if np.ndim(a) == 0 else a, ci._replace(estimate=None))
    wall = time.perf_counter() - start
    return {"estimator": arm, "registry": ESTIMATOR_NAMES[arm], "value": ci.value, "stderr": ci.stderr,
            "ci_low": ci.ci_low, "ci_high": ci.ci_high, "bias": ci.bias, "queries": ci.queries,
            "wall_seconds": wall, "noise_level": oracle.noise_level(pi, mu)}


def truth_of(pi, mu, limit):
    return enumerate_tv(pi, mu) if pi.vocab_size**pi.n <= limit else None


def study(cfg):
    s = cfg.study
    reference = OmegaConf.to_container(s.reference)
    entries = [variant_sides(e, reference) for e in OmegaConf.to_container(s.variants)]
    shared = OmegaConf.to_container(s.instance) if s.instance is not None else {}
    root = jax.random.key(cfg.seed)
    rows, skipped = [], {}
    jobs = [(label, pi_kw, mu_kw, n) for label, pi_kw, mu_kw in entries for n in s.sizes]
    for label, pi_kw, mu_kw, n in tqdm(jobs, desc="model variants"):
        if label in skipped:
            continue
        try:
            pi, mu = pair_at(cfg.instance, **shared, n=int(n), pi=pi_kw, mu=mu_kw)
        except ConfigError as e:
            if not s.skip_unsupported:
                raise
            skipped[label] = str(e).splitlines()[-1]
            print(f"[skip] {label}: {skipped[label]}")
            continue
        truth = truth_of(pi, mu, s.enumerate_max)
        arms = ARMS if n in s.access_sizes else ARMS[:1]
        key_n = jax.random.fold_in(root, int(n))  # the same streams for every variant at one n
        for index, arm in enumerate(arms):
            row = measure(arm, jax.random.fold_in(key_n, index), pi, mu, s, cfg.delta)
            rows.append({"variant": label, "n": int(n), **row, "truth": truth,
                         "pi": str(pi_kw), "mu": str(mu_kw), "K": max(pi.max_support, mu.max_support)})
            print(f"{label:16s} n={n:4d} {arm:12s} TV {row['value']:.4f} [{row['ci_low']:.4f}, {row['ci_high']:.4f}]"
                  f"  {row['queries']:.3g} queries  {row['wall_seconds']:.1f} s"
                  + ("" if truth is None else f"  (exact {truth:.4f})"))
    if not rows:
        raise ConfigError(f"no variant could be built: {skipped}")
    summary = {"variants": list(dict.fromkeys(r["variant"] for r in rows)), "skipped": skipped,
               "sizes": list(s.sizes), "num": s.num, "access_sizes": list(s.access_sizes),
               "noisy_sigma": s.noisy_sigma, "schedule": OmegaConf.to_container(s.schedule), "delta": cfg.delta,
               "tv_at_largest_n": {r["variant"]: r["value"] for r in rows
                                   if r["estimator"] == "exact" and r["n"] == max(s.sizes)}}
    return StudyResult(summary, rows, {"model_variants": partial(plot, rows, cfg.delta)})


def plot(rows, delta):
    """Left: Algorithm 1's TV against n per variant (log x), with intervals (and the exact TV as x
    where it is known). Right: the three access models on the same pairs at the smallest n."""
    fig, (left, right) = subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1.2, 1]})
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    # error bars of the interval; a multilevel value may lie outside its (clipped) interval
    interval = lambda mine: np.maximum(0.0, [[r["value"] - r["ci_low"] for r in mine],
                                             [r["ci_high"] - r["value"] for r in mine]])
    for label in labels:
        mine = sorted((r for r in rows if r["variant"] == label and r["estimator"] == "exact"), key=lambda r: r["n"])
        n = [r["n"] for r in mine]
        left.errorbar(n, [r["value"] for r in mine], yerr=interval(mine), fmt="o-", capsize=3, ms=4,
                      color=colors[label], label=label)
        if mine and all(r["truth"] is not None for r in mine):
            left.plot(n, [r["truth"] for r in mine], "x", color=colors[label], ms=9)
    left.set_xscale("log", base=2)
    left.set_xlabel("n (continuation tokens)")
    left.set_ylabel("TV(pi, mu)")
    left.set_ylim(0, 1.02)
    left.set_title(f"exact logits (Algorithm 1), {100 * (1 - delta):.0f}% intervals")
    left.legend(fontsize=7)
    access = [r for r in rows if r["estimator"] != "exact"]
    if access:
        n0 = min(r["n"] for r in access)
        for offset, (arm, marker) in zip((-0.25, 0.0, 0.25), zip(ARMS, "os^")):
            mine = [r for r in rows if r["n"] == n0 and r["estimator"] == arm]
            x = [labels.index(r["variant"]) + offset for r in mine]
            right.errorbar(x, [r["value"] for r in mine], yerr=interval(mine), fmt=marker, capsize=3, ms=5,
                           color=f"C{ARMS.index(arm)}", label=arm)
        right.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        right.set_ylabel("TV(pi, mu)")
        right.set_ylim(-0.05, 1.25)
        right.axhline(1.0, color="k", lw=0.5, ls=":")
        right.set_title(f"n = {n0}: exact, noisy and sample-only access")
        right.legend(fontsize=7)
    else:
        right.set_axis_off()
    fig.tight_layout()
    return fig


@hydra.main(config_path="../configs", config_name="model_variants", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
