"""Whole-model checks of the cuda backend against the reference backend on the GPU, on the same weights:

* a V4.1-Flash-width slice (4 layers of the four attention kinds, 384 experts, DSpark block) in BF16:
  logits of a prefill (every position) and of teacher-forced decode steps. Tolerance: relative Frobenius
  error <= 3e-2 per step. Both backends round at the same points; what differs is float32 summation order
  inside the kernels, and each BF16 rounding that order flips propagates through the residual stream.
* a tiny config in float32: greedy tokens equal over a prefill and decode steps.

Weights come from benchmarks/reference_forward.py (random tensors in the storage formats, drawn on the
device), so the slice is the one the speed benchmarks run.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from deepinfer.models.deepseek_v41.runtime import RuntimeOptions, build_runtime
from deepinfer.models.interface import ForwardBatch, SequenceSegment
from deepinfer.ops import get_ops
from deepinfer.testing.configs import flash_slice_config, tiny_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLICE_TOL = 3e-2


def _reference_forward():
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "reference_forward.py"
    spec = importlib.util.spec_from_file_location("reference_forward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(config, tensors, token_map, backend: str, dtype: torch.dtype, prompt: list[int],
         decode: list[int] | None) -> list[torch.Tensor]:
    """Logits of the prefill (every position) then of each decode step; decode None: greedy (argmax).
    The runtime releases checkpoint entries it has consumed: it gets its own dict of the tensors."""
    runtime = build_runtime(config, dict(tensors), dtype=dtype, ops=get_ops(backend, "cuda"),
                            engram_token_map=token_map, options=RuntimeOptions(cache_precision="release"))
    steps = len(decode) if decode is not None else 4
    blocks = -(-(len(prompt) + steps) // runtime.cache_layout().block_size)
    runtime.allocate_cache(blocks + 1, 2)
    table = list(range(1, blocks + 1))
    out = runtime.forward(ForwardBatch([SequenceSegment(1, table, 0, prompt, logits="all")]))
    logits = [out.logits.float().cpu()]
    for i in range(steps):
        token = decode[i] if decode is not None else int(logits[-1][-1].argmax())
        out = runtime.forward(ForwardBatch([SequenceSegment(1, table, len(prompt) + i, [token])]))
        logits.append(out.logits.float().cpu())
    del runtime
    torch.cuda.empty_cache()
    return logits


def test_flash_slice_logits_match_reference():
    rf = _reference_forward()
    config = flash_slice_config(num_layers=4)
    tensors = rf.random_weights(config, torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, config.text.vocab_size, (40,), generator=gen).tolist()
    prompt, decode = tokens[:36], tokens[36:]
    token_map = rf.token_map(config)
    want = _run(config, tensors, token_map, "reference", torch.bfloat16, prompt, decode)
    got = _run(config, tensors, token_map, "cuda", torch.bfloat16, prompt, decode)
    errs = [float((g.double() - w.double()).norm() / w.double().norm())
            for g, w in zip(got, want, strict=True)]
    print(f"flash slice logits, relative error per step (prefill, decode...): {errs}")
    assert all(torch.isfinite(g).all() for g in got)
    assert max(errs) <= SLICE_TOL, errs


def test_tiny_float32_greedy_tokens_match_reference():
    rf = _reference_forward()
    config = tiny_config("full")
    tensors = rf.random_weights(config, torch.device("cuda"))
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, config.text.vocab_size, (20,), generator=gen).tolist()
    token_map = rf.token_map(config)
    want = _run(config, tensors, token_map, "reference", torch.float32, prompt, None)
    got = _run(config, tensors, token_map, "cuda", torch.float32, prompt, None)
    assert torch.equal(got[0].argmax(-1), want[0].argmax(-1))
    assert [int(g.argmax()) for g in got[1:]] == [int(w.argmax()) for w in want[1:]]
