"""The expected tensor list for full-size Flash matches the model spec's inventory (§14)."""

from __future__ import annotations

from collections import Counter

import pytest

from deepinfer.checkpoint import inventory
from deepinfer.config import ModelConfig
from deepinfer.testing import flash_config_dict


@pytest.fixture(scope="module")
def flash():
    return inventory(ModelConfig.from_hf_dict(flash_config_dict()))


SPEC_14 = {  # name: (shape, dtype) as listed in the spec
    "embed.weight": ((129280, 5120), "BF16"),
    "head.weight": ((129280, 5120), "F32"),
    "layers.0.attn.wq_a.scale": ((40, 160), "F8_E8M0"),
    "layers.0.attn.wq_b.weight": ((32768, 1280), "F8_E4M3"),
    "layers.0.attn.wq_b.scale": ((1024, 40), "F8_E8M0"),
    "layers.0.attn.wkv.scale": ((16, 160), "F8_E8M0"),
    "layers.0.attn.wo_a.weight": ((8192, 4096), "F8_E4M3"),
    "layers.0.attn.wo_a.scale": ((256, 128), "F8_E8M0"),
    "layers.0.attn.wo_b.scale": ((160, 256), "F8_E8M0"),
    "layers.0.attn.attn_sink": ((64,), "F32"),
    "layers.0.ffn.gate.bias_vl": ((384,), "F32"),
    "layers.39.ffn.experts.383.w1.weight": ((2304, 2560), "I8"),
    "layers.39.ffn.experts.383.w1.scale": ((2304, 160), "F8_E8M0"),
    "layers.39.ffn.experts.383.w2.weight": ((5120, 1152), "I8"),
    "layers.39.ffn.experts.383.w2.scale": ((5120, 72), "F8_E8M0"),
    "layers.5.ffn.shared_experts.w1.scale": ((72, 160), "F8_E8M0"),
    "layers.5.ffn.shared_experts.w2.scale": ((160, 72), "F8_E8M0"),
    "layers.5.hc_ffn_fn": ((24, 20480), "F32"),
    "layers.5.hc_ffn_scale": ((3,), "F32"),
    "layers.2.attn.compressor.wgate.weight": ((512, 5120), "F32"),
    "layers.20.attn.compressor.wkv.weight": ((512, 5120), "F32"),
    "layers.36.attn.indexer.wq_b.scale": ((128, 40), "F8_E8M0"),
    "layers.36.attn.indexer.weights_proj.weight": ((32, 5120), "BF16"),
    "layers.20.attn.indexer.wk.weight": ((128, 512), "BF16"),
    "layers.1.engram.embed.weight": ((384006168, 256), "F8_E4M3"),
    "layers.14.engram.embed.scale": ((384016682, 8), "F8_E8M0"),
    "layers.14.engram.wkv.scale": ((800, 192), "F8_E8M0"),
    "layers.1.engram.k_weight": ((4, 5120), "BF16"),
    "mtp.0.main_proj.scale": ((160, 480), "F8_E8M0"),
    "mtp.1.ffn.experts.127.w3.weight": ((2304, 2560), "I8"),
    "mtp.2.markov_head.head.weight": ((129280, 256), "BF16"),
    "mtp.2.confidence_head.proj.weight": ((1, 5376), "F32"),
}


def test_flash_shapes_and_dtypes(flash):
    for name, (shape, dtype) in SPEC_14.items():
        assert (flash[name].shape, flash[name].dtype) == (shape, dtype), name


def test_flash_presence_by_layer_role(flash):
    owners = Counter(n.split(".")[1] for n in flash if n.endswith("compressor.wkv.weight"))
    assert sorted(map(int, owners)) == [2, 8, 14, 20]
    assert sorted(int(n.split(".")[1]) for n in flash if n.endswith("compressor.wgate.weight")) == [2, 8, 14]
    assert sorted(int(n.split(".")[1]) for n in flash if n.endswith("indexer.wq_b.weight")) == [
        2,
        8,
        14,
        20,
        24,
        28,
        32,
        36,
    ]
    assert sorted(int(n.split(".")[1]) for n in flash if n.endswith("engram.wkv.weight")) == [1, 14]
    assert "mtp.0.main_proj.weight" in flash and "mtp.1.main_proj.weight" not in flash
    assert "mtp.2.norm.weight" in flash and "mtp.0.norm.weight" not in flash
    assert not any(n.startswith(("hc_head", "vision.", "mtp.0.embed", "mtp.0.head")) for n in flash)


def test_flash_total_bytes(flash):
    per_expert = sum(s.nbytes for n, s in flash.items() if n.startswith("layers.3.ffn.experts.7."))
    assert per_expert == 18_800_640
    total = sum(s.nbytes for s in flash.values())
    assert total == 510_676_024_152  # ≈ 202.8 GB Engram + 296.0 GB routed experts + 11.9 GB the rest
