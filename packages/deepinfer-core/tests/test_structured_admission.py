"""Admission around a constrained request whose grammar is still compiling: requests behind it are
admitted meanwhile, and it is admitted as soon as its grammar is ready, even while those still run."""

from __future__ import annotations

import re
import threading

import torch

from deepinfer.engine import EngineConfig, LLMEngine
from deepinfer.engine.sequence import SeqStatus
from deepinfer.sampling import SamplingParams


class _SlowCompile:
    """The real grammar backend, with `compile` held until `gate` is set."""

    def __init__(self, real, gate: threading.Event):
        self.real, self.gate = real, gate

    def compile(self, spec):
        self.gate.wait(5)
        return self.real.compile(spec)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def test_slow_compile_does_not_delay_requests_behind_it(toy_models, synthetic_tokenizer):
    from deepinfer.structured.llguidance_backend import LLGuidanceBackend

    torch.manual_seed(0)
    toy = toy_models[0](vocab_size=synthetic_tokenizer.vocab_size)
    engine = LLMEngine(toy, synthetic_tokenizer, EngineConfig(
        max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, cache_bytes=1 << 20,
        log_stats_interval=0))
    gate = threading.Event()
    manager = engine.runner.structured
    manager._factory = lambda tok, vocab, eos: _SlowCompile(LLGuidanceBackend(tok, vocab, eos), gate)
    try:
        slow = SamplingParams(seed=1, max_tokens=20, structured_outputs={"regex": "[a-z]{3}"})
        engine.add_request([0, 5, 6, 7], slow, request_id="slow")  # first in line
        free = SamplingParams(seed=0, max_tokens=40, ignore_eos=True)
        engine.add_request([0, 40, 41], free, request_id="free")
        seq_slow, seq_free = engine.requests["slow"].seqs[0], engine.requests["free"].seqs[0]
        engine.step()
        assert seq_free.status is SeqStatus.RUNNING and seq_slow.status is SeqStatus.WAITING
        engine.step()
        assert len(seq_free.token_ids) > seq_free.prompt_len  # it decodes while "slow" compiles

        gate.set()
        manager._compiled(slow.structured_outputs).result(timeout=5)
        engine.step()
        assert seq_slow.status is not SeqStatus.WAITING  # admitted while "free" still runs
        assert seq_free.status is SeqStatus.RUNNING
        done = {}
        while engine.has_unfinished_requests():
            done |= {o.request_id: o for o in engine.step() if o.finished}
        assert re.fullmatch("[a-z]{3}", done["slow"].outputs[0].text)
        assert len(done["free"].outputs[0].token_ids) == 40
    finally:
        gate.set()
        engine.close()
