"""The one exception type for invalid model configurations."""

from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A config.json violates a rule; the message starts with the offending key (dotted path)."""


def config_error_from(exc: ValidationError, prefix: str = "") -> ConfigError:
    """Turn pydantic's error list into one ConfigError whose lines read `key: rule`."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        if err["type"] == "missing":
            msg = "missing required key"
        elif err["type"] == "value_error":
            # our own rule messages already name their key ("key: rule"); keep them as written
            msg = str(err["ctx"]["error"])
            if loc:
                loc = f"{loc}." if ":" in msg.split(" ", 1)[0] else f"{loc}: "
                lines.append(f"{loc}{msg}")
                continue
        else:
            msg = err["msg"]
        lines.append(f"{loc}: {msg}" if loc else msg)
    return ConfigError("; ".join(lines))
