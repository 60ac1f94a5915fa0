#!/usr/bin/env bash
# One GPU call for the fast-path issues (8, 9, 10): every GPU test (kernels, op conformance cuda vs
# reference, sync-free forward), then the Flash-width 5-layer slice on the cuda and reference backends and
# the HF transformers peer, all in the same run. Usage, on the device after benchmarks/device/install.sh:
#   benchmarks/device/fast_path.sh OUT_DIR   (SKIP_TESTS=1 / SKIP_B64=1 / SKIP_REF=1 / SKIP_PEER=1 to shorten;
#   TESTS="paths and pytest options" replaces the GPU test selection; SLOW_TESTS=1 adds the slow
#   whole-model GPU checks)
# The cuda slices decode eagerly (per-layer times) and then through CUDA graphs ("eager" in their JSON).
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
section() { echo "== $1 $(date -u +%T)"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
    section gpu-tests
    # every file with GPU tests (`pytest --collect-only -m gpu`), in TEST_WORKERS processes (pytest-xdist is in
    # the device image; 12 ran the ~850 non-slow cases in 70 s on 2026-12-02; one process where it is missing)
    core=packages/deepinfer-core/tests
    tests=${TESTS:-packages/deepinfer-kernels-cuda/tests tests/test_op_conformance.py $core/test_step_ops.py \
        $core/test_cuda_graphs.py $core/test_device_metadata.py $core/test_spec_engine.py \
        $core/test_sampling_sampler.py $core/test_cache_quant.py packages/deepinfer-spec/tests/test_confidence.py}
    workers=()
    python3 -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-12}")
    # shellcheck disable=SC2086  # TESTS is a list of words
    timeout -s INT "${TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider --tb=short -m "not slow" \
        "${workers[@]}" $tests > "$out/gpu_tests.txt" 2>&1
    grep -E "passed|failed|error" "$out/gpu_tests.txt" | tail -3
    grep -E "^(FAILED|ERROR)" "$out/gpu_tests.txt" | head -20
fi
if [ -n "${SLOW_TESTS:-}" ]; then
    # the slow GPU checks on whole models: Flash-slice logits cuda vs reference, batch invariance end to end
    section gpu-slow-tests
    timeout -s INT "${SLOW_TEST_S:-240}" python3 -m pytest -q -p no:cacheprovider --tb=short -s -m "slow and gpu" \
        packages/deepinfer-kernels-cuda/tests/test_linear_moe_slice_cuda.py \
        packages/deepinfer-kernels-cuda/tests/test_batch_invariant_slice_cuda.py \
        packages/deepinfer-kernels-cuda/tests/test_compressor_cuda.py > "$out/gpu_slow_tests.txt" 2>&1
    grep -E "passed|failed|error" "$out/gpu_slow_tests.txt" | tail -3
    grep -E "^(FAILED|ERROR)|relative error" "$out/gpu_slow_tests.txt" | head -20
fi
slice=(--device cuda --layers 5 --prefill "${PREFILL:-2048}" --decode 8 --dtype bfloat16)
decode_line() {  # decode ms/step eager and with graphs, from a slice JSON
    python3 -c "import json, sys; r = json.load(open(sys.argv[1])); e = r.get('eager', {}); \
print('decode ms/step: eager', e.get('decode_s', 0) * 1e3 / r['decode_steps'], 'graphs', \
r['decode_s'] * 1e3 / r['decode_steps'], 'prefill tok/s', r['prefill_tok_s'])" "$1"
}
section slice-cuda
timeout -s INT "${SLICE_S:-150}" python3 benchmarks/reference_forward.py "${slice[@]}" --backend cuda \
    --graphs both --json "$out/slice_cuda.json" > "$out/slice_cuda.txt" 2>&1
tail -4 "$out/slice_cuda.txt"
decode_line "$out/slice_cuda.json"
if [ -z "${SKIP_B64:-}" ]; then
    section slice-cuda-batch64
    timeout -s INT "${SLICE_S:-150}" python3 benchmarks/reference_forward.py --device cuda --layers 5 \
        --batch 64 --prefill 512 --decode 8 --dtype bfloat16 --backend cuda --graphs both \
        --json "$out/slice_cuda_b64.json" > "$out/slice_cuda_b64.txt" 2>&1
    tail -4 "$out/slice_cuda_b64.txt"
    decode_line "$out/slice_cuda_b64.json"
fi
if [ -z "${SKIP_REF:-}" ]; then
    section slice-reference
    timeout -s INT "${SLICE_S:-150}" python3 benchmarks/reference_forward.py "${slice[@]}" --backend reference \
        --graphs off --json "$out/slice_reference.json" > "$out/slice_reference.txt" 2>&1
    tail -25 "$out/slice_reference.txt"
fi
if [ -z "${SKIP_PEER:-}" ]; then
    section hf-peer
    timeout -s INT "${PEER_S:-150}" python3 benchmarks/hf_peer.py --layers 5 --prefill "${PREFILL:-2048}" \
        --decode 8 --batch 1 --json "$out/hf_peer.json" > "$out/hf_peer.txt" 2>&1
    tail -15 "$out/hf_peer.txt"
fi
section done
