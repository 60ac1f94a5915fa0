#!/usr/bin/env bash
# Runs the project's checks on a fresh or existing machine: lint, then the test suite on CPU.
# GPU tests skip themselves without a CUDA device; slow tests run with `scripts/test.sh -m slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$HOME/.local/bin:$PATH"
uv run --frozen ruff check .
uv run --frozen pytest -m "not slow" -q "$@"
