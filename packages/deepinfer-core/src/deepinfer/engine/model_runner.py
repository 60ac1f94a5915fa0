"""Model runner: a scheduled step -> `ForwardBatch` -> logits -> sampled tokens.

It runs on the engine's worker thread, strictly in step order. Under async scheduling a segment of
step N+1 may end in the scheduler's `PLACEHOLDER` for the token step N is sampling; the runner then
passes the model `ForwardBatch.input_ids`, built on the device, whose placeholder entries are copied
on the device from step N's sampled-token tensor (as the official engine's ZOS does): launching step
N+1 never waits for step N's samples to reach the host. Their host copy is only read by
post-processing (one step behind) and by penalty rows that need the newest token. Slot resets and
fork copies also run here, in step order, so they never race a step that still uses the slot.

With a speculator every sampled row goes through exact verification instead of the plain sampler (a
row without drafts samples identically), and after it the proposer drafts the next tokens of every
speculating sequence that just sampled. The engine plans a speculative step only once the step
before it has returned, so its segments hold host token ids except for the drafts: a step returns
once drafting is launched, and the next one feeds its drafts' ids to the forward from the proposal
(`ProposedDrafts`, on the device) and reads their host copy only for verification, after launching
the forward. Finished sequences are released to the proposer here, before a step, so that a release
never races a step drafting for that sequence.

An asynchronous confidence-scheduled step (`SchedulerOutput.split`) comes with every draft planned and
the number to verify in all: the runner splits that total among the sequences by their newest
confidences on the device (the proposal's tensors; `splitter`), has the model run just those rows
(`forward_rows`: metadata built on the device) and reads the row counts back behind an event queued
before the forward, so it waits for the drafting only, then verifies each sequence's kept drafts. A
model without `forward_rows`, or a step it cannot run that way (a prefill chunk beside the decodes),
gets the host's split of the same total instead, as does a step with nothing to choose (one speculating
sequence, or a total of none or all of the drafts).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from deepinfer.engine.scheduler import PLACEHOLDER, ScheduledSegment, SchedulerOutput
from deepinfer.engine.sequence import Request, Sequence
from deepinfer.models.interface import CausalLM, ForwardBatch, SequenceSegment
from deepinfer.ops import get_ops
from deepinfer.sampling.params import SamplingParams
from deepinfer.sampling.sampler import (
    HostCopy,
    PendingLogprobs,
    SampleOutput,
    Sampler,
    SampleRow,
    TokenLogprob,
    to_device,
)
from deepinfer.speculators.drafts import NextDrafts, ProposedDrafts
from deepinfer.speculators.interface import History, ProposeBatch, Proposer, ProposeRequest
from deepinfer.speculators.verify import verify
from deepinfer.structured.manager import StructuredManager

_PROFILE_PARAMS = SamplingParams(temperature=0)


def _no_token_in_flight(seq: Sequence) -> int:
    raise AssertionError("speculative steps are planned after the step before: every token is on the host")


@runtime_checkable
class SupportsFork(Protocol):
    """Optional model capability that lets n > 1 completions share one prompt prefill."""

    def copy_slot(self, src: int, dst: int) -> None: ...

    def copy_blocks(self, src: list[int], dst: list[int]) -> None: ...


@dataclass
class Verified:
    """What a speculative step did for one sequence: emitted tokens (accepted drafts + one target
    token) with their logprobs, the drafts it verified and accepted, and its next drafts."""

    seq: Sequence
    tokens: list[int]
    logprobs: list[TokenLogprob | None]
    num_drafts: int
    num_accepted: int
    next: NextDrafts | None = None  # its drafts for the step after (None: it drafts nothing)


@dataclass
class StepResult:
    sample_seqs: list[Sequence]
    samples: SampleOutput | None  # one row per entry of sample_seqs
    pending_prompt_logprobs: list[tuple[Request, int, PendingLogprobs]]  # (request, first pos, rows)
    start: float  # perf_counter when the step was launched on the worker
    end: float
    num_tokens: int
    num_seqs: int
    verified: list[Verified] | None = None  # speculative steps: replaces sample_seqs / samples
    # CUDA: events recorded on the step's stream at its start and end (GPU time, read a step later)
    gpu: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    @property
    def gpu_s(self) -> float | None:
        """GPU time from the step's first to its last queued work (waits for the end event)."""
        if self.gpu is None:
            return None
        start, end = self.gpu
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    @property
    def sampled(self) -> list[tuple[Sequence, int, TokenLogprob | None]]:
        """(sequence, token, logprob) on the host: waits for this step's device-to-host copies."""
        if self.samples is None:
            return []
        return list(zip(self.sample_seqs, self.samples.token_ids, self.samples.logprobs))

    @property
    def prompt_logprobs(self) -> list[tuple[Request, int, list[TokenLogprob | None]]]:
        return [(req, first, rows.get()) for req, first, rows in self.pending_prompt_logprobs]


