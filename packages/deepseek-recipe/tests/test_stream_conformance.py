"""Replays the recorded official outputs (tests/fixtures/stream_cases.jsonl) on this package.

Every case must match byte for byte after normalising random ids and timestamps. Run directly
(`python tests/test_stream_conformance.py [-v]`) for a pass count per case family.
"""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import recorded
import stream_cases

import deepseek_recipe as dr

CASES = recorded.load_cases("stream_cases.jsonl")


def actual(record):
    return stream_cases.run_stream_case(dr, record["case"])


@pytest.mark.parametrize("record", CASES, ids=recorded.case_ids(CASES))
def test_stream_case(record):
    assert actual(record) == record["expected"]


if __name__ == "__main__":
    recorded.report(CASES, actual, width=28)
