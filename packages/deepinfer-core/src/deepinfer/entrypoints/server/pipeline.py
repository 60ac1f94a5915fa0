"""The one output pipeline: engine token ids -> deepseek_recipe's StreamProcessor -> protocol events.

Every protocol route runs a request through `generate`: it submits the prompt ids, feeds each choice's
new tokens to that choice's processor (whose initial state comes from the rendered prompt via the
converted request's ParsingOptions), and yields `(choice_index, events)`. Stop sequences are the
recipe's: once every choice's processor has finished, the engine request is aborted. Leaving the
iteration early for any reason (client gone, deadline, error) aborts the engine request too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from deepinfer.engine import RequestOutput
from deepinfer.entrypoints.server.async_engine import QueueFullError, RequestAborted
from deepinfer.entrypoints.server.errors import APIError
from deepinfer.entrypoints.server.state import ServerState
from deepinfer.sampling import SamplingParams
from deepinfer.sampling.sampler import TokenLogprob

T = TypeVar("T")

# sampler settings the protocols lack but clients send (vLLM's extensions), read from the raw body
EXTRA_SAMPLING_FIELDS = ("top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                         "min_tokens", "ignore_eos", "logit_bias", "structured_outputs")


def sampling_params(state: ServerState, converted: Any, prompt_len: int, body: dict[str, Any],
                    n: int = 1) -> SamplingParams:
    """SamplingParams from the recipe's InferenceOptions plus the extension fields of the raw body."""
    try:
        max_tokens = converted.resolve_max_tokens(prompt_len, state.max_model_len)
    except Exception as exc:  # ConversionError: the prompt leaves no room
        raise APIError(getattr(exc, "status_code", 400), str(exc)) from None
    io = converted.inference_options
    extras = {k: body[k] for k in EXTRA_SAMPLING_FIELDS if body.get(k) is not None}
    seed = io.seed if io.seed is not None else body.get("seed")  # Messages/Responses: an extension field
    constraint = output_constraint(state, converted)
    if constraint is not None:
        if "structured_outputs" in extras:
            raise APIError(400, "structured_outputs cannot be combined with response_format or tools",
                           param="structured_outputs")
        extras["structured_outputs"] = constraint
    elif isinstance(so := extras.get("structured_outputs"), dict) and _thinking(state, converted):
        extras["structured_outputs"] = {"start_after": "</think>", **so}
    try:
        return SamplingParams(
            n=n, max_tokens=max_tokens, temperature=io.temperature, top_p=io.top_p, seed=seed,
            logprobs=(io.top_logprobs or 0) if io.logprobs else None, **extras)
    except ValueError as exc:
        raise APIError(400, f"invalid sampling parameters: {exc}") from None


def output_constraint(state: ServerState, converted: Any) -> dict[str, Any] | None:
    """`StructuredOutputs` fields for the recipe's OutputConstraint (response_format, tools). A thinking
    prompt constrains only what follows `</think>`, so the reasoning stays free."""
    oc = converted.inference_options.output_constraint
    if oc is None:
        return None
    po = converted.parsing_options
    so: dict[str, Any] = {"start_after": "</think>"} if _thinking(state, converted) else {}
    if oc.kind == "json":
        so |= {"json_schema": oc.schema} if oc.schema else {"json_object": True}
    elif oc.kind == "regex":
        so["regex"] = oc.schema
    elif oc.kind in ("tool_call", "tool_call_required"):
        tools = [{"name": t["function"]["name"], "parameters": t["function"].get("parameters") or {}}
                 for t in json.loads(oc.schema)]
        so["tools"] = {"tools": tools, "mode": "auto" if oc.kind == "tool_call" else "required",
                       "opened": bool(po.starts_in_tool_calls)}
    else:
        raise ValueError(f"unsupported output constraint {oc.kind!r}")
    return so


def _thinking(state: ServerState, converted: Any) -> bool:
    """The rendered prompt opens the answer in reasoning: constraints start after `</think>`."""
    stage = converted.parsing_options.thinking_initial_stage
    return stage == state.recipe.ThinkingInitialStage.ReasoningStart


class ChoiceParser:
    """One choice's StreamProcessor; `done` once it has emitted its finish (EOS, stop sequence, length)."""

    def __init__(self, state: ServerState, generator: Any, parsing_options: Any, prompt_tokens: int):
        r = state.recipe
        self._r = r
        self._eos = state.engine.engine.eos_token_id
        self.proc = r.StreamProcessor(generator, parsing_options, state.recipe_tokenizer)
        usage = r.PromptUsage(prompt_tokens=prompt_tokens, prompt_cache_hit_tokens=0)
        self.initial = self.proc.push(r.InferenceChunk.ready(prompt_usage=usage))
        self.done = False
        self.token_ids: list[int] = []  # everything the engine generated for this choice, EOS included

    def push(self, token_ids: list[int], logprobs: list[TokenLogprob | None] | None,
             finish_reason: str | None) -> list[Any]:
        if self.done:
            return []
        self.token_ids += token_ids
        if finish_reason in ("stop", "grammar_error") and token_ids and token_ids[-1] == self._eos:
            token_ids, logprobs = token_ids[:-1], logprobs[:-1] if logprobs else logprobs  # EOS is no text
        events = []
        if token_ids:
            lp = None if logprobs is None else [(t.logprob, list(t.top)) if t else (0.0, [])
                                                for t in logprobs]
            events = self.proc.push(self._r.InferenceChunk.tokens(token_ids, lp))
        if not self.proc.finished and finish_reason is not None:
            reason = self._r.InferenceFinishReason
            events += self.proc.push(self._r.InferenceChunk.finish(
                reason.Length if finish_reason == "length" else reason.Stop))
        if self.proc.finished:
            events += self.proc.finish()
            self.done = True
        return events


