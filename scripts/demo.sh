#!/usr/bin/env bash
# The main job on the embedded default model: checkpoints/tiny-stdlib, a small DeepSeek-V4.1-architecture
# model (every layer kind, FP8/FP4 release format, DSpark drafter) trained on the Python standard library
# by tools/train (docs/training.md). It completes Python code; expect plausible, repetitive code from a
# 20M-parameter model trained for four minutes, not correct programs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
model=checkpoints/tiny-stdlib
uv run --frozen deepinfer describe --model "$model"
echo "== greedy completions of Python prompts by the default model (prompts end without a newline) =="
uv run --frozen deepinfer generate --model "$model" --max-tokens 64 --temperature 0 --log-level WARNING \
    --prompt "def fibonacci(n):" \
    --prompt "class Stack:
    \"\"\"A last-in, first-out stack.\"\"\"

    def __init__(self):" \
    --prompt "import os

def list_python_files(directory):" \
    --prompt "def is_prime(n):" "$@"
