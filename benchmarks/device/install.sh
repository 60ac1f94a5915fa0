#!/usr/bin/env bash
# There, at the start of a GPU run: install the carried wheels into the image's python3, offline.
set -euo pipefail
cd "$(dirname "$0")/../.."
# --force-reinstall: a warm machine keeps the previous call's wheels, of the same version number
python3 -m pip install --quiet --no-index --no-deps --force-reinstall .device/wheels/*.whl
python3 -c "import torch, deepinfer; from deepinfer.ops import get_ops; \
print(torch.__version__, torch.cuda.get_device_name(), get_ops(device='cuda').backend_name)"
