#!/usr/bin/env bash
# The main job on the embedded default model: a tiny DeepSeek-V4.1-format checkpoint with RANDOM
# weights, built on first use under checkpoints/ (seconds), so the output text is meaningless.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
model=checkpoints/tiny-default
if [ ! -f "$model/model.safetensors.index.json" ]; then
    uv run --frozen deepinfer make-checkpoint --config full --out "$model" --seed 0
fi
uv run --frozen deepinfer describe --model "$model"
echo "== generating with the tiny default model: its weights are RANDOM, so the text is noise =="
uv run --frozen deepinfer generate --model "$model" --max-tokens 32 \
    --prompt "The quick brown fox" --prompt "Hello world" "$@"
