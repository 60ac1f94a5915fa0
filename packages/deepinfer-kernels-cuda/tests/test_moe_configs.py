"""The MoE tile table: the down kernel's own entries (same block_m as the gate+up entry, else an error
naming both) and the maxnreg field (tables written before it load with 0: the compiler's choice)."""

import json

import pytest
import torch

from deepinfer_kernels_cuda import configs
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
    configs.save(path, {"moe:5120x2304:16384": UP})
    assert configs.load(path)["moe:5120x2304:16384"] == UP
    old = {"block_n": 64, "block_m": 16, "block_k": 128, "split_k": 1, "num_warps": 4, "num_stages": 4}
    path.write_text(json.dumps({"moe:5120x2304:512": old}))
    configs.save(tmp_path / "other.json", {})  # clears the table cache
    assert configs.load(path)["moe:5120x2304:512"].maxnreg == 0
