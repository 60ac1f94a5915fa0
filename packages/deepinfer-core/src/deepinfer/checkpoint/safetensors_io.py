"""The safetensors container, read and written directly (no whole-shard buffering).

File layout: 8-byte little-endian header length N, N bytes of JSON header (space padded), then the
tensor bytes back to back. Header entries: name -> {dtype, shape, data_offsets: [begin, end]} with
offsets relative to the end of the header, plus an optional "__metadata__" string map.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

INDEX_FILE = "model.safetensors.index.json"  # sharded release layout: name -> shard file
SINGLE_FILE = "model.safetensors"  # unsharded layout
HEADER_ALIGN = 8
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class HeaderEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    end: int  # absolute file offset one past the last byte


class HeaderError(ValueError):
    """The file is not a well-formed safetensors file."""


def read_header(path: Path) -> tuple[dict[str, HeaderEntry], int]:
    """Parse the header of `path` -> (entries, data start offset). Reads only the header bytes."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise HeaderError("file shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise HeaderError(
                f"header length {n} exceeds the file size {size} (truncated or not safetensors)"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HeaderError(f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    start = 8 + n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            b, e = info["data_offsets"]
            entries[name] = HeaderEntry(
                name, str(info["dtype"]), tuple(int(d) for d in info["shape"]), start + b, start + e
            )
        except (KeyError, TypeError, ValueError):
            raise HeaderError(f"malformed header entry for tensor {name!r}") from None
    return entries, start


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of a tensor, without copying when it is contiguous."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def header_bytes(layout: list[tuple[str, str, tuple[int, ...], int]], metadata: dict[str, str]) -> bytes:
    """Header for tensors (name, dtype, shape, nbytes) stored back to back in the given order."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, nbytes in layout:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % HEADER_ALIGN)
    return struct.pack("<Q", len(raw)) + raw


def write_tensor(f: BinaryIO, t: torch.Tensor) -> int:
    return f.write(tensor_bytes(t))
