"""Replays the recorded official image results (tests/fixtures/images_cases.jsonl) on this package:
token-count arithmetic, preprocessing sizes and error kinds, data-URL and URL errors. No network."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import recorded
import stream_cases

import deepseek_recipe as dr

CASES = recorded.load_cases("images_cases.jsonl")


def actual(record):
    return stream_cases.run_image_case(dr, record["case"])


@pytest.mark.parametrize("record", CASES, ids=recorded.case_ids(CASES))
def test_image_case(record):
    assert actual(record) == record["expected"]


def test_destination_filter_must_be_callable():
    with pytest.raises(TypeError):
        dr.ReqwestImageFetcher().with_destination_filter(42)


if __name__ == "__main__":
    recorded.report(CASES, actual)
