"""Hydra app: certified TV lower bounds from samples alone, against model equality testing.

    .venv/bin/python experiments/blackbox.py [smoke=true]

For pairs of known TV (`study.families`: tabular pairs, support mismatch by top-k included, coins,
the paper's block instance) and each sample size of `study.sizes`, `study.seeds` independent runs
of `tvjax.audit.distinguish.distinguish_copies` (the n-gram classifier): the certified lower bound at
1 - delta, the point estimate pi_hat(A) - mu_hat(A), their ratio to the true TV, and the share of
seeds that detect a difference (bound > 0 at delta = level). On the same samples (up to
`met_max_size` per side), model equality testing's MMD test (`model-equality-testing`, in its own
environment, through `benchmarks/met_anchor.py`): the share of seeds with p < level.

Then: validity rates over `validity.seeds` seeds (bound > true TV; on identical pairs pi vs pi,
bound > 0), the Flax transformer on a few configurations, and SmolLM2 serving variants (`lm.seeds`
independent seeds: disjoint blocks of a resumable store of continuations per side, `lm_store`;
the true TV the exact-logit estimate of docs/tutorials/real-model-variants.md).
"""

import json
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import hydra
import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from tvjax.audit.distinguish import TokenSamples, TrainSettings, copy_samples, distinguish, distinguish_copies, sample_process
from tvjax.core.instances import exact_tv
from tvjax.core.studies import job_key
from tvjax.studykit import ConfigError, StudyResult, build_pair, config_digest, csv_text, finish, run_study, subplots

READS = ("seed", "fast_compile", "study")
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- model equality testing


def met_rows(samples):
    """int [N, n] with the package's padding: -1 at positions at or after a row's length."""
    tokens, lengths = np.asarray(samples.tokens), np.asarray(samples.lengths)
    return np.where(np.arange(tokens.shape[1])[None] < lengths[:, None], tokens, -1)


def met_pvalues(met, jobs):
    """MET p-values of jobs [(pi samples, mu samples)], one subprocess for all of them; None when
    the environment is missing. Returns (pvalues, record)."""
    python = ROOT / met.python
    if not jobs:
        return [], None
    if not python.exists():
        print(f"[met] {python} missing (bash .ci/engines_setup.sh met): MET columns left empty")
        return [None] * len(jobs), None
    with tempfile.TemporaryDirectory() as folder:
        arrays = {"jobs": len(jobs)}
        for j, (a, b) in enumerate(jobs):
            arrays[f"pi_{j}"], arrays[f"mu_{j}"] = met_rows(a), met_rows(b)
        np.savez(Path(folder) / "samples.npz", **arrays)
        out = Path(folder) / "pvalues.json"
        subprocess.run([str(python), str(ROOT / met.script), str(Path(folder) / "samples.npz"), str(out),
                        "--permutations", str(met.permutations), "--mode", met.mode], check=True)
        record = json.loads(out.read_text())
    return record["pvalues"], {k: v for k, v in record.items() if k not in ("pvalues", "statistics")}


def attach_met(s, rows, met_jobs):
    """Run MET on every seed's samples of met_jobs [(row index, [(pi, mu) per seed])] in one
    subprocess and write each row's detection rate (p < level) and median p-value; the run's record."""
    pvalues, record = met_pvalues(s.met, [tuple(pair) for _, samples in met_jobs for pair in samples])
    for index, samples in met_jobs:
        mine, pvalues = pvalues[: len(samples)], pvalues[len(samples):]
        if mine and mine[0] is not None:
            rows[index]["met_detect_rate"] = float(np.mean(np.array(mine) < s.level))
            rows[index]["met_pvalue_median"] = float(np.median(mine))
    return record


def seed_slices(samples, seeds):
    """Per seed, the (pi, mu) TokenSamples of copy `seed` of stacked copy samples."""
    a, b = samples
    take = lambda s, i: TokenSamples(s.tokens[i], s.lengths[i], s.vocab_size)
    return [(take(a, i), take(b, i)) for i in range(seeds)]


# --------------------------------------------------------------------------- the synthetic families


