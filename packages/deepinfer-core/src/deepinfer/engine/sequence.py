"""Requests and their sequences (one per completion), with the bookkeeping the scheduler needs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from deepinfer.sampling.detokenizer import IncrementalDetokenizer
from deepinfer.sampling.params import SamplingParams
from deepinfer.sampling.sampler import TokenLogprob
from deepinfer.speculators.drafts import NextDrafts


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"
    ERROR = "error"  # a step it was in failed; `LLMEngine.step` raised the exception
    GRAMMAR_ERROR = "grammar_error"  # its structured-output constraint failed (compile, timeout, dead end)
    PROMPT_TOO_LONG = "prompt_length_exceeded"  # prompt leaves no room under max_model_len


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int  # admission order: FCFS key
    arrival_time: float
    stream: bool
    seqs: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    first_token_time: float | None = None
    first_scheduled_time: float | None = None  # end of its queue time; a preempted request keeps it
    finish_time: float | None = None

    @property
    def finished(self) -> bool:
        return all(s.status is SeqStatus.FINISHED for s in self.seqs)


@dataclass(eq=False)
class SpecState:
    """Speculative decoding of one sequence: the drafts for the tokens after its newest one, and
    counters of what verification did with earlier drafts."""

    next: NextDrafts | None = None  # ids, distributions and confidences of its current drafts
    num_drafts: int = 0  # drafts verified so far
    num_accepted: int = 0  # of those, accepted
    confidence_sum: float = 0.0  # summed estimates of the verified drafts that had one
    num_estimated: int = 0
    # the conditional estimates of the drafts its last step consumed (host): what an asynchronous
    # confidence schedule plans from while its newest drafts' estimates are still on their way
    estimates: list[float] | None = None

    def clear(self) -> None:
        self.next = None


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request: Request
    index: int  # which of the request's n completions
    seed: int  # int64 bit pattern keying this sequence's RNG
    token_ids: list[int]  # prompt + generated tokens known on the CPU
    detok: IncrementalDetokenizer | None
    limit: int  # length at which it finishes: min(max_model_len, prompt + max_tokens)
    prompt_len: int
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens in the cache, counting those of steps still in flight
    num_inflight: int = 0  # sampled tokens of in-flight steps not yet in token_ids
    slot: int = 0  # 0 = none
    blocks: list[int] = field(default_factory=list)
    fork_parent: Sequence | None = None  # waiting to copy this sequence's cache after its prefill
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    streamed: int = 0  # output tokens already handed out as stream deltas
    scheduled_step: int = 0  # last step that planned tokens for it
    spec: SpecState | None = None  # set when the engine speculates for this sequence

    @property
    def num_outputs(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def order(self) -> tuple[int, int]:
        return (self.request.arrival, self.index)