def _fill(out: torch.Tensor, dst: torch.Tensor, source: torch.Tensor, src: torch.Tensor) -> None:
    """out[dst] = source[src] on the device (stand-in ids replaced by sampled tokens or drafts)."""
    out[dst] = source[src]


def _cut(sched: SchedulerOutput, drafts: dict[int, int]) -> None:
    """Keep the first drafts[i] drafts of segment i, a speculating decode [newest token, drafts]."""
    for i, k in drafts.items():
        s = sched.segments[i]
        sched.num_tokens -= s.num_drafts - k
        del s.token_ids[1 + k:]
        s.num_drafts = k


def _newest_confidences(drafts: list[NextDrafts], device: torch.device) -> torch.Tensor:
    """[R, K] the conditional estimates of each sequence's drafts, gathered on `device` from their
    proposals' tensors (narrower proposals padded: entries past a sequence's drafts are ignored by the
    split)."""
    stacked: dict[int, tuple[int, torch.Tensor]] = {}  # per proposal: its first row in the stack, estimates
    index = []
    for d in drafts:
        confidences = d.proposal.confidences
        assert confidences is not None
        if id(d.proposal) not in stacked:
            stacked[id(d.proposal)] = sum(c.shape[0] for _, c in stacked.values()), confidences
        index.append(stacked[id(d.proposal)][0] + d.row)
    # a host proposal's estimates (prompt lookup) go up pinned: a pageable copy would wait for the device
    tables = [c.pin_memory().to(device, non_blocking=True) if c.device.type == "cpu" and device.type == "cuda"
              else c.to(device) for _, c in stacked.values()]
    width = max(c.shape[1] for c in tables)
    stack = tables[0] if len(tables) == 1 else torch.cat([F.pad(c, (0, width - c.shape[1])) for c in tables])
    return stack[to_device(index, device)]


def _row_offsets(batch: ForwardBatch) -> list[int]:
    offsets = [0]
    for seg in batch.segments:
        rows = {"none": 0, "last": 1, "all": len(seg.token_ids)}[seg.logits]
        offsets.append(offsets[-1] + rows)
    return offsets


