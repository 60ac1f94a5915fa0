"""How the CLI reports a failed command: one line on stderr, exit 2 for a bad option, 1 otherwise.

`--debug` (or DEEPINFER_DEBUG=1) lets the exception through with its traceback instead. This module is
imported before anything heavy (pydantic, torch), so `main` can report a Ctrl-C during those imports.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import pydantic

N = TypeVar("N", int, float)

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT


class UsageError(ValueError):
    """An option's value is invalid (reported like argparse's own usage errors, exit 2)."""


def describe(exc: BaseException) -> str:
    """One line saying what went wrong, without Python internals."""
    import pydantic

    from deepinfer.config.errors import config_error_from

    if isinstance(exc, pydantic.ValidationError):
        return str(config_error_from(exc))
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename is not None else ""
        return f"{exc.strerror}{where}"
    if isinstance(exc, RecursionError):
        return "input nested too deeply"
    if isinstance(exc, MemoryError) and not str(exc):
        return "out of memory"
    text = " ".join(str(exc).split())  # one line
    if isinstance(exc, (ValueError, TypeError, ImportError, LookupError, MemoryError)) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _pydantic_msg(err: dict) -> str:
    if err["type"] == "value_error":  # our own validators: their message, without pydantic's prefix
        return str(err["ctx"]["error"])
    return err["msg"]


def usage_errors(exc: pydantic.ValidationError, flags: dict[str, str] | None = None) -> UsageError:
    """A validation error of settings built from options, naming the options (`top_k` -> `--top-k`)."""
    flags = flags or {}
    parts = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else ""
        flag = flags.get(name, "--" + name.replace("_", "-")) if name else "options"
        parts.append(f"{flag}: {_pydantic_msg(err)}")
    return UsageError("; ".join(parts))


# ---- argparse value types: a bad value is a usage error naming the option --------------------------


def positive_int(text: str) -> int:
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def finite_float(text: str) -> float:
    value = _number(float, text)
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_rate(text: str) -> float:
    """A rate > 0; `inf` allowed (everything at once)."""
    value = _number(float, text)
    if not value > 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text!r}")
    return value


def _number(kind: Callable[[str], N], text: str) -> N:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
