"""What only the Hydra apps need: config -> objects, run folders with done-markers over the config
a study reads, result files and figures, and the multirun summary callback.

Each study is a pure function `study(cfg) -> StudyResult`; `run_study(cfg, study, reads)` hands
it a view of the config holding only the top-level keys in `reads` (reading any other key is an
error, so the declaration stays true), hashes that view for the done-marker that lets a re-run
multirun skip finished jobs, and writes results.json, results.csv and the PNG figures into the
job's output folder. The numerical helpers (repetitions, errors, fits) are `tvjax.core.studies`.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import ctypes
import functools
import hashlib
import importlib
import importlib.metadata
import io
import json
import logging
import math
import os
import platform
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import numpy as np

from tvjax._extras import require

require("hydra", "experiments", "tvjax's Hydra studies")
require("matplotlib", "experiments", "tvjax's Hydra studies")

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tvjax.core.jsonable import to_jsonable
from tvjax.core.programs import LOAD_EVENT, compiler_options, enable_compilation_cache, release_programs
from tvjax.core.studies import runs_over_floor

# Launchers that start fresh processes (submitit's local and Slurm executors) unpickle the app's
# task there, which imports this module by name: export this folder to them.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, os.environ.get("PYTHONPATH")) if p)

def process_age():
    """Seconds since this process started (Linux /proc; time.process_time's clock is CPU time)."""
    with open("/proc/self/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as uptime:
        return float(uptime.read().split()[0]) - started / os.sysconf("SC_CLK_TCK")


# JAX reports how long it traces, lowers and compiles each program, and tvjax how long it loads
# a saved one (which is neither traced nor lowered); the studies' seconds are broken down with
# these running totals.
COMPILE_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "tracing",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "compiling",
    LOAD_EVENT: "compiling",
}
_compile_seconds = collections.Counter()


# matplotlib's import waits for the first of these: a program lowered (its compile, which
# releases the GIL, follows) or a saved one loaded (its runs follow).
_PRELOAD_AFTER = ("/jax/core/compile/jaxpr_to_mlir_module_duration", LOAD_EVENT)
_preload_armed = [False]


def _on_duration(event, duration, **_):
    if event in COMPILE_EVENTS:
        _compile_seconds[COMPILE_EVENTS[event]] += duration
    if _preload_armed[0] and event in _PRELOAD_AFTER:
        _preload_armed[0] = False
        preload_matplotlib()


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def limit_malloc_arenas(arenas=2):
    """Cap glibc's malloc arenas (as MALLOC_ARENA_MAX would): XLA's compiler threads each take an
    arena of their own by default, and what one thread frees the next compile's threads cannot
    reuse, so a study that compiles several programs holds tens of MB more at its peak. Where
    libc has no mallopt (not glibc), nothing changes."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


_M_ARENA_MAX = -8  # glibc's malloc.h
limit_malloc_arenas()
_IMPORTED_AT = process_age()  # the apps import studykit last: about the end of their imports

DONE_MARKER = "done.json"
VERSIONED_PACKAGES = ("tvjax", "jax", "jaxlib", "numpy", "hydra-core", "omegaconf", "matplotlib")


class StudyResult(NamedTuple):
    """What a study returns: a JSON summary, CSV rows (one dict per row), named figures as
    functions that draw them (called after the study, so their time is counted apart and
    matplotlib loads only when a figure is drawn), and the random 32-bit words the study's
    estimates need at the least (`tvjax.core.studies.random_words`), for its floor; `files` maps
    further file names to their text (e.g. a second table)."""

    summary: dict
    rows: list
    figures: dict
    random_words: int = 0
    files: dict | None = None


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
    return tuple(build(instance_cfg, **overrides))


def build(cfg, **overrides):
    """The object a `_target_` config describes (a pair, an oracle, an estimator from the
    registry); a target that refuses its arguments is a ConfigError with the target's reason."""
    try:
        return instantiate(cfg, _convert_="all", **overrides)
    except InstantiationException as e:
        raise ConfigError(str(e)) from e


# --------------------------------------------------------------------------- the config a study reads


# Integers under `study` are counts (seeds, rounds, sizes, repeats, epochs) and must be >= 1,
# except these keys; sub-configs with a _target_ (instances) are checked by their constructors.
NON_COUNT_KEYS = frozenset({"seed", "point"})


def check_study_values(study, where="study"):
    """Refuse a count < 1 or a negative or non-finite number anywhere in a study config, naming its
    key: a study run with study.rounds=-1 would otherwise report on nothing."""
    if isinstance(study, dict):
        if "_target_" in study:
            return
        items = study.items()
    elif isinstance(study, list):
        items = ((f"[{i}]", v) for i, v in enumerate(study))
    else:
        return
    for key, value in items:
        name = f"{where}{key}" if str(key).startswith("[") else f"{where}.{key}"
        if isinstance(value, bool) or key in NON_COUNT_KEYS:
            continue
        if isinstance(value, int) and value < 1:
            raise ConfigError(f"{name} must be a count >= 1, got {value}")
        if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
        check_study_values(value, name)


def _refuse_masked_overrides(smoke):
    """Under smoke=true, study_smoke's keys replace study's: a command-line study.K=v whose K the
    smoke settings also set would be dropped without a word, so it is refused."""
    if not HydraConfig.initialized():
        return
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        inner, absent = key[len("study."):], object()
        if key.startswith("study.") and OmegaConf.select(OmegaConf.create(smoke), inner, default=absent) is not absent:
            raise ConfigError(f"{override} has no effect under smoke=true, where study_smoke.{inner} "
                              f"replaces it: override study_smoke.{inner} instead, or drop smoke=true")


def study_view(cfg, reads):
    """The top-level keys `reads` of cfg, resolved, as a struct config (reading another key
    raises); `study` is cfg.study with cfg.study_smoke merged over it when smoke=true."""
    missing = [key for key in reads if key not in cfg]
    if missing:
        hint = ": pick one with experiment=<name>" if "study" in missing else ""
        raise ConfigError(f"this app needs the config key(s) {missing}{hint}")
    view = {}
    for key in reads:
        value = cfg[key]
        if key == "study":
            check_study_values(OmegaConf.to_container(value, resolve=True))
        if key == "study" and cfg.get("smoke", False):
            smoke = cfg.get("study_smoke", {})
            check_study_values(OmegaConf.to_container(smoke, resolve=True) if OmegaConf.is_config(smoke) else smoke,
                               "study_smoke")
            _refuse_masked_overrides(smoke)
            value = OmegaConf.merge(value, smoke)
        view[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    view = OmegaConf.create(view)
    OmegaConf.set_struct(view, True)
    return view


def config_digest(view):
    """Hash of the config a study reads: the identity of a job's work."""
    resolved = OmegaConf.to_container(view, resolve=True)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_complete(out_dir, digest):
    marker = Path(out_dir) / DONE_MARKER
    return marker.exists() and json.loads(marker.read_text()).get("config_digest") == digest


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


def csv_text(rows):
    """CSV of dict rows, the columns in order of first appearance, non-finite numbers as text."""
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
    writer.writeheader()
    writer.writerows(to_jsonable(rows, nonfinite_as_string=True))
    return handle.getvalue()


def write_csv(path, rows):
    Path(path).write_text(csv_text(rows), newline="")


def subplots(nrows=1, ncols=1, *, figsize=None, **kwargs):
    """(figure, axes) like pyplot.subplots, without pyplot (its import and global state): a
    matplotlib Figure that savefig renders with Agg."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def preload_matplotlib():
    """Import matplotlib in a thread while the study runs: its import (a good part of a short
    study's seconds) then overlaps the compiles and runs, which release the GIL. `run_study`
    starts it once the study's first program is lowered or loaded, not before: tracing and
    lowering hold the GIL, and an import beside them slows both."""
    thread = threading.Thread(target=importlib.import_module, args=("matplotlib.figure",), daemon=True)
    thread.start()
    return thread


_SUPERSCRIPTS = str.maketrans("0123456789-\N{MINUS SIGN}", "\N{SUPERSCRIPT ZERO}\N{SUPERSCRIPT ONE}\N{SUPERSCRIPT TWO}"
                              "\N{SUPERSCRIPT THREE}\N{SUPERSCRIPT FOUR}\N{SUPERSCRIPT FIVE}\N{SUPERSCRIPT SIX}"
                              "\N{SUPERSCRIPT SEVEN}\N{SUPERSCRIPT EIGHT}\N{SUPERSCRIPT NINE}"
                              "\N{SUPERSCRIPT MINUS}\N{SUPERSCRIPT MINUS}")


def plain_power_label(label):
    """A log axis's mathtext tick label ($\\mathdefault{2\\times10^{-1}}$) as plain text with
    Unicode superscripts (2×10⁻¹); other labels unchanged."""
    match = re.fullmatch(r"\$\\mathdefault\{(.*)\}\$", label)
    if match is None:
        return label
    body = match.group(1).replace(r"\times", "\N{MULTIPLICATION SIGN}")
    return re.sub(r"\^\{([^}]*)\}", lambda power: power.group(1).translate(_SUPERSCRIPTS), body)


@functools.cache
def _plain_log_formatter():
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLogFormatter(LogFormatterSciNotation):
        """matplotlib's log tick labels (which ticks get one, their values) as plain text."""

        def __call__(self, x, pos=None):
            return plain_power_label(super().__call__(x, pos))

    return PlainLogFormatter


def fast_log_axes(fig):
    """Log axes that render fast. Their tick labels become plain text (matplotlib's mathtext
    parser, on the first figure of a process, costs about as much as drawing the rest), and minor
    ticks go from axes that span two decades or more (their decades label them enough; placing
    and drawing them is about half of a log-log figure's rendering). A narrower axis keeps them,
    or it would show one labelled tick."""
    from matplotlib.ticker import LogFormatterSciNotation, NullLocator

    plain = _plain_log_formatter()
    for ax in fig.axes:
        for axis, scale, limits in ((ax.xaxis, ax.get_xscale(), ax.get_xlim()), (ax.yaxis, ax.get_yscale(), ax.get_ylim())):
            if scale != "log":
                continue
            for get, set_ in ((axis.get_major_formatter, axis.set_major_formatter),
                              (axis.get_minor_formatter, axis.set_minor_formatter)):
                old = get()
                if isinstance(old, LogFormatterSciNotation) and not isinstance(old, plain):
                    set_(plain(old._base, labelOnlyBase=old.labelOnlyBase, minor_thresholds=old.minor_thresholds))
            low, high = sorted(limits)
            if low > 0 and high / low >= 100:
                axis.set_minor_locator(NullLocator())


def save_figures(out_dir, figures):
    """Draw each figure (name -> function returning a Figure) into out_dir/name.png."""
    paths = []
    for name, draw in figures.items():
        path = Path(out_dir) / f"{name}.png"
        fig = draw()
        fast_log_axes(fig)
        fig.savefig(path, dpi=100, bbox_inches="tight")
        paths.append(path.name)
    return paths


def _quietly(study, view):
    """study(view) with its prints and progress bars dropped, for the floor's repeats of a study:
    the seconds of its runs, as `run_study` counts them (its wall time less its tracing, lowering,
    compiling and loading of programs: a study that drops one arm's programs before the next, to
    bound its memory, loads them again in each repeat)."""
    before = sum(_compile_seconds.values())
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        study(view)
    return time.perf_counter() - start - (sum(_compile_seconds.values()) - before)


def run_study(cfg, study: Callable, reads, out_dir=None):
    """Run study(view) once into out_dir (the Hydra job folder by default), where view holds the
    config keys `reads`; skip it when a done-marker with the same digest of that view is there.
    Returns the results.json content. Under a Hydra run (not a multirun), a config it cannot run
    is one line on stderr and exit status 2, as the command lines do; elsewhere a ConfigError."""
    try:
        view = study_view(cfg, reads)
    except ConfigError as e:
        if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
            raise
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        sys.exit(2)
    if out_dir is None:
        out_dir = HydraConfig.get().runtime.output_dir
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = config_digest(view)
    if is_complete(out_dir, digest):
        print(f"[skip] {out_dir} is complete for config {digest}")
        return json.loads((out_dir / "results.json").read_text())
    (out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(view))
    cache = enable_compilation_cache(cfg.get("compilation_cache"))
    release_programs()  # a multirun's jobs share a process: keep its compiled programs bounded
    plots = cfg.get("plots", True)
    entered, compiled_before = process_age(), dict(_compile_seconds)
    start = time.perf_counter()
    if plots:
        compiler_options()  # probed now (a trivial compile), so the first program lowered is the study's
        _preload_armed[0] = True
    result = study(view)
    _preload_armed[0] = False  # a study that compiled and loaded nothing imports it when it draws
    wall = time.perf_counter() - start
    seconds = {"startup_and_imports": _IMPORTED_AT, "hydra_composition": entered - _IMPORTED_AT}
    phases = dict.fromkeys(COMPILE_EVENTS.values())
    seconds.update({phase: _compile_seconds[phase] - compiled_before.get(phase, 0.0) for phase in phases})
    seconds["runs"] = wall - sum(seconds[phase] for phase in phases)
    started = time.perf_counter()
    figures = save_figures(out_dir, result.figures) if plots else []
    seconds["figures"] = time.perf_counter() - started
    record = {
        "study": view.study.name if "study" in view else "estimate",
        "seed": cfg.seed,
        "smoke": bool(cfg.get("smoke", False)),
        "wall_seconds": wall,
        "seconds": seconds,
        "random_words": result.random_words,
        "compilation_cache": str(cache) if cache else None,
        "versions": package_versions(),
        "results": result.summary,
        "figures": figures,
    }
    if cfg.get("measure_floor", False) and result.random_words:
        pairs = runs_over_floor(functools.partial(_quietly, study, view), result.random_words)
        record.update(random_floor_seconds=float(np.median(pairs.floors)), runs_over_floor=pairs.ratio,
                      floor_pairs=pairs._asdict())
    started = time.perf_counter()
    write_csv(out_dir / "results.csv", result.rows)
    for name, text in (result.files or {}).items():
        (out_dir / name).write_text(text)
    seconds["writing"] = time.perf_counter() - started  # the CSVs; results.json is small beside them
    (out_dir / "results.json").write_text(json.dumps(to_jsonable(record, nonfinite_as_string=True), indent=2))
    (out_dir / DONE_MARKER).write_text(json.dumps({"config_digest": digest, "wall_seconds": wall}))
    print(f"[done] {record['study']} in {wall:.1f} s -> {out_dir}")
    return record


def finish():
    """End an app's process once its main has returned: every result is written and closed, stdio
    is flushed and logging shut down; then exit without Python's teardown of JAX's backends, thread
    pools and modules (about half a second, a tenth of a short study, and nothing of ours).
    Multiruns end normally: a launcher's worker pool (joblib's loky processes) must be shut down,
    or its idle workers keep the process's output pipes open until they time out."""
    if any(arg in ("-m", "--multirun") or arg.replace(" ", "") == "hydra.mode=MULTIRUN" for arg in sys.argv[1:]):
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    fig, ax = subplots(figsize=(max(5, 0.9 * len(rows) + 2), 4))
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
            save_figures(sweep_dir, {"sweep_summary": lambda: plot_sweep(rows)})
        print(f"[sweep] {len(rows)} jobs summarized in {sweep_dir / 'sweep_summary.csv'}")
