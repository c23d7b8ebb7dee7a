"""Where an estimator's program is compiled, and with which XLA options.

With its classic loop emitters XLA's CPU backend compiles the estimator programs 20-30% faster
than with its newer fusion emitters, with a third less peak memory, and runs them within about
20% (docs/benchmarks/numpy.md). A backend refuses an option it does not know (the GPU backend refuses
the CPU's, and newer XLA releases retire options), so the options are those of COMPILER_OPTIONS
that this process's default backend accepts (`compiler_options`). JAX accepts compiler options on
the outermost jit only (a nested jit that names them is an error), so an estimator core is jitted
twice: with the options when called from Python, plainly when traced inside a caller's jit, which
then decides the options (pass `compiler_options()` to your own jax.jit around estimator calls).
"""

import functools
import gc
import hashlib
import os
import pickle
import time
from pathlib import Path

import jax

from tvjax.core.validate import all_concrete

COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
# A program that runs once, briefly (a study's diagnostic on a few thousand trajectories), costs
# mostly its compile: LLVM at level 1 compiles it about a third faster than XLA's default level 3,
# and on such a run the code it makes is as fast (docs/benchmarks/anchors.md). Long runs keep level 3
# (Algorithm 3's estimates run twice as long at level 1).
BRIEF_RUN_OPTIONS = {**COMPILER_OPTIONS, "xla_backend_optimization_level": 1}


_REFUSED_OPTION = "No such compile option"  # XLA's error for an option name its backend does not know


@functools.cache
def _accepted(name, value):
    """Whether the default backend compiles with option `name` = `value`: one trivial compile per
    process and option."""
    try:
        jax.jit(lambda x: x, compiler_options={name: value}).lower(0.0).compile()
    except Exception as error:  # jaxlib's runtime error, whose type moves between releases
        if _REFUSED_OPTION in str(error):
            return False
        raise
    return True


def compiler_options(options=COMPILER_OPTIONS):
    """The entries of `options` that this process's default backend accepts (a backend refuses
    an option it does not know: the GPU backend the CPU's, a newer XLA a retired one)."""
    return {name: value for name, value in options.items() if _accepted(name, value)}


def program(static_argnames=()):
    """Decorator: jit `fn` with `compiler_options()` at the top level (that jit is `fn.top()`,
    made at the first call, once the backend is known), plainly inside a trace."""

    def wrap(fn):
        top = functools.cache(lambda: jax.jit(fn, static_argnames=static_argnames, compiler_options=compiler_options()))
        nested = jax.jit(fn, static_argnames=static_argnames)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return (top() if all_concrete((args, kwargs)) else nested)(*args, **kwargs)

        call.top = top
        return call

    return wrap


def jit_program(fn, fast_compile=False, static_argnames=()):
    """jax.jit(fn) with `compiler_options()`, for callers that jit their own loops over
    estimators. fast_compile lowers XLA's backend optimization (about 2x faster compiles, slower
    runs)."""
    options = {**COMPILER_OPTIONS, **({"xla_backend_optimization_level": 0} if fast_compile else {})}
    return jax.jit(fn, static_argnames=static_argnames, compiler_options=compiler_options(options))


# --------------------------------------------------------------------------- persistent compilation cache

CACHE_ENV = "TVJAX_COMPILATION_CACHE"  # a folder, or "off" to opt out
CACHE_OFF = ("0", "off", "false", "no", "none")
CACHE_MAX_BYTES = 2 * 2**30  # least recently used entries go first beyond this


def default_cache_dir():
    """$XDG_CACHE_HOME/tvjax/jax-compilation (~/.cache/tvjax/jax-compilation)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tvjax" / "jax-compilation"


def enable_compilation_cache(path=None):
    """Turn on JAX's persistent compilation cache for this process and return its folder (None
    when opted out). `path` or $TVJAX_COMPILATION_CACHE choose the folder (default
    `default_cache_dir()`); TVJAX_COMPILATION_CACHE=off opts out, and so does JAX's own switch
    (jax_enable_compilation_cache false); a cache folder already set in JAX's own config
    (JAX_COMPILATION_CACHE_DIR) is kept.

    The CLI, the study apps and the benchmarks call this before their first compile (JAX fixes
    the folder at its first compile). Invalidation is by content: an entry's key hashes the
    program's HLO, the compile options, the devices and the jax/jaxlib versions, so any code
    change that changes a program misses, and a program that did not change is reused. Entries
    live in one subfolder per jax/jaxlib version, so an upgrade starts afresh instead of
    accumulating dead entries. Every program is cached, however short its compile: the studies
    are many sub-second compiles."""
    setting = str(path) if path is not None else os.environ.get(CACHE_ENV, "")
    if setting.strip().lower() in CACHE_OFF or not jax.config.jax_enable_compilation_cache:
        return None
    if jax.config.jax_compilation_cache_dir and path is None:
        return Path(jax.config.jax_compilation_cache_dir)
    import jaxlib

    base = Path(setting).expanduser() if setting else default_cache_dir()
    folder = base / f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}"
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return folder


# --------------------------------------------------------------------------- saved executables

# On a warm compilation cache a program is still traced and lowered to find its entry (a good
# part of a short study's seconds). A saved executable skips both: it is found by what decides
# the program without tracing it, the function's identity, tvjax's sources, the arguments'
# structure and shapes, JAX's configuration, XLA's flags, the devices and the versions.
EXECUTABLES = "executables"  # subfolder of the compilation cache folder
EXECUTABLES_MAX_BYTES = 512 * 2**20  # oldest entries go first beyond this
LOAD_EVENT = "/tvjax/executable_load_duration"
_executables = {}  # key -> compiled, this process
_jax_cache_hits = [0]  # JAX's persistent cache hits in this process


def _count_jax_cache_hit(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        _jax_cache_hits[0] += 1


jax.monitoring.register_event_listener(_count_jax_cache_hit)


@functools.cache
def _package_sources_digest():
    """Hash of tvjax's own Python sources: any edit to the package is another program."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _environment():
    import jaxlib

    config = {name: repr(value) for name, value in jax.config.values.items()
              if "cache" not in name and "log" not in name and "explain" not in name}
    devices = [(d.platform, d.device_kind) for d in jax.devices()]
    return (jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""), devices, sorted(config.items()))


