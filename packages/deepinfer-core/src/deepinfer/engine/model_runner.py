"""Model runner: a scheduled step -> `ForwardBatch` -> logits -> sampled tokens.

It runs on the engine's worker thread, strictly in step order. Under async scheduling a segment of
step N+1 may end in the scheduler's `PLACEHOLDER` for the token step N is sampling; the runner then
passes the model `ForwardBatch.input_ids`, built on the device, whose placeholder entries are copied
on the device from step N's sampled-token tensor (as the official engine's ZOS does): launching step
N+1 never waits for step N's samples to reach the host. Their host copy is only read by
post-processing (one step behind) and by penalty rows that need the newest token. Slot resets and
fork copies also run here, in step order, so they never race a step that still uses the slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from deepinfer.engine.scheduler import PLACEHOLDER, ScheduledSegment, SchedulerOutput
from deepinfer.engine.sequence import Request, Sequence
from deepinfer.models.interface import CausalLM, ForwardBatch, SequenceSegment
from deepinfer.sampling.sampler import (
    PendingLogprobs,
    SampleOutput,
    Sampler,
    SampleRow,
    TokenLogprob,
    to_device,
)


@runtime_checkable
class SupportsFork(Protocol):
    """Optional model capability that lets n > 1 completions share one prompt prefill."""

    def copy_slot(self, src: int, dst: int) -> None: ...

    def copy_blocks(self, src: list[int], dst: list[int]) -> None: ...


@dataclass
class StepResult:
    sample_seqs: list[Sequence]
    samples: SampleOutput | None  # one row per entry of sample_seqs
    pending_prompt_logprobs: list[tuple[Request, int, PendingLogprobs]]  # (request, first pos, rows)
    start: float  # perf_counter when the step was launched on the worker
    end: float
    num_tokens: int
    num_seqs: int

    @property
    def sampled(self) -> list[tuple[Sequence, int, TokenLogprob | None]]:
        """(sequence, token, logprob) on the host: waits for this step's device-to-host copies."""
        if self.samples is None:
            return []
        return list(zip(self.sample_seqs, self.samples.token_ids, self.samples.logprobs))

    @property
    def prompt_logprobs(self) -> list[tuple[Request, int, list[TokenLogprob | None]]]:
        return [(req, first, rows.get()) for req, first, rows in self.pending_prompt_logprobs]


def _row_offsets(batch: ForwardBatch) -> list[int]:
    offsets = [0]
    for seg in batch.segments:
        rows = {"none": 0, "last": 1, "all": len(seg.token_ids)}[seg.logits]
        offsets.append(offsets[-1] + rows)
    return offsets


class ModelRunner:
    def __init__(self, model: CausalLM, sampler: Sampler):
        self.model = model
        self.sampler = sampler
        self._prev: SampleOutput | None = None  # the previous step's samples (tokens on the device)
        self._prev_row: dict[int, int] = {}  # seq id -> its row in self._prev

    def execute(self, sched: SchedulerOutput) -> StepResult:
        start = time.perf_counter()
        for slot in sched.resets:
            self.model.reset_slot(slot)
        segments = [SequenceSegment(s.slot, s.blocks, s.start_pos, s.token_ids, s.logits)
                    for s in sched.segments]
        batch = ForwardBatch(segments, self._input_ids(sched))
        out = self.model.forward(batch)
        for f in sched.forks:  # after the forward: the parent's cache now holds the whole prompt
            self.model.copy_slot(f.src_slot, f.dst_slot)  # type: ignore[attr-defined]
            self.model.copy_blocks(f.src_blocks, f.dst_blocks)  # type: ignore[attr-defined]
        offsets = out.row_offsets or _row_offsets(batch)

        rows, sample_rows, sample_seqs = [], [], []
        prompt_lp = []
        for i, s in enumerate(sched.segments):
            if s.sample_seqs:
                position = s.start_pos + len(s.token_ids)  # of the token being generated
                rows.extend([offsets[i + 1] - 1] * len(s.sample_seqs))
                sample_rows.extend(self._sample_row(seq, position) for seq in s.sample_seqs)
                sample_seqs.extend(s.sample_seqs)
            if s.prompt_logprobs is not None:
                prompt_lp.append(self._prompt_logprobs(out.logits, offsets[i], segments[i], s))
        result = None
        if rows:
            logits = out.logits.index_select(0, to_device(rows, out.logits.device))
            result = self.sampler(logits, sample_rows)
        self._prev, self._prev_row = result, {seq.seq_id: r for r, seq in enumerate(sample_seqs)}
        end = time.perf_counter()
        return StepResult(sample_seqs, result, prompt_lp, start, end, sched.num_tokens, len(sched.segments))

    def _input_ids(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """Device ids with the placeholders filled from the previous step's sampled tokens, on the
        device; None when every token is known on the host (then the lists are the values)."""
        flat, dst, src = [], [], []
        for s in sched.segments:
            if s.token_ids[-1] == PLACEHOLDER:
                dst.append(len(flat) + len(s.token_ids) - 1)
                src.append(self._prev_row[s.seq.seq_id])
            flat.extend(s.token_ids)
        if not dst:
            return None
        assert self._prev is not None, "a placeholder without a previous step"
        prev = self._prev.tokens
        ids = to_device(flat, prev.device)
        ids[to_device(dst, prev.device)] = prev[to_device(src, prev.device)]
        return ids

    def _sample_row(self, seq: Sequence, position: int) -> SampleRow:
        p = seq.request.params
        row = SampleRow(p, seq.seed, position, position - seq.prompt_len)
        if p.has_penalties:
            # tokens up to `position` never change once appended; the newest may still be in flight
            row.prompt_ids = seq.request.prompt_ids
            row.output_ids = seq.token_ids[seq.prompt_len:position]
            if len(row.output_ids) < row.num_outputs:  # after this step's forward was launched
                assert self._prev is not None
                row.output_ids.append(self._prev.token_ids[self._prev_row[seq.seq_id]])
        return row

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor, first_row: int, seg: SequenceSegment,
                         s: ScheduledSegment) -> tuple[Request, int, PendingLogprobs]:
        """Rows of an "all" chunk predict the prompt tokens after each of its positions."""
        prompt = s.seq.request.prompt_ids
        last = min(seg.start_pos + len(seg.token_ids), len(prompt) - 1)  # last position predicted from
        n = last - seg.start_pos
        targets = to_device(prompt[seg.start_pos + 1:last + 1], logits.device)
        rows = logits[first_row:first_row + n]
        return s.seq.request, seg.start_pos + 1, PendingLogprobs(rows, targets, [s.prompt_logprobs] * n)
