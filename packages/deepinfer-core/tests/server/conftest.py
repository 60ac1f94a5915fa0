"""A real `deepinfer serve` subprocess on 127.0.0.1 (a free port) and the SDK clients that drive it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("deepseek_recipe")

API_KEY = "sk-test"
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, checkpoint: str, *extra: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "deepinfer.entrypoints.cli.main", "serve", checkpoint,
                "--port", str(self.port), "--api-key", API_KEY, "--served-model-name", MODEL,
                "--max-model-len", "512", "--cache-mb", "32", *extra]
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        auth = {"Authorization": f"Bearer {API_KEY}"}
        self.http = httpx.Client(base_url=self.url, headers=auth, timeout=60)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if self.http.get("/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server not ready in 180 s:\n{log.read_text()[-3000:]}")

    def openai(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=60, **kw)

    def async_openai(self, **kw):
        import openai

        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=60, **kw)

    def anthropic(self):
        import anthropic

        return anthropic.Anthropic(base_url=self.url, api_key=API_KEY, max_retries=0, timeout=60)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one series in /metrics (0 if absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.http.get("/metrics").text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def wait_idle(self, timeout: float = 30) -> None:
        """Until the engine runs nothing and every cache block is free (fails otherwise)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
            if all(self.metric(f"deepinfer:{name}") == 0 for name in names):
                return
            time.sleep(0.1)
        raise AssertionError(f"engine not idle with all blocks free after {timeout} s: "
                             f"{self.http.get('/ready').json()}")

    def stop(self) -> int:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server_factory(tiny_checkpoint, tmp_path_factory) -> Iterator:
    servers: list[Server] = []

    def start(*extra: str) -> Server:
        servers.append(Server(tiny_checkpoint, *extra, log=tmp_path_factory.mktemp("server") / "server.log"))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()
