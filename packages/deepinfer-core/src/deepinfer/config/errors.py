"""The one exception type for invalid model configurations."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config.json violates a rule; the message starts with the offending key (dotted path)."""


def config_error_from(exc: ValidationError, prefix: str = "") -> ConfigError:
    """Turn pydantic's error list into one ConfigError whose parts read `dotted.key: rule`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        if err["type"] == "value_error":
            # raised by our own rule checks, whose messages already start with "key: "
            msg = str(err["ctx"]["error"])
            parts.append(f"{loc}.{msg}" if loc else msg)
            continue
        msg = "missing required key" if err["type"] == "missing" else err["msg"]
        parts.append(f"{loc}: {msg}" if loc else msg)
    return ConfigError("; ".join(parts))
