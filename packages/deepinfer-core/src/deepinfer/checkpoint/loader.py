"""Load a release-layout checkpoint: validate everything from the headers, then map the data.

Order of work: config -> file list (index or single file) -> every safetensors header -> name
normalisation (`model.` prefix optional, ambiguous duplicates rejected) -> every expected tensor's
presence, dtype, shape and byte range checked -> only then the data: each file is memory-mapped
once, each tensor becomes a zero-copy view of its bytes, and float/scale tensors are scanned once
for NaN/Inf. Any problem raises CheckpointError naming the tensor and the file.

Returned tensors keep their storage dtype: FP8 weights `float8_e4m3fn`, FP4 experts packed `int8`
[R, C/2], scales `float8_e8m0fnu`, other tensors F32/BF16 as on disk (head, compressor and
confidence-head weights may be either, spec §13.6). The model dequantises per use
(`deepinfer.checkpoint.formats`). Vision weights (`vision.*`, `aligner.*`, `image_*`) are not
loaded yet; other unknown tensors are ignored with a warning, as the official loader does.

One rank of several (an active `deepinfer.distributed` state, or an explicit `shard`) validates every
header the same way but maps only its share: the backbone routed experts of its expert slots and its
block of rows of each Engram table.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from deepinfer.checkpoint.inventory import DTYPE_BYTES, TORCH_DTYPES, TensorSpec, inventory
from deepinfer.checkpoint.safetensors_io import INDEX_FILE, SINGLE_FILE, HeaderEntry, HeaderError, read_header
from deepinfer.config import ModelConfig, load_model_config
from deepinfer.distributed.state import ParallelState, parallel_state

log = logging.getLogger(__name__)

PREFIX = "model."
IGNORED_PREFIXES = ("vision.", "aligner.", "image_start", "image_end", "image_newline")
SCAN_CHUNK = 1 << 26  # elements per NaN/Inf scan step: few, large reductions



class CheckpointError(ValueError):
    """A checkpoint does not match its config or is damaged; the message names tensor and file."""


@dataclass(frozen=True)
class LoadStats:
    files: int
    tensors: int
    bytes: int
    seconds: float
    header_seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / 1e9 / self.seconds if self.seconds > 0 else math.inf


@dataclass
class Checkpoint:
    path: Path
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # release names (no `model.` prefix), storage dtypes
    specs: dict[str, TensorSpec]
    stats: LoadStats
    ignored: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Located:
    entry: HeaderEntry
    file: Path


def _checkpoint_files(root: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Shard files and (for sharded checkpoints) the index weight map."""
    index_path = root / INDEX_FILE
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map must map tensor names to file names")
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{index_path}: invalid index ({exc})") from None
        files = sorted({root / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index_path}: lists shard {f.name}, which does not exist")
        return files, weight_map
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE], None
    raise CheckpointError(f"{root}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


def _collect(files: list[Path], weight_map: dict[str, str] | None) -> dict[str, _Located]:
    """Read every header; map release names (prefix stripped) to their file entry."""
    found: dict[str, _Located] = {}
    raw_names: dict[str, str] = {}
    for path in files:
        try:
            entries, _ = read_header(path)
        except (HeaderError, OSError) as exc:
            raise CheckpointError(f"{path.name}: corrupt safetensors header ({exc})") from None
        size = path.stat().st_size
        for raw, entry in entries.items():
            name = raw.removeprefix(PREFIX)
            if name in found:
                other = found[name].file.name
                raise CheckpointError(
                    f"tensor {name!r}: stored twice (as {raw_names[name]!r} in {other} and {raw!r} in "
                    f"{path.name}); ambiguous duplicate"
                )
            if not entry.begin <= entry.end <= size:
                raise CheckpointError(
                    f"tensor {raw!r} in {path.name}: data range [{entry.begin}, {entry.end}) exceeds "
                    f"the file size {size} (truncated shard?)"
                )
            if weight_map is not None and weight_map.get(raw) != path.name:
                raise CheckpointError(
                    f"tensor {raw!r} in {path.name}: {INDEX_FILE} maps it to {weight_map.get(raw)!r}"
                )
            found[name] = _Located(entry, path)
            raw_names[name] = raw
    if weight_map is not None:
        for raw, fname in weight_map.items():
            if raw.removeprefix(PREFIX) not in found:
                raise CheckpointError(
                    f"tensor {raw!r}: listed in {INDEX_FILE} for {fname} but not in its header"
                )
    return found


def _check_specs(specs: dict[str, TensorSpec], found: dict[str, _Located], root: Path) -> None:
    for name, spec in specs.items():
        loc = found.get(name)
        if loc is None:
            raise CheckpointError(f"tensor {name!r}: missing from the checkpoint in {root}")
        e, fname = loc.entry, loc.file.name
        if e.dtype not in spec.dtypes:
            raise CheckpointError(
                f"tensor {name!r} in {fname}: dtype {e.dtype}, expected {' or '.join(spec.dtypes)}"
            )
        if e.shape != spec.shape:
            raise CheckpointError(
                f"tensor {name!r} in {fname}: shape {list(e.shape)}, expected {list(spec.shape)}"
            )
        nbytes = math.prod(e.shape) * DTYPE_BYTES[e.dtype]
        if e.end - e.begin != nbytes:
            raise CheckpointError(
                f"tensor {name!r} in {fname}: header gives {e.end - e.begin} bytes for shape "
                f"{list(e.shape)} {e.dtype} ({nbytes} expected)"
            )


def _map_file(path: Path) -> torch.Tensor:
    """Whole file as a uint8 tensor over a private (copy-on-write) memory map."""
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    return torch.frombuffer(mm, dtype=torch.uint8)  # the tensor keeps the mapping alive


def _view(data: torch.Tensor, e: HeaderEntry) -> torch.Tensor:
    raw = data[e.begin : e.end]
    if e.begin % DTYPE_BYTES[e.dtype]:
        raw = raw.clone()  # misaligned in the file: one copy so the dtype view is legal
    return raw.view(TORCH_DTYPES[e.dtype]).reshape(e.shape)


def _has_nonfinite(t: torch.Tensor, dtype: str) -> bool:
    """NaN/Inf anywhere in a float or scale tensor, with one reduction pass per chunk."""
    flat = t.reshape(-1)
    for begin in range(0, flat.numel(), SCAN_CHUNK):
        chunk = flat[begin : begin + SCAN_CHUNK]
        if dtype in ("F32", "BF16"):
            lo, hi = torch.aminmax(chunk)  # NaN propagates, Inf shows up as an extreme
            bad = not (torch.isfinite(lo) and torch.isfinite(hi))
        elif dtype == "F8_E8M0":
            bad = chunk.view(torch.uint8).amax().item() == 0xFF  # the only NaN code
        elif dtype == "F8_E4M3":
            # NaN is S.1111.111: 0xFF is the uint8 maximum, 0x7F the int8 maximum (two passes, no temporary)
            u = chunk.view(torch.uint8)
            bad = u.amax().item() == 0xFF or u.view(torch.int8).amax().item() == 0x7F
        else:
            return False  # packed FP4 codes have no NaN
        if bad:
            return True
    return False


def _rows(shard: ParallelState | None, name: str, spec: TensorSpec) -> tuple[int, int] | None:
    """The row range of `name` this rank maps (an Engram table under sharding), None for all of it."""
    return None if shard is None else shard.row_range(name, spec.shape[0])


def _nbytes(e: HeaderEntry, rows: tuple[int, int] | None) -> int:
    size = e.end - e.begin
    return size if rows is None else size // e.shape[0] * (rows[1] - rows[0])


def load_checkpoint(
    path: str | Path,
    config: ModelConfig | None = None,
    *,
    check_values: bool = True,
    materialize: bool = False,
    progress: bool = True,
    shard: ParallelState | None = None,
) -> Checkpoint:
    """Validate and load the checkpoint in directory `path` (config from its config.json by default).

    `materialize=True` copies every tensor out of the memory map into process memory (so every byte
    is read now); by default tensors are views of the map and FP4 bytes are paged in on first use.
    `shard` (default: the active parallel state) loads only that rank's experts and Engram rows.
    """
    shard = shard if shard is not None else parallel_state()
    t0 = time.perf_counter()
    root = Path(path)
    config = config if config is not None else load_model_config(root)
    specs = inventory(config)
    files, weight_map = _checkpoint_files(root)
    found = _collect(files, weight_map)
    _check_specs(specs, found, root)
    ignored = sorted(n for n in found if n not in specs)
    unknown = [n for n in ignored if not n.startswith(IGNORED_PREFIXES)]
    if unknown:
        log.warning("ignoring %d tensors the config does not use, e.g. %s", len(unknown), unknown[:3])
    t_headers = time.perf_counter() - t0

    wanted = {name: _rows(shard, name, specs[name]) for name in specs
              if shard is None or shard.keeps_expert(name, config.text.n_routed_experts)}
    total = sum(_nbytes(found[n].entry, rows) for n, rows in wanted.items())
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(found[name].file, []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="loading", disable=not progress)
    for file in files:
        names = sorted(by_file.get(file, []), key=lambda n: found[n].entry.begin)  # sequential reads
        if not names:
            continue
        data = _map_file(file)
        for name in names:
            e = found[name].entry
            t = _view(data, e)
            if wanted[name] is not None:
                t = t[slice(*wanted[name])]
            if materialize:
                t = t.clone()
            if check_values and _has_nonfinite(t, e.dtype):
                raise CheckpointError(f"tensor {name!r} in {file.name}: contains NaN or Inf values")
            tensors[name] = t
            bar.update(_nbytes(e, wanted[name]))
    bar.close()
    seconds = time.perf_counter() - t0
    stats = LoadStats(len(files), len(tensors), total, seconds, t_headers)
    log.info(
        "%sloaded %d tensors, %.3f GB from %d file(s) in %.2f s (%.2f GB/s; headers %.3f s)",
        f"rank {shard.rank}/{shard.world_size}: " if shard is not None else "",
        stats.tensors,
        total / 1e9,
        stats.files,
        seconds,
        stats.gb_per_s,
        t_headers,
    )
    return Checkpoint(root, config, tensors, specs, stats, ignored)
