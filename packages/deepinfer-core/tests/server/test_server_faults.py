"""Faults against a live server: disconnects (prefill, decode, non-streaming), a queue flood, and a
request whose engine step raises. Every case ends with the engine idle and all cache blocks free."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import httpx
import openai
import pytest

from .conftest import API_KEY, MODEL

NO_THINK = {"thinking": {"type": "disabled"}}
HI = [{"role": "user", "content": "Hi"}]
LONG = {"model": MODEL, "messages": HI, "max_tokens": 400, "ignore_eos": True, **NO_THINK}


@pytest.fixture(scope="module")
def server(server_factory):
    # a small batch and a short queue: prefill of a long prompt takes many steps, floods overflow
    return server_factory("--max-num-seqs", "2", "--max-num-batched-tokens", "32",
                          "--max-num-queued-reqs", "2")


def _aborts(server) -> float:
    return server.metric("deepinfer:request_success_total", finished_reason="abort")


def test_stream_disconnect_mid_decode_aborts(server):
    before = _aborts(server)
    with server.http.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200
        lines = 0
        for line in r.iter_lines():
            lines += line.startswith("data:")
            if lines >= 4:
                break  # leaving the block closes the connection mid-decode
    server.wait_idle()
    assert _aborts(server) == before + 1


def test_non_stream_disconnect_aborts(server):
    before = _aborts(server)
    with pytest.raises(httpx.ReadTimeout):
        server.http.post("/v1/chat/completions", json=LONG, timeout=httpx.Timeout(60, read=1.5))
    server.wait_idle()
    assert _aborts(server) == before + 1


def test_disconnect_mid_prefill_aborts(server):
    ttft_before = server.metric("deepinfer:time_to_first_token_seconds_count")
    before = _aborts(server)
    prompt = list(range(3, 480))  # ~15 prefill steps of 32 tokens
    with pytest.raises(httpx.ReadTimeout):
        server.http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 8},
                         timeout=httpx.Timeout(60, read=0.05))
    server.wait_idle()
    assert _aborts(server) == before + 1
    assert server.metric("deepinfer:time_to_first_token_seconds_count") == ttft_before  # no token came


def test_queue_flood_gets_503_and_the_server_keeps_serving(server):
    rejected_before = server.metric("deepinfer:admission_rejections_total", reason="queue_full")

    async def flood() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                                     timeout=120) as client:
            body = {**LONG, "max_tokens": 12}
            responses = await asyncio.gather(*(client.post("/v1/chat/completions", json=body)
                                               for _ in range(24)))
        for r in responses:
            if r.status_code == 503:
                assert r.headers["Retry-After"] == "1" and "queue is full" in r.json()["error"]["message"]
        return [r.status_code for r in responses]

    statuses = asyncio.run(flood())
    assert set(statuses) == {200, 503} and statuses.count(200) >= 2, statuses
    assert server.metric("deepinfer:admission_rejections_total", reason="queue_full") == (
        rejected_before + statuses.count(503))
    with pytest.raises(openai.InternalServerError, match="queue is full"):  # the SDK's view of a 503
        _flood_with_sdk(server)
    server.wait_idle()
    ok = server.openai().chat.completions.create(model=MODEL, messages=LONG["messages"], max_tokens=4,
                                                 extra_body=NO_THINK)
    assert ok.choices[0].finish_reason == "length"


def _flood_with_sdk(server) -> None:
    client = server.async_openai()

    async def run():
        await asyncio.gather(*(client.chat.completions.create(
            model=MODEL, messages=LONG["messages"], max_tokens=12, extra_body=NO_THINK) for _ in range(16)))

    asyncio.run(run())


def test_sigterm_drains_in_flight_requests(server):
    """Last test of the module (it stops the server): a stream in flight at SIGTERM still completes."""
    body = {**LONG, "max_tokens": 40, "stream": True}
    with server.http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        server.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data:")]
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2].replace(" ", "")
    assert server.proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    log = server.log.read_text()
    assert "available routes" in log and "Traceback" not in log


def test_engine_failure_and_deadline(tiny_checkpoint):
    """In-process server whose model raises on a poisoned token: that request gets a 500, the next one
    is served, the cache is freed and /ready stays 200. A request past its deadline gets a 504."""
    import uvicorn

    from deepinfer.entrypoints.cli.main import build_parser
    from deepinfer.entrypoints.cli.serve import make_state
    from deepinfer.entrypoints.server.app import build_app

    from .conftest import free_port

    args = build_parser().parse_args(["serve", tiny_checkpoint, "--max-model-len", "256", "--cache-mb", "16",
                                      "--served-model-name", MODEL])
    args.model = args.model_tag
    state = make_state(args)
    model = state.engine.engine.runner.model
    forward, poison = model.forward, 700

    def failing_forward(batch):
        if any(poison in seg.token_ids for seg in batch.segments):
            raise RuntimeError("injected fault")
        return forward(batch)

    model.forward = failing_forward
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            while not server.started:
                time.sleep(0.05)
            body = {"model": MODEL, "prompt": [5, poison, 9], "max_tokens": 4}
            bad = http.post("/v1/completions", json=body)
            assert bad.status_code == 500 and "injected fault" in bad.json()["error"]["message"], bad.text
            good = http.post("/v1/completions", json={**body, "prompt": [5, 6, 9]})
            assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] == "length"
            ready = http.get("/ready")
            assert ready.status_code == 200 and ready.json()["failed_steps"] == 1
            state.request_timeout = 0.2
            late = http.post("/v1/completions", json={**body, "prompt": [5, 6, 9], "max_tokens": 200,
                                                      "ignore_eos": True})
            assert late.status_code == 504 and "deadline" in late.json()["error"]["message"]
            time.sleep(0.5)  # the abort lands within a step
            assert state.engine.snapshot.cache_all_free and state.engine.snapshot.running == 0
    finally:
        server.should_exit = True
        thread.join(30)
