"""Backend discovery through the `deepinfer.backends` entry-point group, selection and op fallback."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Collection, Mapping
from functools import cache, partial
from types import MappingProxyType
from typing import Any, ClassVar

import torch

from deepinfer.plugins import load_entry_points

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "deepinfer.backends"
BACKEND_ENV_VAR = "DEEPINFER_BACKEND"
REFERENCE = "reference"

# Ops that exchange backend-prepared objects: a backend provides all of a group or none of it, since
# one backend's `linear` cannot read another's `prepare_linear` result.
OP_GROUPS: tuple[frozenset[str], ...] = (frozenset({"prepare_linear", "linear", "prepare_experts", "moe"}),)

# Backends we know of, so that asking for one that is not installed names the package to install.
KNOWN_PACKAGES = {
    "reference": "deepinfer-core",
    "cuda": "deepinfer-kernels-cuda (pip install 'deepinfer-core[cuda]')",
    "ascend": "deepinfer-kernels-ascend (pip install 'deepinfer-core[ascend]')",
}


class BackendError(RuntimeError):
    pass


class Backend:
    """A set of op implementations for some devices. Plugins subclass this and register the class.

    `priority` orders automatic selection: the highest-priority installed backend that supports the
    device wins, so the always-available reference backend has the lowest.
    """

    name: ClassVar[str]
    package: ClassVar[str]
    priority: ClassVar[int] = 0
    # Ops whose implementations here are batch-invariant as they are: per-row math, no reduction across
    # rows and no kernel, tile or split choice that depends on the number of rows (or no rows at all,
    # like weight preparation).
    row_wise: ClassVar[frozenset[str]] = frozenset()

    def supports(self, device: torch.device) -> bool:
        raise NotImplementedError

    def ops(self, *, batch_invariant: bool = False) -> dict[str, Callable]:
        """Op name -> implementation; names must belong to the reference op set. With
        `batch_invariant`, only implementations whose result for a row never depends on the other rows
        of the call (`invariant_ops` builds that table); the registry fills the rest from reference."""
        raise NotImplementedError

    def plan(self, metadata: Any) -> None:
        """Called once per forward with the step's metadata (e.g. deepseek_v41 StepMetadata), before
        any op runs: derive the backend's own scheduling data (split sizes, tile maps) here. Must not
        read device values on the host. Default: nothing to plan."""


def invariant_ops(table: Mapping[str, Callable], row_wise: Collection[str]) -> dict[str, Callable]:
    """The batch-invariant part of an op table: each function with a keyword-only `batch_invariant`
    parameter bound to True (its fixed-config mode), the `row_wise` ops as they are, nothing else."""
    out = {}
    for name, fn in table.items():
        parameter = inspect.signature(fn).parameters.get("batch_invariant")
        if parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            out[name] = partial(fn, batch_invariant=True)
        elif name in row_wise:
            out[name] = fn
    return out


class Ops:
    """Read-only namespace of resolved ops: `ops.rms_norm(x, w, eps)`."""

    def __init__(
        self,
        backend_name: str,
        table: dict[str, Callable],
        fallbacks: tuple[str, ...],
        plan: Callable[[Any], None] | None = None,
        batch_invariant: bool = False,
    ):
        self.backend_name = backend_name
        self.plan = plan or (lambda metadata: None)  # the backend's per-step hook (Backend.plan)
        self.fallbacks = fallbacks  # ops served by the reference backend
        self.batch_invariant = batch_invariant  # every op's row results independent of the other rows
        self._table = MappingProxyType(dict(table))

    def __getattr__(self, name: str) -> Callable:
        try:
            return self._table[name]
        except KeyError:
            raise AttributeError(f"op {name!r} is not in the deepinfer op set") from None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._table))


@cache
def available_backends() -> dict[str, Backend]:
    """Installed backends by name (entry points are scanned once per process)."""
    return {name: backend_class() for name, backend_class in load_entry_points(ENTRY_POINT_GROUP).items()}


def _select(name: str | None, device: torch.device) -> Backend:
    backends = available_backends()
    name = name or os.environ.get(BACKEND_ENV_VAR) or None
    if name is None:
        usable = [b for b in backends.values() if b.supports(device)]
        if not usable:
            raise BackendError(f"no installed backend supports device {device}")
        return max(usable, key=lambda b: b.priority)
    if name not in backends:
        hint = KNOWN_PACKAGES.get(name, f"a package registering {name!r} in {ENTRY_POINT_GROUP!r}")
        raise BackendError(
            f"backend {name!r} is not installed (installed: {sorted(backends)}); install {hint}"
        )
    backend = backends[name]
    if not backend.supports(device):
        raise BackendError(f"backend {name!r} ({backend.package}) does not support device {device}")
    return backend


def _backend_ops(backend: Backend, batch_invariant: bool) -> dict[str, Callable]:
    if not batch_invariant:
        return backend.ops()  # plugins written before the batch-invariant mode take no argument
    if "batch_invariant" not in inspect.signature(backend.ops).parameters:
        raise BackendError(f"backend {backend.name!r} ({backend.package}) has no batch-invariant mode")
    return backend.ops(batch_invariant=True)


@cache
def _resolve(backend_name: str, device_type: str, batch_invariant: bool = False) -> Ops:
    backends = available_backends()
    mode = " in batch-invariant mode" if batch_invariant else ""
    full = backends[REFERENCE].ops()
    reference = _backend_ops(backends[REFERENCE], batch_invariant)
    own = {} if backend_name == REFERENCE else _backend_ops(backends[backend_name], batch_invariant)
    unknown = sorted(set(own) - set(full))
    if unknown:
        raise BackendError(f"backend {backend_name!r} provides ops outside the op set: {unknown}")
    for group in OP_GROUPS:
        partial_group = sorted(group & set(own))
        if partial_group and len(partial_group) < len(group):
            raise BackendError(
                f"backend {backend_name!r} provides {partial_group} but not "
                f"{sorted(group - set(own))}{mode}: the ops {sorted(group)} share prepared weights, "
                "so a backend provides all of them or none"
            )
    missing = sorted(set(full) - set(own) - set(reference))
    if missing:
        raise BackendError(
            f"backend {backend_name!r} on {device_type} cannot run {missing} batch-invariantly: it has no "
            "batch-invariant implementation of them and their reference versions are not row-wise"
        )
    table = {**reference, **own}
    if backend_name == REFERENCE:
        return Ops(REFERENCE, table, (), backends[REFERENCE].plan, batch_invariant)
    fallbacks = tuple(sorted(set(full) - set(own)))
    if fallbacks:
        logger.info("backend %r lacks %d ops on %s%s; using reference for: %s",
                    backend_name, len(fallbacks), device_type, mode, ", ".join(fallbacks))
    return Ops(backend_name, table, fallbacks, backends[backend_name].plan, batch_invariant)


def get_ops(
    backend: str | None = None, device: torch.device | str = "cpu", *, batch_invariant: bool = False
) -> Ops:
    """Ops for `device` from `backend` (or $DEEPINFER_BACKEND, or the best installed one). With
    `batch_invariant`, every op's result for a row is bitwise independent of the other rows of its
    call (batch size and composition), or a BackendError names the ops that cannot be."""
    device = torch.device(device)
    return _resolve(_select(backend, device).name, device.type, batch_invariant)
