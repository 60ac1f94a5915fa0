"""Differential fuzzing of the stream parser against the official wheel (not part of CI).

Random model outputs are assembled from tag fragments, newlines, unicode and stop strings, cut at random
points (text or token chunks), recorded with the official venv and replayed on this package:

    /work/main/.venv/bin/python tools/fuzz_stream_diff.py [--seed N] [--cases N]
"""

import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile

TESTS = pathlib.Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

import stream_cases as sc  # noqa: E402

OFFICIAL_PYTHON = "/work/venvs/recipe-official/bin/python"
D = sc.D
SNIPPETS = [
    "Hello", " world", "\n", "\n\n", "</think>", "<think>", "<", "</", "<x>", " ", "é", "🎉", "你好", "STOP",
    f"<{D}tool_calls>", f"<{D} calls>", f'<{D}invoke name="f">', f'<{D} invoke name="g">',
    f'<{D}parameter name="a" string="true">', f'<{D} parameter name="b" string="false">', "v<1>",
    f"</{D}parameter>", f"</{D} parameter>", f"</{D}invoke>", f"</{D} invoke>", f"</{D}tool_calls>",
    f"</{D} calls>", "```json\n", '{"k": [1, "}"]}', "\n```", sc.EOS, "x",
]  # fmt: skip


def make_cases(dr, seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    tok = sc.load_tokenizer(dr)
    gens = sc._generator_specs()
    cases = []
    for i in range(count):
        text = "".join(rng.choice(SNIPPETS) for _ in range(rng.randint(1, 14)))
        stage = rng.choice([None, "ReasoningStart", "ReasoningContinuation", "ContentContinuation"])
        options = {"thinking_initial_stage": stage}
        for key, p, value in (
            ("parse_tool_calls", 0.2, False),
            ("stop_sequences", 0.15, ["STOP"]),
            ("parse_json_output", 0.1, True),
            ("starts_in_tool_calls", 0.1, True),
        ):
            if rng.random() < p:
                options[key] = value
        protocol, gen = gens[rng.randrange(len(gens))]
        if rng.random() < 0.5:
            n = rng.randint(1, 6)
            inputs = [{"text": text[j : j + n], "token_count": 1} for j in range(0, len(text), n)]
        else:
            ids, n = tok.encode(text), rng.randint(1, 4)
            inputs = [{"tokens": ids[j : j + n]} for j in range(0, len(ids), n)]
        finish = rng.choice(["Stop", "Length", None])
        cases.append({"id": f"fuzz/{i}", "protocol": protocol, "generator": gen, "options": options,
                      "ready": None, "inputs": inputs, "finish": finish})  # fmt: skip
    return cases


def record(seed: int, count: int, path: str) -> None:
    import deepseek_recipe as dr

    with open(path, "w", encoding="utf-8") as out:
        for case in make_cases(dr, seed, count):
            result = {"case": case, "expected": sc.run_stream_case(dr, case)}
            out.write(json.dumps(result, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--record-to")
    args = parser.parse_args()
    if args.record_to:
        record(args.seed, args.cases, args.record_to)
        return
    import deepseek_recipe as dr

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fuzz.jsonl")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        command = [OFFICIAL_PYTHON, __file__, "--seed", str(args.seed), "--cases", str(args.cases)]
        subprocess.run([*command, "--record-to", path], check=True, env=env)
        records = [json.loads(line) for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines()]
    failed = [r["case"]["id"] for r in records if sc.run_stream_case(dr, r["case"]) != r["expected"]]
    same = len(records) - len(failed)
    print(f"fuzz seed {args.seed}: {same}/{len(records)} identical; differing: {failed[:30]}")


if __name__ == "__main__":
    main()