def summarize(result, truth, level):
    bound, estimate = np.asarray(result.lower_bound), np.asarray(result.estimate)
    return {"truth": truth, "seeds": len(bound), "lower_bound_mean": float(np.mean(bound)),
            "lower_bound_p10": float(np.quantile(bound, 0.1)), "estimate_mean": float(np.mean(estimate)),
            "estimate_stderr": float(np.std(estimate) / np.sqrt(len(estimate))),
            "estimate_over_tv": float(np.mean(estimate) / truth) if truth > 0 else None,
            "bound_over_tv": float(np.mean(bound) / truth) if truth > 0 else None,
            "detect_rate": float(np.mean(bound > 0)), "bound_above_tv_rate": float(np.mean(bound > truth)),
            "epochs_mean": float(np.mean(result.epochs)), "validation_accuracy": float(np.mean(result.best_validation_accuracy))}


def power_rows(cfg, pairs):
    s = cfg.study
    rows, met_jobs = [], []
    jobs = [(i, family, size) for i, family in enumerate(s.families) for size in s.sizes]
    for i, family, size in tqdm(jobs, desc="families x sizes"):
        pi, mu, truth = pairs[family.label]
        key = job_key(cfg.seed, i, size)
        start = time.perf_counter()
        result = distinguish_copies(key, pi, mu, size, s.seeds, classifier=s.classifier, delta=s.level,
                                    fast_compile=cfg.fast_compile)
        wall = time.perf_counter() - start
        row = {"family": family.label, "classifier": s.classifier, "size": size, "delta": s.level,
               **summarize(result, truth, s.level), "wall_seconds": wall, "met_detect_rate": None, "met_pvalue_median": None}
        if size <= s.met_max_size:
            samples = seed_slices(copy_samples(key, pi, mu, size, s.seeds), s.seeds)
            met_jobs.append((len(rows), samples))
        rows.append(row)
        print(f"{family.label:42s} N={size:6d} TV {truth:.3f} bound {row['lower_bound_mean']:.3f} estimate "
              f"{row['estimate_mean']:.3f} detect {row['detect_rate']:.2f} ({wall:.1f} s)")
    start = time.perf_counter()
    record = attach_met(s, rows, met_jobs)
    return rows, {"met_seconds": time.perf_counter() - start, "met": record}


def validity_rows(cfg, pairs):
    s, v = cfg.study, cfg.study.validity
    rows = []
    for i, label in enumerate(tqdm(v.families, desc="validity")):
        if label not in pairs:
            raise ConfigError(f"validity family {label!r} is not in study.families")
        pi, mu, truth = pairs[label]
        for kind, (a, b, target) in {"pair": (pi, mu, truth), "identical (pi vs pi)": (pi, pi, 0.0)}.items():
            start = time.perf_counter()
            result = distinguish_copies(job_key(cfg.seed, 1000 + i, kind == "pair"), a, b, v.size, v.seeds,
                                        classifier=s.classifier, delta=s.delta, fast_compile=cfg.fast_compile)
            bound = np.asarray(result.lower_bound)
            rate = float(np.mean(bound > target))
            rows.append({"family": label, "kind": kind, "classifier": s.classifier, "size": v.size, "seeds": v.seeds,
                         "delta": s.delta, "truth": target, "bound_above_truth_rate": rate,
                         "rate_stderr": float(np.sqrt(max(rate * (1 - rate), 1e-12) / v.seeds)),
                         "lower_bound_mean": float(np.mean(bound)), "estimate_mean": float(np.mean(result.estimate)),
                         "wall_seconds": time.perf_counter() - start})
            print(f"validity {label:40s} {kind:22s} bound > {target:.3f} in {rate:.4f} of {v.seeds} seeds (delta {s.delta})")
    return rows


def transformer_rows(cfg, pairs):
    s, t = cfg.study, cfg.study.transformer
    settings = TrainSettings(**OmegaConf.to_container(t.settings))
    rows = []
    for i, run in enumerate(tqdm(t.runs, desc="transformer")):
        pi, mu, truth = pairs[run.family]
        for classifier in ("transformer", "ngram"):
            start = time.perf_counter()
            result = distinguish_copies(job_key(cfg.seed, 2000 + i), pi, mu, run.size, t.seeds, classifier=classifier,
                                        delta=s.level, settings=settings if classifier == "transformer" else None,
                                        fast_compile=cfg.fast_compile)
            rows.append({"family": run.family, "classifier": classifier, "size": run.size,
                         **summarize(result, truth, s.level), "wall_seconds": time.perf_counter() - start})
            print(f"{classifier:12s} {run.family:40s} N={run.size} bound {rows[-1]['lower_bound_mean']:.3f} "
                  f"estimate {rows[-1]['estimate_mean']:.3f} (TV {truth:.3f}, {rows[-1]['wall_seconds']:.1f} s)")
    return rows


# --------------------------------------------------------------------------- language models