class ModelRunner:
    def __init__(self, model: CausalLM, sampler: Sampler, proposer: Proposer | None = None,
                 num_draft_tokens: int = 0):
        self.model = model
        self.sampler = sampler
        # a model that records CUDA graphs of its steps records the sampler's too (graphs off: None)
        sampler.recorder = getattr(model, "graph_recorder", None)
        self.structured = StructuredManager(None, model.vocab_size, model.eos_token_id)  # engine's: tokenizer
        self.proposer = proposer
        self.num_draft_tokens = num_draft_tokens
        # (newest confidences [R, K], drafts each may verify [R], drafts in all) -> split [R], on the device
        self.splitter: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None
        if proposer is not None and self._device.type == "cuda":
            self._load_fill_kernels()
        self._prev: SampleOutput | None = None  # the previous step's samples (tokens on the device)
        self._prev_row: dict[int, int] = {}  # seq id -> its row in self._prev
        self._releases: deque[int] = deque()  # finished sequences the proposer has yet to drop

    def record_sampling_graphs(self, max_rows: int) -> None:
        """Record the sampler's graphs for steps of up to `max_rows` sampled rows (start-up, after the
        model's); none with a speculator, whose verification samples every row instead."""
        if self.proposer is None:
            self.sampler.record_graphs(self.model.vocab_size, self._device, max_rows)

    def release_later(self, seq_id: int) -> None:
        """Queue a finished sequence's release (engine thread); done before the next step."""
        self._releases.append(seq_id)

    def release_pending(self) -> None:
        """Release the queued sequences (worker thread, or the engine's while no step is in flight)."""
        while self._releases:
            self.proposer.release(self._releases.popleft())  # type: ignore[union-attr]

    def execute(self, sched: SchedulerOutput) -> StepResult:
        start = time.perf_counter()
        gpu_start = self._event()
        self.release_pending()
        for slot in sched.resets:
            self.model.reset_slot(slot)
        # the lists are shared with the scheduled segments: cutting their drafts cuts the forward's
        segments = [SequenceSegment(s.slot, s.blocks, s.start_pos, s.token_ids, s.logits)
                    for s in sched.segments]
        split = sched.split
        on_device = split is not None and self._splits_on_device(sched, segments)
        if split is not None and not on_device:
            _cut(sched, split.host)
        batch = ForwardBatch(segments, self._input_ids(sched))
        if on_device:
            logits, offsets = self._forward_split(sched, batch)
        else:
            out = self.model.forward(batch)
            logits, offsets = out.logits, out.row_offsets or _row_offsets(batch)
        for f in sched.forks:  # after the forward: the parent's cache now holds the whole prompt
            self.model.copy_slot(f.src_slot, f.dst_slot)  # type: ignore[attr-defined]
            self.model.copy_blocks(f.src_blocks, f.dst_blocks)  # type: ignore[attr-defined]

        prompt_lp = [self._prompt_logprobs(logits, offsets[i], segments[i], s)
                     for i, s in enumerate(sched.segments) if s.prompt_logprobs is not None]
        if self.proposer is not None:
            verified = self._speculate(logits, offsets, sched)
            return StepResult([], None, prompt_lp, start, time.perf_counter(), sched.num_tokens,
                              len(sched.segments), verified, self._events(gpu_start))
        rows, sample_rows, sample_seqs = [], [], []
        for i, s in enumerate(sched.segments):
            if s.sample_seqs:
                position = s.start_pos + len(s.token_ids)  # of the token being generated
                for seq in s.sample_seqs:  # mostly one: appends cost less than extends here
                    rows.append(offsets[i + 1] - 1)
                    sample_rows.append(self._sample_row(seq, position))
                    sample_seqs.append(seq)
        result = None
        if rows:
            if len(rows) != len(logits) or rows != list(range(len(rows))):  # not every row, in order
                logits = logits.index_select(0, to_device(rows, logits.device))
            logits = self.structured.apply(  # structured output: mask the constrained rows
                logits, sample_seqs, [r.position for r in sample_rows],
                lambda seq: self._prev.token_ids[self._prev_row[seq.seq_id]], self.sampler.ops)  # type: ignore[union-attr]
            result = self.sampler(logits, sample_rows)
        self._prev, self._prev_row = result, {seq.seq_id: r for r, seq in enumerate(sample_seqs)}
        end = time.perf_counter()
        return StepResult(sample_seqs, result, prompt_lp, start, end, sched.num_tokens, len(sched.segments),
                          gpu=self._events(gpu_start))

    def _event(self) -> torch.cuda.Event | None:
        """A timing event recorded now on the current CUDA stream; None for a model off CUDA."""
        device = getattr(self.model, "device", None)
        if not isinstance(device, torch.device) or device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event

    def _events(self, start: torch.cuda.Event | None) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        end = self._event() if start is not None else None
        return None if start is None or end is None else (start, end)

    def _input_ids(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """Ids on the model's device with the stand-ins filled there: `PLACEHOLDER` from the previous
        step's sampled tokens, `DRAFT` from the proposal the drafts came from; None when every token
        is known on the host (then the lists are the values). A decode after a decode whose sequences
        keep their order gets the previous samples' tensor itself. Drafts proposed off the model's
        device (a host lookup) are written into the segment lists instead, which the forward shares."""
        device = self._device
        flat: list[int] = []
        # (source tensor, destinations, flat source indices): per proposal, then the previous samples
        fills: dict[int, tuple[torch.Tensor, list[int], list[int]]] = {}
        prev_dst: list[int] = []  # placeholders: their flat index, and their row in the previous samples
        prev_src: list[int] = []
        prev, prev_row = self._prev, self._prev_row
        for s in sched.segments:
            ids = s.token_ids
            if ids[-1] == PLACEHOLDER:
                assert prev is not None, "a placeholder without a previous step"
                prev_dst.append(len(flat) + len(ids) - 1)
                prev_src.append(prev_row[s.seq.seq_id])
            if s.num_drafts:
                drafts, k = s.drafts, s.num_drafts
                assert drafts is not None, "drafts to verify without their proposal"
                table = drafts.proposal.token_ids
                if table.device != device:
                    ids[-k:] = drafts.tokens()[:k]
                else:
                    if id(drafts.proposal) not in fills:
                        fills[id(drafts.proposal)] = table.reshape(-1), [], []
                    _, dst, src = fills[id(drafts.proposal)]
                    dst += range(len(flat) + len(ids) - k, len(flat) + len(ids))
                    src += range(drafts.row * table.shape[1], drafts.row * table.shape[1] + k)
            flat.extend(ids)
        if prev_dst:
            assert prev is not None
            if not fills and len(prev_dst) == len(flat) == len(prev.tokens) and prev_src == prev_dst:
                return prev.tokens  # every id is last step's sample, in its order (decode after decode)
            fills[id(prev)] = prev.tokens, prev_dst, prev_src
        if not fills:
            return None
        # one upload: the ids, then each fill's destinations and sources
        values = flat + [i for _, dst, src in fills.values() for i in (*dst, *src)]
        uploaded = to_device(values, device)
        out, at = uploaded[: len(flat)], len(flat)
        for source, dst, _ in fills.values():
            n = len(dst)
            _fill(out, uploaded[at : at + n], source, uploaded[at + n : at + 2 * n])
            at += 2 * n
        return out

    def use_splitter(self, splitter: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> None:
        """Split asynchronous confidence-scheduled steps on the device with `splitter`; on CUDA it runs
        once here on stand-in estimates, with the row-count sum after it, so that a first split step
        loads no kernel (a load may wait for the drafting queued ahead: `_load_fill_kernels`)."""
        self.splitter = splitter
        if self._device.type == "cuda":
            rows = to_device([0, 1], self._device)
            most = to_device([self.num_draft_tokens] * 2, self._device)
            estimates = torch.full((2, self.num_draft_tokens), 0.5, device=self._device)[rows]
            kept = splitter(estimates, most, self.num_draft_tokens)
            HostCopy(most.index_add(0, rows, kept)).get()

    def _load_fill_kernels(self) -> None:
        """Run `_fill` once at start-up. CUDA loads a kernel when it is first launched (lazy module
        loading, the default), and the load may wait for the device's queued work (the H200: a first
        indexing launch waited for a running kernel): a first speculative step would otherwise wait
        there, before its forward, for the drafting queued ahead of it."""
        ids = torch.zeros(1, dtype=torch.int64, device=self._device)
        index = to_device([0], self._device)
        _fill(ids, index, ids.clone(), index)

    @property
    def _device(self) -> torch.device:
        """Where the model takes its inputs (a model without a `device` attribute: the CPU), with its
        index, as tensors report theirs."""
        device = getattr(self.model, "device", None)
        if not isinstance(device, torch.device):
            return torch.device("cpu")
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    def _sample_row(self, seq: Sequence, position: int, drafts: Seq[int] = ()) -> SampleRow:
        """The row deciding `position`; `drafts`: draft tokens just before it (verification rows)."""
        p = seq.request.params
        row = SampleRow(p, seq.seed, position, position - seq.prompt_len)
        if p.has_penalties:
            # tokens up to `position` never change once appended; the newest may still be in flight
            row.prompt_ids = seq.request.prompt_ids
            row.output_ids = seq.token_ids[seq.prompt_len:position - len(drafts)] + list(drafts)
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

    # ---- speculative decoding (the next step is planned once this step's verification is on the host)

    def _splits_on_device(self, sched: SchedulerOutput, segments: list[SequenceSegment]) -> bool:
        """Whether the step's drafts are split on the device: a choice to make (several speculating
        sequences, some drafts verified, not all: otherwise the host's split is the only one, and the
        step keeps the plain forward and its graphs), a splitter, confidences for every speculating
        segment (on the device, or a host proposal's, uploaded) and a model that runs device row counts
        for these segments."""
        split = sched.split
        assert split is not None
        return (len(split.host) > 1
                and 0 < split.num_drafts < sum(sched.segments[i].num_drafts for i in split.host)
                and all(sched.segments[i].drafts.proposal.confidences is not None  # type: ignore[union-attr]
                        for i in split.host)
                and self._rows_on_device(segments))

    def _rows_on_device(self, segments: list[SequenceSegment]) -> bool:
        """Whether a split is set up and the model runs device row counts for these segments."""
        fits = getattr(self.model, "device_rows_fit", None)
        return self.splitter is not None and fits is not None and fits(segments)

    def _forward_split(self, sched: SchedulerOutput, batch: ForwardBatch) -> tuple[torch.Tensor, list[int]]:
        """Split the step's drafts on the device, run the rows kept, and cut the segments to them once
        the row counts are on the host (read behind the drafting, while the forward runs): the logits
        and each segment's first row."""
        split, segs, device = sched.split, sched.segments, self._device
        assert split is not None and self.splitter is not None
        spec = list(split.host)
        base = [1 if i in split.host else len(s.token_ids) for i, s in enumerate(segs)]
        n, r = len(segs), len(spec)
        uploaded = to_device(base + spec + [segs[i].num_drafts for i in spec], device)
        confidences = _newest_confidences([segs[i].drafts for i in spec], device)  # type: ignore[misc]
        kept = self.splitter(confidences, uploaded[n + r:], split.num_drafts)
        rows = uploaded[:n].index_add(0, uploaded[n:n + r], kept)
        counts = HostCopy(rows)  # queued before the forward: waits for the split (and the drafting) only
        total = sum(base) + split.num_drafts
        logits = self.model.forward_rows(batch, rows, total)  # type: ignore[attr-defined]
        q = counts.get()[0].tolist()
        _cut(sched, {i: q[i] - 1 for i in spec})
        return logits, [0, *itertools.accumulate(q)]

    def time_verification(self, num_tokens: int, width: int, slots: list[int], blocks: list[int]) -> float:
        """Milliseconds of a decode-shaped step: `num_tokens` query tokens as segments of `width` (one per
        slot, at position 0, one block each), logits for every row, greedy verification of a draft on
        every row but the segments' last. The slots are reset afterwards. Every row has its own token
        (spread over the vocabulary): equal rows would all route to the same experts, so an MoE step
        would read a fraction of a real batch's expert weights. With a device split a step of several
        segments runs as split steps do (`forward_rows`: exactly its rows, no padding to the verification
        length); one segment runs the plain forward, as a step of one speculating sequence does."""
        segments, drafts = [], []
        for i, first in enumerate(range(0, num_tokens, width)):
            n = min(width, num_tokens - first)
            ids = [(1 + first + j) * 7919 % self.model.vocab_size for j in range(n)]
            segments.append(SequenceSegment(slots[i], [blocks[i]], 0, ids, "all"))
            drafts += [0] * (n - 1) + [-1]
        rows = [SampleRow(_PROFILE_PARAMS, 0, j, 0) for j in range(num_tokens)]
        for s in segments:
            self.model.reset_slot(s.slot)
        # as steps run: several sequences split on the device, one takes the plain (padded) forward
        split = len(segments) > 1 and self._rows_on_device(segments)
        start = time.perf_counter()
        if split:
            lens = to_device([len(s.token_ids) for s in segments], self._device)
            logits = self.model.forward_rows(ForwardBatch(segments), lens, num_tokens)  # type: ignore[attr-defined]
        else:
            logits = self.model.forward(ForwardBatch(segments)).logits
        verify(logits, rows, drafts, None, self.sampler.eos_token_id, self.sampler.ops).tokens.tolist()
        ms = (time.perf_counter() - start) * 1e3
        for s in segments:
            self.model.reset_slot(s.slot)
        return ms

    def _speculate(self, logits: torch.Tensor, offsets: list[int], sched: SchedulerOutput) -> list[Verified]:
        """Verify every sampled row, then launch drafting after each speculating sequence's new tokens."""
        items: list[tuple[Sequence, ScheduledSegment, list[int]]] = []  # per sampled sequence: its drafts
        rows, sample_rows, drafts = [], [], []
        probs: list[tuple[torch.Tensor | None, list[int]]] = []  # per verified run: (draft probs, drafts)
        for i, s in enumerate(sched.segments):
            k = s.num_drafts
            first = offsets[i + 1] - 1 - k
            pos0 = s.start_pos + len(s.token_ids) - k  # the position row `first` decides
            # the drafts' host copy: waited for only now, with this step's forward already queued
            ds = s.drafts.tokens()[:k] if s.drafts is not None and k else []
            for seq in s.sample_seqs:
                items.append((seq, s, ds))
                rows += range(first, first + k + 1)
                sample_rows += [self._sample_row(seq, pos0 + j, ds[:j]) for j in range(k + 1)]
                drafts += [*ds, -1]
                if k:
                    held = s.drafts.probs  # type: ignore[union-attr]
                    probs.append((None if held is None else held[:k], ds))
        picked = self._constrain(logits.index_select(0, to_device(rows, logits.device)), items)
        draft_probs = None
        if any(p is not None for p, _ in probs):  # deterministic runs among them: one-hot
            vocab, dev = picked.shape[-1], picked.device
            draft_probs = torch.cat([p if p is not None else F.one_hot(to_device(ds, dev), vocab).float()
                                     for p, ds in probs])
        out = verify(picked, sample_rows, drafts, draft_probs, self.sampler.eos_token_id, self.sampler.ops)
        tokens, accepted = torch.stack([out.tokens, out.accepted.long()]).tolist()  # one device copy
        logprobs = out.logprobs.get()
        verified, r = [], 0
        for seq, s, _ in items:
            k = s.num_drafts
            n = next((j for j in range(k) if not accepted[r + j]), k)
            verified.append(Verified(seq, tokens[r:r + n + 1], logprobs[r:r + n + 1], k, n))
            if seq.request.params.structured_outputs is not None:
                self._settle_grammar(seq, s.start_pos + len(s.token_ids) - k, verified[-1].tokens)
            r += k + 1
        self._propose(verified, logits.device)
        return verified

    def _settle_grammar(self, seq: Sequence, position: int, emitted: list[int]) -> None:
        """Commit the grammar state through an emitted run that ends the sequence by EOS after an
        accepted draft (`position`: the run's first). `draft_rows` rolled its drafts back, and with
        them an end (dead end or completion) found at a later row; replaying the accepted tokens row
        by row records that end where a plain decode would, so the EOS there finishes with its
        reason ("grammar_error" for a dead end). Other runs need nothing: the next step catches up."""
        eos = self.sampler.eos_token_id
        last = next((j for j, t in enumerate(emitted) if t == eos), 0)
        for j in range(1, last + 1):
            self.structured.fill([seq], [position + j], lambda _, t=emitted[j - 1]: t)

    def _constrain(self, logits: torch.Tensor, items: list[tuple[Sequence, ScheduledSegment, list[int]]]
                   ) -> torch.Tensor:
        """Structured output: each verification row masked by the grammar state after the drafts
        before it (the target distribution a plain decode would sample from)."""
        if not any(seq.request.params.structured_outputs is not None for seq, _, _ in items):
            return logits
        masks = []
        for seq, s, drafts in items:
            position = s.start_pos + len(s.token_ids) - s.num_drafts
            masks.append(self.structured.draft_rows(seq, position, drafts, _no_token_in_flight))
        mask = torch.from_numpy(np.concatenate(masks))
        if logits.device.type == "cuda":  # pinned: queued behind the forward instead of waiting for it
            mask = mask.pin_memory()
        mask = mask.to(logits.device, non_blocking=True)
        return (self.sampler.ops or get_ops(device=logits.device)).apply_token_bitmask(logits, mask)

    def _propose(self, verified: list[Verified], device: torch.device) -> None:
        """Ask the proposer for the drafts after each speculating sequence's newest token (launched:
        their ids and confidences reach the host behind the drafting)."""
        assert self.proposer is not None
        todo, requests = [], []
        for v in verified:
            seq, params = v.seq, v.seq.request.params
            context = History(seq.token_ids, v.tokens)
            room = min(self.num_draft_tokens, seq.limit - len(context) - 1)
            eos = None if params.ignore_eos else self.sampler.eos_token_id
            stopped = any(t == eos or t in params.stop_token_ids for t in v.tokens)
            if seq.spec is None or room < 1 or stopped:
                continue
            todo.append(v)
            requests.append(ProposeRequest(seq.seq_id, seq.slot, len(context) - 1, context, params,
                                           seq.seed, room))
        if not requests:
            return
        sampled = to_device([r.token_ids[-1] for r in requests], device)
        proposal = ProposedDrafts(self.proposer.propose(ProposeBatch(requests, sampled)))
        for v, drafts in zip(todo, proposal.rows(), strict=True):
            v.next = drafts
