#!/usr/bin/env bash
# The paper's GPU case study in one call, on a machine with one NVIDIA GPU, within 8 minutes: CUDA
# JAX into .venv-gpu (reused once ready; TVJAX_WHEELHOUSE: a folder of wheels, for a machine
# offline), the three synthetic studies, the JAX float32-vs-bfloat16 engine campaign on SmolLM2-135M
# and, with SGLANG_PYTHON, the SGLang bridge; one JSON, benchmarks/results-gpu-case-study.json.
#   bash benchmarks/gpu.sh [--out PATH] [--venv DIR] [--repeats R] ...   (--help lists the options)
#   bash benchmarks/gpu.sh --dry-run    # the same steps on the CPU with .venv, at tiny sizes (CI)
# Exit status: 0 no step failed, 1 a step failed, 2 no GPU. The steps: benchmarks/gpu_case_study.py.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}
[[ $here == "${BASH_SOURCE[0]}" ]] && here=.
cd "$here/.."
exec "${TVJAX_BASE_PYTHON:-python3}" benchmarks/gpu_case_study.py "$@"
