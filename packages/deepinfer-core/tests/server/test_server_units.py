"""The server's pure pieces: response store bound, usage merging, error shapes, bench statistics."""

from __future__ import annotations

import pytest

from deepinfer.entrypoints.cli.bench_serve import Result, parse_slos, percentile, summarize
from deepinfer.entrypoints.cli.errors import UsageError
from deepinfer.entrypoints.server.errors import error_payload
from deepinfer.entrypoints.server.protocols import _sum_usage
from deepinfer.entrypoints.server.store import ResponseStore, StoredResponse


def test_store_evicts_least_recently_used():
    store = ResponseStore(capacity=2)
    for rid in ("a", "b"):
        store.put(rid, StoredResponse({"id": rid}))
    assert store.get("a") is not None  # "b" is now the least recently used
    store.put("c", StoredResponse({"id": "c"}))
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2


def test_usage_of_n_choices_counts_the_prompt_once():
    u = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
         "completion_tokens_details": {"reasoning_tokens": 2}, "prompt_tokens_details": {"cached_tokens": 0}}
    other = {**u, "completion_tokens": 5, "completion_tokens_details": {"reasoning_tokens": 1}}
    total = _sum_usage([u, other])
    assert total["prompt_tokens"] == 10 and total["completion_tokens"] == 8 and total["total_tokens"] == 18
    assert total["completion_tokens_details"]["reasoning_tokens"] == 3
    assert u["completion_tokens"] == 3  # inputs untouched
    assert _sum_usage([None, None]) is None


def test_error_shapes_per_protocol():
    assert error_payload("/v1/messages", 413, "too big") == {
        "type": "error", "error": {"type": "request_too_large", "message": "too big"}}
    assert error_payload("/v1/chat/completions", 503, "full", "x") == {
        "error": {"message": "full", "type": "service_unavailable", "param": "x", "code": 503}}


def test_bench_statistics():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5 and percentile([7.0], 99) == 7.0
    ok = [Result(True, 10, 5, ttft=0.1, e2el=0.5, itl=[0.1] * 4), Result(True, 10, 1, ttft=0.3, e2el=0.3)]
    s = summarize([*ok, Result(False, error="boom")], duration=2.0, slos={"ttft": 0.2}, percentiles=[50])
    assert (s["completed"], s["failed"], s["errors"]) == (2, 1, ["boom"])
    assert s["total_output_tokens"] == 6 and s["request_throughput"] == 1.0 and s["goodput"] == 0.5
    assert s["mean_tpot_ms"] == pytest.approx(100.0)  # only the request with > 1 token has a TPOT
    assert s["p50_ttft_ms"] == pytest.approx(200.0)
    assert parse_slos(["ttft:500", "e2el:2000"]) == {"ttft": 0.5, "e2el": 2.0}
    for bad in ("ttft", "itl:5", "tpot:-1", "tpot:x"):
        with pytest.raises(UsageError, match="--goodput"):
            parse_slos([bad])
