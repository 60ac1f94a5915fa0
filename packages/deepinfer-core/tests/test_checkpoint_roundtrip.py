"""Writer -> loader round trips (bit-exact, deterministic) and every corrupted variant rejected."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from deepinfer.checkpoint import CheckpointError, inventory, load_checkpoint, write_checkpoint
from deepinfer.checkpoint.safetensors_io import INDEX_FILE, SINGLE_FILE
from deepinfer.config import ModelConfig
from deepinfer.testing import TINY_CONFIG_NAMES, tiny_config, tiny_config_dict
from deepinfer.tokenizer import build_synthetic_tokenizer

SHARD_BYTES = 700_000  # small enough that every tiny config spans several shards


def _digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def _read_all(root: Path) -> dict[str, torch.Tensor]:
    """Independent reader: the safetensors library over every shard."""
    out = {}
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(f, "pt") as h:
            for k in h.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[k] = h.get_tensor(k)
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    tok = build_synthetic_tokenizer()
    out = {}
    for name in TINY_CONFIG_NAMES:
        out[name] = root / name
        write_checkpoint(
            tiny_config(name), out[name], seed=7, tokenizer=tok, shard_bytes=SHARD_BYTES, progress=False
        )
    return out


@pytest.fixture
def single(written, tmp_path) -> Path:
    """A fresh single-file copy of the `full` tiny checkpoint, safe to corrupt."""
    d = tmp_path / "single"
    d.mkdir()
    shutil.copy(written["full"] / "config.json", d)
    save_file(_read_all(written["full"]), d / SINGLE_FILE, metadata={"format": "pt"})
    return d


def _rewrite(d: Path, mutate) -> None:
    tensors = _read_all(d)
    mutate(tensors)
    (d / SINGLE_FILE).unlink()
    save_file(tensors, d / SINGLE_FILE)


@pytest.mark.parametrize("name", TINY_CONFIG_NAMES)
def test_loader_round_trips_bit_exactly(written, name):
    ck = load_checkpoint(written[name], progress=False)
    reference = _read_all(written[name])
    assert set(ck.tensors) == set(reference) == set(inventory(ck.config))
    assert all(_same(ck.tensors[k], v) for k, v in reference.items())
    assert ck.stats.files > 1 and ck.stats.bytes == sum(
        v.numel() * v.element_size() for v in reference.values()
    )
    spec = ck.specs
    for k, t in ck.tensors.items():
        assert tuple(t.shape) == spec[k].shape


def test_storage_dtypes_stay_quantised(written):
    t = load_checkpoint(written["full"], progress=False).tensors
    assert t["layers.2.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
    assert t["layers.2.attn.wq_a.scale"].dtype == torch.float8_e8m0fnu
    assert t["layers.2.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert t["layers.1.engram.embed.weight"].dtype == torch.float8_e4m3fn
    assert t["head.weight"].dtype == torch.float32 and t["embed.weight"].dtype == torch.bfloat16


def test_everything_randomised(written):
    t = load_checkpoint(written["full"], progress=False).tensors
    for name in (
        "norm.weight",
        "layers.0.attn.attn_sink",
        "layers.0.ffn.gate.bias",
        "layers.0.ffn.gate.bias_vl",
        "layers.0.hc_attn_base",
        "layers.0.hc_ffn_scale",
        "layers.1.engram.q_weight",
    ):
        v = t[name].float()
        assert v.std() > 0.01, name


def test_head_gives_logits_of_a_few_units(written):
    t = load_checkpoint(written["full"], progress=False).tensors
    h = torch.randn(64, t["head.weight"].shape[1], generator=torch.Generator().manual_seed(0))
    std = (h @ t["head.weight"].float().T).std().item()
    assert 1.5 < std < 6


def test_writer_is_deterministic(written, tmp_path):
    cfg = tiny_config("full")
    write_checkpoint(
        cfg,
        tmp_path / "a",
        seed=7,
        tokenizer=build_synthetic_tokenizer(),
        shard_bytes=SHARD_BYTES,
        progress=False,
    )
    assert _digest(tmp_path / "a") == _digest(written["full"])
    write_checkpoint(cfg, tmp_path / "b", seed=8, shard_bytes=SHARD_BYTES, progress=False)
    differ = [k for k, v in _digest(tmp_path / "b").items() if v != _digest(written["full"]).get(k)]
    assert "model-00001-of-00009.safetensors" in differ and "config.json" not in differ


def test_single_file_and_materialize(single, written):
    a = load_checkpoint(single, progress=False, materialize=True)
    b = load_checkpoint(written["full"], progress=False)
    assert a.stats.files == 1 and all(_same(a.tensors[k], b.tensors[k]) for k in b.tensors)


def test_model_prefix_accepted(single):
    _rewrite(single, lambda t: t.update({f"model.{k}": t.pop(k) for k in list(t)}))
    assert len(load_checkpoint(single, progress=False).tensors) == len(inventory(tiny_config("full")))


def test_duplicate_prefixed_names_rejected(single):
    _rewrite(single, lambda t: t.update({"model.norm.weight": t["norm.weight"].clone()}))
    with pytest.raises(CheckpointError, match=r"'norm.weight'.*ambiguous duplicate"):
        load_checkpoint(single, progress=False)


def test_bf16_accepted_for_head_compressor_confidence(single):
    def to_bf16(t):
        for k in ("head.weight", "layers.2.attn.compressor.wkv.weight", "mtp.2.confidence_head.proj.weight"):
            t[k] = t[k].to(torch.bfloat16)

    _rewrite(single, to_bf16)
    assert load_checkpoint(single, progress=False).tensors["head.weight"].dtype == torch.bfloat16


def test_extra_tensors_ignored(single):
    _rewrite(single, lambda t: t.update({"vision.x": torch.zeros(2), "aligner.w1.weight": torch.zeros(2)}))
    assert load_checkpoint(single, progress=False).ignored == ["aligner.w1.weight", "vision.x"]


def _set_nan_scale(t):
    s = t["layers.3.attn.wo_b.scale"].view(torch.uint8).clone()
    s[0, 0] = 0xFF
    t["layers.3.attn.wo_b.scale"] = s.view(torch.float8_e8m0fnu)


def _set(name, fn):
    def mutate(t):
        t[name] = fn(t[name])

    return mutate


CORRUPTIONS = {
    "missing tensor": (
        lambda t: t.pop("layers.4.attn.indexer.wq_b.scale"),
        r"tensor 'layers.4.attn.indexer.wq_b.scale': missing",
    ),
    "wrong dtype": (
        _set("layers.0.attn_norm.weight", lambda v: v.float()),
        r"'layers.0.attn_norm.weight' in model.safetensors: dtype F32, expected BF16",
    ),
    "wrong scale dtype": (
        _set("layers.0.attn.wkv.scale", lambda v: v.view(torch.uint8)),
        r"'layers.0.attn.wkv.scale' in model.safetensors: dtype U8, expected F8_E8M0",
    ),
    "wrong shape": (
        _set("layers.2.ffn.experts.3.w2.weight", lambda v: v[:, :-1].contiguous()),
        r"'layers.2.ffn.experts.3.w2.weight' in model.safetensors: shape \[128, 31\], expected \[128, 32\]",
    ),
    "nan scale": (_nan := _set_nan_scale, r"'layers.3.attn.wo_b.scale' in model.safetensors: contains NaN"),
    "nan bf16": (
        _set("embed.weight", lambda v: v.index_fill(0, torch.tensor([5]), float("nan"))),
        r"'embed.weight' in model.safetensors: contains NaN or Inf",
    ),
    "inf f32": (
        _set("layers.0.hc_ffn_fn", lambda v: v.index_fill(1, torch.tensor([3]), float("inf"))),
        r"'layers.0.hc_ffn_fn' in model.safetensors: contains NaN or Inf",
    ),
    "nan fp8": (
        _set(
            "layers.1.engram.embed.weight",
            lambda v: v.view(torch.uint8).index_fill(0, torch.tensor([0]), 0x7F).view(torch.float8_e4m3fn),
        ),
        r"'layers.1.engram.embed.weight' in model.safetensors: contains NaN",
    ),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupted_single_file_rejected(single, case):
    mutate, message = CORRUPTIONS[case]
    _rewrite(single, mutate)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(single, progress=False)


@pytest.fixture
def sharded(written, tmp_path) -> Path:
    d = tmp_path / "sharded"
    shutil.copytree(written["full"], d)
    return d


def test_truncated_shard_rejected_before_reading(sharded):
    shard = sharded / "model-00003-of-00009.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(
        CheckpointError, match=r"tensor '.+' in model-00003-of-00009.safetensors: .*truncated shard"
    ):
        load_checkpoint(sharded, progress=False)


def test_corrupt_header_rejected(sharded):
    shard = sharded / "model-00002-of-00009.safetensors"
    data = bytearray(shard.read_bytes())
    data[8:20] = b"garbage!!!!!"
    shard.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"model-00002-of-00009.safetensors: corrupt safetensors header"
    ):
        load_checkpoint(sharded, progress=False)
    shard.write_bytes(struct.pack("<Q", 10**12))
    with pytest.raises(
        CheckpointError, match=r"model-00002-of-00009.safetensors: corrupt .* exceeds the file size"
    ):
        load_checkpoint(sharded, progress=False)


def test_bad_index_json_rejected(sharded):
    (sharded / INDEX_FILE).write_text("{ nope")
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: invalid index"):
        load_checkpoint(sharded, progress=False)
    (sharded / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match=r"invalid index"):
        load_checkpoint(sharded, progress=False)


def test_index_pointing_to_missing_or_wrong_shard(sharded):
    index = json.loads((sharded / INDEX_FILE).read_text())
    good = dict(index["weight_map"])
    index["weight_map"]["norm.weight"] = "model-00009-of-00009.safetensors"
    (sharded / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"'norm.weight' in model-00001-of-00009.safetensors: .* maps it to"
    ):
        load_checkpoint(sharded, progress=False)
    index["weight_map"] = {**good, "norm.weight": "model-00042-of-00009.safetensors"}
    (sharded / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"lists shard model-00042-of-00009.safetensors, which does not exist"
    ):
        load_checkpoint(sharded, progress=False)


def test_no_weights_at_all(tmp_path, written):
    shutil.copy(written["c2"] / "config.json", tmp_path)
    with pytest.raises(CheckpointError, match=r"neither model.safetensors.index.json nor model.safetensors"):
        load_checkpoint(tmp_path, progress=False)


def test_tokenizer_files_and_engram_vocab_consistency(written):
    d = written["engram"]
    assert (d / "tokenizer.json").exists() and json.loads((d / "tokenizer_config.json").read_text())[
        "bos_token"
    ]
    cfg = tiny_config("engram")
    bad = cfg.model_copy(update={"text": cfg.text.model_copy(update={"engram_compressed_vocab_size": 5})})
    with pytest.raises(ValueError, match="engram_compressed_vocab_size"):
        write_checkpoint(bad, d.parent / "bad", tokenizer=build_synthetic_tokenizer(), progress=False)


def test_official_engine_only_variants_round_trip(tmp_path):
    """Non-shifted mHC (global HC head) and an index-K source that is not a KV source."""
    d = tiny_config_dict("reindex")
    d["text_config"].update(hc_shifted=False, index_k_source_layer_ids=[1, 2, 4])
    cfg = ModelConfig.from_hf_dict(d)
    write_checkpoint(cfg, tmp_path, single_file=True, progress=False)
    t = load_checkpoint(tmp_path, progress=False).tensors
    assert t["hc_head_fn"].shape == (4, 4 * 128) and t["hc_head_scale"].shape == (1,)
    assert "layers.4.attn.indexer.wk.weight" in t and "layers.4.attn.compressor.wkv.weight" not in t
    assert "layers.3.attn.indexer.wk.weight" not in t
