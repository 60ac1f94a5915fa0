"""Training tensors <-> release-format checkpoint directories (model spec §13).

Export quantises every tensor to the storage the inventory names (FP8 32x32 blocks, MXFP4 routed
experts, FP8 Engram rows, BF16/F32 dense) and writes one safetensors shard plus the index, config and
tokenizer. Import dequantises a release checkpoint back into training tensors (stacked experts), so a
trained-and-exported model can be evaluated exactly as the runtime sees it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from deepinfer.checkpoint.formats import (
    dequantize_fp4,
    dequantize_fp8,
    dequantize_fp8_rows,
    quantize_fp4,
    quantize_fp8,
    quantize_fp8_rows,
)
from deepinfer.checkpoint.inventory import TORCH_DTYPES, iter_inventory
from deepinfer.checkpoint.loader import load_checkpoint
from deepinfer.checkpoint.safetensors_io import INDEX_FILE, header_bytes, write_tensor
from deepinfer.config import ModelConfig, load_model_config
from deepinfer.tokenizer import compressed_vocab, save_tokenizer

SHARD_BYTES = 12 * 1024**2  # small shards: every file stays far below per-file transfer and git limits
_QUANTIZE = {"fp8": quantize_fp8, "fp4": quantize_fp4, "fp8_rows": quantize_fp8_rows}
_DEQUANTIZE = {"fp8": dequantize_fp8, "fp4": dequantize_fp4, "fp8_rows": dequantize_fp8_rows}


def _expert_source(name: str) -> tuple[str, int, str] | None:
    """`p.ffn.experts.{e}.w1.weight` -> ("p.ffn.experts", e, "w1"); None for other names."""
    head, sep, tail = name.partition(".ffn.experts.")
    if not sep:
        return None
    e, key, _ = tail.split(".")
    return f"{head}.ffn.experts", int(e), key


def release_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Training tensors (float, any device) -> every inventory tensor in its storage dtype, on CPU."""
    out: dict[str, torch.Tensor] = {}
    for spec in iter_inventory(config):
        if spec.kind == "scale":
            continue
        src = _expert_source(spec.name)
        w = tensors[f"{src[0]}.{src[2]}"][src[1]] if src else tensors[spec.name]
        w = w.detach().float().cpu()
        if spec.kind in _QUANTIZE:
            q, s = _QUANTIZE[spec.kind](w)
            out[spec.name], out[spec.name.removesuffix(".weight") + ".scale"] = q, s
        else:
            out[spec.name] = w.to(TORCH_DTYPES[spec.dtype])
    return out


def write_release(
    config: ModelConfig,
    tensors: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    out_dir: str | Path,
    shard_bytes: int = SHARD_BYTES,
) -> int:
    """Write config, tokenizer, quantised shards and their index; returns the tensor bytes written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = config.text
    if t.has_engram and compressed_vocab(tokenizer).size != t.engram_compressed_vocab_size:
        raise ValueError("engram_compressed_vocab_size does not match the tokenizer")
    save_tokenizer(tokenizer, out, t.max_position_embeddings)
    (out / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2, ensure_ascii=False) + "\n")
    storage = release_tensors(config, tensors)
    specs = {s.name: s for s in iter_inventory(config)}
    shards: list[list[str]] = [[]]
    size = 0
    for spec in specs.values():  # a weight and its scale stay in one shard
        if spec.kind == "scale":
            continue
        names = [n for n in (spec.name, spec.name.removesuffix(".weight") + ".scale") if n in storage]
        n_bytes = sum(_nbytes(storage[n]) for n in names)
        if shards[-1] and size + n_bytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1] += names
        size += n_bytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        shard.sort(key=lambda n: -storage[n].element_size())  # widest first keeps every tensor aligned
        layout = [(n, specs[n].dtype, tuple(storage[n].shape), _nbytes(storage[n])) for n in shard]
        with (out / fname).open("wb") as f:
            f.write(header_bytes(layout, {"format": "pt"}))
            for n in shard:
                write_tensor(f, storage[n])
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(_nbytes(t) for t in storage.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return total


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def read_release(model_dir: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A release checkpoint -> (config, float32 training tensors with stacked experts)."""
    config = load_model_config(Path(model_dir) / "config.json")
    stored = load_checkpoint(model_dir, config, progress=False).tensors
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for spec in iter_inventory(config):
        if spec.kind == "scale":
            continue
        raw = stored[spec.name]
        if spec.kind in _DEQUANTIZE:
            w = _DEQUANTIZE[spec.kind](
                raw, stored[spec.name.removesuffix(".weight") + ".scale"], dtype=torch.float32
            )
        else:
            w = raw.float()
        src = _expert_source(spec.name)
        if src:
            experts.setdefault(f"{src[0]}.{src[2]}", {})[src[1]] = w
        else:
            out[spec.name] = w
    for name, by_id in experts.items():
        out[name] = torch.stack([by_id[e] for e in range(len(by_id))])
    return config, out
