"""`deepinfer` command line: one module per subcommand, each exposing `register(subparsers)`.

A subcommand's `register` adds its parser and sets `func` (taking the parsed args, returning an exit
code). Modules are imported lazily by name so `deepinfer --help` stays fast and a subcommand whose
optional dependency is missing fails only when used. Options every command takes (`--log-level`,
`--debug`) and the help format are added here, so they work after the subcommand too.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from deepinfer.entrypoints.cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    EXIT_USAGE,
    UsageError,
    describe,
)

SUBCOMMAND_MODULES = [
    "make_checkpoint",
    "describe",
    "backends",
    "score",
    "generate",
    "chat",
    "bench",
    "serve",
    "bench_serve",
]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _ShowDefaults:
    """Help-formatter mixin: append "(default: X)" once, only where a default says something."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        says_nothing = default is None or default is False or default is argparse.SUPPRESS or (
            isinstance(default, str | list) and not default)
        if not action.option_strings or "default" in text or says_nothing:
            return action.help
        return f"{text} (default: {default})" if text else f"(default: {default})"


def _with_defaults(formatter: type[argparse.HelpFormatter]) -> type[argparse.HelpFormatter]:
    if issubclass(formatter, _ShowDefaults):
        return formatter
    if formatter is argparse.ArgumentDefaultsHelpFormatter:  # would add the default a second time
        formatter = argparse.HelpFormatter
    return type(formatter.__name__, (_ShowDefaults, formatter), {})


def _add_common(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default,
                        metavar="LEVEL", help=f"logging level: {', '.join(LOG_LEVELS)} (default: INFO)")
    parser.add_argument("--debug", action="store_true", default=default,
                        help="show the Python traceback of an error (also: DEEPINFER_DEBUG=1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepinfer",
        description="DeepInfer: inference for DeepSeek-V4.1 / V4 models. "
        "Run `deepinfer <command> --help` for the options of each command.",
        formatter_class=_with_defaults(argparse.HelpFormatter),
    )
    _add_common(parser, None)
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"deepinfer.entrypoints.cli.{name}").register(subparsers)
    for sub in subparsers.choices.values():
        _add_common(sub, argparse.SUPPRESS)  # after the subcommand: only overrides when given
        sub.formatter_class = _with_defaults(sub.formatter_class)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "serve"]:  # `deepinfer bench serve` is the bench-serve command
        argv[:2] = ["bench-serve"]
    debug = "--debug" in argv or os.environ.get("DEEPINFER_DEBUG", "") not in ("", "0")
    prog = "deepinfer"
    try:  # building the parser imports torch: a Ctrl-C there is an interrupt like any other
        args = build_parser().parse_args(argv)
        prog = f"deepinfer {args.command}"
        logging.basicConfig(level=args.log_level or "INFO", format="%(levelname)s %(name)s: %(message)s")
        return int(args.func(args) or 0)
    except UsageError as exc:
        if debug:
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        print(f"{prog}: error: {describe(exc)} (--debug shows the traceback)", file=sys.stderr)
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
