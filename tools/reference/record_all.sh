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
DEFAULT_CASES=(swa_only:0 c2:0 c1_yoco:0 reindex:0 engram:0 dspark:0 full:0 full:1)

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
  if "$ROOT/.venv/bin/deepinfer" make-checkpoint --help >/dev/null 2>&1; then
    "$ROOT/.venv/bin/deepinfer" make-checkpoint --config "$name" --seed "$seed" --out "$work/ckpt"
  else  # the writer's Python API, as the parity test calls it
    "$ROOT/.venv/bin/python" -c "import sys; from pathlib import Path
from deepinfer.checkpoint.writer import write_checkpoint
from deepinfer.testing.configs import tiny_config
from deepinfer.tokenizer import build_synthetic_tokenizer
write_checkpoint(tiny_config(sys.argv[1]), Path(sys.argv[3]), seed=int(sys.argv[2]),
                 tokenizer=build_synthetic_tokenizer(), progress=False)" "$name" "$seed" "$work/ckpt"
  fi
  TORCHDYNAMO_DISABLE=1 "$NEMO_VENV/bin/python" "$ROOT/tools/reference/record_nemo_reference.py" \
    --checkpoint "$work/ckpt" --config-name "$name" --seed "$seed" --threads "${THREADS:-1}" \
    --out "$FIXTURES/${name}_${seed}" > "$work/summary.json"
  du -sh "$FIXTURES/${name}_${seed}"
done
