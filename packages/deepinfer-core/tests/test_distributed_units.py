"""Distributed pieces that need no second process: placement and EPLB policy, request assignment,
sharded checkpoint loading, and the expert-parallel MoE path on a one-rank group (with redundant
expert slots) against the single-process op."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from deepinfer.checkpoint import load_checkpoint
from deepinfer.checkpoint.formats import quantize_fp4, quantize_fp8
from deepinfer.config import TextConfig
from deepinfer.distributed.frontend import assign_least_loaded
from deepinfer.distributed.placement import ExpertPlacement, _peak_sums, balanced_placement, imbalance
from deepinfer.distributed.state import ParallelState, parallel_state, use_parallel
from deepinfer.models.deepseek_v41.moe import MoE
from deepinfer.models.deepseek_v41.weights import Weights
from deepinfer.ops import get_ops
from deepinfer.testing import write_tiny_checkpoint
from deepinfer.testing.flash import FLASH_TEXT_CONFIG

OPS = get_ops("reference")


def test_initial_placement_is_logical_order_then_redundant_copies():
    p = ExpertPlacement.initial(8, redundant=3, world_size=4)  # 11 slots rounded up to 12
    assert p.slots == (0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3)
    assert p.local_logical(2) == [6, 7, 0]
    table, count = p.replica_table(torch.device("cpu"))
    assert count.tolist() == [2, 2, 2, 2, 1, 1, 1, 1]
    assert table[0].tolist() == [0, 8] and table[7].tolist() == [7, 7]
    with pytest.raises(ValueError, match="cannot be spread"):
        ExpertPlacement.initial(2, 0, 4)


def test_balanced_placement_replicates_hot_experts_and_lowers_the_peak():
    load = torch.tensor([400.0, 10, 10, 10, 300, 10, 10, 10])
    old = ExpertPlacement.initial(8, 2, 2)
    new = balanced_placement(load, len(old.slots), 2)
    assert sorted(set(new.slots)) == list(range(8))  # every expert still has a slot
    assert new.slots.count(0) == 2 and new.slots.count(4) == 2  # the two hot experts got the replicas
    assert all(len(set(new.local_logical(r))) == new.per_rank for r in range(2))  # no copy twice on a rank
    before, after = imbalance(old.rank_loads(load)), imbalance(new.rank_loads(load))
    assert after < before and after == pytest.approx(1.0, abs=0.05)
    assert balanced_placement(load, 10, 2) == new  # deterministic: every rank computes the same


def test_peak_objective_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    current, changed = torch.rand(7, 5, generator=g, dtype=torch.float64), torch.rand(7, 5, generator=g,
                                                                                          dtype=torch.float64)
    want = []
    for c in range(5):
        trial = current.clone()
        trial[:, c] = changed[:, c]
        want.append(float(trial.max(1).values.sum()))
    assert _peak_sums(current, changed).tolist() == pytest.approx(want, abs=1e-12)


def test_balanced_placement_takes_a_series_of_steps():
    steps = torch.tensor([[300.0, 0, 10, 10, 10, 10, 10, 10], [100, 0, 10, 10, 300, 10, 10, 10]])
    new = balanced_placement(steps, 10, 2)
    assert new.slots.count(0) == 2 and new.slots.count(4) == 2
    assert imbalance(new.rank_loads(steps.sum(0))) < imbalance(ExpertPlacement.initial(8, 2, 2).rank_loads(
        steps.sum(0)))


def test_one_rank_is_no_parallel_layout():
    with use_parallel(ParallelState(0, 1, None)) as active:
        assert active is None
    with use_parallel(ParallelState(0, 2, None)) as active:
        assert active is not None and parallel_state() is active
    assert parallel_state() is None


def test_requests_go_to_the_least_loaded_rank():
    assert assign_least_loaded([10, 3, 3, 3, 1], 2) == [0, 1, 1, 1, 1]
    assert assign_least_loaded([5, 5, 5], 4) == [0, 1, 2]


def test_sharded_load_maps_only_this_ranks_experts_and_engram_rows(tmp_path, caplog):
    path = write_tiny_checkpoint("engram", tmp_path / "ckpt", seed=1)
    full = load_checkpoint(path, progress=False).tensors
    state = ParallelState(rank=1, world_size=2, group=None, redundant_experts=1)  # slots 5..9 of 10
    with caplog.at_level("INFO", logger="deepinfer.checkpoint.loader"):
        part = load_checkpoint(path, progress=False, shard=state).tensors
    assert "rank 1/2: loaded" in caplog.text  # load time per rank
    experts = {int(n.split(".")[4]) for n in part if ".ffn.experts." in n and n.startswith("layers.0.")}
    assert experts == {0, 1, 5, 6, 7}
    table = "layers.1.engram.embed.weight"
    begin, end = state.engram_rows(full[table].shape[0])
    assert end == full[table].shape[0] and 0 < begin < end
    assert torch.equal(part[table].view(torch.uint8), full[table][begin:end].view(torch.uint8))
    assert torch.equal(part["layers.1.engram.embed.scale"].view(torch.uint8),
                       full["layers.1.engram.embed.scale"][begin:end].view(torch.uint8))
    assert part.keys() - full.keys() == set()
    assert {n for n in full.keys() - part.keys() if ".ffn.experts." not in n} == set()


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_expert_parallel_moe_equals_the_single_process_op(one_rank_group):
    cfg = TextConfig.from_hf({**FLASH_TEXT_CONFIG, "hidden_size": 64, "moe_intermediate_size": 32,
                              "n_routed_experts": 8, "num_experts_per_tok": 3})
    g = torch.Generator().manual_seed(3)
    h, i, e = 64, 32, 8
    t = {"gate.weight": torch.randn(e, h, generator=g).bfloat16(), "gate.bias": torch.randn(e, generator=g),
         "gate.bias_vl": torch.randn(e, generator=g)}
    for name, (r, c) in {"w1": (i, h), "w3": (i, h), "w2": (h, i)}.items():
        t[f"layers.0.ffn.shared_experts.{name}.weight"], t[f"layers.0.ffn.shared_experts.{name}.scale"] = (
            quantize_fp8(torch.randn(r, c, generator=g) * 0.1))
        for x in range(e):
            t[f"layers.0.ffn.experts.{x}.{name}.weight"], t[f"layers.0.ffn.experts.{x}.{name}.scale"] = (
                quantize_fp4(torch.randn(r, c, generator=g) * 0.1))
    t.update({f"layers.0.ffn.{k}": v for k, v in t.items() if k.startswith("gate.")})
    single = MoE.load(Weights(dict(t)).sub("layers.0.ffn."), cfg, e, 3, OPS, torch.float32)
    # a one-rank "group" (use_parallel ignores one rank) still dispatches through the exchange, here
    # over 8 + 5 slots: 5 experts have two replicas, their pairs split over both
    state = ParallelState(0, 1, None, redundant_experts=5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("deepinfer.models.deepseek_v41.moe.parallel_state", lambda: state)
        parallel = MoE.load(Weights(dict(t)).sub("layers.0.ffn."), cfg, e, 3, OPS, torch.float32)
    assert parallel.ep is not None and len(parallel.ep.placement.slots) == 13
    x = torch.randn(37, h, generator=g)
    torch.testing.assert_close(parallel(x), single(x), rtol=0, atol=1e-5)
    empty = torch.zeros(0, h)
    assert parallel(empty).shape == (0, h)
    assert parallel.ep.loads[0].sum() == 37 * 3  # counters: every routed pair of the first call
