"""Speculator discovery. Entries are classes: a speculator is built later, around a loaded model."""

from __future__ import annotations

from functools import cache

from deepinfer.plugins import load_entry_points

ENTRY_POINT_GROUP = "deepinfer.speculators"


class SpeculatorError(RuntimeError):
    pass


@cache
def available_speculators() -> dict[str, type]:
    return load_entry_points(ENTRY_POINT_GROUP)  # type: ignore[return-value]


def get_speculator(name: str) -> type:
    speculators = available_speculators()
    if name not in speculators:
        raise SpeculatorError(
            f"speculator {name!r} is not installed (installed: {sorted(speculators)}); "
            "install deepinfer-spec (pip install 'deepinfer-core[spec]') or a package registering "
            f"{name!r} in {ENTRY_POINT_GROUP!r}"
        )
    return speculators[name]