def _leaf_signature(leaf):
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return ("key", str(jax.random.key_impl(leaf)), leaf.shape)
    aval = jax.typeof(leaf) if isinstance(leaf, jax.Array) else jax.api_util.shaped_abstractify(leaf)
    return (str(aval), getattr(leaf, "weak_type", None), type(leaf).__name__, str(getattr(leaf, "sharding", None)))


@functools.cache
def _files_digest(paths):
    """Hash of the files `paths` (read once per process, not per call)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def _executable_key(identity, sources, args):
    leaves, tree = jax.tree.flatten(args)
    digest = hashlib.sha256(repr((identity, _package_sources_digest(), _files_digest(tuple(sources)),
                                  str(tree), [_leaf_signature(leaf) for leaf in leaves], _environment(),
                                  str(jax.sharding.get_abstract_mesh()))).encode())
    return digest.hexdigest()[:32]


def _prune(folder):
    files = sorted(folder.glob("*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)
    kept = 0
    for path in files:
        kept += path.stat().st_size
        if kept > EXECUTABLES_MAX_BYTES:
            path.unlink(missing_ok=True)


def _cache_on():
    """JAX's persistent compilation cache is on: a folder is set and JAX's switch is not off."""
    return bool(jax.config.jax_compilation_cache_dir) and jax.config.jax_enable_compilation_cache


def _load_or_compile(jitted, key, args):
    from jax.experimental import serialize_executable

    path = Path(jax.config.jax_compilation_cache_dir) / EXECUTABLES / f"{key}.bin"
    if path.exists():
        start = time.perf_counter()
        try:
            payload = pickle.loads(path.read_bytes())
            compiled = serialize_executable.deserialize_and_load(*payload)
            jax.monitoring.record_event_duration_secs(LOAD_EVENT, time.perf_counter() - start)
            os.utime(path)  # recently used
            return compiled
        except Exception:  # written by another jaxlib, truncated, ...: compile afresh and replace it
            path.unlink(missing_ok=True)
    hits_before = _jax_cache_hits[0]
    compiled = jitted.lower(*args).compile()
    # An executable that JAX loaded from its own cache does not serialize whole on CPU (its
    # fusions' code is missing when reloaded): only a fresh compile is saved.
    if _jax_cache_hits[0] == hits_before:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps(serialize_executable.serialize(compiled)))
        os.replace(partial, path)  # whole entries only, whatever runs beside
        _prune(path.parent)
    return compiled


def saved_program(jitted, identity, sources=()):
    """`jitted` (a jax.jit function) as a callable that, called with concrete arguments while a
    compilation cache is on (`enable_compilation_cache`), runs an executable saved in the cache
    folder's `executables/` for these arguments' structure and shapes, or compiles, saves and
    runs one: no tracing or lowering on a warm cache. `identity` (hashable, with a stable repr)
    names the function and every value it closes over; `sources` are files beyond the tvjax
    package whose code it runs. So the key misses when tvjax's sources, those files, the
    arguments' structure (static fields included), shapes or dtypes, JAX's configuration,
    XLA_FLAGS, the devices or the versions change. Code changed at run time (a patched class
    attribute) is not seen: it goes through `jitted` with the cache off. Traced arguments, or
    jax.disable_jit, call `jitted` directly."""

    def call(*args):
        if not _cache_on() or jax.config.jax_disable_jit or not all_concrete(args):
            return jitted(*args)
        key = _executable_key(identity, sources, args)
        compiled = _executables.get(key)
        if compiled is None:
            compiled = _executables[key] = _load_or_compile(jitted, key, args)
        return compiled(*args)

    return call


# --------------------------------------------------------------------------- a long process's programs

# Every XLA:CPU executable keeps its machine code in memory mappings of its own, which live as long
# as JAX's caches keep the program. A process that compiles program after program (a Hydra
# multirun over shapes, a test session) reaches Linux's limit on mappings (vm.max_map_count,
# 65530 by default), and its next compile dies of a segmentation fault.
MAP_LIMIT_SHARE = 0.5  # clear the caches past half the limit


def memory_maps():
    """(memory mappings this process holds, the kernel's limit), or None where /proc does not say."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            held = sum(1 for _ in maps)
        return held, int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def release_programs(share=MAP_LIMIT_SHARE):
    """Drop the compiled programs this process keeps (JAX's caches, the saved executables loaded
    here) where it holds more than `share` of the kernel's memory-mapping limit (share=0: always).
    Programs are compiled again, or loaded from the persistent cache, when next called. Returns
    whether it dropped them."""
    maps = memory_maps()
    if share > 0 and (maps is None or maps[0] <= share * maps[1]):
        return False
    jax.clear_caches()
    _executables.clear()
    gc.collect()
    return True
