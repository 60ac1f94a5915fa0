"""`LLMEngine`: requests in, per-token outputs out, one `step()` at a time.

A step plans a batch (scheduler), runs it (model runner: forward + sampler) and turns the sampled
tokens into outputs (detokenization, stop checks, freeing finished sequences). With async scheduling
(the default) `step()` plans step N and launches it on the model runner's worker thread,
then post-processes step N-1 while step N runs, so the device never waits for the Python side longer
than a thread hand-off. Sampled tokens depend only on logits and (seed, position), never on timing,
so outputs are identical in both modes.

With a speculator (`EngineConfig.speculator`) a step emits several tokens per sequence, appended
one by one with the stop rules. Planning step N+1 needs step N's verification (how many drafts were
accepted: the next segment's position) but not its drafting (only how many drafts follow: their ids
stay on the device for the forward; a synchronous confidence schedule waits for their confidences, an
asynchronous one chooses the step's total from the estimates of the drafts before and the runner
splits it by the newest ones on the device), so async scheduling overlaps less than
plain decoding: step N is committed first
(tokens appended with the token-level stops: EOS, stop ids, length, grammar; the next drafts), step
N+1 is planned and launched, and only then does step N's text-level work run
(incremental detokenization and stop strings, outputs, stats) while step N+1 computes. A stop string
found then truncates the sequence and discards its step N+1 row, as async discards rows planned past
a stop. Outputs are identical to synchronous steps.

Every public call runs inside an `EngineGuard`: calls from several threads are serialised, and a
Ctrl-C is held back until the call has left the engine consistent (then raised as usual). A step
whose forward fails aborts the sequences of every step in flight (finish reason "error") and
re-raises, so the engine keeps serving.
"""

from __future__ import annotations

import gc
import itertools
import logging
import operator
import random
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import torch

from deepinfer.engine.cache_manager import CacheManager, cache_budget, plan_cache
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.interrupts import EngineGuard
from deepinfer.engine.model_runner import ModelRunner, StepResult, SupportsFork, Verified
from deepinfer.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from deepinfer.engine.scheduler import Scheduler, SchedulerOutput
from deepinfer.engine.sequence import FinishReason, Request, SeqStatus, Sequence, SpecState
from deepinfer.engine.stats import EngineStats, StepStat
from deepinfer.models.interface import CausalLM
from deepinfer.ops import get_ops
from deepinfer.sampling import rng
from deepinfer.sampling.detokenizer import IncrementalDetokenizer, Tokenizer
from deepinfer.sampling.params import SamplingParams
from deepinfer.sampling.sampler import Sampler, TokenLogprob
from deepinfer.speculators.interface import Proposer, SpeculatorConfig, VerifyScheduler
from deepinfer.speculators.registry import SpeculatorError, get_speculator
from deepinfer.structured.manager import StructuredManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedRequest:
    """A validated, tokenized request that `add_prepared` queues without further checks."""

    text: str | None
    ids: list[int]
    params: SamplingParams


