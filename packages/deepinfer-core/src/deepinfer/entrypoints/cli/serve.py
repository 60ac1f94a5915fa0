"""`deepinfer serve MODEL`: the OpenAI- and Anthropic-compatible HTTP server (vLLM's flag spellings)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from deepinfer.distributed.cli import add_parallel_args
from deepinfer.entrypoints.cli.engine_args import add_engine_args, llm_from_args
from deepinfer.entrypoints.cli.errors import UsageError, finite_float, positive_int

if TYPE_CHECKING:
    from deepinfer.entrypoints.server.state import ServerState

logger = logging.getLogger("deepinfer.server")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="OpenAI- and Anthropic-compatible HTTP server",
        description="Serve a checkpoint over HTTP: /v1/chat/completions, /v1/completions, /v1/responses, "
        "/v1/messages (+count_tokens), /v1/models, /tokenize, /detokenize, /health, /ready, /metrics, "
        "/version. Prompts are rendered and outputs parsed by deepseek_recipe (pip install "
        "'deepinfer-core[serve]'). See docs/serving.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("model_tag", nargs="?", metavar="MODEL", help="checkpoint directory (or use --model)")
    add_engine_args(parser)
    add_parallel_args(parser)
    for action in parser._actions:  # the positional MODEL may stand in for --model
        if action.dest == "model":
            action.required = False
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes the server)")
    g.add_argument("--port", type=positive_int, default=8000)
    g.add_argument("--api-key", default=None,
                   help="key required on EVERY route except /health and /ready (inference, admin, metrics, "
                   "tokenize); clients send 'Authorization: Bearer KEY' or 'x-api-key: KEY'. "
                   "Default: $DEEPINFER_API_KEY, else no key (bind to localhost then)")
    g.add_argument("--served-model-name", nargs="+", default=None,
                   help="model names clients use (default: the checkpoint directory's name)")
    g.add_argument("--max-num-queued-reqs", type=positive_int, default=None,
                   help="waiting requests beyond which new ones get 503 + Retry-After (default: unbounded)")
    g.add_argument("--request-timeout", type=positive_seconds, default=None,
                   help="per-request deadline in seconds (queue + generation); past it: 504, aborted")
    g.add_argument("--max-request-body-bytes", type=positive_int, default=16 << 20,
                   help="larger bodies get 413")
    g.add_argument("--response-store-size", type=positive_int, default=1024,
                   help="Responses API results kept for GET/cancel (least recently used evicted)")
    g.add_argument("--shutdown-timeout", type=positive_seconds, default=30.0,
                   help="seconds to let in-flight requests finish on SIGINT/SIGTERM")
    parser.set_defaults(func=run, defaults={a.dest: a.default for a in parser._actions})


def positive_seconds(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def make_state(args: argparse.Namespace) -> ServerState:
    """Load the checkpoint, start nothing yet: the app's lifespan starts the engine thread."""
    import deepseek_recipe as recipe
    from deepinfer.entrypoints.server.async_engine import AsyncEngine
    from deepinfer.entrypoints.server.metrics import ServerMetrics
    from deepinfer.entrypoints.server.state import ServerState
    from deepinfer.entrypoints.server.store import ResponseStore

    model_dir = Path(args.model)
    if not (model_dir / "tokenizer.json").exists():
        raise UsageError(f"{model_dir} has no tokenizer.json: the server renders prompts and needs one")
    llm = llm_from_args(args)
    if args.dp > 1:  # persistent ranks; the server process keeps only the tokenizer
        if args.eplb_interval:
            raise UsageError("--eplb-interval: not available with serve --dp (idle ranks do not rebalance)")
        from deepinfer.distributed.serving import DataParallelEngine
        from deepinfer.entrypoints.llm import load_tokenizer

        engine, text_tokenizer = DataParallelEngine(llm), load_tokenizer(model_dir)
    else:
        engine, text_tokenizer = llm.engine, llm.tokenizer
    engine.tokenizer = None  # token ids in and out: the recipe does all text (no second detokenizer)
    names = args.served_model_name or [model_dir.resolve().name]
    options = recipe.ConversionOptions()
    for name in names:
        options = options.with_model_alias(name, recipe.ModelVersion.DeepseekV41Flash)
    recipe_tokenizer = recipe.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return ServerState(
        recipe=recipe, engine=AsyncEngine(engine, args.max_num_queued_reqs),
        metrics=ServerMetrics(names[0], engine.proposer.num_draft_tokens if engine.proposer else 0),
        served_model_names=names, recipe_tokenizer=recipe_tokenizer,
        encoding=recipe.DeepseekV41Encoding().with_tokenizer(recipe_tokenizer), conversion_options=options,
        text_tokenizer=text_tokenizer, max_model_len=engine.max_model_len, api_key=args.api_key,
        max_body_bytes=args.max_request_body_bytes, request_timeout=args.request_timeout,
        responses=ResponseStore(args.response_store_size))


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from deepinfer.entrypoints.server.app import build_app, route_list

    args.model = args.model_tag or args.model
    args.api_key = args.api_key or os.environ.get("DEEPINFER_API_KEY")  # not a default: --help shows those
    if not args.model:
        raise UsageError("give the checkpoint directory: deepinfer serve MODEL")
    changed = {k: v for k, v in vars(args).items()
               if k in args.defaults and k != "api_key" and args.defaults[k] != v}
    logger.info("non-default arguments: %s", changed)
    app = build_app(make_state(args))
    logger.info("available routes:\n  %s", "\n  ".join(route_list()))
    if args.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("serving on %s without --api-key: anyone who can reach it can use it", args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=args.shutdown_timeout)
    return 0
