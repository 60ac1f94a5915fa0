"""`deepinfer serve --dp 2 --ep 2`: persistent ranks answer like a single-process server; a lost rank
fails its requests and /ready instead of hanging."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import MODEL

pytestmark = pytest.mark.slow

PROMPTS = ["Hi", "Tell me a story", "What is 2+2?", "Name three colors of the rainbow please"]


def _greedy(server) -> list[str]:
    client = server.async_openai()

    async def one(text: str) -> str:
        out = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=12, temperature=0,
            extra_body={"thinking": {"type": "disabled"}})
        return out.choices[0].message.content or ""

    async def run() -> list[str]:
        return await asyncio.gather(*(one(p) for p in PROMPTS))

    return asyncio.run(run())


def _rank_pids(server_pid: int) -> list[int]:
    """The server's spawned rank processes (not multiprocessing's resource tracker)."""
    tasks = Path(f"/proc/{server_pid}/task").iterdir()  # children are listed under the spawning thread
    children = [p for task in tasks for p in (task / "children").read_text().split()]
    return [int(p) for p in children
            if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_serve_dp_matches_single_process_and_fails_cleanly(server_factory):
    single = server_factory()
    expected = _greedy(single)
    single.stop()
    dp = server_factory("--dp", "2", "--ep", "2", "--dist-timeout", "20")
    assert _greedy(dp) == expected
    stream = dp.openai().completions.create(model=MODEL, prompt="Hi", max_tokens=400, stream=True)
    next(iter(stream))
    stream.close()  # the client leaves: its rank aborts the request and frees its cache
    dp.wait_idle()

    ranks = _rank_pids(dp.proc.pid)
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while dp.http.get("/ready").status_code == 200:
        assert time.monotonic() < deadline, "/ready still 200 after a rank died"
        time.sleep(0.2)
    assert "rank 1" in dp.http.get("/ready").json()["reason"]
    resp = dp.http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
    assert resp.status_code >= 500
