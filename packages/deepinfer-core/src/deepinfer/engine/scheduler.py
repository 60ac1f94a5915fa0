"""Continuous batching: which tokens of which sequences run in the next step.

One step mixes decodes and prefill chunks under a token budget (`max_num_batched_tokens`) and a
sequence cap (`max_num_seqs`). Running sequences go first, oldest first; waiting ones are admitted in
arrival order (FCFS: a request that does not fit blocks those behind it). A request whose grammar is
still compiling is passed over until it is ready, then goes first again by its arrival. When a running
sequence needs a block and none is free, the youngest running sequence is preempted by recompute: its
cache is freed and it returns to the waiting queue to prefill prompt + generated tokens again.

Under async scheduling the step before is still running when this one is planned, so a sequence's
last token may not be known yet: its segment then ends in `PLACEHOLDER`, which the model runner
replaces by that step's sampled token. `num_computed` and `num_inflight` count such tokens ahead.

A speculating decode (its sequence holds drafts; planned once the step before has returned) runs
[newest token, d_1..d_k] with logits for every row, the drafts as `DRAFT` stand-ins (the model runner
feeds their ids from the proposal, so planning needs only their count); k is capped by the token
budget, the room left before the sequence's limit and, with a verification scheduler, by that
scheduler's choice. That choice needs the drafts' confidences; under async scheduling the newest ones
are still on their way to the host (drafting runs behind the step handed over), so the host chooses
from each sequence's estimates for the drafts it had before (`SpecState.estimates`), which are there,
and keeps only the step's total: every speculating segment holds all its drafts (an upper bound within
its limit, its blocks reserved unless that would preempt another sequence) and `SchedulerOutput.split`
says how many drafts the step verifies in all, the rows the token budget is charged with; the model
runner splits them by the newest confidences on the device (deepinfer-official §6-§7), or applies the
host's own split (`DraftSplit.host`) where it cannot. `num_computed` counts all planned rows; the
engine corrects it to the accepted length after verification (rejected rows are simply overwritten by
the next segment).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from deepinfer.engine.cache_manager import CacheManager
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.sequence import SeqStatus, Sequence
from deepinfer.models.interface import LogitsWanted
from deepinfer.speculators.drafts import NextDrafts
from deepinfer.speculators.interface import VerifyScheduler

logger = logging.getLogger(__name__)

PLACEHOLDER = -1  # "the token this sequence sampled in the previous step"
DRAFT = -2  # "a draft of `ScheduledSegment.drafts`": the model runner feeds its id from the proposal


@dataclass(slots=True)
class ScheduledSegment:
    seq: Sequence
    slot: int
    blocks: list[int]  # the sequence's table; later steps may append to it, never change entries
    start_pos: int
    token_ids: list[int]
    logits: LogitsWanted
    sample_seqs: list[Sequence]  # the last row is sampled once for each (several: n > 1 forks)
    prompt_logprobs: int | None = None  # top-k for the prompt tokens this chunk predicts
    num_drafts: int = 0  # the last num_drafts tokens are drafts to verify (one sample sequence)
    drafts: NextDrafts | None = None  # where those drafts come from (their ids: DRAFT in token_ids)


@dataclass
class ForkCopy:
    """Copy a finished prefill's cache into a sibling completion's slot and blocks (after the step)."""

    src_slot: int
    dst_slot: int
    src_blocks: list[int]
    dst_blocks: list[int]


@dataclass
class DraftSplit:
    """An asynchronous confidence-scheduled step's verification: its speculating segments (indices into
    `SchedulerOutput.segments`, each planned with all its drafts) verify `num_drafts` drafts in all,
    split among them by their newest confidences; `host` is the host's split of that total (from the
    older estimates), per segment index."""

    num_drafts: int
    host: dict[int, int]


@dataclass
class SchedulerOutput:
    segments: list[ScheduledSegment] = field(default_factory=list)
    resets: list[int] = field(default_factory=list)  # slots to clear before the forward
    forks: list[ForkCopy] = field(default_factory=list)
    num_tokens: int = 0
    split: DraftSplit | None = None  # async confidence schedule: the step's total of drafts to verify


class Scheduler:
    def __init__(self, config: EngineConfig, cache: CacheManager, can_fork: bool,
                 verify_scheduler: VerifyScheduler | None = None):
        self.config = config
        self.verify_scheduler = verify_scheduler
        self.cache = cache
        self.can_fork = can_fork
        self.waiting: list[Sequence] = []  # sorted by arrival
        self.running: list[Sequence] = []  # sorted by arrival; the tail is preempted first
        self.num_preemptions = 0
        self._step = 0
        self._watermark = int(config.watermark * cache.num_blocks)
        # structured output: a request is admitted once its grammar is compiled (or its wait timed out)
        self.admissible: Callable[[Sequence], bool] = lambda seq: True

    def add(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=lambda s: s.order)

    def remove(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its cache."""
        for queue in (self.running, self.waiting):
            if seq in queue:
                queue.remove(seq)
        self.cache.free(seq)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> SchedulerOutput:
        self._step = step = self._step + 1
        out = SchedulerOutput()
        budget = self.config.token_budget
        running, block_size = SeqStatus.RUNNING, self.cache.block_size
        verify = self._verify_counts()
        # async confidence schedule: every draft planned, the host's choice kept as the step's total
        split = {} if self.verify_scheduler is not None and self.config.async_scheduling else None
        for seq in list(self.running):
            if budget <= 0:
                break
            # forks join `running` mid-loop (already planned); preempted victims leave it
            if seq.scheduled_step == step or seq.status is not running:
                continue
            known = len(seq.token_ids) + seq.num_inflight
            if known >= seq.limit:
                continue  # what is sampled or in flight already finishes it
            n = min(known - seq.num_computed, budget)
            if n == 1 and split is not None:  # all its drafts planned, the host's choice charged
                k = self._num_drafts(seq, {})
                choice = min(k, verify.get(seq.seq_id, k), budget - 1)
            else:
                k = choice = self._num_drafts(seq, verify, budget) if n == 1 else 0
            n += k
            while (seq.num_computed + n > len(seq.blocks) * block_size  # fast path: fits already
                   and not self.cache.grow(seq, seq.num_computed + n)):
                if k > choice:  # drafts beyond the host's choice are not worth a preemption
                    n, k = n - (k - choice), choice
                    continue
                victim = next(s for s in reversed(self.running) if s.scheduled_step != step)
                self._preempt(victim, f"no free cache block for request {seq.request.request_id}")
                if victim is seq:
                    break
            if seq.status is not running:
                break  # it was the youngest unplanned sequence: nothing after it can run either
            self._add_segment(out, seq, n, k)
            if k and split is not None:
                split[len(out.segments) - 1] = choice
            budget -= n - k + choice  # the rows the step runs (a split runs the host's total)
        if split:
            out.split = DraftSplit(sum(split.values()), split)
        self._admit(out, budget)
        return out

    def _verify_counts(self) -> dict[int, int]:
        """The verification scheduler's choice per speculating sequence that has estimates: its drafts'
        own (synchronous steps: waits for their copy) or, under async scheduling, those of the drafts
        it had before (the last one repeated; none yet: all its drafts count toward the step's total)."""
        if self.verify_scheduler is None:
            return {}
        seqs, confidences = [], []
        for s in self.running:
            if s.spec is None or s.spec.next is None:
                continue
            if self.config.async_scheduling:
                known, held = s.spec.estimates, s.spec.next.count
                c = (known + known[-1:] * held)[:held] if known else None
            else:
                c = s.spec.next.confidences()  # waits for the confidences of the step just committed
            if c:
                seqs.append(s)
                confidences.append(c)
        if not seqs:
            return {}
        counts = self.verify_scheduler.choose(confidences)
        return {s.seq_id: c for s, c in zip(seqs, counts, strict=True)}

    @staticmethod
    def _num_drafts(seq: Sequence, verify: dict[int, int], budget: int | None = None) -> int:
        """Drafts planned in a decode of `seq`: what it holds, within its limit, the verification
        scheduler's choice (`verify`) and the token budget (if given)."""
        if seq.spec is None or seq.spec.next is None or seq.num_inflight:
            return 0
        room = seq.limit - len(seq.token_ids) - 1  # a step emits up to k + 1 tokens
        held = seq.spec.next.count
        return max(0, min(held, verify.get(seq.seq_id, held), room, held if budget is None else budget - 1))

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        i = 0  # waiting[:i] are passed over this step (grammar still compiling)
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[i]
            if seq.num_inflight:
                break  # preempted while a step for it was in flight: wait for that token
            if not self.admissible(seq):
                i += 1  # its grammar is still compiling: those behind it need not wait for it
                continue
            n = min(len(seq.token_ids), budget)
            reserve = self._watermark if self.running else 0  # an idle engine admits any that fits
            if (self.cache.blocks_for(n) + reserve > self.cache.free_blocks
                    or not self.cache.take_slot(seq)):
                break
            self.cache.grow(seq, n)
            self.waiting.pop(i)
            seq.status = SeqStatus.RUNNING
            if seq.request.first_scheduled_time is None:
                seq.request.first_scheduled_time = time.time()
            bisect.insort(self.running, seq, key=lambda s: s.order)
            out.resets.append(seq.slot)
            self._add_segment(out, seq, n)
            budget -= n

    def _add_segment(self, out: SchedulerOutput, seq: Sequence, n: int, num_drafts: int = 0) -> None:
        seq.scheduled_step = self._step
        start = seq.num_computed
        known = len(seq.token_ids)
        ids = seq.token_ids[start:start + n - num_drafts]
        if len(ids) < n - num_drafts:  # the last token is being sampled by the step in flight
            ids.append(PLACEHOLDER)
        if num_drafts:
            ids += [DRAFT] * num_drafts  # their ids need not be on the host yet
        seq.num_computed += n
        sampling = seq.num_computed - num_drafts == known + seq.num_inflight
        req = seq.request
        # prompt logprobs are collected once per request, by completion 0, even across recompute
        have = len(req.prompt_logprobs)
        want_prompt_lp = (req.params.prompt_logprobs is not None and seq.index == 0
                          and have < seq.prompt_len and start + n >= have)
        logits: LogitsWanted = ("all" if want_prompt_lp or num_drafts
                                else "last" if sampling else "none")
        # the block list is shared, not copied: the cache manager only appends to it or replaces it
        seg = ScheduledSegment(seq, seq.slot, seq.blocks, start, ids, logits, [],
                               req.params.prompt_logprobs if want_prompt_lp else None, num_drafts,
                               seq.spec.next if num_drafts else None)  # type: ignore[union-attr]
        if sampling:
            self._sample(seg, seq)
            if self.can_fork and seq.index == 0 and req.params.n > 1:
                self._fork_children(out, seg, seq)
        out.segments.append(seg)
        out.num_tokens += n

    @staticmethod
    def _sample(seg: ScheduledSegment, seq: Sequence) -> None:
        seg.sample_seqs.append(seq)
        seq.num_inflight += 1

    def _fork_children(self, out: SchedulerOutput, seg: ScheduledSegment, parent: Sequence) -> None:
        """Siblings waiting on this prompt copy its cache after the step and sample from its logits."""
        for child in [s for s in parent.request.seqs if s.fork_parent is parent]:
            child.fork_parent = None
            if (len(self.running) >= self.config.max_num_seqs
                    or len(parent.blocks) + self._watermark > self.cache.free_blocks
                    or not self.cache.take_slot(child)):
                self.add(child)  # no room to share: it prefills on its own later
                continue
            self.cache.grow(child, parent.num_computed)
            child.status = SeqStatus.RUNNING
            child.num_computed = parent.num_computed
            bisect.insort(self.running, child, key=lambda s: s.order)
            out.forks.append(ForkCopy(parent.slot, child.slot, list(parent.blocks), list(child.blocks)))
            child.scheduled_step = self._step
            self._sample(seg, child)

    def _preempt(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self.cache.free(seq)
        seq.num_computed = 0
        if seq.spec is not None:
            seq.spec.clear()  # the recompute samples the next token afresh and drafts after it
        seq.status = SeqStatus.WAITING
        self.add(seq)
        self.num_preemptions += 1
        logger.info("preempted request %s (completion %d, %d tokens) by recompute: %s",
                    seq.request.request_id, seq.index, len(seq.token_ids), reason)
