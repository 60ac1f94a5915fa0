"""Model runner: a scheduled step -> `ForwardBatch` -> logits -> sampled tokens.

It runs on the engine's worker thread under async scheduling, strictly in step order, so the tokens
sampled by step N are at hand when step N+1 is launched: placeholders left by the scheduler are
filled from them here, off the scheduling thread. Slot resets and fork copies also run here, in step
order, so they never race a step that still uses the slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from deepinfer.engine.scheduler import PLACEHOLDER, ScheduledSegment, SchedulerOutput
from deepinfer.engine.sequence import Request, Sequence
from deepinfer.models.interface import CausalLM, ForwardBatch, SequenceSegment
from deepinfer.sampling.sampler import Sampler, SampleRow, TokenLogprob, token_logprobs


@runtime_checkable
class SupportsFork(Protocol):
    """Optional model capability that lets n > 1 completions share one prompt prefill."""

    def copy_slot(self, src: int, dst: int) -> None: ...

    def copy_blocks(self, src: list[int], dst: list[int]) -> None: ...


@dataclass
class StepResult:
    sampled: list[tuple[Sequence, int, TokenLogprob | None]]
    prompt_logprobs: list[tuple[Request, int, list[TokenLogprob | None]]]  # (request, first pos, rows)
    start: float  # perf_counter when the step began on the worker
    end: float
    num_tokens: int
    num_seqs: int


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
        self._last_sampled: dict[int, int] = {}  # seq id -> token sampled by the previous step

    def execute(self, sched: SchedulerOutput) -> StepResult:
        start = time.perf_counter()
        for slot in sched.resets:
            self.model.reset_slot(slot)
        segments = []
        for s in sched.segments:
            ids = s.token_ids
            if ids[-1] == PLACEHOLDER:
                ids = [*ids[:-1], self._last_sampled[s.seq.seq_id]]
            segments.append(SequenceSegment(s.slot, s.blocks, s.start_pos, ids, s.logits))
        batch = ForwardBatch(segments)
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
        sampled = []
        if rows:
            logits = out.logits.index_select(0, torch.tensor(rows, device=out.logits.device))
            result = self.sampler(logits, sample_rows)
            self._last_sampled = {seq.seq_id: t for seq, t in zip(sample_seqs, result.token_ids)}
            sampled = list(zip(sample_seqs, result.token_ids, result.logprobs))
        end = time.perf_counter()
        return StepResult(sampled, prompt_lp, start, end, sched.num_tokens, len(sched.segments))

    def _sample_row(self, seq: Sequence, position: int) -> SampleRow:
        p = seq.request.params
        row = SampleRow(p, seq.seed, position, position - seq.prompt_len)
        if p.has_penalties:
            # tokens up to `position` never change once appended; the newest may still be in flight
            row.prompt_ids = seq.request.prompt_ids
            row.output_ids = seq.token_ids[seq.prompt_len:position]
            if len(row.output_ids) < row.num_outputs:
                row.output_ids.append(self._last_sampled[seq.seq_id])
        return row

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor, first_row: int, seg: SequenceSegment,
                         s: ScheduledSegment) -> tuple[Request, int, list[TokenLogprob | None]]:
        """Rows of an "all" chunk predict the prompt tokens after each of its positions."""
        prompt = s.seq.request.prompt_ids
        last = min(seg.start_pos + len(seg.token_ids), len(prompt) - 1)  # last position predicted from
        n = last - seg.start_pos
        targets = torch.tensor(prompt[seg.start_pos + 1:last + 1], dtype=torch.long)
        rows = logits[first_row:first_row + n]
        return s.seq.request, seg.start_pos + 1, token_logprobs(rows, targets, [s.prompt_logprobs] * n)
