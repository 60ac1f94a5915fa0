"""Replays the recorded official outputs (tests/fixtures/conversion.jsonl) on this package.

Every case (request conversion, prompt rendering, prompt encoding, tokenizer, API surface) must match
the official deepseek-recipe 0.2.0 exactly. Run directly (`python tests/test_conversion_conformance.py`)
for a pass count per case family; add `-v` to list failures.
"""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import conversion_cases
import recorded

import deepseek_recipe as dr

CASES = recorded.load_cases("conversion.jsonl")


def actual(record):
    # Round-trip through JSON so tuples/lists and int/float keys compare as recorded.
    return json.loads(json.dumps(conversion_cases.run_case(dr, record["case"]), ensure_ascii=False))


@pytest.mark.parametrize("record", CASES, ids=recorded.case_ids(CASES))
def test_conversion_case(record):
    assert actual(record) == record["expected"]


def test_case_count():
    assert len(CASES) >= 250


def main() -> None:
    recorded.report(CASES, actual)


if __name__ == "__main__":
    main()
