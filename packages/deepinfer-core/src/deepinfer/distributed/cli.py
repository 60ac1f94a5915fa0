"""`deepinfer generate --dp N --ep N`: the options of data/expert-parallel ranks and the front end
they describe."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from deepinfer.distributed.launch import DEFAULT_TIMEOUT_S
from deepinfer.entrypoints.cli.errors import UsageError, finite_float, non_negative_int, positive_int

if TYPE_CHECKING:
    from deepinfer.distributed.frontend import DataParallelLLM


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("parallelism (ranks on this host, CPU/gloo)")
    g.add_argument("--dp", type=positive_int, default=1,
                   help="data-parallel ranks: each is an engine serving its share of the requests")
    g.add_argument("--ep", type=positive_int, default=None,
                   help="expert-parallel size: routed experts and Engram table rows are sharded over the "
                   "ranks (must equal --dp; default: --dp)")
    g.add_argument("--redundant-experts", type=non_negative_int, default=0,
                   help="extra expert slots per MoE layer for EPLB replicas")
    g.add_argument("--eplb-interval", type=non_negative_int, default=0,
                   help="rebalance the experts every N forwards from the measured loads (0: off)")
    g.add_argument("--dist-timeout", type=finite_float, default=DEFAULT_TIMEOUT_S,
                   help="seconds a rank may wait in a collective before the group stops with an error")


def data_parallel_llm(args: argparse.Namespace, llm_kwargs: dict[str, Any]) -> DataParallelLLM:
    """The front end over `--dp` ranks, each building `LLM(args.model, **llm_kwargs)` on its share."""
    from deepinfer.distributed.frontend import DataParallelLLM

    ep = args.ep or args.dp
    if ep != args.dp:
        raise UsageError(f"--ep: {ep} must equal --dp {args.dp} (experts are sharded over the data-parallel "
                         "ranks)")
    if args.dist_timeout <= 0:
        raise UsageError(f"--dist-timeout: must be > 0, got {args.dist_timeout}")
    if llm_kwargs.get("device") not in (None, "cpu"):
        raise UsageError(f"--device: {llm_kwargs['device']}: --dp ranks run on the CPU (gloo) for now")
    return DataParallelLLM(args.model, args.dp, {**llm_kwargs, "device": "cpu"}, timeout_s=args.dist_timeout,
                           redundant_experts=args.redundant_experts, eplb_interval=args.eplb_interval,
                           seed=llm_kwargs.get("seed", 0))
