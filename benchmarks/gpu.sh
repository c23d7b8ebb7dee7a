#!/usr/bin/env bash
# The benchmark workloads through tvjax on a GPU machine; prints absolute throughput (queries per
# second, wall and CPU seconds) and writes benchmarks/results-gpu.json. Needs a Python environment
# with tvjax and a CUDA build of JAX (pip install -e . "jax[cuda12]"); PYTHON selects it.
# Extra arguments go to run.py (e.g. --quick, --workloads multilevel).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 'no GPU backend: ' + str(jax.devices()))"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # peak memory should be what the run uses, not a preallocated pool
"$PYTHON" benchmarks/run.py --implementations tvjax --out benchmarks/results-gpu.json "$@"
