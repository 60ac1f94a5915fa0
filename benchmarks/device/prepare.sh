#!/usr/bin/env bash
# Here, before a GPU run: wheels of our pure-Python packages plus the dependencies the GPU image lacks,
# into .device/wheels (git-ignored; pass `carry: [".device"]` to the device run).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .device/wheels
rm -f .device/wheels/deepinfer*.whl
for package in deepinfer-core deepinfer-kernels-cuda deepinfer-spec; do
    uv build --quiet --wheel --package "$package" -o .device/wheels
done
# The GPU image has torch, triton, safetensors, tokenizers, numpy, tqdm but not pydantic.
python3 -m pip download --quiet pydantic --python-version 3.12 --only-binary=:all: \
    --platform manylinux2014_x86_64 -d .device/wheels
ls .device/wheels
