"""Loaded checkpoint tensors seen from one module: prefixed names, presence/shape checks, clear errors."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import torch


class WeightError(ValueError):
    """A checkpoint tensor is missing or malformed; the message starts with the full tensor name."""


@dataclass(frozen=True)
class Weights:
    """A read-only view of `tensors` under `prefix` (e.g. "layers.3.attn.")."""

    tensors: Mapping[str, torch.Tensor]
    prefix: str = ""

    def name(self, key: str) -> str:
        return self.prefix + key

    def __contains__(self, key: str) -> bool:
        return self.prefix + key in self.tensors

    def __getitem__(self, key: str) -> torch.Tensor:
        full = self.prefix + key
        if full not in self.tensors:
            raise WeightError(f"{full}: missing from the checkpoint")
        return self.tensors[full]

    def sub(self, prefix: str) -> Weights:
        return Weights(self.tensors, self.prefix + prefix)

    def get(self, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The tensor `key`, checked against `shape` when given."""
        t = self[key]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise WeightError(f"{self.prefix + key}: shape {list(t.shape)}, expected {list(shape)}")
        if t.is_floating_point() and t.dtype.itemsize > 1 and not bool(torch.isfinite(t).all()):
            raise WeightError(f"{self.prefix + key}: contains NaN or infinite values")
        return t

    def release(self, keys: list[str]) -> None:
        """Drop `keys` from the underlying mapping when it is mutable (a loader's dict), so tensors
        copied into another layout at load (stacked experts) are not held twice."""
        if isinstance(self.tensors, MutableMapping):
            for key in keys:
                del self.tensors[self.prefix + key]
