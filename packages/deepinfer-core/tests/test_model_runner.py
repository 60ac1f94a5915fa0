"""The model runner's per-step shortcuts (tiny checkpoint, reference backend): what a decode step
after a decode step skips, with outputs equal to the synchronous engine's."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from deepinfer.engine.loader import load_model
from deepinfer.engine.scheduler import PLACEHOLDER
from deepinfer.sampling import SamplingParams
from deepinfer.sampling.sampler import SampleOutput, Sampler
from deepinfer.testing.engine import run_requests

PROMPTS = [[0, *range(5, 17)], [0, *range(40, 47)]]


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_model(tiny_checkpoint)


run = partial(run_requests, max_model_len=128, max_num_seqs=4)


def test_decode_after_decode_reads_last_samples_and_logits_in_place(model, monkeypatch):
    """Async decode steps whose sequences sampled in the same order one step before get the previous
    samples' device tensor itself as `input_ids` (no upload, no fill), and a step whose every logits
    row samples passes the forward's logits to the sampler unindexed."""
    samples: list[SampleOutput] = []
    logits: list[torch.Tensor] = []
    reused, sampled_in_place = [], []
    sample, forward = Sampler.__call__, model.forward

    def record_sample(self, rows_logits, rows):
        sampled_in_place.append(any(rows_logits is t for t in logits[-1:]))
        samples.append(sample(self, rows_logits, rows))
        return samples[-1]

    def record_forward(batch):
        if all(s.token_ids == [PLACEHOLDER] for s in batch.segments) and samples:
            reused.append(batch.input_ids is samples[-1].tokens)
        out = forward(batch)
        logits.append(out.logits)
        return out

    monkeypatch.setattr(Sampler, "__call__", record_sample)
    monkeypatch.setattr(model, "forward", record_forward)
    reqs = [(p, SamplingParams(temperature=0.8, seed=i, max_tokens=6, ignore_eos=True))
            for i, p in enumerate(PROMPTS)]
    asyn, _ = run(model, reqs)
    assert reused and all(reused)
    assert sampled_in_place and all(sampled_in_place)
    monkeypatch.undo()
    assert asyn == run(model, reqs, async_scheduling=False)[0]
