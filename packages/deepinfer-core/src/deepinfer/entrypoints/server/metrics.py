"""Prometheus metrics: vLLM's metric names under a `deepinfer:` prefix, so dashboards port by renaming.

Every series carries `model_name`. Times are seconds, measured on the server's monotonic clock from the
moment the HTTP request arrived (rendering and tokenization included), except the queue time, which the
engine measures from the request's arrival in the engine to its first scheduling.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from deepinfer.entrypoints.server.async_engine import EngineSnapshot, SpecCounters

P = "deepinfer:"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class ServerMetrics:
    def __init__(self, model_name: str, num_draft_tokens: int = 0):
        """`num_draft_tokens`: the speculator's K, 0 without speculative decoding (no spec_decode series)."""
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        m = ["model_name"]
        self.running = Gauge(f"{P}num_requests_running", "Sequences in the running batch", m, registry=r)
        self.waiting = Gauge(f"{P}num_requests_waiting", "Sequences waiting to be scheduled", m, registry=r)
        self.kv_usage = Gauge(f"{P}kv_cache_usage_perc", "Share of KV cache blocks in use (0-1)", m,
                              registry=r)
        self.in_flight = Gauge(f"{P}num_requests_in_flight", "HTTP requests the engine is serving", m,
                               registry=r)
        self.failed_steps = Gauge(f"{P}engine_failed_steps", "Engine steps that raised", m, registry=r)
        self.prompt_tokens = Counter(f"{P}prompt_tokens", "Prefilled prompt tokens", m, registry=r)
        self.generation_tokens = Counter(f"{P}generation_tokens", "Generated tokens", m, registry=r)
        self.success = Counter(f"{P}request_success", "Finished requests by finish reason",
                               [*m, "finished_reason"], registry=r)
        self.rejections = Counter(f"{P}admission_rejections", "Requests refused at admission",
                                  [*m, "reason"], registry=r)
        self.ttft = Histogram(f"{P}time_to_first_token_seconds", "Time to first token", m,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{P}inter_token_latency_seconds", "Time between streamed outputs", m,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(f"{P}request_queue_time_seconds", "Engine arrival to first scheduling", m,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{P}e2e_request_latency_seconds", "Arrival to finish", m,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_len = Histogram(f"{P}request_prompt_tokens", "Prompt tokens per request", m,
                                    buckets=TOKEN_BUCKETS, registry=r)
        self.gen_len = Histogram(f"{P}request_generation_tokens", "Generated tokens per request", m,
                                 buckets=TOKEN_BUCKETS, registry=r)
        self.http = Counter("http_requests", "HTTP requests by route and status", ["handler", "status"],
                            registry=r)
        self.spec = SpecDecodeMetrics(r, model_name, num_draft_tokens) if num_draft_tokens else None

    def render(self, snapshot: EngineSnapshot, in_flight: int) -> bytes:
        """The exposition text, with the gauges taken from the engine thread's latest snapshot."""
        name = self.model_name
        self.running.labels(name).set(snapshot.running)
        self.waiting.labels(name).set(snapshot.waiting)
        self.kv_usage.labels(name).set(snapshot.kv_usage)
        self.in_flight.labels(name).set(in_flight)
        self.failed_steps.labels(name).set(snapshot.failed_steps)
        if self.spec is not None:
            self.spec.update(snapshot.spec)
        return generate_latest(self.registry)

    def finished(self, reason: str, prompt_tokens: int, output_tokens: int, e2e: float,
                 ttft: float | None, queue_time: float | None) -> None:
        """One request ended. `queue_time` is None for a request never scheduled (aborted while waiting)."""
        name = self.model_name
        self.success.labels(name, reason).inc()
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.generation_tokens.labels(name).inc(output_tokens)
        self.prompt_len.labels(name).observe(prompt_tokens)
        self.gen_len.labels(name).observe(output_tokens)
        self.e2e.labels(name).observe(e2e)
        if ttft is not None:
            self.ttft.labels(name).observe(ttft)
        if queue_time is not None:
            self.queue_time.labels(name).observe(queue_time)


class SpecDecodeMetrics:
    """vLLM's spec_decode counters. The engine's counts are cumulative: each update adds what is new."""

    def __init__(self, registry: CollectorRegistry, model_name: str, num_draft_tokens: int):
        m, r = ["model_name"], registry
        self.drafts = Counter(f"{P}spec_decode_num_drafts", "Sequence-steps that verified drafts", m,
                              registry=r).labels(model_name)
        self.draft_tokens = Counter(f"{P}spec_decode_num_draft_tokens", "Draft tokens verified", m,
                                    registry=r).labels(model_name)
        self.accepted_tokens = Counter(f"{P}spec_decode_num_accepted_tokens", "Draft tokens accepted", m,
                                       registry=r).labels(model_name)
        per_pos = Counter(f"{P}spec_decode_num_accepted_tokens_per_pos",
                          "Drafts accepted at each position of the verified drafts", [*m, "position"],
                          registry=r)
        # every position from the start, so per-position acceptance (per_pos / num_drafts) reads 0, not absent
        self.accepted_per_pos = [per_pos.labels(model_name, str(j)) for j in range(num_draft_tokens)]
        self._seen = SpecCounters()

    def update(self, counts: SpecCounters) -> None:
        seen = self._seen
        self.drafts.inc(counts.drafts - seen.drafts)
        self.draft_tokens.inc(counts.draft_tokens - seen.draft_tokens)
        self.accepted_tokens.inc(counts.accepted_tokens - seen.accepted_tokens)
        before = seen.accepted_per_pos
        for j, n in enumerate(counts.accepted_per_pos):
            self.accepted_per_pos[j].inc(n - (before[j] if j < len(before) else 0))
        self._seen = counts
