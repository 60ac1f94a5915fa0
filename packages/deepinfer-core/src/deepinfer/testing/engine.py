"""Run a batch of requests through a fresh engine to the end, as the engine tests on real models do."""

from __future__ import annotations

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.models.interface import CausalLM
from deepinfer.sampling import SamplingParams


def run_requests(model: CausalLM, reqs: list[tuple[list[int], SamplingParams]],
                 **config) -> tuple[dict[str, list[list[int]]], LLMEngine]:
    """Add `reqs` as requests "r0", "r1", ... to a new engine over `model` (no tokenizer; `config` are
    EngineConfig fields over a 16 MiB cache and no stats logging) and step until none is left.

    Returns each request's completions' token ids and the closed engine (its stats), after checking that
    every cache block and slot was given back."""
    config = {"cache_bytes": 16 << 20, "log_stats_interval": 0, **config}
    engine = LLMEngine(model, None, EngineConfig(**config))
    for i, (ids, params) in enumerate(reqs):
        engine.add_request(ids, params, request_id=f"r{i}")
    done = {}
    while engine.has_unfinished_requests():
        done |= {o.request_id: [c.token_ids for c in o.outputs] for o in engine.step() if o.finished}
    engine.close()
    assert engine.cache.all_free(), "cache blocks or slots leaked"
    return done, engine
