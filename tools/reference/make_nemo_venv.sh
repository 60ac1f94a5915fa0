#!/usr/bin/env bash
# Build the separate Python 3.11 virtual environment that hosts the nemo-automodel
# DeepSeek-V4.1 reference (pure torch, CPU). It lives outside the repository and is
# only needed to (re)record the parity fixtures; CI never uses it.
#
# usage: tools/reference/make_nemo_venv.sh [VENV_DIR]   (default /work/venvs/nemo-v41)
set -euo pipefail

VENV="${1:-${NEMO_VENV:-/work/venvs/nemo-v41}}"
PY="${PYTHON:-python3.11}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"

if command -v uv >/dev/null 2>&1; then
  uv venv --allow-existing --python "$PY" "$VENV"
  pip_install() { uv pip install --python "$VENV/bin/python" "$@"; }
else
  "$PY" -m venv "$VENV"
  pip_install() { "$VENV/bin/pip" install "$@"; }
fi

# torch: the PyPI wheel (the only index reachable here); fall back to any >= 2.11.
pip_install "torch==${TORCH_VERSION}" || pip_install "torch>=2.11"
pip_install --no-deps "nemo-automodel==0.7.0"
pip_install "transformers==5.18.0" pillow safetensors

TORCHDYNAMO_DISABLE=1 "$VENV/bin/python" - <<'PY'
import torch
import nemo_automodel.components.models.deepseek_v41.model  # noqa: F401
import nemo_automodel.components.models.deepseek_v41.dspark  # noqa: F401
print("nemo-v41 venv ok: torch", torch.__version__)
PY
