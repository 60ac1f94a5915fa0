#!/usr/bin/env bash
# Regenerate every nemo-automodel parity fixture: for each (tiny config, seed) make the checkpoint
# with OUR deterministic writer (root venv), record nemo's outputs for it (nemo venv), and drop the
# checkpoint again (the test regenerates it from the recipe stored in meta.json).
#
# usage: tools/reference/record_all.sh [CONFIG:SEED ...]      (default: the list below)
# env:   NEMO_VENV (default /work/venvs/nemo-v41; built on first use), THREADS (default 1)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NEMO_VENV="${NEMO_VENV:-/work/venvs/nemo-v41}"
FIXTURES="$ROOT/packages/deepinfer-core/tests/fixtures/nemo"
DEFAULT_CASES=(tiny:0)

if [ ! -x "$NEMO_VENV/bin/python" ]; then
  "$ROOT/tools/reference/make_nemo_venv.sh" "$NEMO_VENV"
fi

cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=("${DEFAULT_CASES[@]}")

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for case in "${cases[@]}"; do
  name="${case%%:*}"
  seed="${case##*:}"
  echo "== $name seed $seed"
  rm -rf "$work/ckpt"
  "$ROOT/.venv/bin/deepinfer" make-checkpoint --config "$name" --seed "$seed" --out "$work/ckpt"
  TORCHDYNAMO_DISABLE=1 "$NEMO_VENV/bin/python" "$ROOT/tools/reference/record_nemo_reference.py" \
    --checkpoint "$work/ckpt" --config-name "$name" --seed "$seed" --threads "${THREADS:-1}" \
    --out "$FIXTURES/${name}_${seed}" > "$work/summary.json"
  du -sh "$FIXTURES/${name}_${seed}"
done
