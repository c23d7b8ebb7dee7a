"""The replay arithmetic shared by every bridge, and the SGLang processor's arithmetic, on
synthetic logits (tests/engines/torch_checks.py, run inside the transformers venv: it needs torch)."""

import re

import pytest
from _engine_envs import engine_python, run_in

pytestmark = pytest.mark.slow  # engine environments, subprocesses, real models


def test_replay_arithmetic_on_synthetic_logits():
    proc = run_in(engine_python("transformers"), ["-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                                                  "tests/engines/torch_checks.py"], timeout=300)
    assert re.search(r"^\d+ passed", proc.stdout, re.M) and "failed" not in proc.stdout, proc.stdout
