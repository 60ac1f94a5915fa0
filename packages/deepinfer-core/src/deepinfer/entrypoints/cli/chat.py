"""`deepinfer chat`: an interactive, streaming conversation in the terminal."""

from __future__ import annotations

import argparse
import sys

from deepinfer.entrypoints.cli.engine_args import (
    add_engine_args,
    add_sampling_args,
    llm_from_args,
    sampling_from_args,
)

DIM, RESET = "\033[2m", "\033[0m"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="interactive streaming chat",
        description="Chat with a model: each line you type is a user turn; the reply streams as it is "
        "generated (reasoning dimmed when --thinking). The prompt is rendered in the DeepSeek-V4.1 chat "
        "format by deepseek_recipe (pip install 'deepinfer-core[serve]'). Commands: /reset clears the "
        "history, /quit (or end of input) leaves.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
    tty = sys.stdout.isatty()
    history: list[dict] = []
    try:
        while True:
            try:
                line = input("you> " if sys.stdin.isatty() else "")
            except EOFError:
                break
            if line.strip() in ("/quit", "/exit"):
                break
            if line.strip() == "/reset":
                history.clear()
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            system = [{"role": "system", "content": args.system}] if args.system else []
            reply, reasoning = [], []
            print("assistant> ", end="", flush=True)
            for delta in llm.chat_stream(system + history, params, thinking=args.thinking,
                                         reasoning_effort=args.reasoning_effort):
                if text := delta.get("reasoning_content"):
                    reasoning.append(text)
                    print(f"{DIM}{text}{RESET}" if tty else text, end="", flush=True)
                if text := delta.get("content"):
                    reply.append(text)
                    print(text, end="", flush=True)
                for call in delta.get("tool_calls", []):
                    print(f"\n[tool call] {call}", end="", flush=True)
            print()
            turn = {"role": "assistant", "content": "".join(reply)}
            if args.thinking:
                turn["reasoning_content"] = "".join(reasoning)
            history.append(turn)
    finally:
        llm.close()
    return 0