def lm_store(cfg, p_index, pair, pi, mu):
    """The (pi, mu) TokenSamples of a language-model pair: seeds x max(sizes) continuations per
    side, kept in a pool under `lm.store` and drawn in shards of `lm.shard` rows, each shard with
    its own key, so that an interrupted run (or one spread over sessions) resumes where it
    stopped and draws exactly what one uninterrupted run draws. Returns (samples, seconds spent
    sampling in this run, continuations drawn in this run)."""
    from tvjax.core.currency import stopping_ids
    from tvjax.pools.store import create_pool, read_lengths, read_tokens, tokens_key

    lm = cfg.study.lm
    total = lm.seeds * max(lm.sizes)
    spec = OmegaConf.create({"model": lm.model, "prompt": lm.prompt, "n": lm.n, "pi": pair.pi, "mu": pair.mu,
                             "seed": cfg.seed, "pair": p_index, "rows": total, "shard": lm.shard})
    identity, digest = OmegaConf.to_container(spec, resolve=True), config_digest(spec)
    store = Path(lm.store) if Path(lm.store).is_absolute() else ROOT / lm.store
    path = store / f"pair{p_index}-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    eos_ids = stopping_ids(pi)
    writer = create_pool(path, n=lm.n, num_per_side=total, repeats=1, row_chunk=lm.shard, exist_ok=True,
                         eos_ids=eos_ids, metadata={"study": "blackbox", **identity})
    shards = [(side_index, side, start) for side_index, side in enumerate(("pi", "mu"))
              for start in range(0, total, lm.shard)]
    todo = [job for job in shards if not writer.is_done(tokens_key(job[1], job[2], min(job[2] + lm.shard, total)))]
    started, drawn = time.perf_counter(), 0
    for side_index, side, start in tqdm(todo, desc=f"{pair.label}: shards of {lm.shard}", disable=not todo):
        rows = min(lm.shard, total - start)
        samples = sample_process(job_key(cfg.seed, 3000 + p_index, side_index, start // lm.shard), (pi, mu)[side_index], rows)
        writer.write_tokens(side, start, np.asarray(samples.tokens), lengths=np.asarray(samples.lengths) if eos_ids else None)
        drawn += rows
    samples = tuple(TokenSamples(read_tokens(path, side), read_lengths(path, side), int(pi.vocab_size)) for side in ("pi", "mu"))
    return samples, time.perf_counter() - started, drawn


def lm_rows(cfg):
    """SmolLM2 serving variants: seed j of size N reads rows [j M, j M + N) of each side's store
    (M = max(sizes)): disjoint, so the seeds are independent, and nested across sizes."""
    from tvjax.models.pairs import lm_pair  # the models extra: only when the LM part runs

    s, lm = cfg.study, cfg.study.lm
    rows, met_jobs, seconds = [], [], {}
    block = max(lm.sizes)
    for p_index, pair in enumerate(lm.pairs):
        pi, mu = lm_pair(lm.model, lm.prompt, lm.n, pi=dict(pair.pi), mu=dict(pair.mu))
        pools, sampling, drawn = lm_store(cfg, p_index, pair, pi, mu)
        seconds[pair.label] = {"sampling": sampling, "continuations_drawn": drawn}
        for size in lm.sizes:
            subsets = [[TokenSamples(side.tokens[j * block:j * block + size], side.lengths[j * block:j * block + size],
                                     side.vocab_size) for side in pools] for j in range(lm.seeds)]
            for classifier, seeds in (("ngram", lm.seeds), ("transformer", lm.transformer_seeds)):
                if classifier == "transformer" and size != block:
                    continue
                start = time.perf_counter()
                results = [distinguish(job_key(cfg.seed, 3000 + p_index, size, j), *subsets[j], classifier=classifier,
                                       delta=s.level) for j in range(seeds)]
                bound = np.array([r.lower_bound for r in results])
                estimate = np.array([r.estimate for r in results])
                rows.append({"family": pair.label, "classifier": classifier, "size": size, "seeds": seeds,
                             "truth": pair.tv, "truth_interval": list(pair.tv_interval),
                             "lower_bound_mean": float(np.mean(bound)), "estimate_mean": float(np.mean(estimate)),
                             "estimate_over_tv": float(np.mean(estimate) / pair.tv), "detect_rate": float(np.mean(bound > 0)),
                             "bound_above_tv_interval_rate": float(np.mean(bound > pair.tv_interval[1])),
                             "met_detect_rate": None, "met_pvalue_median": None,
                             "wall_seconds": time.perf_counter() - start})
                if classifier == "ngram":
                    met_jobs.append((len(rows) - 1, subsets))
                print(f"{pair.label:26s} {classifier:11s} N={size:4d} bound {rows[-1]['lower_bound_mean']:.3f} estimate "
                      f"{rows[-1]['estimate_mean']:.3f} detect {rows[-1]['detect_rate']:.2f} (TV ~{pair.tv})")
    start = time.perf_counter()
    record = attach_met(s, rows, met_jobs)
    seconds["met"] = time.perf_counter() - start
    return rows, {"seconds": seconds, "met": record}


# --------------------------------------------------------------------------- the study


def study(cfg):
    s = cfg.study
    if s.lm.get("only", False) and not s.lm.enabled:
        raise ConfigError("study.lm.only=true runs the language-model rows alone: set study.lm.enabled=true too")
    pairs = {}
    for family in s.families:
        pi, mu = build_pair(family.instance)
        pairs[family.label] = (pi, mu, float(exact_tv(pi, mu)))
    timing = {}
    power, met_info, validity, transformer = [], None, [], []
    if not s.lm.get("only", False):
        start = time.perf_counter()
        power, met_info = power_rows(cfg, pairs)
        timing["power"] = time.perf_counter() - start
        start = time.perf_counter()
        validity = validity_rows(cfg, pairs)
        timing["validity"] = time.perf_counter() - start
        start = time.perf_counter()
        transformer = transformer_rows(cfg, pairs)
        timing["transformer"] = time.perf_counter() - start
    lm, lm_info = [], None
    if s.lm.enabled:
        start = time.perf_counter()
        lm, lm_info = lm_rows(cfg)
        timing["lm"] = time.perf_counter() - start
    summary = {"delta": s.delta, "level": s.level, "classifier": s.classifier, "seeds": s.seeds, "sizes": list(s.sizes),
               "true_tv": {label: truth for label, (_, _, truth) in pairs.items()}, "seconds": timing,
               "met": met_info, "lm": lm_info,
               "validity": [{k: r[k] for k in ("family", "kind", "bound_above_truth_rate", "seeds")} for r in validity],
               "power": [{k: r[k] for k in ("family", "size", "detect_rate", "met_detect_rate", "estimate_over_tv")}
                         for r in power + lm if r["classifier"] == s.classifier]}
    files = {"validity.csv": csv_text(validity), "transformer.csv": csv_text(transformer)}
    if lm:
        files["lm.csv"] = csv_text(lm)
    return StudyResult(summary, power, {"blackbox": partial(plot, power, lm, s.level)}, files=files)


def plot(power, lm, level):
    """Left: the share of seeds detecting a difference against N, tvjax (solid) and MET (dashed).
    Right: the mean certified bound and the point estimate over the true TV against N."""
    fig, (left, right) = subplots(1, 2, figsize=(12, 4.6))
    families = list(dict.fromkeys(r["family"] for r in power + lm))
    for i, family in enumerate(families):
        mine = sorted((r for r in power + lm if r["family"] == family and r["classifier"] == "ngram"), key=lambda r: r["size"])
        x = [r["size"] for r in mine]
        color = f"C{i % 10}"
        left.plot(x, [r["detect_rate"] for r in mine], "o-", color=color, label=family)
        met = [(r["size"], r["met_detect_rate"]) for r in mine if r["met_detect_rate"] is not None]
        if met:
            left.plot(*zip(*met), "s--", color=color, alpha=0.7)
        right.plot(x, [r["estimate_mean"] / r["truth"] for r in mine], "o-", color=color, label=family)
        right.plot(x, [r["lower_bound_mean"] / r["truth"] for r in mine], "v:", color=color)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("samples per side (half held out)")
    left.set_ylabel(f"share of seeds detecting (level {level})")
    left.set_title("power: tvjax bound > 0 (solid) vs MET p < level (dashed)")
    left.set_ylim(-0.02, 1.02)
    left.legend(fontsize=7)
    right.axhline(1.0, color="k", lw=0.5)
    right.set_ylabel("mean over seeds / true TV")
    right.set_title("point estimate (solid) and certified bound (dotted) over the true TV")
    right.set_ylim(-0.1, 1.1)
    fig.tight_layout()
    return fig


@hydra.main(config_path="../configs", config_name="blackbox", version_base="1.3")
def main(cfg):
    run_study(cfg, study, READS)


if __name__ == "__main__":
    main()
    finish()  # results written: skip Python's teardown
