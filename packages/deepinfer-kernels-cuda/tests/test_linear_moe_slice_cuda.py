"""Whole-model checks of the cuda backend against the reference backend on the GPU, on the same weights
(benchmarks/reference_forward.py's random tensors in the storage formats, drawn on the device), through
benchmarks/slice_diff.py. A V4.1-Flash-width slice (4 layers of the four attention kinds, 384 experts,
DSpark block) in BF16, a 36-token prefill (logits at every position) and 4 teacher-forced decode steps.

Why not one bound on all logits: the former check (relative Frobenius error <= 3e-2 on every step) failed
on the H200 with 0.051 (prefill) and 0.109 (first decode step), 0.012-0.013 on the others. Diagnosed
(H200 run of 2026-12-01 19:53 UTC): every op, fed the same inputs, matches its reference within 7e-4
(MoE; linears <= 2.1e-4, attention 2.2e-3, the rest <= 6e-5), and the router picks the same top-6 of 384
on all 160 rows; but end to end, BF16 summation-order noise moves the router's input, and where two
experts' scores are closer than that noise the top-6 set flips, which swaps a sixth of that row's routed
output. The reference against itself with every linear accumulated in float32 (`reordered`: another
summation order, nothing else) shows the same signature: 0.098 on the one decode step with a flip (1 row
of 4 layers), 0.012-0.014 on the others, prefill 0.029 with 3 of 36 rows flipped. So:

* identical inputs per op (teacher forcing: every op runs both backends on the reference forward's
  inputs, the reference output drives the model): each op within its conformance tolerance, at the
  shapes and paths the model really takes. Float outputs: relative Frobenius error <= 1e-2 in BF16
  (summation order plus one-ulp rounding flips), <= 3e-3 for the LM head (the cuda backend holds the
  F32 head in BF16 for a BF16 model, as the official engine: ~1.1e-3 from rounding the weight); index
  outputs (indexer top-k): rows whose selected set differs <= 2%; MoE: rows whose top-6 differs on the
  same input <= 2% (exact near-ties only), every other row within the BF16 bound. A kernel bug at a
  Flash shape shows here as one op's error instead of a drift through the layers.
* free runs (each backend runs the whole forward, eagerly: the decisions are copied to the host; the
  graph path is checked by test_cuda_graphs): per step, the error on the causally clean rows (before
  the first row whose routing or indexer top-k flipped in any layer; causal attention keeps a flip out
  of earlier rows) <= 3e-2 (noise measured 0.012-0.017), and flips in at most 10% of (row, layer) pairs or
  twice the `reordered` run's flips on the same weights, whichever is more: a broken router or expert path
  would flip far more. The count takes every flipped (row, layer) pair, also rows that a flip in an earlier
  layer already moved, so it grows with the noise: `reordered` flipped 4 of 160 (2.5%) on 2026-12-01, 12 of
  160 (7.5%: prefill 0 / 4 / 5 / 2 per layer) on 2026-12-02, when the cuda run flipped 20 (0 / 3 / 7 / 9 + 1
  in decode) with every op within its bound on identical inputs. The `reordered` run is printed alongside.
* a tiny config in float32: greedy tokens equal over a prefill and decode steps.
"""

import pytest
import torch

from deepinfer.ops import get_ops
from deepinfer.testing.configs import flash_slice_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLICE_TOL = 3e-2
OP_TOL = {torch.bfloat16: 1e-2}
HEAD_TOL = 3e-3  # the F32 head held in BF16: each weight rounded by <= 2^-9 (rms ~1.1e-3 of the logits)
FLIP_SHARE = 0.02  # same inputs: rows whose top-k may differ (exact near-ties)
FREE_FLIP_SHARE = 0.1  # free runs: (row, layer) pairs whose top-6 may differ (noise-driven near-ties)


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
        elif op.startswith("linear dense") and "(129280,)" in op:  # the LM head
            bound = HEAD_TOL
        else:
            bound = OP_TOL[torch.bfloat16]
        assert row["max_rel"] <= bound, row


def test_flash_slice_logits_match_reference(sd, flash):
    config, tensors, token_map, prompt, decode = flash
    bf16 = torch.bfloat16
    dw = sd.Decisions()
    want = sd.run_slice(config, tensors, token_map, sd.recording(get_ops("reference", "cuda"), dw), bf16,
                        prompt, decode, decisions=dw)
    reports = {}
    for name in ("reordered", "cuda"):
        dg = sd.Decisions()
        ops = sd.recording(sd.candidate_ops(name, "cuda"), dg)
        got = sd.run_slice(config, tensors, token_map, ops, bf16, prompt, decode, decisions=dg)
        assert all(torch.isfinite(g).all() for g in got)
        reports[name] = sd.free_run_report(want, got, dw, dg)["steps"]
        for row in reports[name]:
            print(name, row)
    steps = reports["cuda"]
    for row in steps:
        if row["clean_rows"]:
            assert row["rel_clean_rows"] <= SLICE_TOL, row
    flipped, noise = (sum(sum(row["moe_flipped_rows_per_call"]) for row in reports[name])
                      for name in ("cuda", "reordered"))
    pairs = sum(row["rows"] * len(row["moe_flipped_rows_per_call"]) for row in steps)
    assert flipped <= max(FREE_FLIP_SHARE * pairs, 2 * noise), steps


def test_tiny_float32_greedy_tokens_match_reference(tiny_full_logits):
    want, got = (tiny_full_logits(get_ops(backend, "cuda")) for backend in ("reference", "cuda"))
    assert torch.equal(got[0].argmax(-1), want[0].argmax(-1))
    assert [int(g.argmax()) for g in got[1:]] == [int(w.argmax()) for w in want[1:]]
