"""Record the official deepseek-recipe 0.2.0 output-side behaviour as conformance fixtures.

Run with the official venv:  /work/venvs/recipe-official/bin/python tools/record_official_stream.py
Writes tests/fixtures/stream_cases.jsonl and tests/fixtures/images_cases.jsonl. The case builders live in
tests/stream_cases.py and are shared with the replay test, so both sides drive the API identically.
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import stream_cases  # noqa: E402

FIXTURES = HERE.parent / "tests" / "fixtures"


def main() -> None:
    import deepseek_recipe as dr

    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, cases, run in (
        ("stream_cases.jsonl", stream_cases.stream_cases(dr), stream_cases.run_stream_case),
        ("images_cases.jsonl", stream_cases.image_cases(dr), stream_cases.run_image_case),
    ):
        with open(FIXTURES / name, "w", encoding="utf-8") as out:
            for case in cases:
                result = run(dr, case)
                out.write(json.dumps({"case": case, "expected": result}, ensure_ascii=False) + "\n")
        print(f"{name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
