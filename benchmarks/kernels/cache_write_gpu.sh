#!/usr/bin/env bash
# One GPU call for the cache-write, compressor and Engram kernels: their GPU tests (four pytest processes
# at once, so the Triton compiles overlap), then benchmarks/kernels/cache_write.py and engram.py.
# Usage: benchmarks/kernels/cache_write_gpu.sh OUT_DIR (after installing the wheels); time limits in s
# from TEST_S, BENCH_S, ENGRAM_S.
set -uo pipefail
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
t=packages/deepinfer-kernels-cuda/tests
run() { timeout -s INT "${TEST_S:-38}" python3 -m pytest -q -p no:cacheprovider --tb=short -rA "$@"; }
echo "== tests $(date -u +%T)"
run "$t/test_cache_write_cuda.py" > "$out/t_cache_write.txt" 2>&1 &
run "$t/test_compressor_cuda.py" > "$out/t_compressor.txt" 2>&1 &
run "$t/test_engram_cuda.py" > "$out/t_engram.txt" 2>&1 &
run tests/test_op_conformance.py -k "backend and (cache_write or compressor_update or engram or quantize)" \
    > "$out/t_conformance.txt" 2>&1 &
wait
for f in "$out"/t_*.txt; do echo "$(basename "$f"): $(tail -1 "$f")"; done
grep -hE "^(FAILED|ERROR)|rel. error" "$out"/t_*.txt | head -20
cd benchmarks/kernels
echo "== cache_write.py $(date -u +%T)"
timeout -s INT "${BENCH_S:-20}" python3 cache_write.py --out "$out/bench.md" > "$out/cache_write.txt" 2>&1
echo "== engram.py $(date -u +%T)"
timeout -s INT "${ENGRAM_S:-10}" python3 engram.py --out "$out/bench.md" > "$out/engram.txt" 2>&1
cat "$out/bench.md"
tail -n 3 "$out/cache_write.txt" "$out/engram.txt"
echo "== done $(date -u +%T)"
