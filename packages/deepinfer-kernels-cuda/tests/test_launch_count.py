"""benchmarks/launch_count.py on the CPU: a graphed decode step of the slice-shaped tiny model launches no
more kernels in the attention and indexer families than after session 8's cuts (attention per layer:
kernel, the step's keys encoded, split combine (or fold) storing the ring; indexer top-k: scores + 4 digit
passes + ids per index layer), in the default and the batch-invariant table. Slow: ~20 s (a subprocess:
the interpreter switch comes before triton's import)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_decode_step_launches_per_family(tmp_path):
    benchmarks = Path(__file__).resolve().parents[3] / "benchmarks"
    out = tmp_path / "counts.json"
    done = subprocess.run([sys.executable, "launch_count.py", "--dtype", "bfloat16", "--invariant", "--json",
                           str(out)], cwd=benchmarks, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(out.read_text())
    for case in ("bfloat16", "bfloat16 invariant"):
        families = counts[case]["families"]
        assert families["attention"] <= 3 * 5, (case, families)  # 5 layers
        assert families["indexer top-k"] == 6 * 3, (case, families)  # 3 index layers, several programs a row
        assert "aten::topk" not in str(counts[case]["kernels"])  # candidate mask: no torch radix sort
