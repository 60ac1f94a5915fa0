"""`deepinfer backends`: list installed backends, the devices they serve and their op coverage."""

from __future__ import annotations

import argparse

import torch

from deepinfer.ops import available_backends, get_ops


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backends",
        help="list installed op backends",
        description="List the backends found through the `deepinfer.backends` entry points, whether "
        "each supports the given device, and which ops fall back to the reference backend.",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    print(f"{'backend':<12} {'package':<28} {'priority':>8}  {'device ' + str(device):<14} fallbacks")
    for name, backend in sorted(available_backends().items(), key=lambda kv: -kv[1].priority):
        supported = backend.supports(device)
        fallbacks = len(get_ops(name, device).fallbacks) if supported else "-"
        print(f"{name:<12} {backend.package:<28} {backend.priority:>8}  {'yes' if supported else 'no':<14} "
              f"{fallbacks}")
    return 0
