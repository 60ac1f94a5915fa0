"""`deepinfer chat`: an interactive, streaming conversation in the terminal."""

from __future__ import annotations

import argparse
import sys
from contextlib import closing
from typing import TYPE_CHECKING

from deepinfer.engine.llm_engine import check_text
from deepinfer.entrypoints.cli.engine_args import (
    add_engine_args,
    add_sampling_args,
    llm_from_args,
    sampling_from_args,
)
from deepinfer.entrypoints.cli.errors import describe
from deepinfer.sampling import SamplingParams

if TYPE_CHECKING:
    from deepinfer.entrypoints.llm import LLM

DIM, RESET = "\033[2m", "\033[0m"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="interactive streaming chat",
        description="Chat with a model: each line you type is a user turn; the reply streams as it is "
        "generated (reasoning dimmed when --thinking). The prompt is rendered in the DeepSeek-V4.1 chat "
        "format by deepseek_recipe (pip install 'deepinfer-core[serve]'). Commands: /reset clears the "
        "history, /quit (or end of input) leaves. Ctrl-C stops a reply; at the prompt it leaves.",
    )
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--thinking", action="store_true", help="enable thinking mode")
    parser.add_argument("--reasoning-effort", default=None, help="low, medium, high, max, ...")
    add_engine_args(parser)
    add_sampling_args(parser, max_tokens=256)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_from_args(args)
    llm = llm_from_args(args)
    # undecodable input arrives as lone surrogates and is refused per line instead of ending the session
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")
    tty = sys.stdout.isatty()
    history: list[dict] = []
    system = [{"role": "system", "content": args.system}] if args.system else []
    try:
        while True:
            try:
                line = input("you> " if sys.stdin.isatty() else "")
            except (EOFError, KeyboardInterrupt):
                print()
                break
            if line.strip() in ("/quit", "/exit"):
                break
            if line.strip() == "/reset":
                history.clear()
                continue
            if not line.strip():
                continue
            try:
                check_text(line, "this line")
                turn = _reply(llm, [*system, *history, {"role": "user", "content": line}], params, args, tty)
            except ValueError as exc:  # this turn is refused; the conversation so far stays
                print(f"\n[error: {describe(exc)}; the line was not added]", file=sys.stderr)
                continue
            except KeyboardInterrupt:
                print("\n[interrupted; the line was not added]", file=sys.stderr)
                continue
            history += [{"role": "user", "content": line}, turn]
    finally:
        llm.close()
    return 0


def _reply(llm: LLM, messages: list[dict], params: SamplingParams, args: argparse.Namespace,
           tty: bool) -> dict:
    """Stream one reply to the terminal; the assistant turn for the history."""
    reply, reasoning = [], []
    print("assistant> ", end="", flush=True)
    stream = llm.chat_stream(messages, params, thinking=args.thinking, reasoning_effort=args.reasoning_effort)
    with closing(stream):  # an interrupt aborts the request at once
        for delta in stream:
            if text := delta.get("reasoning_content"):
                reasoning.append(text)
                print(f"{DIM}{text}{RESET}" if tty else text, end="", flush=True)
            if text := delta.get("content"):
                reply.append(text)
                print(text, end="", flush=True)
            for call in delta.get("tool_calls", []):
                print(f"\n[tool call] {call}", end="", flush=True)
            reason = delta.get("finish_reason")
            if reason in ("prompt_length_exceeded", "abort", "error"):
                raise ValueError(f"no reply: {reason.replace('_', ' ')} (max_model_len "
                                 f"{llm.engine.max_model_len})")
    print()
    turn = {"role": "assistant", "content": "".join(reply)}
    if args.thinking:
        turn["reasoning_content"] = "".join(reasoning)
    return turn
