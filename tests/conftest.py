"""Test-wide settings: JAX's persistent compilation cache (which the CLI, the apps and the
benchmarks turn on) goes to a folder of this test session, not the user's ~/.cache, and is
inherited by the processes the tests start."""

import os
import tempfile

os.environ.setdefault("TVJAX_COMPILATION_CACHE", tempfile.mkdtemp(prefix="tvjax-test-jax-cache-"))
