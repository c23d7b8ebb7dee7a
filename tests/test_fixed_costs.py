"""Fixed costs: JAX's persistent compilation cache as tvjax turns it on (a second process reuses a
program, a changed program misses, the opt-out writes nothing), the study job keys, and the count
of random words behind a study's floor."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tvjax.core.instances import paper_block_pair, random_tabular_pair
from tvjax.core.oracles import Exact, Noisy, Sampler
from tvjax.core.schedules import Level, Samples, Schedule
from tvjax.core.studies import job_key, random_words, runs_over_floor

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys
import jax, jax.numpy as jnp
from tvjax.core.programs import enable_compilation_cache
events = {"hits": 0, "misses": 0}
names = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
def count(event, **_):
    if event in names:
        events[names[event]] += 1
jax.monitoring.register_event_listener(count)
folder = enable_compilation_cache(sys.argv[2])
scale = float(sys.argv[1])
value = jax.jit(lambda x: jnp.sum(jnp.sin(x) * scale))(jnp.arange(8.0))
print(json.dumps({"folder": str(folder) if folder else None, "value": float(value), **events}))
"""


def probe(scale, cache):
    env = {key: value for key, value in os.environ.items() if key not in ("TVJAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    out = subprocess.run([sys.executable, "-c", PROBE, str(scale), str(cache)], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=env, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def entries(folder):
    return sorted(p.name for p in Path(folder).rglob("*-cache"))


def test_second_process_reuses_and_a_changed_program_misses(tmp_path):
    first = probe(2.0, tmp_path)
    assert first["misses"] >= 1 and first["hits"] == 0
    folder = Path(first["folder"])
    assert folder.parent == tmp_path and folder.name.startswith("jax-")  # one subfolder per jax/jaxlib version
    written = entries(folder)
    assert written
    second = probe(2.0, tmp_path)
    assert second["hits"] >= 1 and second["misses"] == 0 and second["value"] == first["value"]
    assert entries(folder) == written
    changed = probe(3.0, tmp_path)  # another constant: another program, so another key
    assert changed["misses"] >= 1 and changed["value"] == pytest.approx(1.5 * first["value"])
    assert len(entries(folder)) > len(written)


def test_opting_out_writes_nothing(tmp_path):
    result = probe(2.0, "off")
    assert result["folder"] is None and result["hits"] == result["misses"] == 0



SAVED_PROBE = """
import json, sys
import jax, numpy as np
import tvjax.core.programs as programs
from tvjax.core.estimators import lookup
from tvjax.core.instances import paper_block_pair
from tvjax.core.oracles import Noisy
from tvjax.core.schedules import Schedule
from tvjax.core.studies import replicate
events = {"loads": 0, "compiles": 0}
def count(event, duration, **_):
    if event == programs.LOAD_EVENT:
        events["loads"] += 1
    if event == "/jax/core/compile/backend_compile_duration":
        events["compiles"] += 1
jax.monitoring.register_event_duration_secs_listener(count)
if sys.argv[3] == "edited":  # what an edit to tvjax's sources does to the key
    programs._package_sources_digest = lambda: "edited"
if sys.argv[3] == "jax_off":  # JAX's own switch off: tvjax neither caches nor saves
    jax.config.update("jax_enable_compilation_cache", False)
programs.enable_compilation_cache(sys.argv[1])
pi, mu = paper_block_pair()
sizes = Schedule(np.array([[40, 10]] * 3, np.int32), np.array([4, 16], np.int32))
est = replicate(lookup("multilevel").fn, jax.random.key(3), 3, pi, mu, Noisy(float(sys.argv[2])), sizes)
print(json.dumps({"values": est.value.tolist(), **events}))
"""


def saved_probe(cache, sigma=0.3, variant="plain"):
    env = {key: value for key, value in os.environ.items() if key not in ("TVJAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    out = subprocess.run([sys.executable, "-c", SAVED_PROBE, str(cache), str(sigma), variant], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_saved_programs_skip_tracing_and_miss_when_anything_that_decides_them_changes(tmp_path):
    first = saved_probe(tmp_path)
    saved = sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("executables/*.bin"))
    assert len(saved) == 1 and first["loads"] == 0 and first["compiles"] >= 1
    assert first["values"] == saved_probe("off")["values"]  # the saved program is the plain jit's
    second = saved_probe(tmp_path)  # a warm cache: loaded, the same numbers
    assert second["loads"] == 1 and second["compiles"] < first["compiles"] and second["values"] == first["values"]
    other_sigma = saved_probe(tmp_path, sigma=0.6)  # sigma is an argument: the same program, other numbers
    assert other_sigma["loads"] == 1 and other_sigma["values"] != first["values"]
    # Another source digest misses: traced again. Its HLO is unchanged, so JAX's own cache gives
    # the program, and that is not saved (it does not reload whole on CPU).
    edited = saved_probe(tmp_path, variant="edited")
    assert edited["loads"] == 0 and edited["values"] == first["values"]
    assert sorted((p.name, p.stat().st_size) for p in tmp_path.rglob("executables/*.bin")) == saved
    for path in tmp_path.rglob("executables/*.bin"):  # a damaged entry is not trusted: it goes
        path.write_bytes(b"truncated")
    damaged = saved_probe(tmp_path)
    assert damaged["loads"] == 0 and damaged["values"] == first["values"]
    # Its program came from JAX's own cache this time, which does not reload whole: not saved.
    assert not list(tmp_path.rglob("executables/*.bin"))


def test_saved_programs_are_off_with_the_cache_and_for_code_outside_tvjax(tmp_path):
    from tvjax.core.studies import _replicated

    off = saved_probe("off")
    assert off["loads"] == 0 and not list(tmp_path.rglob("executables/*"))
    jax_off = saved_probe(tmp_path, variant="jax_off")
    assert jax_off["loads"] == 0 and jax_off["values"] == off["values"] and not list(tmp_path.iterdir())

    def local_estimator(key, pi, mu, oracle, sizes, copies=None):
        return key

    assert hasattr(_replicated(local_estimator, 2, False), "lower")  # a plain jit: its code is not in the key

def test_job_keys_are_distinct_and_reproducible():
    keys = [job_key(0, 1, i) for i in range(4)] + [job_key(0, 2, 0), job_key(1, 1, 0)]
    data = [tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in keys]
    assert len(set(data)) == len(data)
    assert np.array_equal(jax.random.key_data(job_key(0, 1, 2)), jax.random.key_data(job_key(0, 1, 2)))


def jax_fold_chain(seed, *indices):
    key = jax.random.key(seed)
    for index in indices:
        key = jax.random.fold_in(key, index)
    return np.asarray(jax.random.key_data(key))


def test_job_keys_equal_jax_fold_in_chains():
    """job_key computes threefry in NumPy: it must give JAX's keys bit for bit (the streams of
    every study and of its multirun jobs hang on it), edge words included."""
    rng = np.random.default_rng(3)
    cases = [(0,), (0, 0), (1, 0, 0), (2**31 - 1, 2**31 - 1, 1), (5, np.int64(7))]
    cases += [tuple(int(w) for w in rng.integers(0, 2**31, size=rng.integers(1, 5))) for _ in range(40)]
    for words in cases:
        assert np.array_equal(np.asarray(jax.random.key_data(job_key(*words))), jax_fold_chain(*words)), words
    with pytest.raises(OverflowError):  # out of range: JAX's own path and error
        job_key(0, -1)


def test_random_words_counts_samples_and_drawn_sums():
    pi, _ = paper_block_pair()  # one word per sample, 13 drawn positions
    assert pi.random_words_per_sample == 1
    assert random_words(pi, Exact(), Samples(100), copies=3) == 300
    assert random_words(pi, Noisy(0.1), Samples(100)) == 100 * (1 + 2 * 13)
    assert random_words(pi, Sampler(), Level(10, 4)) == 2 * 10 * (1 + 2 * 13)
    # A coupled level draws two sums per cell; both sides sample.
    assert random_words(pi, Noisy(0.1), Schedule((10, 5), (1, 8))) == 2 * 10 * (1 + 26) + 2 * 5 * (1 + 52)
    tab, _ = random_tabular_pair(n=6)  # no compact sampler: a word per position, every position drawn
    assert random_words(tab, Noisy(0.1), Samples(7)) == 7 * (6 + 2 * 6)


def test_runs_over_floor_times_each_run_between_two_floor_draws(monkeypatch):
    """floor, run, floor, run, ..., floor: each run is divided by the mean of the two draws beside
    it, and the median of those ratios is reported (times from a scripted clock, not this machine)."""
    from tvjax.core import studies

    draws = iter([1.0, 3.0, 2.0, 6.0])  # the floor draws' seconds, in order
    monkeypatch.setattr(studies, "_floor_draw", lambda words, chunk, seed: next(draws))
    clock = iter([0.0, 4.0, 10.0, 15.0, 20.0, 32.0])  # the runs take 4, 5 and 12 seconds
    monkeypatch.setattr(studies, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    calls = []
    pairs = runs_over_floor(lambda: calls.append(1), words=10, pairs=3)
    assert len(calls) == 3
    assert pairs.runs == (4.0, 5.0, 12.0) and pairs.floors == (2.0, 2.5, 4.0)
    assert pairs.ratio == 2.0  # the median of 2.0, 2.0 and 3.0


def test_runs_over_floor_counts_the_seconds_a_run_reports(monkeypatch):
    """A run that reports its runs' seconds (a study's wall time less the programs it loaded or
    compiled) is counted at those seconds, not at its wall time."""
    from tvjax.core import studies

    draws = iter([2.0, 2.0, 4.0])
    monkeypatch.setattr(studies, "_floor_draw", lambda words, chunk, seed: next(draws))
    clock = iter([0.0, 9.0, 10.0, 19.0])  # each run's wall time is 9 s, of which it reports 3 and 6
    monkeypatch.setattr(studies, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    reported = iter([3.0, 6.0])
    pairs = runs_over_floor(lambda: next(reported), words=10, pairs=2)
    assert pairs.runs == (3.0, 6.0) and pairs.floors == (2.0, 3.0)
    assert pairs.ratio == 1.75  # the median of 1.5 and 2.0


def test_random_floor_draws_every_word_once_compiled():
    """The floor's program draws ceil(words / chunk) chunks, compiled before any timed draw: the
    xor of the chunks' largest words, over as many chunks as asked."""
    from tvjax.core import studies

    draw = studies._word_drawer(64)
    one, two = (int(draw(jax.random.key(5), steps)) for steps in (1, 2))
    chunk = lambda i: int(jnp.max(jax.random.bits(jax.random.fold_in(jax.random.key(5), i), (64,), jnp.uint32)))
    assert one == chunk(0) and two == chunk(0) ^ chunk(1)
    assert studies._floor_draw(1000, 64, seed=1) > 0


def test_released_programs_give_back_their_memory_mappings(monkeypatch):
    """Each XLA:CPU executable holds memory mappings until JAX's caches drop it; past the share of
    the kernel's limit `release_programs` drops them all, below it (or without /proc) none."""
    from tvjax.core import programs

    held, limit = programs.memory_maps()
    assert 0 < held < limit
    jitted = [jax.jit(lambda x, k=k: x * k + k) for k in range(20)]
    for f in jitted:
        f(1.0)
    grown = programs.memory_maps()[0]
    assert grown >= held + 20
    assert not programs.release_programs(share=1.0)  # far below the limit: kept
    assert all(f._cache_size() == 1 for f in jitted)
    monkeypatch.setattr(programs, "memory_maps", lambda: None)  # nothing measured: nothing dropped
    assert not programs.release_programs()
    monkeypatch.setattr(programs, "memory_maps", lambda: (grown, 2 * grown - 2))
    assert programs.release_programs()  # past half the limit
    assert all(f._cache_size() == 0 for f in jitted)
    monkeypatch.undo()
    assert programs.memory_maps()[0] <= grown - 20


def test_compiler_options_keep_only_what_the_backend_accepts():
    """An option the backend does not know (the CPU's on a GPU, one a newer XLA retired) is left
    out instead of failing every compile; the ones it knows are kept."""
    from tvjax.core.programs import COMPILER_OPTIONS, compiler_options

    wanted = {**COMPILER_OPTIONS, "xla_tvjax_no_such_option": True}
    with pytest.raises(Exception, match="No such compile option"):
        jax.jit(lambda x: x + 1, compiler_options=wanted).lower(1.0).compile()
    kept = compiler_options(wanted)
    assert kept == compiler_options() and "xla_tvjax_no_such_option" not in kept
    assert float(jax.jit(lambda x: x + 1, compiler_options=kept)(1.0)) == 2.0
    if jax.default_backend() == "cpu" and jax.__version__.startswith("0.10."):
        assert kept == COMPILER_OPTIONS  # this CPU's XLA knows them all
