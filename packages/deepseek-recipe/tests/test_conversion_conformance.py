"""Replays the recorded official outputs (tests/fixtures/conversion.jsonl) on this package.

Every case (request conversion, prompt rendering, prompt encoding, tokenizer, API surface) must match
the official deepseek-recipe 0.2.0 exactly. Run directly (`python tests/test_conversion_conformance.py`)
for a pass count per case family; add `-v` to list failures.
"""

import collections
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import conversion_cases

import deepseek_recipe as dr

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "conversion.jsonl"


def load_cases():
    with open(FIXTURE, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


CASES = load_cases()


def normalised(result):
    # Round-trip through JSON so tuples/lists and int/float keys compare as recorded.
    return json.loads(json.dumps(result, ensure_ascii=False))


@pytest.mark.parametrize("record", CASES, ids=[r["case"]["id"] for r in CASES])
def test_conversion_case(record):
    assert normalised(conversion_cases.run_case(dr, record["case"])) == record["expected"]


def test_case_count():
    assert len(CASES) >= 250


def main() -> None:
    passed = collections.Counter()
    total = collections.Counter()
    failures = []
    for record in CASES:
        family = record["case"]["id"].split("/")[0]
        total[family] += 1
        if normalised(conversion_cases.run_case(dr, record["case"])) == record["expected"]:
            passed[family] += 1
        else:
            failures.append(record["case"]["id"])
    for family in sorted(total):
        print(f"{family:12s} {passed[family]:4d}/{total[family]}")
    print(f"TOTAL {sum(passed.values())}/{sum(total.values())}")
    if "-v" in sys.argv:
        print("\n".join(failures))


if __name__ == "__main__":
    main()
