"""`deepinfer generate`: complete text or token-id prompts; human-readable or `--json` for scripts."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from deepinfer.distributed.cli import add_parallel_args
from deepinfer.entrypoints.cli.engine_args import (
    add_engine_args,
    add_sampling_args,
    llm_from_args,
    parse_ids,
    sampling_from_args,
)
from deepinfer.entrypoints.cli.errors import UsageError

# The embedded default model: trained by tools/train, tracked in the repository (docs/training.md).
DEFAULT_MODEL = "checkpoints/tiny-stdlib"


def default_model_dir() -> str:
    """The default checkpoint of a source checkout (found from this file), else the relative path."""
    repo = Path(__file__).resolve().parents[6]
    return str(repo / DEFAULT_MODEL) if (repo / DEFAULT_MODEL).is_dir() else DEFAULT_MODEL


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate completions for prompts",
        description="Load a checkpoint and complete each prompt with continuous batching. Prompts are "
        "text (--prompt, tokenized with the checkpoint's tokenizer and a BOS) or token ids "
        "(--prompt-ids 0,5,17). With --json, prints one JSON object per request (token ids, text, "
        "logprobs, finish reason, timing) in submission order.",
    )
    src = parser.add_argument_group("prompts")
    src.add_argument("--prompt", action="append", default=[], help="text prompt (repeatable)")
    src.add_argument("--prompt-ids", action="append", type=parse_ids, default=[],
                     help="comma-separated token-id prompt (repeatable)")
    src.add_argument("--stream", action="store_true", help="print text as it is generated (one prompt)")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    add_engine_args(parser)
    model = next(a for a in parser._actions if a.dest == "model")
    model.required, model.default = False, default_model_dir()
    model.help = f"checkpoint directory (default: the trained default model, {DEFAULT_MODEL})"
    add_parallel_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.prompt) == bool(args.prompt_ids):
        raise UsageError("give --prompt or --prompt-ids (not both)")
    if args.stream and args.dp > 1:
        raise UsageError("--stream: not available with --dp")
    if args.stream and len(args.prompt or args.prompt_ids) != 1:
        raise UsageError("--stream takes a single prompt")
    params = sampling_from_args(args)
    llm = llm_from_args(args)
    try:
        prompts = dict(prompts=args.prompt) if args.prompt else dict(prompt_token_ids=args.prompt_ids)
        if args.stream:
            for out in llm.generate_stream(**prompts, sampling_params=params):
                for c in out.outputs:
                    print(c.text, end="", flush=True)
            print()
            return 0
        outputs = llm.generate(**prompts, sampling_params=params, use_tqdm=not args.json)
    finally:
        llm.close()
    if args.json:
        for out in outputs:
            print(json.dumps(to_json(out), ensure_ascii=False))
        return 0
    for out in outputs:
        head = out.prompt if out.prompt is not None else out.prompt_token_ids
        print(f"=== {out.request_id}: {head!r}")
        for c in out.outputs:
            print(f"[{c.index}] {c.text!r}  ({len(c.token_ids)} tokens, {c.finish_reason})")
        m = out.metrics
        if m.ttft is not None:
            print(f"    TTFT {1000 * m.ttft:.1f} ms" + (f", TPOT {1000 * m.tpot:.1f} ms" if m.tpot else ""))
    return 0


def to_json(out) -> dict:
    m = out.metrics
    return {
        "request_id": out.request_id,
        "prompt": out.prompt,
        "prompt_token_ids": out.prompt_token_ids,
        "outputs": [
            {"index": c.index, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
             "stop_reason": c.stop_reason,
             "logprobs": None if c.logprobs is None else [dataclasses.asdict(lp) for lp in c.logprobs],
             "cumulative_logprob": c.cumulative_logprob, "draft_tok": c.draft_tok, "accept_tok": c.accept_tok}
            for c in out.outputs
        ],
        "ttft_s": m.ttft,
        "tpot_s": m.tpot,
    }
