"""`deepinfer serve --dp N`: a data-parallel engine whose ranks live as long as the server.

`DataParallelEngine` stands where the server's `AsyncEngine` expects one `LLMEngine`: requests go to
the rank with the fewest queued tokens through its inbox, every rank steps its own engine (in step with
the others, see lockstep.py) and sends each step's outputs back through one shared outbox. Ranks are
started by `launch.spawn` on a thread, so its watchdog still stops the group when a rank fails; the
engine then raises from `has_unfinished_requests`, which ends the server's engine loop (its requests
fail, /ready answers 503) instead of leaving them waiting.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deepinfer.distributed.frontend import DataParallelLLM
from deepinfer.distributed.launch import spawn
from deepinfer.distributed.lockstep import LockStep, dummy_forward
from deepinfer.distributed.state import ParallelState, use_parallel
from deepinfer.engine import CompletionOutput, LLMEngine, RequestMetrics, RequestOutput
from deepinfer.engine.stats import EngineStats
from deepinfer.sampling import SamplingParams

_STOP = 1 << 20  # an idle rank's tick when it is stopping; real forwards tick 1 (see _idle_tick)
_IDLE_WAIT_S = 0.01  # how long an idle rank waits for a request before ticking again


@dataclass
class _RankLoad:
    """What a rank last reported, read by the server's /ready and /metrics (sums over ranks)."""

    running: int = 0  # sequences
    waiting: int = 0
    usage: float = 0.0
    free: bool = True

    @property
    def idle(self) -> bool:
        return not (self.running or self.waiting) and self.free

    @classmethod
    def of(cls, engine: LLMEngine) -> _RankLoad:
        sched, cache = engine.scheduler, engine.cache
        return cls(len(sched.running), len(sched.waiting), cache.usage, cache.all_free())


class _Scheduler:
    """`running`/`waiting` over all ranks, sized like the scheduler's queues (only their length is read)."""

    def __init__(self, loads: list[_RankLoad]):
        self._loads = loads

    @property
    def running(self) -> range:
        return range(sum(load.running for load in self._loads))

    @property
    def waiting(self) -> range:
        return range(sum(load.waiting for load in self._loads))


class _Cache:
    def __init__(self, loads: list[_RankLoad]):
        self._loads = loads

    @property
    def usage(self) -> float:
        return sum(load.usage for load in self._loads) / len(self._loads)

    def all_free(self) -> bool:
        return all(load.free for load in self._loads)


class DataParallelEngine:
    """The `LLMEngine` surface `AsyncEngine` uses, over `llm.dp` persistent ranks."""

    proposer = None  # no speculative decoding across ranks
    tokenizer = None  # token ids in and out

    def __init__(self, llm: DataParallelLLM, ready_timeout_s: float = 600.0):
        ctx = mp.get_context("spawn")
        self.dp = llm.dp
        self._inboxes = [ctx.Queue() for _ in range(self.dp)]
        self._outbox = ctx.Queue()
        self._loads = [_RankLoad() for _ in range(self.dp)]
        self.scheduler, self.cache, self.stats = _Scheduler(self._loads), _Cache(self._loads), EngineStats()
        self._owner: dict[str, tuple[int, int]] = {}  # request id -> (rank, queued tokens)
        self._queued = [0] * self.dp
        self._seeds = random.Random(llm.seed)  # the seeds a single engine would draw, in arrival order
        self.failure: BaseException | None = None
        args = (str(llm.model), llm.llm_kwargs, self._inboxes, self._outbox)
        self._thread = threading.Thread(target=self._launch, args=(llm, args), name="deepinfer-dp",
                                        daemon=True)
        self._thread.start()
        infos = [self._next_message(ready_timeout_s) for _ in range(self.dp)]
        if any(kind != "ready" for kind, *_ in infos):
            raise RuntimeError(f"a rank sent {infos} before it was ready")
        info = infos[0][2]
        self.vocab_size, self.eos_token_id, self.max_model_len = (
            info["vocab_size"], info["eos_token_id"], info["max_model_len"])

    def _launch(self, llm: DataParallelLLM, args: tuple) -> None:
        try:
            spawn(_serve_rank, self.dp, *args, timeout_s=llm.timeout_s,
                  redundant_experts=llm.redundant_experts, threads=llm.threads)
        except BaseException as exc:  # the watchdog stopped the group: fail the server's engine loop
            self.failure = exc
        self._outbox.put(("exit",))

    def _next_message(self, timeout_s: float) -> tuple:
        try:
            msg = self._outbox.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"the data-parallel ranks sent nothing for {timeout_s} s") from None
        if msg[0] == "exit":
            raise RuntimeError(f"the data-parallel ranks stopped: {self.failure}")
        return msg

    # ---- the LLMEngine surface ------------------------------------------------------------------

    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str,
                    stream: bool = True) -> str:
        if self.failure is not None:
            raise RuntimeError(f"the data-parallel ranks stopped: {self.failure}")
        if params.seed is None:
            params = params.model_copy(update={"seed": self._seeds.getrandbits(64)})
        rank = min(range(self.dp), key=lambda r: (self._queued[r], r))
        cost = len(prompt) + (params.max_tokens or 0)
        self._queued[rank] += cost
        self._owner[request_id] = (rank, cost)
        self._inboxes[rank].put(("add", request_id, list(prompt), params))
        return request_id

    def abort(self, request_id: str, *, report: bool = True) -> bool:
        owner = self._release(request_id)
        if owner is not None:
            self._inboxes[owner].put(("abort", request_id, report))
        return owner is not None

    def has_unfinished_requests(self) -> bool:
        if self.failure is not None:
            raise RuntimeError(f"a data-parallel rank failed: {self.failure}")
        # also until every rank reported its load after its last request (an abort frees cache later)
        return bool(self._owner) or not all(load.idle for load in self._loads)

    def step(self) -> list[RequestOutput]:
        """The outputs the ranks sent since the last call (waits briefly for the first)."""
        outputs: list[RequestOutput] = []
        try:
            msg = self._outbox.get(timeout=0.05)
            while True:
                outputs.extend(self._handle(msg))
                msg = self._outbox.get_nowait()
        except queue.Empty:
            pass
        return outputs

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(("stop",))
        self._thread.join(60)

    # ---- internals ------------------------------------------------------------------------------

    def _handle(self, msg: tuple) -> list[RequestOutput]:
        kind = msg[0]
        if kind == "exit":
            return []  # `failure` is set (or the group stopped on close)
        if kind == "rejected":  # the rank's engine refused the request: it ends with an error
            _, rid, prompt, message = msg
            self._release(rid)
            return [_error_output(rid, prompt, message)]
        _, rank, outs, load = msg
        self._loads[rank] = load
        for out in outs:
            if out.finished:
                self._release(out.request_id)
        return outs

    def _release(self, request_id: str) -> int | None:
        rank, cost = self._owner.pop(request_id, (None, 0))
        if rank is not None:
            self._queued[rank] -= cost
        return rank


