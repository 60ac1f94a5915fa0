"""Whole-model checks of the cuda backend against the reference backend on the GPU, on the same weights
(benchmarks/reference_forward.py's random tensors in the storage formats, drawn on the device), through
benchmarks/slice_diff.py. A V4.1-Flash-width slice (4 layers of the four attention kinds, 384 experts,
DSpark block) in BF16, a 36-token prefill (logits at every position) and 4 teacher-forced decode steps:

* identical inputs per op (teacher forcing: every op runs both backends on the reference forward's
  inputs, the reference output drives the model): each op within its conformance tolerance, at the
  shapes and paths the model really takes. Float outputs: relative Frobenius error <= 1e-2 in BF16
  (summation order plus one-ulp rounding flips; typically ~2e-3), <= 1e-5 in float32 (the LM head);
  index outputs (indexer top-k): rows whose selected set differs <= 2% (exact near-ties only); MoE:
  rows whose top-6 of 384 experts differs on the same input <= 2% (the router's float32 summation
  order decides near-ties), the output of every other row within the BF16 bound. A kernel bug at any
  Flash shape shows here as one op's error, not as a drift through the layers.
* free runs (each backend runs the whole forward; the cuda decode steps replay CUDA graphs): logits per
  step. End to end the two backends are not comparable row for row: BF16 summation-order noise moves
  the router's input, and where two of 384 experts' scores are closer than that noise the top-6 set
  flips, which swaps a sixth of the routed output of that row (measured in the session-5 GPU run: see
  docs/performance.md, issue 9). So the bound (3e-2) applies to rows whose routing agreed in every
  layer; flipped rows are counted and printed. The same comparison for the reference against itself
  with every linear accumulated in float32 (`reordered`: another summation order, nothing else) is
  printed alongside: the noise floor of any correct kernel.
* a tiny config in float32: greedy tokens equal over a prefill and decode steps.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from deepinfer.ops import get_ops
from deepinfer.testing.configs import flash_slice_config, tiny_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLICE_TOL = 3e-2
OP_TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
FLIP_SHARE = 0.02


def _slice_diff():
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "slice_diff.py"
    spec = importlib.util.spec_from_file_location("slice_diff", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sd():
    return _slice_diff()


@pytest.fixture(scope="module")
def flash(sd):
    rf = sd.reference_forward_module()
    config = flash_slice_config(num_layers=4)
    tensors = rf.random_weights(config, torch.device("cuda"))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, config.text.vocab_size, (40,), generator=gen).tolist()
    yield config, tensors, rf.token_map(config), tokens[:36], tokens[36:]
    del tensors
    torch.cuda.empty_cache()


def test_flash_slice_ops_match_reference_on_identical_inputs(sd, flash):
    config, tensors, token_map, prompt, decode = flash
    teacher = sd.TeacherForcing(get_ops("reference", "cuda"), get_ops("cuda", "cuda"))
    sd.run_slice(config, tensors, token_map, teacher.ops, torch.bfloat16, prompt, decode)
    table = teacher.table()
    for row in table:
        print(row)
    assert {row["op"].split()[0] for row in table} >= {"linear", "moe"}
    for row in table:
        op = row["op"]
        if "router_flipped_rows" in row:
            assert row["router_flipped_rows"] <= FLIP_SHARE * row["rows"], row
        if op.startswith("indexer_topk"):
            bound = FLIP_SHARE if op.endswith("[0]") else OP_TOL[torch.bfloat16]
        elif op.startswith("linear dense") and "(129280,)" in op:  # the float32 LM head
            bound = OP_TOL[torch.float32]
        else:
            bound = OP_TOL[torch.bfloat16]
        assert row["max_rel"] <= bound, row


def test_flash_slice_logits_match_reference(sd, flash):
    config, tensors, token_map, prompt, decode = flash
    bf16 = torch.bfloat16
    dw = sd.Decisions()
    want = sd.run_slice(config, tensors, token_map, sd.recording(get_ops("reference", "cuda"), dw), bf16,
                        prompt, decode)
    reports = {}
    for name, graphs in (("reordered", False), ("cuda", True)):
        dg = sd.Decisions()
        ops = sd.recording(sd.candidate_ops(name, "cuda"), dg)
        got = sd.run_slice(config, tensors, token_map, ops, bf16, prompt, decode, graphs=graphs)
        assert all(torch.isfinite(g).all() for g in got)
        reports[name] = sd.free_run_report(want, got, dw, dg)["steps"]
        for row in reports[name]:
            print(name, row)
    for row in reports["cuda"]:
        assert row["topk_flipped_rows_per_call"] == [0] * len(row["topk_flipped_rows_per_call"]), row
        if row["unflipped_rows"]:
            assert row["rel_unflipped_rows"] <= SLICE_TOL, row


def test_tiny_float32_greedy_tokens_match_reference(sd):
    rf = sd.reference_forward_module()
    config = tiny_config("full")
    tensors = rf.random_weights(config, torch.device("cuda"))
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, config.text.vocab_size, (20,), generator=gen).tolist()
    token_map = rf.token_map(config)
    want, got = (sd.run_slice(config, tensors, token_map, get_ops(backend, "cuda"), torch.float32, prompt, 4,
                              graphs=True) for backend in ("reference", "cuda"))
    assert torch.equal(got[0].argmax(-1), want[0].argmax(-1))
    assert [int(g.argmax()) for g in got[1:]] == [int(w.argmax()) for w in want[1:]]
