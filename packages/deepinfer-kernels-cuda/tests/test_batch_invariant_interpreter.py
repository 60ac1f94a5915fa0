"""Batch-invariant mode of the cuda kernels without a GPU: the Triton interpreter runs the `cuda` op table
(get_ops' invariant binding, reference row-wise fallbacks) on the CPU over the tiny `engram` config
(Engram, compressors, indexer; release cache; float32, since the interpreter's bf16 dot is wrong). A
probe's prefill and decode logits are bitwise the same alone and in three batches (3 sequences; 8 with
the probe 4th; a prefill joining a decode step); the default table, run the same way, is not (the check
can fail). Slow: minutes in the interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
from reference_forward import random_weights, token_map
from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, build_runtime
from deepinfer.ops import Ops
from deepinfer.ops.reference.backend import ReferenceBackend
from deepinfer.testing.configs import tiny_config
from deepinfer.testing.invariance import Scenario, allocate, differing_steps, probe_logits
from deepinfer_kernels_cuda.backend import CudaBackend

PROBE, DECODE = 16, 2
config = tiny_config("engram")
tensors = random_weights(config, torch.device("cpu"))
for invariant, scenarios in ((True, [Scenario((5, 12)), Scenario((9, 2, 6, 15, 3, 1, 7), at=3),
                                     Scenario((6,), late=(20,), at=1)]),
                             (False, [Scenario((9, 2, 6, 15, 3, 1, 7), at=3)])):
    cuda, reference = CudaBackend(), ReferenceBackend()
    table = {**reference.ops(batch_invariant=invariant), **cuda.ops(batch_invariant=invariant)}
    ops = Ops("cuda", table, (), cuda.plan, invariant)
    options = RuntimeOptions(cache_precision="release", batch_invariant=invariant)
    runtime = build_runtime(config, dict(tensors), dtype=torch.float32, ops=ops,
                            engram_token_map=token_map(config), options=options)
    allocate(runtime, 40, 9)
    alone = probe_logits(runtime, Scenario(), PROBE, DECODE)
    print(invariant, [differing_steps(probe_logits(runtime, s, PROBE, DECODE), alone) for s in scenarios])
"""


def test_invariant_table_is_bitwise_in_batches_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    benchmarks = Path(__file__).resolve().parents[3] / "benchmarks"
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(benchmarks)], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "True [[], [], []]", lines  # invariant: no step differs in any batch
    assert lines[1] != "False [[]]", lines  # default: some step differs
