#!/usr/bin/env bash
# Makes a fresh machine ready: uv (from PyPI) and a Rust toolchain if missing, then the workspace venv
# (.venv) with every package installed from uv.lock. Safe to run again; uv's cache makes reruns fast.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$HOME/.local/bin:$HOME/.cargo/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
    echo "bootstrap: installing uv from PyPI" >&2
    python3 -m pip install --quiet --user uv
fi
if ! command -v cargo >/dev/null 2>&1; then
    # deepseek-recipe is a Rust extension built from source by maturin.
    echo "bootstrap: installing a Rust toolchain (Debian package cargo)" >&2
    if [ "$(id -u)" = 0 ]; then apt-get install -y -q cargo; else sudo apt-get install -y -q cargo; fi
fi
uv sync --all-packages --frozen --quiet
