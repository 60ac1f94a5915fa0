"""Replays the recorded official image results (tests/fixtures/images_cases.jsonl) on this package:
token-count arithmetic, preprocessing sizes and error kinds, data-URL resolution. No network."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import stream_cases

import deepseek_recipe as dr

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "images_cases.jsonl"
CASES = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("record", CASES, ids=[r["case"]["id"] for r in CASES])
def test_image_case(record):
    assert stream_cases.run_image_case(dr, record["case"]) == record["expected"]


def test_destination_filter_must_be_callable():
    with pytest.raises(TypeError):
        dr.ReqwestImageFetcher().with_destination_filter(42)


def test_rejected_destination_is_not_fetched():
    fetcher = dr.ReqwestImageFetcher().with_destination_filter(lambda host, address: False)
    with pytest.raises(dr.ImageError) as info:
        fetcher.fetch("http://127.0.0.1:9/x.png")
    assert info.value.kind == "DestinationRejected"
    assert info.value.is_retryable is False


def main() -> None:
    passed = sum(stream_cases.run_image_case(dr, r["case"]) == r["expected"] for r in CASES)
    print(f"images: {passed}/{len(CASES)}")
    if "-v" in sys.argv:
        for r in CASES:
            got = stream_cases.run_image_case(dr, r["case"])
            if got != r["expected"]:
                print(r["case"]["id"], got, r["expected"])


if __name__ == "__main__":
    main()
