#!/usr/bin/env bash
# Engine benchmarks on a GPU host (the numbers in docs/performance.md, "Engine"): the engine's CPU
# overhead with a zero-cost model, then a Flash-width slice (4 layers, 16 routed experts) in bfloat16 on
# the best installed backend, async vs sync. Usage: benchmarks/engine_gpu.sh OUT_DIR
set -euo pipefail
out=${1:-/tmp/engine-bench}
mkdir -p "$out"
python3 benchmarks/engine_overhead.py --json-out "$out/overhead_async.json" | tee "$out/overhead_async.txt"
python3 benchmarks/engine_overhead.py --sync --json-out "$out/overhead_sync.json" | tee "$out/overhead_sync.txt"
di="python3 -m deepinfer.entrypoints.cli.main --log-level WARNING"
ck=/tmp/flash-slice
[ -f "$ck/config.json" ] || $di make-checkpoint --config flash_slice --layers 4 --experts 16 \
    --dspark-experts 8 --engram-vocab 1000 --out "$ck" --quiet
common=(--model "$ck" --device cuda --dtype bfloat16 --num-requests 128 --input-len 256 --output-len 128
        --overhead-batches 1,64,256 --overhead-steps 16 --max-num-seqs 256)
$di bench "${common[@]}" --json-out "$out/bench_async.json" | tee "$out/bench_async.txt"
$di bench "${common[@]}" --sync --json-out "$out/bench_sync.json" | tee "$out/bench_sync.txt"
