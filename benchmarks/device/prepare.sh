#!/usr/bin/env bash
# Here, before a GPU run: wheels of our pure-Python packages plus the dependencies the GPU image lacks.
#   benchmarks/device/prepare.sh            the working tree's wheels into .device/wheels (git-ignored; pass
#                                           `carry: [".device"]` to the device run)
#   benchmarks/device/prepare.sh REF DIR    git REF's tree (a branch, a commit) copied to DIR under .device with
#                                           its own wheels: uncommitted edits stay out. Run it there with
#                                           `carry: [".device/DIR"]` and `cd .device/DIR && bash benchmarks/device/install.sh && ...`
# The copy leaves out what a GPU run does not read (the recipe package, the nemo fixtures) so that it fits
# the device's carry limit; KEEP_CHECKPOINTS=1 keeps checkpoints/ (the engine tests on tiny-stdlib).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ge 1 ]; then
    ref=${1:?} dest=.device/${2:?usage: prepare.sh [REF DIR]}
    excluded=(":!packages/deepseek-recipe" ":!packages/deepinfer-core/tests/fixtures/nemo")
    [ -n "${KEEP_CHECKPOINTS:-}" ] || excluded+=(":!checkpoints")
    rm -rf "$dest" && mkdir -p "$dest"
    git archive "$ref" -- . "${excluded[@]}" | tar -x -C "$dest"
    cd "$dest"
fi
mkdir -p .device/wheels
rm -f .device/wheels/deepinfer*.whl
for package in deepinfer-core deepinfer-kernels-cuda deepinfer-spec; do
    uv build --quiet --wheel --package "$package" -o .device/wheels
done
# The GPU image has torch, triton, safetensors, tokenizers, numpy, tqdm but not pydantic or llguidance
# (structured output; without it the engine's grammar tests fail there).
python3 -m pip download --quiet pydantic "llguidance>=1.9" --python-version 3.12 --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 -d .device/wheels
ls .device/wheels; du -sh .
