"""Record the official deepseek-recipe 0.2.0 output-side behaviour as conformance fixtures.

Run with the official venv:  /work/venvs/recipe-official/bin/python tools/record_official_stream.py
Writes tests/fixtures/stream_cases.jsonl and tests/fixtures/images_cases.jsonl. The case builders live in
tests/stream_cases.py and are shared with the replay test, so both sides drive the API identically.
New cases go after the existing ones (e.g. `resp_custom/*`, apply_patch custom tool calls), so the records
already in the fixture stay byte-identical; main() checks that.
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
    before = {}
    for name in ("stream_cases.jsonl", "images_cases.jsonl"):
        path = FIXTURES / name
        before[name] = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for name, cases, run in (
        ("stream_cases.jsonl", stream_cases.stream_cases(dr), stream_cases.run_stream_case),
        ("images_cases.jsonl", stream_cases.image_cases(dr), stream_cases.run_image_case),
    ):
        with open(FIXTURES / name, "w", encoding="utf-8") as out:
            for case in cases:
                result = run(dr, case)
                out.write(json.dumps({"case": case, "expected": result}, ensure_ascii=False) + "\n")
        lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
        changed = sum(old != new for old, new in zip(before[name], lines))
        added = len(lines) - len(before[name])
        print(f"{name}: {len(cases)} cases ({added} new, {changed} earlier records changed)")


if __name__ == "__main__":
    main()
