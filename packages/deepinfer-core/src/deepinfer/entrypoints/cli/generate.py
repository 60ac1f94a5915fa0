"""`deepinfer generate`: complete text or token-id prompts; human-readable or `--json` for scripts."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pydantic

from deepinfer.distributed.cli import add_parallel_args
from deepinfer.entrypoints.cli.engine_args import (
    add_engine_args,
    add_sampling_args,
    llm_from_args,
    parse_ids,
    sampling_from_args,
)
from deepinfer.entrypoints.cli.errors import UsageError, usage_errors
from deepinfer.sampling import SamplingParams

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
    add_structured_args(parser)
    parser.set_defaults(func=run)


def add_structured_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "structured output", "constrain every completion to one of these (at most one); see "
        "docs/structured_output.md")
    kinds = g.add_mutually_exclusive_group()
    kinds.add_argument("--json-schema", metavar="FILE_OR_JSON",
                       help="JSON valid under this JSON Schema: a file if one exists at that path, else the "
                       "schema itself as JSON")
    kinds.add_argument("--json-object", action="store_true", help="any JSON object")
    kinds.add_argument("--regex", metavar="RE", help="text matching this regular expression in full")
    kinds.add_argument("--choice", action="append", metavar="TEXT",
                       help="exactly one of these strings (repeat: --choice yes --choice no)")
    kinds.add_argument("--grammar", metavar="FILE_OR_TEXT",
                       help="text in this grammar (Lark, or GBNF/EBNF as llama.cpp writes it): "
                       "a file if one exists at that path, else the grammar itself")
    g.add_argument("--structured-start-after", metavar="TEXT",
                   help="generate freely until this text (e.g. '</think>'), then apply the constraint")


def structured_from_args(args: argparse.Namespace) -> tuple[dict, str] | None:
    """The `structured_outputs` the options ask for and the option that set it, or None."""
    if args.json_schema is not None:
        so, flag = {"json_schema": _json_schema(args.json_schema)}, "--json-schema"
    elif args.json_object:
        so, flag = {"json_object": True}, "--json-object"
    elif args.regex is not None:
        so, flag = {"regex": args.regex}, "--regex"
    elif args.choice is not None:
        so, flag = {"choice": args.choice}, "--choice"
    elif args.grammar is not None:
        path = Path(args.grammar)
        so, flag = {"grammar": path.read_text() if path.is_file() else args.grammar}, "--grammar"
    elif args.structured_start_after is not None:
        raise UsageError("--structured-start-after: needs one of --json-schema, --json-object, --regex, "
                         "--choice, --grammar")
    else:
        return None
    if args.structured_start_after is not None:
        so["start_after"] = args.structured_start_after
    return so, flag


def _json_schema(value: str) -> dict:
    path = Path(value)
    is_file = path.is_file()
    try:
        schema = json.loads(path.read_text() if is_file else value)
    except json.JSONDecodeError as exc:
        what = f"file {value}" if is_file else "no such file, and the value"
        raise UsageError(f"--json-schema: {what} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--json-schema: a JSON Schema is an object, got {type(schema).__name__}")
    return schema


def run(args: argparse.Namespace) -> int:
    if bool(args.prompt) == bool(args.prompt_ids):
        raise UsageError("give --prompt or --prompt-ids (not both)")
    if args.stream and args.dp > 1:
        raise UsageError("--stream: not available with --dp")
    if args.stream and len(args.prompt or args.prompt_ids) != 1:
        raise UsageError("--stream takes a single prompt")
    params = sampling_from_args(args)
    structured = structured_from_args(args)
    if structured is not None:
        so, flag = structured
        try:  # validated again with the constraint: an invalid schema or regex is an error here
            params = SamplingParams(**{**dict(params), "structured_outputs": so})
        except pydantic.ValidationError as exc:
            raise usage_errors(exc, {"structured_outputs": flag}) from None
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
