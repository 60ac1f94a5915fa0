"""A dataclass tree (such as the step metadata) flattened by field path, for tests that compare builds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


def fields_by_path(value: object, tensor: Callable[[torch.Tensor], object],
                   prefix: str = "meta") -> dict[str, object]:
    """Every tensor (as `tensor` maps it) and host value under `value`, through dataclass fields and dict
    entries, by path ("meta.field[key].field")."""
    out: dict[str, object] = {}

    def visit(path: str, v: object) -> None:
        if isinstance(v, torch.Tensor):
            out[path] = tensor(v)
        elif dataclasses.is_dataclass(v):
            for f in dataclasses.fields(v):
                visit(f"{path}.{f.name}", getattr(v, f.name))
        elif isinstance(v, dict):
            for k, x in v.items():
                visit(f"{path}[{k}]", x)
        else:
            out[path] = v

    visit(prefix, value)
    return out
