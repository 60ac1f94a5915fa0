#!/usr/bin/env bash
# The main job on the embedded default model: checkpoints/tiny-stdlib, a small DeepSeek-V4.1-architecture
# model (every layer kind, FP8/FP4 release format, DSpark drafter) trained on the Python standard library
# by tools/train (docs/training.md). It completes Python code; expect plausible, repetitive code from a
# 20M-parameter model trained for four minutes, not correct programs. Extra options go to every
# `deepinfer generate` call (e.g. `scripts/demo.sh --temperature 0` for greedy decoding).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
model=checkpoints/tiny-stdlib
uv run --frozen deepinfer describe --model "$model"
prompts=(
    "def fibonacci(n):"
    $'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):'
    $'import os\n\ndef list_python_files(directory):'
    "def is_prime(n):"
)
# Prompts end without a newline (the tokenizer merges a newline with the next line's indentation).
# Seeded sampling reads better than greedy decoding, which loops at this size.
for prompt in "${prompts[@]}"; do
    printf '\n==== prompt + completion (64 tokens) ====\n%s' "$prompt"
    uv run --frozen deepinfer generate --model "$model" --max-tokens 64 --log-level WARNING --stream \
        --temperature 0.6 --top-p 0.9 --repetition-penalty 1.1 --sampling-seed 1 --prompt "$prompt" "$@"
done
