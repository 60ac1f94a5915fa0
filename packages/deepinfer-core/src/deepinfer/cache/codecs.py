"""How one cache entry (a vector of `dim` values) is stored as bytes.

"raw" keeps the values in a float dtype (exact precision); "fp8", "nvfp4" and "mxfp4" are the release
formats of model spec §6.9 / §15.1: packed elements first, then the scale bytes of that entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from deepinfer.ops import Ops
from deepinfer.ops.reference.cache_quant import FP8_GROUP, MXFP4_GROUP, NVFP4_GROUP

Format = Literal["raw", "fp8", "nvfp4", "mxfp4"]
_GROUP = {"fp8": FP8_GROUP, "nvfp4": NVFP4_GROUP, "mxfp4": MXFP4_GROUP}


@dataclass(frozen=True)
class Codec:
    format: Format
    dim: int
    dtype: torch.dtype  # raw: storage dtype; quantised formats: dtype of decoded values

    def __post_init__(self) -> None:
        group = _GROUP.get(self.format)
        if group and self.dim % group:
            raise ValueError(f"{self.format} cache entries need a width divisible by {group}, got {self.dim}")

    @property
    def data_bytes(self) -> int:
        if self.format == "raw":
            return self.dim * self.dtype.itemsize
        return self.dim if self.format == "fp8" else self.dim // 2

    @property
    def nbytes(self) -> int:
        if self.format == "raw":
            return self.data_bytes
        return self.data_bytes + self.dim // _GROUP[self.format]  # one scale byte per group

    def encode(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        """[n, dim] values -> [n, nbytes] uint8."""
        if self.format == "raw":
            return x.to(self.dtype).contiguous().view(torch.uint8)
        if self.format == "fp8":
            data, scale = ops.fp8_quantize(x)
        elif self.format == "nvfp4":
            data, scale = ops.nvfp4_quantize(x)
        else:
            data, scale = ops.mxfp4_quantize(x)
        return torch.cat((data.view(torch.uint8), scale.view(torch.uint8)), dim=-1)

    def decode(self, b: torch.Tensor, ops: Ops) -> torch.Tensor:
        """[n, nbytes] uint8 -> [n, dim] values in `dtype`."""
        if self.format == "raw":
            return b.contiguous().view(self.dtype)
        data, scale = b[:, : self.data_bytes].contiguous(), b[:, self.data_bytes :].contiguous()
        if self.format == "fp8":
            return ops.fp8_dequantize(data.view(torch.float8_e4m3fn), scale, self.dtype)
        if self.format == "nvfp4":
            return ops.nvfp4_dequantize(data, scale.view(torch.float8_e4m3fn), self.dtype)
        return ops.mxfp4_dequantize(data, scale, self.dtype)

    def round_trip(self, x: torch.Tensor, ops: Ops) -> tuple[torch.Tensor, torch.Tensor]:
        """(stored bytes, the values a later read returns) - current-chunk keys use the latter."""
        b = self.encode(x, ops)
        return b, self.decode(b, ops)