@dataclass
class Generation:
    """One request in flight: what the route needs for logs and metrics once it ends."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    queue_time: float | None = None  # the engine's, from its request metrics
    output_tokens: int = 0
    token_ids: list[list[int]] = field(default_factory=list)  # per choice, once generation ended
    finish_reason: str = "abort"

    def summary(self) -> str:
        ttft = "-" if self.first_token is None else f"{self.first_token - self.arrival:.3f}s"
        return (f"{self.request_id}: {len(self.prompt_ids)} prompt + {self.output_tokens} output tokens, "
                f"n={self.params.n}, finish={self.finish_reason}, ttft={ttft}")


async def generate(state: ServerState, gen: Generation,
                   parser_factory: Callable[[], ChoiceParser]) -> AsyncIterator[tuple[int, list[Any]]]:
    """Yield `(choice_index, events)` until every choice has finished; see the module docstring."""
    stream = admit(state, lambda: state.engine.submit(gen.request_id, gen.prompt_ids, gen.params))
    parsers = [parser_factory() for _ in range(gen.params.n)]
    try:
        for i, p in enumerate(parsers):
            yield i, p.initial
        last, out = None, None
        async with asyncio.timeout(state.request_timeout):
            async for out in stream:
                now = time.monotonic()
                if gen.first_token is None:
                    gen.first_token = now
                    gen.queue_time = out.metrics.queue_time
                elif last is not None:
                    state.metrics.itl.labels(state.model_name).observe(now - last)
                last = now
                for i, events in _choice_events(parsers, out):
                    yield i, events
                if all(p.done for p in parsers):
                    break
        gen.finish_reason = _finish_reason(out)
    except RequestAborted:  # cancelled through the API: end with what was generated
        pass
    except TimeoutError:
        gen.finish_reason = "timeout"
        raise APIError(504, f"the request ran past its deadline of {state.request_timeout} s") from None
    except EngineStepError:
        gen.finish_reason = "error"
        raise APIError(500, f"the engine failed while generating this request: "
                       f"{state.engine.last_step_error}") from None
    except ValueError as exc:  # the engine refused the request
        gen.finish_reason = "error"
        raise APIError(400, str(exc)) from None
    finally:
        state.engine.abort(gen.request_id)  # no-op if the engine already finished it
        gen.output_tokens = sum(len(p.token_ids) for p in parsers)
        gen.token_ids = [p.token_ids for p in parsers]
        state.metrics.finished(gen.finish_reason, len(gen.prompt_ids), gen.output_tokens,
                               time.monotonic() - gen.arrival,
                               None if gen.first_token is None else gen.first_token - gen.arrival,
                               gen.queue_time)



async def choice_events(first: tuple[int, list[Any]],
                        events: AsyncIterator[tuple[int, list[Any]]]) -> AsyncIterator[tuple[int, Any]]:
    """(choice index, protocol event) pairs: `first` (taken early so admission errors surface before any
    header is sent), then the rest of `events`, which is closed however the caller stops."""
    async with contextlib.aclosing(events):
        item: tuple[int, list[Any]] | None = first
        while item is not None:
            index, batch = item
            for event in batch:
                yield index, event
            item = await anext(events, None)


def admit(state: ServerState, submit: Callable[[], T]) -> T:
    """Run an admission step; a full queue is a 503 with Retry-After, a dead engine a 503."""
    try:
        return submit()
    except QueueFullError as exc:
        state.metrics.rejections.labels(state.model_name, "queue_full").inc()
        raise APIError(503, str(exc), headers={"Retry-After": str(state.retry_after_s)}) from None
    except RuntimeError as exc:
        raise APIError(503, str(exc)) from None


class EngineStepError(RuntimeError):
    """A step this request was in failed (the engine finished it with reason "error")."""


def _choice_events(parsers: list[ChoiceParser], out: RequestOutput) -> list[tuple[int, list[Any]]]:
    result = []
    for c in out.outputs:
        if c.finish_reason == "error":
            raise EngineStepError
        events = parsers[c.index].push(c.token_ids, c.logprobs, c.finish_reason)
        if events:
            result.append((c.index, events))
    return result


def _finish_reason(out: RequestOutput | None) -> str:
    """The engine's reason when it finished, else "stop" (a recipe stop sequence ended every choice)."""
    reasons = {c.finish_reason for c in out.outputs if c.finish_reason} if out else set()
    return "length" if reasons == {"length"} else "stop"
