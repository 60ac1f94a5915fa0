"""The MoE tile table: the down kernel's own entries (same block_m as the gate+up entry, else an error
naming both), the maxnreg / tma / pdl fields (tables written before them load with 0), the checks on TMA
tiles, and the shipped H200 table's TMA entries passing them."""

import json
from types import SimpleNamespace

import pytest
import torch

from deepinfer_kernels_cuda import configs, moe
from deepinfer_kernels_cuda.configs import TileConfig

CUDA0 = torch.device("cuda", 0)  # only looked up by name here: no device needed
UP = TileConfig(64, 64, 64, 1, 4, 3, 128)


def _table(monkeypatch, entries: dict[str, TileConfig]) -> None:
    monkeypatch.setattr(configs, "_entry", lambda kernel, n, k, bucket, index: entries.get(
        configs.key(kernel, n, k, bucket)))


def test_down_entry_is_used_where_present(monkeypatch):
    down = TileConfig(128, 64, 64, 1, 8, 3)
    _table(monkeypatch, {"moe-down:5120x2304:16384": down})
    assert configs.lookup_moe_down(12288, 384, 5120, 2304, CUDA0, UP) == down
    assert configs.lookup_moe_down(24576, 384, 5120, 2304, CUDA0, UP) == UP  # no entry at 32768
    assert configs.lookup_moe_down(12288, 384, 5120, 2304, torch.device("cpu"), UP) == UP


def test_down_entry_with_another_block_m_is_refused(monkeypatch):
    _table(monkeypatch, {"moe-down:5120x2304:16384": TileConfig(128, 32, 64, 1, 8, 3)})
    with pytest.raises(ValueError, match="block_m 32, the gate\\+up entry's is 64"):
        configs.lookup_moe_down(12288, 384, 5120, 2304, CUDA0, UP)


def test_maxnreg_round_trips_and_defaults_to_zero(tmp_path):
    path = tmp_path / "gpu.json"
    boxed, pdl = TileConfig(256, 64, 64, 1, 8, 3, 0, 3), TileConfig(4, 1, 1024, 1, 4, 1, pdl=1)
    configs.save(path, {"moe:5120x2304:16384": UP, "moe-down:5120x2304:16384": boxed, "fp8:1280x5120:1": pdl})
    assert configs.load(path) == {"moe:5120x2304:16384": UP, "moe-down:5120x2304:16384": boxed,
                                  "fp8:1280x5120:1": pdl}
    old = {"block_n": 64, "block_m": 16, "block_k": 128, "split_k": 1, "num_warps": 4, "num_stages": 4}
    path.write_text(json.dumps({"moe:5120x2304:512": old}))
    configs.save(tmp_path / "other.json", {})  # clears the table cache
    assert configs.load(path)["moe:5120x2304:512"].maxnreg == 0


STACKED_FP4 = SimpleNamespace(fp8=False, expert_strides=(1,))  # what _check_tma reads of a _Mlp
TMA_UP = TileConfig(128, 64, 128, 1, 8, 3, 128, 1)
PLAIN = TileConfig(128, 64, 64, 1, 8, 3)
ONLY_STACKED_FP4 = "aligned stacked FP4 experts only"


@pytest.mark.parametrize("mlp, direct, up, down, message", [
    (SimpleNamespace(fp8=True, expert_strides=(1,)), False, TMA_UP, TMA_UP, ONLY_STACKED_FP4),
    (SimpleNamespace(fp8=False, expert_strides=None), False, TMA_UP, TMA_UP, ONLY_STACKED_FP4),
    (STACKED_FP4, True, TMA_UP, TMA_UP, ONLY_STACKED_FP4),
    (STACKED_FP4, False, TileConfig(512, 64, 128, 1, 8, 3, 0, 1), PLAIN, "block_n must divide 2304 / 5120"),
    (STACKED_FP4, False, TMA_UP, TileConfig(384, 64, 64, 1, 8, 3, 0, 1), "block_n must divide 2304 / 5120"),
    (STACKED_FP4, False, TileConfig(128, 64, 128, 1, 8, 3, 0, 4), PLAIN, "bits 1 and TMA_ACTS"),
    (STACKED_FP4, False, TileConfig(128, 64, 128, 1, 8, 3, 0, 2), PLAIN, "a down-tile bit"),
    (STACKED_FP4, False, PLAIN, TileConfig(256, 64, 64, 1, 8, 3, 0, 3), "needs a TMA gate\\+up tile"),
])
def test_tma_tiles_are_checked(mlp, direct, up, down, message):
    with pytest.raises(ValueError, match=message):
        moe._check_tma(mlp, direct, 5120, 2304, up, down)


def test_shipped_h200_tma_entries_pass_the_checks():
    table = configs.load(configs.CONFIG_DIR / "NVIDIA_H200.json")
    checked = 0
    for name, up in table.items():
        kernel, shape, bucket = name.split(":")
        if kernel != "moe":
            continue
        h, inter = map(int, shape.split("x"))
        down = table.get(f"moe-down:{shape}:{bucket}", up)
        assert down.block_m == up.block_m, name
        if up.tma or down.tma:
            moe._check_tma(STACKED_FP4, False, h, inter, up, down)
            checked += 1
    assert checked  # the prefill buckets take the TMA kernels


def test_invariant_tiles_keep_the_chain_and_fill_the_sms(monkeypatch):
    """Batch-invariant tiles: INVARIANT_CONFIG's K step for FP4 (E4M3 and the FP8 shared expert may take any:
    one MMA per K step) and one accumulator at every size; larger blocks only where their gate+up tiles
    fill the SMs; one tile off CUDA and for float32 operands."""
    monkeypatch.setattr(configs, "sm_count", lambda device: 132)
    x = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device=CUDA0)
    inv = (moe.INVARIANT_CONFIG, moe.INVARIANT_CONFIG)

    def tiles(assignments, experts, fp4=True, h=5120, inter=2304, operand=x):
        return moe.invariant_tiles(operand, assignments, experts, fp4, h, inter)

    assert tiles(6 * 4096, 64) == moe.INVARIANT_PREFILL  # the cost benchmark's slice: 384 per expert
    assert tiles(6 * 2048, 384) == moe.INVARIANT_PREFILL  # Flash width: 32 per expert
    assert tiles(6 * 1100, 384) == moe._INVARIANT_FP4[32]  # 17 per expert
    assert tiles(6 * 257, 384) == inv
    assert tiles(4096, 1, fp4=False) == moe.INVARIANT_FP8[64]  # the shared expert
    assert tiles(300, 1, fp4=False) == moe.INVARIANT_FP8[32]  # 64-token blocks: 4 x 18 tiles < 132 SMs
    assert tiles(64, 1, fp4=False) == moe.INVARIANT_FP8[16]
    assert tiles(6 * 4096, 64, h=5000) == moe._INVARIANT_FP4_POINTERS  # 256-row TMA tiles do not divide H
    assert tiles(6 * 4096, 64, operand=SimpleNamespace(is_cuda=False, dtype=torch.bfloat16)) == inv
    assert tiles(6 * 4096, 64, operand=SimpleNamespace(is_cuda=True, dtype=torch.float32)) == inv
    for block_m, (up, down) in (*moe._INVARIANT_FP4.items(), (64, moe._INVARIANT_FP4_POINTERS)):
        assert up.block_m == down.block_m == block_m
        for t in (up, down):
            assert (t.block_k, t.split_k) == (moe.INVARIANT_CONFIG.block_k, 1), t
    for block_m, (up, down) in moe.INVARIANT_FP8.items():
        assert up.block_m == down.block_m == block_m and up.split_k == down.split_k == 1
