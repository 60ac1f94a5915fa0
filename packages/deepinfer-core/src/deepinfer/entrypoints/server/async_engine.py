"""`AsyncEngine`: the HTTP event loop's view of an `LLMEngine` stepping in its own thread.

The engine is not thread-safe, so only the engine thread touches it: the event loop queues `add` and
`abort` commands, which the thread applies between steps (an abort therefore frees the request's cache
within one step), and the thread hands each step's outputs back to the loop in one
`call_soon_threadsafe`. The loop never waits on a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from deepinfer.engine import LLMEngine, RequestOutput
from deepinfer.sampling import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Admission refused: the engine's queue is at `max_num_queued_reqs`."""




class RequestAborted(Exception):
    """The front end aborted the request (client gone, cancelled): its stream ends here."""


@dataclass(frozen=True)
class SpecCounters:
    """The engine's cumulative speculative-decoding counts, replaced whole so a reader never mixes steps."""

    drafts: int = 0  # sequence-steps that verified at least one draft
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()  # [j]: verifications that accepted draft position j


@dataclass
class EngineSnapshot:
    """What the engine thread last published (read by /ready, /metrics and admission)."""

    running: int = 0  # sequences
    waiting: int = 0
    kv_usage: float = 0.0
    cache_all_free: bool = True
    steps: int = 0
    failed_steps: int = 0
    spec: SpecCounters = field(default_factory=SpecCounters)
    heartbeat: float = field(default_factory=time.monotonic)  # last loop iteration (monotonic)


class RequestStream:
    """Outputs of one request, in order; ends after the finished output or with an exception."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            yield item


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_num_queued_reqs: int | None = None, idle_wait_s: float = 0.5):
        self.engine = engine
        self.max_num_queued_reqs = max_num_queued_reqs
        self.snapshot = EngineSnapshot()
        self._idle_wait_s = idle_wait_s
        self._commands: deque[tuple[str, str, list[int] | None, SamplingParams | None]] = deque()
        self._pending_adds = 0  # adds queued for the thread but not yet applied
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead: BaseException | None = None  # set if the engine thread itself died
        self.last_step_error = ""

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="deepinfer-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stop the engine thread after its current step and close the engine."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self.engine.close()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ---- requests (event loop side) -------------------------------------------------------------

    def check_admission(self) -> None:
        """Raise QueueFullError when the queue is full, RuntimeError if the engine loop died (cheap)."""
        if self.dead is not None:
            raise RuntimeError(f"the engine loop has stopped: {self.dead}")
        limit = self.max_num_queued_reqs
        if limit is not None and self.snapshot.waiting + self._pending_adds >= limit:
            raise QueueFullError(f"the request queue is full ({limit} waiting)")

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request (after `check_admission`)."""
        self.check_admission()
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        self._pending_adds += 1
        self._commands.append(("add", request_id, prompt_ids, params))
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request (no-op once finished); its cache is freed before the engine's next step."""
        stream = self._streams.pop(request_id, None)
        if stream is not None and not stream.finished:
            stream.put(RequestAborted(request_id))
            self._commands.append(("abort", request_id, None, None))
            self._wake.set()

    def _deliver(self, outputs: list[RequestOutput], errors: list[tuple[str, BaseException]]) -> None:
        for rid, exc in errors:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream.put(exc)
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted by the front end: nobody is listening
            if out.finished:
                del self._streams[out.request_id]
            stream.put(out)

    def _applied_adds(self, n: int) -> None:
        self._pending_adds -= n

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        engine, loop = self.engine, self._loop
        assert loop is not None
        try:
            while not self._stop:
                errors: list[tuple[str, BaseException]] = []
                adds = self._apply_commands(errors)
                if adds:
                    loop.call_soon_threadsafe(self._applied_adds, adds)
                outputs: list[RequestOutput] = []
                if engine.has_unfinished_requests():
                    try:
                        outputs = engine.step()
                        self.snapshot.steps += 1
                    except Exception as exc:  # the engine finished the step's requests with "error"
                        logger.exception("engine step failed; its requests end with an error")
                        self.snapshot.failed_steps += 1
                        self.last_step_error = f"{type(exc).__name__}: {exc}"
                elif not self._commands:
                    self._wake.wait(self._idle_wait_s)
                    self._wake.clear()
                self._publish()
                if outputs or errors:
                    loop.call_soon_threadsafe(self._deliver, outputs, errors)
        except BaseException as exc:  # the loop itself broke: fail everyone, /ready turns 503
            logger.exception("engine loop died")
            self.dead = exc
            with contextlib.suppress(RuntimeError):  # the event loop may be closed already
                loop.call_soon_threadsafe(self._fail_streams, exc)

    def _apply_commands(self, errors: list[tuple[str, BaseException]]) -> int:
        adds = 0
        while self._commands:
            op, rid, prompt_ids, params = self._commands.popleft()
            if op == "abort":
                self.engine.abort(rid, report=False)  # nobody listens for its final output
                continue
            adds += 1
            try:
                self.engine.add_request(prompt_ids, params, request_id=rid, stream=True)
            except Exception as exc:  # ValueError: a bad request; anything else is the engine's fault
                errors.append((rid, exc))
        return adds

    def _publish(self) -> None:
        s, sched, cache = self.snapshot, self.engine.scheduler, self.engine.cache
        s.running, s.waiting = len(sched.running), len(sched.waiting)
        s.kv_usage, s.cache_all_free = cache.usage, cache.all_free()
        stats = self.engine.stats
        if stats.spec_verify_steps != s.spec.drafts:
            s.spec = SpecCounters(stats.spec_verify_steps, stats.spec_draft_tokens,
                                  stats.spec_accepted_tokens, tuple(stats.spec_accepted_per_pos))
        s.heartbeat = time.monotonic()

    def _fail_streams(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.put(RuntimeError(f"the engine loop has stopped: {exc}"))
        self._streams.clear()
