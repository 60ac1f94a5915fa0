#!/usr/bin/env bash
# One GPU call for the linear/MoE kernels: GPU tests, tile tuning, then the Flash-shape benchmarks with
# the tuned configs. Usage: benchmarks/kernels/linear_moe_gpu.sh OUT_DIR (after installing the wheels).
# Time limits (s; 0 skips a section) and the points measured come from the environment: TEST_S, TEST_K,
# TUNE_S, TUNE_BUDGET_S, TUNE_ARGS, MOE_S, MOE_TOKENS, LINEAR_S, LINEAR_TOKENS.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$out/gpu.txt"
section() { echo "== $1 $(date -u +%T)"; }
if [ "${TEST_S:-150}" != 0 ]; then
    section tests
    timeout -s INT "${TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider --rootdir=../.. --tb=line \
        ../../packages/deepinfer-kernels-cuda/tests/test_linear_moe_cuda.py ../../tests/test_op_conformance.py \
        ../../packages/deepinfer-kernels-cuda/tests/test_linear_moe_slice_cuda.py \
        -k "${TEST_K:-linear or moe or route or align}" -rA -s > "$out/tests.txt" 2>&1
    tail -4 "$out/tests.txt"
fi
if [ "${TUNE_S:-130}" != 0 ]; then
    section tune
    timeout -s INT "${TUNE_S:-130}" python3 tune.py --budget-s "${TUNE_BUDGET_S:-100}" ${TUNE_ARGS:-} > "$out/tune.txt" 2>&1
    tail -2 "$out/tune.txt"
    cp "$(python3 -c 'from deepinfer_kernels_cuda import configs; print(configs.gpu_file())')" "$out/" || true
fi
section moe
timeout -s INT "${MOE_S:-100}" python3 moe.py --out "$out" --tokens "${MOE_TOKENS:-1,8,64,256,1024,4096,16384}" > "$out/moe.txt" 2>&1
tail -12 "$out/moe.txt"
section linear
timeout -s INT "${LINEAR_S:-140}" python3 linear.py --out "$out" --tokens "${LINEAR_TOKENS:-1,4,8,64,256,1024,4096,16384}" > "$out/linear.txt" 2>&1
tail -3 "$out/linear.txt"
section done
