"""Test-wide settings: JAX's persistent compilation cache (which the CLI, the apps and the
benchmarks turn on) goes to a folder of this test session, not the user's ~/.cache, and is
inherited by the processes the tests start; the folder is removed when the session ends."""

import atexit
import os
import shutil
import tempfile

if "TVJAX_COMPILATION_CACHE" not in os.environ:
    _session_cache = tempfile.mkdtemp(prefix="tvjax-test-jax-cache-")
    os.environ["TVJAX_COMPILATION_CACHE"] = _session_cache
    atexit.register(shutil.rmtree, _session_cache, ignore_errors=True)
