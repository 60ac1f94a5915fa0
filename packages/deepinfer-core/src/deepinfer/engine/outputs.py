"""What the engine hands back: per-completion text, token ids, log-probabilities, finish reason, timing."""

from __future__ import annotations

from dataclasses import dataclass

from deepinfer.sampling.sampler import TokenLogprob


@dataclass
class CompletionOutput:
    """One completion. In a streamed output `text`, `token_ids` and `logprobs` hold only what is new."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob | None] | None  # None unless SamplingParams.logprobs is set
    finish_reason: str | None = None  # "stop", "length", "abort", "error", "prompt_length_exceeded"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    # speculative decoding, cumulative over the whole completion (also in streamed outputs)
    draft_tok: int = 0  # drafts verified
    accept_tok: int = 0  # drafts accepted
    confidence: float | None = None  # mean estimated acceptance of the verified drafts (if estimated)

    @property
    def cumulative_logprob(self) -> float | None:
        if not self.logprobs:
            return None
        return sum(lp.logprob for lp in self.logprobs if lp is not None)


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None
    finish_time: float | None
    num_output_tokens: int
    first_scheduled_time: float | None = None  # when the scheduler first gave it a batch slot

    @property
    def queue_time(self) -> float | None:
        """Seconds from arrival to first scheduling (None: never scheduled)."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_token_time is None or self.finish_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: list[TokenLogprob | None] | None = None  # entry 0 (first token) is None
