"""`deepinfer score`: full-sequence float32 logits of token-id prompts, for parity checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors.torch import save_file

from deepinfer.engine.llm_engine import token_ids
from deepinfer.engine.loader import LOAD_FORMATS, default_cache_precision
from deepinfer.entrypoints.cli.engine_args import add_runtime_args, option_names
from deepinfer.entrypoints.cli.errors import UsageError, non_negative_int, positive_int

# the model's two compute dtypes (the spec's fp32 and bf16), by the names every command uses
SCORE_DTYPES = ("bfloat16", "float32")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "score",
        help="write full-sequence logits of token-id prompts",
        description="Run each prompt through the model (one sequence at a time, through the stateful "
        "cache) and write its float32 logits for every position to a safetensors file. The input JSON "
        "is a list of token-id lists (keys `prompt.0`, `prompt.1`, ...) or an object name -> token ids "
        "(keys = names).",
    )
    parser.add_argument("--model", required=True,
                        help="checkpoint directory (config.json, safetensors; config.json alone with "
                        "--load-format dummy)")
    parser.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                        help="auto: read the checkpoint's safetensors; dummy: random weights drawn from "
                        "--seed in the release storage formats from config.json (the weights `deepinfer "
                        "bench --load-format dummy` runs with the same --seed and --device)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the --load-format dummy weights")
    parser.add_argument("--input", required=True, help="prompts JSON")
    parser.add_argument("--out", required=True, help="output .safetensors")
    parser.add_argument("--dtype", choices=SCORE_DTYPES, default="float32", help="compute dtype")
    parser.add_argument("--backend", default=None, help="op backend (default: best installed)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk", type=positive_int, default=None,
                        help="prefill chunk size (default: the whole prompt)")
    add_runtime_args(parser)
    parser.set_defaults(func=run)


def read_prompts(path: str | Path) -> dict[str, list[int]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: not a JSON file of prompts ({type(exc).__name__})") from None
    if not isinstance(data, dict | list):
        raise ValueError(f"{path}: expected a list of token-id lists or an object name -> token ids")
    items = data.items() if isinstance(data, dict) else ((f"prompt.{i}", p) for i, p in enumerate(data))
    prompts = {}
    for name, value in items:
        try:
            ids = token_ids(value, f"prompt {name!r}")
        except TypeError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if not ids or min(ids) < 0:
            raise ValueError(f"{path}: prompt {name!r} must be a non-empty list of token ids >= 0")
        prompts[str(name)] = ids
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def run(args: argparse.Namespace) -> int:
    from deepinfer.engine.loader import load_model
    from deepinfer.entrypoints.llm import SettingError, runtime_options

    try:
        options = runtime_options(args.cache_precision or default_cache_precision(args.device),
                                  args.replay_mode, args.replay_keep)
    except SettingError as exc:
        raise UsageError(option_names(str(exc))) from None
    prompts = read_prompts(args.input)
    runtime = load_model(args.model, dtype=args.dtype, device=args.device, backend=args.backend,
                         load_format=args.load_format, seed=args.seed, options=options)
    for name, ids in prompts.items():
        if max(ids) >= runtime.vocab_size:
            raise ValueError(f"prompt {name!r}: token id {max(ids)} >= vocab size {runtime.vocab_size}")
    logits = runtime.score(list(prompts.values()), chunk=args.chunk)
    save_file({name: x.float().cpu().contiguous() for name, x in zip(prompts, logits)}, args.out)
    print(f"wrote {len(prompts)} prompt(s) to {args.out}")
    return 0