def _error_output(request_id: str, prompt: list[int], message: str) -> RequestOutput:
    now = time.time()
    completion = CompletionOutput(0, "", [], None, finish_reason="error", stop_reason=message)
    return RequestOutput(request_id, None, prompt, [completion], True, RequestMetrics(now, None, now, 0))


def _serve_rank(state: ParallelState, model: str, llm_kwargs: dict[str, Any], inboxes: list, outbox: Any
                ) -> None:
    """One rank: apply the server's commands between steps, step while there is work, else tick idle."""
    from deepinfer.entrypoints.llm import LLM

    inbox = inboxes[state.rank]
    with use_parallel(state):
        # synchronous steps: a step launched ahead would still run its exchanges after an abort left
        # the rank idle, interleaved with the idle ticks
        llm = LLM(model, **{**llm_kwargs, "async_scheduling": False})
        engine = llm.engine
        engine.tokenizer = None
        lock = LockStep(engine.model.model, state.group)
        lock.attach(engine.model)
        info = {"vocab_size": engine.vocab_size, "eos_token_id": engine.eos_token_id,
                "max_model_len": engine.max_model_len}
        outbox.put(("ready", state.rank, info))
        stopping = False
        while True:
            busy, applied = engine.has_unfinished_requests(), False
            try:
                while True:
                    msg = inbox.get(timeout=_IDLE_WAIT_S) if not (busy or stopping) else inbox.get_nowait()
                    busy = applied = True  # a command may add work: look again below
                    if msg[0] == "add":
                        _, rid, prompt, params = msg
                        try:
                            engine.add_request(prompt, params, request_id=rid, stream=True)
                        except ValueError as exc:
                            outbox.put(("rejected", rid, prompt, str(exc)))
                    elif msg[0] == "abort":
                        engine.abort(msg[1], report=msg[2])
                    else:  # stop: drop what is left, then leave with the others
                        stopping = True
                        engine.abort(list(engine.requests), report=False)
            except queue.Empty:
                pass
            if engine.has_unfinished_requests() and not stopping:
                outbox.put(("step", state.rank, engine.step(), _RankLoad.of(engine)))
                continue
            if applied:  # aborts freed cache without a step: report the load they left
                outbox.put(("step", state.rank, [], _RankLoad.of(engine)))
            if _idle_tick(lock, stopping):
                break
        llm.close()


def _idle_tick(lock: LockStep, stopping: bool) -> bool:
    """Tick as an idle rank (a dummy forward if another rank works) -> whether every rank is stopping."""
    flag = torch.tensor([_STOP if stopping else 0], dtype=torch.int64)
    dist.all_reduce(flag, group=lock.group)
    lock.ticks += 1
    total = int(flag.item())
    if total % _STOP:  # some rank ran a real forward in this round
        dummy_forward(lock.model)
        lock.dummy_forwards += 1
        return False
    return total == _STOP * dist.get_world_size(lock.group)
