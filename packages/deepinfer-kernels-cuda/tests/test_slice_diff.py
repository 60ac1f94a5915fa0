"""benchmarks/slice_diff.py on the CPU (reference ops, tiny config): teacher forcing pins an error to the
op that makes it, and the free-run report compares only rows no routing flip can reach."""

import torch

from deepinfer.ops import Ops, get_ops
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.testing.configs import tiny_config


def test_teacher_forcing_names_the_broken_op(sd):
    ref = get_ops("reference", "cpu")

    def linear(x, prepared, out_dtype):  # off by 1% on one output width only
        y = ref.linear(x, prepared, out_dtype)
        return y * 1.01 if y.shape[-1] == 64 else y

    cand = Ops("broken", {**REFERENCE_OPS, "linear": linear}, ())
    config = tiny_config("c2")
    tensors = sd.reference_forward_module().random_weights(config, torch.device("cpu"))
    teacher = sd.TeacherForcing(ref, cand)
    logits = sd.run_slice(config, tensors, None, teacher.ops, torch.float32, list(range(5, 17)), [20, 21])
    assert len(logits) == 3 and logits[0].shape[0] == 12
    table = {row["op"]: row for row in teacher.table()}
    broken = [op for op in table if op.startswith("linear") and op.endswith("(64,)")]
    assert broken and all(abs(table[op]["max_rel"] - 0.01) < 1e-6 for op in broken)
    assert all(row["max_rel"] == 0 for op, row in table.items() if op not in broken)
    assert table["moe E8 k2"]["calls"] == 3 * 3  # 3 layers x (prefill + 2 decode steps)


def test_free_run_report_compares_rows_before_the_first_flip(sd):
    want = [torch.randn(6, 10), torch.randn(1, 10), torch.randn(1, 10)]
    got = [w.clone() for w in want]
    got[0][3:] += 1.0  # rows from the flipped one on differ
    got[2] += 1.0
    ids = torch.arange(12).view(6, 2)
    flipped = ids.clone()
    flipped[3, 1] = 11
    dw, dg = sd.Decisions(), sd.Decisions()
    for step, (w_ids, g_ids) in enumerate([(ids, flipped), (ids[:1], ids[:1]), (ids[:1], ids[:1] + 1)]):
        for d, layer_ids in ((dw, w_ids), (dg, g_ids)):
            d.new_step()
            d.moe[step] += [w_ids, layer_ids]  # layer 1 agrees, layer 2 carries the flip
    prefill, decode1, decode2 = sd.free_run_report(want, got, dw, dg)["steps"]
    assert prefill["clean_rows"] == 3 and prefill["rel_clean_rows"] == 0 and prefill["rel"] > 0
    assert prefill["moe_flipped_rows_per_call"] == [0, 1]
    assert decode1["clean_rows"] == 1 and decode1["rel_clean_rows"] == 0
    assert decode2["clean_rows"] == 0 and decode2["rel_clean_rows"] is None