class LLMEngine:
    def __init__(self, model: CausalLM, tokenizer: Tokenizer | None = None,
                 config: EngineConfig | None = None, device: torch.device | str = "cpu"):
        self.config = config = config or EngineConfig()
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = model.vocab_size
        self.eos_token_id = model.eos_token_id
        layout = model.cache_layout()
        plan = plan_cache(layout, cache_budget(config, torch.device(device), model), config)
        model.allocate_cache(plan.num_blocks, plan.num_slots)
        logger.info("cache: %s", plan.describe(layout))
        self.max_model_len = min(config.max_model_len, (plan.num_blocks - 1) * layout.block_size)
        if self.max_model_len < config.max_model_len:
            logger.warning("max_model_len lowered from %d to %d: the cache holds no more",
                           config.max_model_len, self.max_model_len)
        self.cache = CacheManager(layout.block_size, plan)
        self.proposer, verify_scheduler = build_speculator(model, config)
        self.scheduler = Scheduler(config, self.cache, isinstance(model, SupportsFork), verify_scheduler)
        sampling_ops = get_ops(device=device, batch_invariant=True) if config.batch_invariant else None
        self.runner = ModelRunner(model, Sampler(model.eos_token_id, sampling_ops), self.proposer,
                                  self.proposer.num_draft_tokens if self.proposer else 0)
        self.runner.record_sampling_graphs(config.max_num_seqs)  # with the model's: no step records one
        split = getattr(verify_scheduler, "split", None)
        if split is not None and config.async_scheduling:  # the scheduler plans the totals
            self.runner.use_splitter(split)
        self._async = config.async_scheduling
        self.runner.structured = StructuredManager(tokenizer, self.vocab_size, self.eos_token_id)
        self.scheduler.admissible = self.runner.structured.admissible
        # The model always runs on this thread, so both modes execute it identically; sync mode just
        # waits for each step before planning the next.
        self._worker: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="deepinfer-step")
        if verify_scheduler is not None:
            self._profile_verification(verify_scheduler)
        self._inflight: deque[tuple[SchedulerOutput, float, Future[StepResult]]] = deque()
        self.requests: dict[str, Request] = {}
        self._ready: list[RequestOutput] = []  # outputs due without a step (aborts, over-long prompts)
        self._seed_rng = random.Random(config.seed)
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()  # also names requests that come without an id
        self._guard = EngineGuard()
        self._late_aborts: list[str] = []  # aborts called back from inside an engine call
        # the previous step's end (worker perf_counter, CUDA end event) while steps follow back to back
        self._prev_end: tuple[float, torch.cuda.Event | None] | None = None
        self._last_log = time.monotonic()
        self.stats = EngineStats()
        if torch.device(device).type == "cuda":
            freeze_startup_objects()

    # ---- requests -------------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
                    request_id: str | None = None, stream: bool = False) -> str:
        """Queue a request (text or token ids). Raises ValueError, before any work, if it is malformed.

        With `stream=True` every step that produces tokens for it yields an output holding only the
        new text/tokens; otherwise one output with everything is produced when it finishes.
        """
        prepared = self.prepare_request(prompt, params)
        with self._guard:
            return self._add(prepared, request_id, stream)

    def prepare_request(self, prompt: str | list[int], params: SamplingParams | dict | None = None
                        ) -> PreparedRequest:
        """Validate and tokenize a request without touching the engine's state."""
        if not isinstance(params, SamplingParams):
            params = SamplingParams.model_validate({} if params is None else params)
        params.check_vocab(self.vocab_size)
        self.runner.structured.prepare(params)  # checks the constraint, starts compiling it
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            text, ids = check_text(prompt, "the prompt"), self.tokenizer.encode(prompt)
        else:
            text, ids = None, token_ids(prompt, "prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]  # a tokenizer may know more ids, too
        if bad:
            raise ValueError(f"prompt token ids {bad[:8]} outside [0, vocab_size={self.vocab_size})")
        if not ids:
            raise ValueError("the prompt is empty")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; use stop_token_ids")
        return PreparedRequest(text, ids, params)

    def add_prepared(self, requests: Iterable[PreparedRequest], stream: bool = False,
                     added: list[str] | None = None) -> list[str]:
        """Queue prepared requests under generated ids, all in one engine call. `added` (if given)
        receives each id as it is queued, so a caller interrupted right after still knows them."""
        ids = added if added is not None else []
        with self._guard:
            for prepared in requests:
                ids.append(self._add(prepared, None, stream))
        return ids

    def _add(self, prepared: PreparedRequest, request_id: str | None, stream: bool) -> str:
        text, ids, params = prepared.text, prepared.ids, prepared.params
        arrival = next(self._arrivals)
        if request_id is None:
            request_id = f"req-{arrival}"
            while request_id in self.requests:  # a caller chose this name: never collide with it
                request_id = f"req-{arrival}.{next(self._arrivals)}"
        elif not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id).__name__}")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")

        req = Request(request_id, text, ids, params, arrival, time.time(), stream)
        req.prompt_logprobs = [None] if params.prompt_logprobs is not None else []
        base_seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(64)
        limit = min(self.max_model_len, len(ids) + (params.max_tokens or self.max_model_len))
        for i in range(params.n):
            detok = (IncrementalDetokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output,
                                            params.skip_special_tokens) if self.tokenizer else None)
            seed = rng.as_int64(rng.child_seed(base_seed, i))
            req.seqs.append(Sequence(next(self._seq_ids), req, i, seed, list(ids), detok, limit, len(ids)))
            if self.proposer is not None:
                req.seqs[-1].spec = SpecState()
        self.requests[request_id] = req

        if len(ids) >= self.max_model_len:
            logger.warning("request %s: prompt of %d tokens leaves no room under max_model_len=%d",
                           request_id, len(ids), self.max_model_len)
            for seq in req.seqs:
                self._finish(seq, FinishReason.PROMPT_TOO_LONG)
            self._ready.extend(self._outputs(req, req.seqs))
            return request_id
        self.scheduler.add(req.seqs[0])
        for seq in req.seqs[1:]:
            if self.scheduler.can_fork:
                seq.fork_parent = req.seqs[0]  # copies completion 0's cache once its prompt is in
            else:
                self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str | Iterable[str], *, report: bool = True) -> bool:
        """Stop requests now and free their cache; True if any was running.

        Their final outputs ("abort") come with the next step; with `report=False` (the caller has
        stopped listening) none are produced and outputs still queued for them are dropped.
        """
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        if self._guard.held_by_current_thread:  # called back from inside an engine call (a finalizer)
            self._late_aborts.extend(ids)
            return any(i in self.requests for i in ids)
        with self._guard:
            return self._abort(ids, report)

    def _abort(self, ids: list[str], report: bool) -> bool:
        found = False
        for req in [self.requests[i] for i in dict.fromkeys(ids) if i in self.requests]:
            found = True
            live = [s for s in req.seqs if s.status is not SeqStatus.FINISHED]
            for seq in live:
                self._finish(seq, FinishReason.ABORT)
            outputs = self._outputs(req, live)
            if report:
                self._ready.extend(outputs)
        if not report:
            dropped = set(ids)
            self._ready = [o for o in self._ready if o.request_id not in dropped]
        return found

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self._ready)

    # ---- the step loop --------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        with self._guard as guard:
            outputs = self._step()
            # a Ctrl-C held back during the step is raised on leaving it: keep the outputs for the next
            guard.on_interrupt = lambda: self._ready.__setitem__(slice(0, 0), outputs)
        return outputs

    def _step(self) -> list[RequestOutput]:
        if self._worker is None:
            raise RuntimeError("the engine is closed")
        if self._late_aborts:
            late, self._late_aborts = self._late_aborts, []
            self._abort(late, report=False)
        outputs, self._ready = self._ready, []
        if self.proposer is not None:
            return self._spec_step(outputs)
        # CPU time of this thread: what the engine itself costs, without waits for the GIL or the device
        t0 = time.thread_time()
        launched = self._launch(t0)
        # async keeps the step just launched running and post-processes the one before it
        keep = 1 if launched and self._async else 0
        while len(self._inflight) > keep:
            done, schedule_s, job = self._inflight[0]
            if job.exception() is not None:
                self._fail_inflight()
                self._ready[:0] = outputs
                raise job.exception()  # type: ignore[misc]
            self._inflight.popleft()
            outputs.extend(self._process(done, schedule_s, job.result()))
        if not self._inflight:
            self._prev_end = None  # idle from here on is not overhead
        self._maybe_log()
        return outputs

    def _launch(self, t0: float) -> bool:
        """Plan a step and start it on the worker; False if there was nothing to run."""
        sched = self.scheduler.schedule() if self.scheduler.has_work() else None
        if sched is None or not sched.segments:
            return False
        assert self._worker is not None
        job = self._worker.submit(self.runner.execute, sched)
        self._inflight.append((sched, time.thread_time() - t0, job))
        return True

    def _spec_step(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """Speculative steps: commit the step in flight, launch the next, then report the committed one
        (async: while the next one runs; sync: the step just launched is waited for first)."""
        done = self._commit_inflight(outputs)
        self._launch(time.thread_time())
        if not self._async:
            done = self._commit_inflight(outputs)
        if done is not None:
            outputs.extend(self._report(*done))
        if not self._inflight:
            self.runner.release_pending()
            self._prev_end = None
        self._maybe_log()
        return outputs

    def _commit_inflight(self, outputs: list[RequestOutput]
                         ) -> tuple[SchedulerOutput, float, float, StepResult] | None:
        """Wait for the step in flight and apply what planning the next one needs: the emitted tokens
        with the token-level stop rules, rollback, and the next drafts. Returns it for `_report`."""
        if not self._inflight:
            return None
        sched, schedule_s, job = self._inflight.popleft()
        if job.exception() is not None:
            self._inflight.appendleft((sched, schedule_s, job))
            self._fail_inflight()
            self._ready[:0] = outputs
            raise job.exception()  # type: ignore[misc]
        t0 = time.thread_time()
        result = job.result()
        self._collect_prompt_logprobs(result)
        now = time.time()
        assert result.verified is not None
        for v in result.verified:
            seq = v.seq
            seq.num_inflight -= 1
            if seq.status is SeqStatus.FINISHED:
                v.tokens = []  # aborted, or stopped by text before this step was planned: discard
                continue
            for i, (token, logprob) in enumerate(zip(v.tokens, v.logprobs, strict=True)):
                if self._append(seq, token, logprob, now, text=False):
                    del v.tokens[i + 1:]
                    break
        self._record_speculation(sched, result)
        return sched, schedule_s, time.thread_time() - t0, result

    def _report(self, sched: SchedulerOutput, schedule_s: float, commit_s: float, result: StepResult
                ) -> list[RequestOutput]:
        """The text-level side of a committed speculative step: detokenization and stop strings (which
        may end a sequence earlier than its token-level stop), outputs and stats."""
        t0 = time.thread_time()
        assert result.verified is not None
        touched: dict[str, tuple[Request, list[Sequence]]] = {}
        for v in result.verified:
            seq = v.seq
            if not v.tokens:
                continue
            self._detokenize(v)
            if seq.status is SeqStatus.FINISHED or seq.request.stream:
                touched.setdefault(seq.request.request_id, (seq.request, []))[1].append(seq)
        outputs = [out for req, seqs in touched.values() for out in self._outputs(req, seqs)]
        self.stats.generated_tokens += sum(len(v.tokens) for v in result.verified)
        self._record_step(result, schedule_s, commit_s + time.thread_time() - t0)
        return outputs

    def _detokenize(self, v: Verified) -> None:
        """Feed a committed run to the detokenizer (the tokens ending `v.seq`); a stop string in it ends
        the sequence there (before a token-level stop later in the run, which is dropped with it)."""
        seq, tokens, detok = v.seq, v.tokens, v.seq.detok
        if detok is None:
            return
        ended = seq.status is SeqStatus.FINISHED
        first = len(seq.token_ids) - len(tokens)
        for i, token in enumerate(tokens):
            if ended and i == len(tokens) - 1 and seq.finish_reason is not FinishReason.LENGTH:
                break  # EOS, a stop id or the grammar ended it: the text never sees that token
            if (stop := detok.add(token)) is None:
                continue
            del seq.token_ids[first + i + 1:], tokens[i + 1:]
            if seq.request.params.logprobs is not None:
                del seq.logprobs[first + i + 1 - seq.prompt_len:]
            if ended:
                seq.finish_reason, seq.stop_reason = FinishReason.STOP, stop
            else:
                self._finish(seq, FinishReason.STOP, stop)
            return
        if ended:
            detok.flush()

    def _profile_verification(self, verify_scheduler: VerifyScheduler) -> None:
        """Time decode-shaped steps of up to every running sequence verifying all its drafts (on the
        worker thread, where the model always runs) for the confidence scheduler's latency curve."""
        assert self.proposer is not None
        width = self.proposer.num_draft_tokens + 1
        seqs = min(self.config.max_num_seqs, self.cache.num_slots, self.cache.num_blocks)
        slots, blocks = list(range(1, seqs + 1)), list(range(1, seqs + 1))
        assert self._worker is not None
        worker = self._worker

        def time_step(num_tokens: int) -> float:
            return worker.submit(self.runner.time_verification, num_tokens, width, slots, blocks).result()

        verify_scheduler.profile(time_step, min(self.config.token_budget, seqs * width))

    def _fail_inflight(self) -> None:
        """A step failed: finish the sequences of every step in flight (later ones may build on its
        tokens) with "error"; their outputs come with the next step."""
        jobs = [job for _, _, job in self._inflight]
        wait(jobs)
        seqs = {id(seq): seq for sched, _, _ in self._inflight for seg in sched.segments
                for seq in (seg.seq, *seg.sample_seqs)}
        self._inflight.clear()
        self._prev_end = None
        touched: dict[str, tuple[Request, list[Sequence]]] = {}
        for seq in seqs.values():
            seq.num_inflight = 0
            if seq.status is not SeqStatus.FINISHED:
                self._finish(seq, FinishReason.ERROR)
                touched.setdefault(seq.request.request_id, (seq.request, []))[1].append(seq)
        for req, _ in touched.values():  # the request's other completions cannot complete it alone
            for seq in req.seqs:
                if seq.status is not SeqStatus.FINISHED:
                    self._finish(seq, FinishReason.ERROR)
            self._ready.extend(self._outputs(req, req.seqs))
        logger.error("a step failed: %d request(s) finished with an error", len(touched))

    def _process(self, sched: SchedulerOutput, schedule_s: float, result: StepResult) -> list[RequestOutput]:
        # waiting for the host copies is device time: a CUDA event's (spinning) wait would count as CPU time
        sampled = result.sampled  # host copies (async: queued a step ago)
        t0 = time.thread_time()
        self._collect_prompt_logprobs(result)
        now = time.time()
        touched: dict[str, tuple[Request, list[Sequence]]] = {}  # requests with outputs due
        appended = 0
        for seq, token, logprob in sampled:
            seq.num_inflight -= 1
            if seq.status is SeqStatus.FINISHED:
                continue  # planned before its stop was seen (async) or aborted: discard
            appended += 1
            if self._append(seq, token, logprob, now) or seq.request.stream:
                touched.setdefault(seq.request.request_id, (seq.request, []))[1].append(seq)
        outputs = [out for req, seqs in touched.values() for out in self._outputs(req, seqs)]
        self.stats.generated_tokens += appended
        self._record_step(result, schedule_s, time.thread_time() - t0)
        return outputs

    @staticmethod
    def _collect_prompt_logprobs(result: StepResult) -> None:
        for req, first, rows in result.prompt_logprobs:
            for pos, lp in enumerate(rows, start=first):
                if pos == len(req.prompt_logprobs):  # recompute after preemption repeats none
                    req.prompt_logprobs.append(lp)

    def _record_step(self, result: StepResult, schedule_s: float, process_s: float) -> None:
        self.stats.num_preemptions = self.scheduler.num_preemptions
        gpu_s = result.gpu_s  # waits for the step's end event: both events can be read from here on
        idle = gpu_idle = None
        if self._prev_end is not None:
            prev_end, prev_event = self._prev_end
            idle = max(0.0, result.start - prev_end)
            if prev_event is not None and result.gpu is not None:
                gpu_idle = max(0.0, prev_event.elapsed_time(result.gpu[0]) / 1e3)
        self._prev_end = result.end, result.gpu[1] if result.gpu is not None else None
        self.stats.steps.append(StepStat(result.num_seqs, result.num_tokens, schedule_s, process_s,
                                         result.end - result.start, idle, gpu_s, gpu_idle))

    def _record_speculation(self, sched: SchedulerOutput, result: StepResult) -> None:
        """Counters, the cache position after verification, the next drafts of each sequence, and the
        step's time for the verification scheduler's latency curve (decode steps only)."""
        assert result.verified is not None
        for v in result.verified:
            seq, spec = v.seq, v.seq.spec
            if spec is None or not v.tokens:  # discarded: it ended before this step was committed
                continue
            # the drafts this step consumed: their copy has landed (queued before this step's verification,
            # whose tokens are on the host), even where none of them was verified
            confidences = spec.next.confidences() if spec.next is not None else None
            if confidences is not None:
                spec.estimates = confidences
            if v.num_drafts:
                self.stats.spec_verify_steps += 1
                self.stats.spec_draft_tokens += v.num_drafts
                self.stats.spec_accepted_tokens += v.num_accepted
                self.stats.count_accepted_positions(v.num_accepted)
                spec.num_drafts += v.num_drafts
                spec.num_accepted += v.num_accepted
                if confidences is not None:
                    spec.confidence_sum += sum(confidences[:v.num_drafts])
                    spec.num_estimated += v.num_drafts
            if seq.status is SeqStatus.FINISHED:
                continue
            # rejected rows are rolled back: the cache holds everything before the newest token
            seq.num_computed = len(seq.token_ids) - 1
            spec.next = v.next
        timing = self.scheduler.verify_scheduler
        if timing is not None and all(s.sample_seqs and len(s.token_ids) == s.num_drafts + 1
                                      for s in sched.segments):
            timing.record(result.num_seqs, result.num_tokens, result.end - result.start)

    def _append(self, seq: Sequence, token: int, logprob: TokenLogprob | None, now: float,
                text: bool = True) -> bool:
        """Add a sampled token and apply the stop rules; True if that finished the sequence. Without
        `text` the detokenizer is left to the caller (`_detokenize`: stop strings, the final flush)."""
        req, p = seq.request, seq.request.params
        seq.token_ids.append(token)
        if p.logprobs is not None:
            seq.logprobs.append(logprob)
        if req.first_token_time is None:
            req.first_token_time = now
        if p.structured_outputs is not None and (why := self.runner.structured.finish_reason(seq)):
            self._finish(seq, FinishReason(why), flush=text)  # the constraint ended (complete, or failed)
        elif token == self.eos_token_id and not p.ignore_eos:
            self._finish(seq, FinishReason.STOP, flush=text)  # the sampler masks EOS until min_tokens
        elif token in p.stop_token_ids:
            self._finish(seq, FinishReason.STOP, token, text)
        elif text and seq.detok is not None and (stop := seq.detok.add(token)) is not None:
            self._finish(seq, FinishReason.STOP, stop)
        elif len(seq.token_ids) >= seq.limit:
            self._finish(seq, FinishReason.LENGTH, flush=text)
        else:
            return False
        return True

    def _finish(self, seq: Sequence, reason: FinishReason, stop: str | int | None = None,
                flush: bool = True) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop
        if flush and seq.detok is not None and not isinstance(stop, str):
            seq.detok.flush()
        self.scheduler.remove(seq)
        if seq.spec is not None:
            seq.spec.clear()
            self.runner.release_later(seq.seq_id)  # the worker may be running a step that drafts for it
            if not self._inflight:
                self.runner.release_pending()
        req = seq.request
        if req.finished:
            req.finish_time = time.time()

    def _outputs(self, req: Request, seqs: list[Sequence]) -> list[RequestOutput]:
        finished = req.finished
        if finished:
            del self.requests[req.request_id]
        if not req.stream and not finished:
            return []
        completions = []
        for seq in seqs if req.stream else req.seqs:
            start = seq.streamed if req.stream else 0
            seq.streamed = seq.num_outputs
            text = seq.detok.take_delta(seq.status is SeqStatus.FINISHED) if seq.detok else ""
            logprobs = seq.logprobs[start:] if req.params.logprobs is not None else None
            completions.append(CompletionOutput(
                seq.index, text, seq.output_ids[start:], logprobs,
                seq.finish_reason.value if seq.finish_reason else None, seq.stop_reason, *spec_counts(seq)))
        n_out = max((s.num_outputs for s in req.seqs), default=0)
        metrics = RequestMetrics(req.arrival_time, req.first_token_time, req.finish_time, n_out,
                                 req.first_scheduled_time)
        prompt_lp = req.prompt_logprobs if req.params.prompt_logprobs is not None and finished else None
        return [RequestOutput(req.request_id, req.prompt, req.prompt_ids, completions, finished, metrics,
                              prompt_lp)]

    # ---- housekeeping ---------------------------------------------------------------------------

    def _maybe_log(self) -> None:
        interval = self.config.log_stats_interval
        now = time.monotonic()
        if not interval or now - self._last_log < interval:
            return
        self._last_log = now
        logger.info("running %d, waiting %d, cache %.0f%% used, %d tokens generated, %d preemptions",
                    len(self.scheduler.running), len(self.scheduler.waiting), 100 * self.cache.usage,
                    self.stats.generated_tokens, self.stats.num_preemptions)
        if self.stats.spec_draft_tokens:
            logger.info("speculation: mean accepted length %.2f, %d of %d drafts accepted",
                        self.stats.mean_accepted_length(), self.stats.spec_accepted_tokens,
                        self.stats.spec_draft_tokens)

    def close(self) -> None:
        """Wait for the in-flight steps and stop the worker thread; the engine takes no more calls."""
        with self._guard:
            wait([job for _, _, job in self._inflight])
            self._inflight.clear()
            if self._worker is not None:
                self._worker.shutdown()
                self._worker = None

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def freeze_startup_objects() -> None:
    """Take what start-up built (modules, Triton kernels, graphs, imported libraries: ~200k objects)
    out of the cyclic collector, as a serving engine keeps them for good: a full collection while
    serving scans them all (~130 ms; one stalled the scheduler 121 ms at 256 running sequences on the
    H200). CUDA engines only: a process that builds many small CPU engines (tests) keeps collecting."""
    gc.collect()
    gc.freeze()


def build_speculator(model: CausalLM, config: EngineConfig) -> tuple[Proposer | None, VerifyScheduler | None]:
    """The configured proposer (None: no speculation) and, for confidence scheduling, its scheduler."""
    if config.speculator == "none":
        return None, None
    proposer: Proposer = get_speculator(config.speculator).build(  # type: ignore[attr-defined]
        model, SpeculatorConfig(config.num_draft_tokens))
    k = proposer.num_draft_tokens
    if k > model.max_backtrack:
        raise SpeculatorError(
            f"speculator {config.speculator!r} verifies up to {k} drafts, but the model can roll back only "
            f"{model.max_backtrack} tokens; lower num_draft_tokens or load the model with more rollback room")
    if config.spec_schedule == "fixed":
        return proposer, None
    try:
        from deepinfer_spec.confidence import ConfidenceScheduler
    except ImportError as exc:
        raise SpeculatorError(f"spec_schedule 'confidence' needs deepinfer-spec's scheduler: {exc}") from None
    return proposer, ConfidenceScheduler(SpeculatorConfig(k))


def spec_counts(seq: Sequence) -> tuple[int, int, float | None]:
    """(drafts verified, drafts accepted, mean estimated acceptance) of a sequence."""
    spec = seq.spec
    if spec is None:
        return 0, 0, None
    mean = spec.confidence_sum / spec.num_estimated if spec.num_estimated else None
    return spec.num_drafts, spec.num_accepted, mean


def token_ids(values: object, what: str) -> list[int]:
    """Integer token ids (Python or numpy/torch integers); floats and bools are errors, not truncated."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a list of token ids, got {type(values).__name__}")
    ids = []
    for v in values:
        if isinstance(v, bool):
            raise TypeError(f"{what}: token ids must be integers, got {v!r}")
        try:
            ids.append(operator.index(v))
        except TypeError:
            raise TypeError(f"{what}: token ids must be integers, got {v!r:.40} "
                            f"({type(v).__name__})") from None
    return ids


def check_text(text: str, what: str) -> str:
    """Text must encode as UTF-8 (a shell passes undecodable bytes on as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8 text (undecodable byte at character {exc.start})"
                         ) from None
    return text
