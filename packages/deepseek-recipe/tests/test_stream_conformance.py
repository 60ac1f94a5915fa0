"""Replays the recorded official outputs (tests/fixtures/stream_cases.jsonl) on this package.

Every case must match byte for byte after normalising random ids and timestamps. Run directly
(`python tests/test_stream_conformance.py`) for a pass count per case family.
"""

import collections
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import stream_cases

import deepseek_recipe as dr

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "stream_cases.jsonl"


def load_cases():
    with open(FIXTURE, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


CASES = load_cases()


@pytest.mark.parametrize("record", CASES, ids=[r["case"]["id"] for r in CASES])
def test_stream_case(record):
    assert stream_cases.run_stream_case(dr, record["case"]) == record["expected"]


def main() -> None:
    passed = collections.Counter()
    total = collections.Counter()
    failures = []
    for record in CASES:
        family = record["case"]["id"].split("/")[0]
        total[family] += 1
        got = stream_cases.run_stream_case(dr, record["case"])
        if got == record["expected"]:
            passed[family] += 1
        else:
            failures.append(record["case"]["id"])
    for family in sorted(total):
        print(f"{family:28s} {passed[family]:4d}/{total[family]}")
    print(f"TOTAL {sum(passed.values())}/{sum(total.values())}")
    if "-v" in sys.argv:
        print("\n".join(failures))


if __name__ == "__main__":
    main()
