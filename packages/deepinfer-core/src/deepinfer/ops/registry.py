"""Backend discovery through the `deepinfer.backends` entry-point group, selection and op fallback."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import cache
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

    def supports(self, device: torch.device) -> bool:
        raise NotImplementedError

    def ops(self) -> dict[str, Callable]:
        """Op name -> implementation; names must belong to the reference op set."""
        raise NotImplementedError

    def plan(self, metadata: Any) -> None:
        """Called once per forward with the step's metadata (e.g. deepseek_v41 StepMetadata), before
        any op runs: derive the backend's own scheduling data (split sizes, tile maps) here. Must not
        read device values on the host. Default: nothing to plan."""


class Ops:
    """Read-only namespace of resolved ops: `ops.rms_norm(x, w, eps)`."""

    def __init__(
        self,
        backend_name: str,
        table: dict[str, Callable],
        fallbacks: tuple[str, ...],
        plan: Callable[[Any], None] | None = None,
    ):
        self.backend_name = backend_name
        self.plan = plan or (lambda metadata: None)  # the backend's per-step hook (Backend.plan)
        self.fallbacks = fallbacks  # ops served by the reference backend
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


@cache
def _resolve(backend_name: str, device_type: str) -> Ops:
    backends = available_backends()
    reference = backends[REFERENCE].ops()
    table = dict(reference)
    if backend_name == REFERENCE:
        return Ops(REFERENCE, table, (), backends[REFERENCE].plan)
    own = backends[backend_name].ops()
    unknown = sorted(set(own) - set(reference))
    if unknown:
        raise BackendError(f"backend {backend_name!r} provides ops outside the op set: {unknown}")
    for group in OP_GROUPS:
        partial = sorted(group & set(own))
        if partial and len(partial) < len(group):
            raise BackendError(
                f"backend {backend_name!r} provides {partial} but not {sorted(group - set(own))}: "
                f"the ops {sorted(group)} share prepared weights, so a backend provides all of them or none"
            )
    table.update(own)
    fallbacks = tuple(sorted(set(reference) - set(own)))
    if fallbacks:
        logger.info("backend %r lacks %d ops on %s; using reference for: %s",
                    backend_name, len(fallbacks), device_type, ", ".join(fallbacks))
    return Ops(backend_name, table, fallbacks, backends[backend_name].plan)


def get_ops(backend: str | None = None, device: torch.device | str = "cpu") -> Ops:
    """Ops for `device` from `backend` (or $DEEPINFER_BACKEND, or the best installed one)."""
    device = torch.device(device)
    return _resolve(_select(backend, device).name, device.type)
