"""Op conformance cases: every backend's ops against the reference on the same inputs.

A `Case` builds the inputs of one op call (`make(device, generator)`, deterministic for a seeded
generator) and says how to judge outputs:

* `check(out, args, kwargs)` judges the REFERENCE op on its own (an oracle, edge cases, padding and
  shape invariants) and raises AssertionError when it is wrong; `tests/test_op_conformance.py` runs it
  on CPU, so it must be able to fail.
* a backend's output is compared to the reference's output on the same inputs (made twice from the
  same seed, so in-place ops see identical state): `compare(actual, expected)` when given, else
  `torch.testing.assert_close` with `tol[dtype]` = (atol, rtol) per output dtype (exact when absent).
* `result(out, args, kwargs)` picks what is compared (default: the op's return value); ops that write
  into an argument (cache writes) return the written tensor here.

Op families register their cases from a module of this package (`attention.py`, `indexer.py`,
`cache.py`, ...): `register(Case(...))` at import time. `cases()` imports every module of the package.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

Args = tuple[tuple[Any, ...], dict[str, Any]]
Make = Callable[[torch.device, torch.Generator], Args]
Check = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]
Compare = Callable[[Any, Any], None]

# Loose default for float outputs of different kernels (accumulation order differs).
DEFAULT_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}


@dataclass(frozen=True)
class Case:
    op: str
    name: str
    make: Make
    check: Check
    tol: dict[torch.dtype, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOL))
    compare: Compare | None = None
    result: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any] | None = None
    seed: int = 0
    # ops taking backend-prepared weights: (op table of the backend under test, args, kwargs) -> the
    # args with their raw checkpoint tensors replaced by that backend's prepared objects
    prepare: Callable[[Mapping[str, Callable], tuple[Any, ...], dict[str, Any]], Args] | None = None

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}"

    def inputs(self, device: torch.device | str, ops: Mapping[str, Callable] | None = None) -> Args:
        """Fresh inputs on `device` (random values drawn on the CPU, so every device sees the same),
        weights prepared by `ops` (default: the reference backend) when the case has `prepare`."""
        args, kwargs = self.make(torch.device(device), torch.Generator().manual_seed(self.seed))
        if self.prepare is None:
            return args, kwargs
        if ops is None:
            from deepinfer.ops.reference import REFERENCE_OPS as ops
        return self.prepare(ops, args, kwargs)

    def judged(self, out: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return out if self.result is None else self.result(out, args, kwargs)

    def assert_matches(self, actual: Any, expected: Any) -> None:
        if self.compare is not None:
            self.compare(actual, expected)
            return
        for a, e in zip(_flatten(actual), _flatten(expected), strict=True):
            if isinstance(e, torch.Tensor) and e.is_floating_point():
                atol, rtol = self.tol.get(e.dtype, (0.0, 0.0))
                torch.testing.assert_close(a.float(), e.float(), atol=atol, rtol=rtol, equal_nan=True)
            elif isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e, atol=0, rtol=0)
            else:
                assert a == e, f"{a!r} != {e!r}"


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [y for item in x for y in _flatten(item)]
    return [x]


_CASES: dict[str, Case] = {}
_loaded = False


def register(case: Case) -> Case:
    if case.id in _CASES:
        raise ValueError(f"conformance case {case.id!r} is registered twice")
    _CASES[case.id] = case
    return case


def cases() -> list[Case]:
    """Every registered case (imports each op-family module of this package once)."""
    global _loaded
    if not _loaded:
        for mod in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{mod.name}")
        _loaded = True
    return sorted(_CASES.values(), key=lambda c: c.id)


def rand(g: torch.Generator, *shape: int, device: torch.device, dtype: torch.dtype = torch.float32,
         scale: float = 1.0) -> torch.Tensor:
    """Standard-normal values drawn on the CPU from `g`, then moved (identical on every device)."""
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def randint(g: torch.Generator, low: int, high: int, *shape: int, device: torch.device) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=g).to(device)
