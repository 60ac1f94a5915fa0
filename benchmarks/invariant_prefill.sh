#!/usr/bin/env bash
# Batch-invariant mode at prefill, one GPU call: (1) the GPU tests of the invariant kernels' tile changes
# (each bitwise against the decode-sized tiles; rows alone vs in batches up to 4096), (2) the whole-model cost
# (benchmarks/batch_invariance.py --cost: decode ms/step at batch 1 / 8 / 64, prefill tok/s, invariant /
# default ratios, probe logits bitwise across batch sizes), (3) the per-kernel variants
# (benchmarks/kernels/invariant_prefill.py; BASE: a directory with the earlier tree's linear.py / moe.py /
# mhc.py for its invariant mode), (4) the slow 2-layer slice test (logits bitwise alone and in batches) with
# the time left. Each part runs under its own time limit within LIMIT_S (default 570).
#
#   benchmarks/device/install.sh && BASE=.device/inv-base benchmarks/invariant_prefill.sh OUT
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${1:?usage: benchmarks/invariant_prefill.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
base=${BASE:+$(cd "$BASE" && pwd)}
tests=packages/deepinfer-kernels-cuda/tests
t0=$(date +%s)
left() { echo $(( ${LIMIT_S:-570} - ($(date +%s) - t0) )); }
step() { echo "== $1 at +$(( $(date +%s) - t0 )) s"; }

step "GPU tests"
timeout -s INT 170 python3 -m pytest -q -rf -m gpu -p no:cacheprovider "$tests/test_linear_invariance_cuda.py" \
    "$tests/test_moe_invariance_cuda.py" "$tests/test_mhc_cuda.py" -k "invariant or bitwise or keep" \
    2>&1 | tail -30
step "whole-model cost"
# the whole log kept: a warning there (a failed graph capture: eager from then on) explains a ratio
timeout -s INT "$(( $(left) - 130 ))" python3 benchmarks/batch_invariance.py --cost --layers 2 --experts 64 \
    --batch 1 8 64 --json "$out/cost.json" > "$out/cost.log" 2>&1
grep "CUDA graphs:" "$out/cost.log" | head -5
grep -v -i warn "$out/cost.log" | tail -20
step "per-kernel variants"
(cd benchmarks/kernels && timeout -s INT "$(( $(left) - 40 ))" python3 invariant_prefill.py --out "$out" \
    --tokens 4096 ${base:+--baseline "$base"} 2>&1 | grep -E "^\{|kernels at|^ +[0-9.]+ us|Error" | cut -c1-220)
step "slice test (time left)"
timeout -s INT "$(left)" python3 -m pytest -q -rf -m "slow and gpu" -p no:cacheprovider \
    "$tests/test_batch_invariant_slice_cuda.py" -k "not engine" 2>&1 | tail -8
step "done"
