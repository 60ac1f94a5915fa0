"""`deepinfer` command line: one module per subcommand, each exposing `register(subparsers)`.

A subcommand's `register` adds its parser and sets `func` (taking the parsed args, returning an exit
code). Modules are imported lazily by name so `deepinfer --help` stays fast and a subcommand whose
optional dependency is missing fails only when used.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMAND_MODULES = [
    "make_checkpoint",
    "describe",
    "backends",
    "score",
    "generate",
    "chat",
    "bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepinfer",
        description="DeepInfer: inference for DeepSeek-V4.1 / V4 models. "
        "Run `deepinfer <command> --help` for the options of each command.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ...)")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"deepinfer.entrypoints.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
