"""Test-wide settings.

JAX's persistent compilation cache (which the CLI, the apps and the benchmarks turn on) goes to a
folder of this test session, not the user's ~/.cache, and is inherited by the processes the tests
start; the folder is removed when the session ends.

After each test module, its compiled programs are dropped (`tvjax.core.programs.release_programs`):
every XLA:CPU executable keeps its machine code in memory mappings of its own, and one pytest
process that kept every test's programs passed Linux's default limit of 65530 mappings per
process (vm.max_map_count), at which point the next compile died of a segmentation fault. This
file is also loaded by the engines' environments, which have no JAX: it imports tvjax only where
a test module has imported JAX.
"""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

if "TVJAX_COMPILATION_CACHE" not in os.environ:
    _session_cache = tempfile.mkdtemp(prefix="tvjax-test-jax-cache-")
    os.environ["TVJAX_COMPILATION_CACHE"] = _session_cache
    atexit.register(shutil.rmtree, _session_cache, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Drop the module's compiled programs once its tests (and its fixtures) are done."""
    yield
    if "jax" in sys.modules:
        from tvjax.core.programs import release_programs

        release_programs(share=0)
