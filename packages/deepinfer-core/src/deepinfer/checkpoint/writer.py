"""Write a random-weight checkpoint in the release layout from a config and a seed.

Output directory: config.json, tokenizer.json + tokenizer_config.json (when a tokenizer is given),
model.safetensors.index.json and `model-0000k-of-0000n.safetensors` shards (or one
`model.safetensors` with `single_file=True`). Tensors are generated, quantised and written one at
a time, so memory stays around one tensor. Same config + seed -> byte-identical files.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer
from tqdm import tqdm

from deepinfer.checkpoint.inventory import TensorSpec
from deepinfer.checkpoint.randomize import random_tensors, weight_groups
from deepinfer.checkpoint.safetensors_io import INDEX_FILE, SINGLE_FILE, header_bytes, write_tensor
from deepinfer.config import ModelConfig
from deepinfer.tokenizer import compressed_vocab, save_tokenizer

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 5 * 1024**3
_ITEMSIZE = {"F32": 4, "BF16": 2}


@dataclass(frozen=True)
class WriteStats:
    files: int
    tensors: int
    bytes: int
    seconds: float


def _plan_shards(groups: list[list[TensorSpec]], shard_bytes: int) -> list[list[list[TensorSpec]]]:
    """Weight groups into shards of about `shard_bytes`, each group (weight + scales) in one shard."""
    shards: list[list[list[TensorSpec]]] = [[]]
    size = 0
    for g in groups:
        n = sum(s.nbytes for s in g)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(g)
        size += n
    # widest elements first keeps every tensor aligned to its element size (stable within a width)
    return [sorted(s, key=lambda g: -_ITEMSIZE.get(g[0].dtype, 1)) for s in shards]


def _check_tokenizer(config: ModelConfig, tokenizer: Tokenizer) -> None:
    t = config.text
    if tokenizer.get_vocab_size(with_added_tokens=True) > t.vocab_size:
        raise ValueError("tokenizer has more ids than text_config.vocab_size")
    if t.has_engram and compressed_vocab(tokenizer).size != t.engram_compressed_vocab_size:
        raise ValueError(
            "engram_compressed_vocab_size does not match the tokenizer's normalised vocabulary "
            f"({compressed_vocab(tokenizer).size} vs {t.engram_compressed_vocab_size})"
        )


def write_config_files(config: ModelConfig, out_dir: str | Path, tokenizer: Tokenizer | None = None) -> Path:
    """config.json and (given a tokenizer) tokenizer.json + tokenizer_config.json, no weights: all that
    `--load-format dummy` needs. Returns the directory (created if missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        _check_tokenizer(config, tokenizer)
        save_tokenizer(tokenizer, out, config.text.max_position_embeddings)
    (out / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2, ensure_ascii=False) + "\n")
    return out


def write_checkpoint(
    config: ModelConfig,
    out_dir: str | Path,
    *,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    single_file: bool = False,
    progress: bool = True,
) -> WriteStats:
    """Generate and write every tensor of `config`'s inventory; returns what was written."""
    t0 = time.perf_counter()
    out = write_config_files(config, out_dir, tokenizer)

    shards = _plan_shards(weight_groups(config), shard_bytes if not single_file else 1 << 62)
    names = (
        [SINGLE_FILE]
        if single_file
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    total = sum(s.nbytes for shard in shards for g in shard for s in g)
    weight_map: dict[str, str] = {}
    n_tensors = 0
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="writing", disable=not progress)
    for fname, shard in zip(names, shards):
        layout = [(s.name, s.dtype, s.shape, s.nbytes) for g in shard for s in g]
        with (out / fname).open("wb") as f:
            f.write(header_bytes(layout, {"format": "pt"}))
            for g in shard:
                tensors = random_tensors(g[0], g[1] if len(g) > 1 else None, seed)
                for spec in g:
                    written = write_tensor(f, tensors[spec.name])
                    if written != spec.nbytes:
                        raise AssertionError(f"{spec.name}: wrote {written} bytes, expected {spec.nbytes}")
                    weight_map[spec.name] = fname
                    bar.update(written)
                    n_tensors += 1
    bar.close()
    if not single_file:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    stats = WriteStats(len(names), n_tensors, total, time.perf_counter() - t0)
    log.info(
        "wrote %d tensors, %.3f GB in %d file(s) to %s in %.1f s",
        n_tensors,
        total / 1e9,
        len(names),
        out,
        stats.seconds,
    )
    return stats
