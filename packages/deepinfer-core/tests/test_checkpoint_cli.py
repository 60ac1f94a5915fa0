"""`deepinfer make-checkpoint` / `deepinfer describe`, and the real-size Flash slice (slow)."""

from __future__ import annotations

import pytest

from deepinfer.checkpoint import inventory, load_checkpoint
from deepinfer.entrypoints.cli.main import main
from deepinfer.testing import flash_slice_config


def test_make_checkpoint_and_describe(tmp_path, capsys):
    out = tmp_path / "ck"
    assert main(["make-checkpoint", "--config", "reindex", "--out", str(out), "--seed", "3", "--quiet"]) == 0
    assert {p.name for p in out.iterdir()} >= {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors.index.json",
    }
    assert main(["describe", "--model", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "reindex C1" in text and "routed_experts" in text and "GB/s" in text


def test_make_checkpoint_from_config_path(tmp_path):
    main(["make-checkpoint", "--config", "c2", "--out", str(tmp_path / "a"), "--quiet", "--single-file"])
    main(
        [
            "make-checkpoint",
            "--config",
            str(tmp_path / "a" / "config.json"),
            "--out",
            str(tmp_path / "b"),
            "--quiet",
            "--single-file",
        ]
    )
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()


def test_flash_slice_shapes_are_full_width():
    specs = inventory(flash_slice_config(num_layers=4))
    assert specs["layers.1.attn.wq_b.weight"].shape == (32768, 1280)
    assert specs["layers.1.attn.compressor.wgate.weight"].shape == (512, 5120)
    assert specs["layers.2.attn.indexer.wk.weight"].shape == (128, 512)
    assert "layers.3.attn.indexer.wk.weight" not in specs and "layers.3.attn.indexer.wq_b.weight" in specs
    assert specs["layers.0.ffn.experts.383.w2.weight"].shape == (5120, 1152)
    assert specs["mtp.0.main_proj.weight"].shape == (5120, 5120)  # one target layer in the slice
    assert specs["mtp.0.confidence_head.proj.weight"].shape == (1, 5376)


@pytest.mark.slow
def test_flash_slice_writes_and_loads(tmp_path):
    """A full-width slice (1 layer, 2 experts; ~4.5 GB, mostly embedding and head) via the CLI and back."""
    out = tmp_path / "slice"
    args = (
        "--config flash_slice --layers 1 --experts 2 --dspark-experts 2 --engram-vocab 1000 --shard-size-gb 1"
    )
    main(["make-checkpoint", *args.split(), "--out", str(out), "--quiet"])
    ck = load_checkpoint(out, progress=False)
    assert ck.stats.files > 2 and ck.config.text.hidden_size == 5120
    assert ck.tensors["layers.0.attn.wo_a.weight"].shape == (8192, 4096)
    assert ck.tensors["head.weight"].shape == (129280, 5120)
