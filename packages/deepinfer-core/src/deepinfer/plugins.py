"""Loading plugins registered under an entry-point group (backends, speculators)."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from importlib.util import find_spec

logger = logging.getLogger(__name__)


def load_entry_points(group: str) -> dict[str, object]:
    """Name -> loaded object for every entry point in `group`; a plugin that fails to import is
    logged and skipped so one broken package cannot take the engine down."""
    found: dict[str, object] = {}
    for ep in entry_points(group=group):
        try:
            found[ep.name] = ep.load()
        except Exception as exc:
            logger.warning("plugin %r (%s) in %s failed to load: %s", ep.name, ep.value, group, exc)
    return found


def module_available(name: str) -> bool:
    """Whether `name` can be imported, without importing it (backends probe their toolkits this way)."""
    return find_spec(name) is not None
