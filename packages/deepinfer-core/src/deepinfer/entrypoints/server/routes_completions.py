"""/v1/completions: raw prompts (text or token ids), no chat template.

The output still goes through deepseek_recipe's StreamProcessor (token decoding, stop sequences) with
a plain-content chunk generator and tool-call parsing off, so text and stops agree with the chat routes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from deepinfer.entrypoints.server.errors import APIError, error_payload
from deepinfer.entrypoints.server.http import read_json, sse, unless_disconnected
from deepinfer.entrypoints.server.pipeline import (
    EXTRA_SAMPLING_FIELDS,
    ChoiceParser,
    Generation,
    admit,
    choice_events,
    generate,
)
from deepinfer.entrypoints.server.protocols import CHAT, MAX_N, convert
from deepinfer.entrypoints.server.state import ServerState
from deepinfer.sampling import SamplingParams

router = APIRouter()
PATH = "/v1/completions"


def _prompt_ids(state: ServerState, prompt: object) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return state.text_tokenizer.encode(prompt)
    vocab = state.engine.engine.vocab_size
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt)):
        return list(prompt)
    raise APIError(400, "prompt must be a non-empty string or a list of token ids in "
                   f"[0, {vocab}) (batches of several prompts are not supported)", param="prompt")


def _params(body: dict[str, Any]) -> SamplingParams:
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {n!r}", param="n")
    fields = {k: body[k] for k in ("max_tokens", "temperature", "top_p", "seed", "logprobs",
                                   *EXTRA_SAMPLING_FIELDS) if body.get(k) is not None}
    fields.setdefault("max_tokens", 16)
    try:
        return SamplingParams(n=n, **fields)
    except ValueError as exc:
        raise APIError(400, f"invalid sampling parameters: {exc}") from None


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, "stop must be a non-empty string or a list of them", param="stop")
    return stop


def _plain_generator(state: ServerState, rid: str, model: str) -> Any:
    """A chat chunk generator for plain, non-thinking content (the recipe builds generators only from a
    converted request, so convert a minimal one)."""
    converted = convert(state, CHAT, {"model": model, "messages": [{"role": "user", "content": "-"}],
                                      "thinking": {"type": "disabled"}})
    return state.recipe.ChatCompletionRequest.chunk_generator(converted, rid, model)


def _text_and_logprobs(chunk: dict[str, Any]) -> tuple[str, dict[str, Any] | None, str | None]:
    """A chat chunk's content, its logprobs in the completions shape, and its finish reason."""
    choice = (chunk.get("choices") or [{}])[0]
    text = (choice.get("delta") or {}).get("content") or ""
    entries = (choice.get("logprobs") or {}).get("content")
    logprobs = None
    if entries:
        logprobs = {"tokens": [e["token"] for e in entries],
                    "token_logprobs": [e["logprob"] for e in entries],
                    "top_logprobs": [{t["token"]: t["logprob"] for t in e.get("top_logprobs", [])}
                                     for e in entries]}
    return text, logprobs, choice.get("finish_reason")


@router.post(PATH)
async def completions(request: Request) -> Response:
    arrival = time.monotonic()
    state: ServerState = request.app.state.server
    admit(state, state.engine.check_admission)
    body = await read_json(request, state.max_body_bytes)
    model = state.check_model(body.get("model"))
    if body.get("echo"):
        raise APIError(400, "echo is not supported", param="echo")
    prompt_ids = _prompt_ids(state, body.get("prompt"))
    if len(prompt_ids) >= state.max_model_len:
        raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this server's max_model_len is "
                       f"{state.max_model_len}", param="prompt")
    stream = bool(body.get("stream"))
    params, stops = _params(body), _stops(body)
    rid = f"cmpl-{uuid.uuid4().hex}"
    gen = request.state.generation = Generation(rid, prompt_ids, params, arrival=arrival)
    options = state.recipe.ParsingOptions(parse_tool_calls=False, stop_sequences=stops)
    events = generate(state, gen, lambda: ChoiceParser(state, _plain_generator(state, rid, model), options,
                                                       len(prompt_ids)))
    first = await anext(events)
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
    if stream:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(_stream(gen, head, first, events, include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    collect = _collect(gen, head, first, events, bool(body.get("return_token_ids")))
    return JSONResponse(await unless_disconnected(request, collect))


def _usage(gen: Generation) -> dict[str, Any]:
    return {"prompt_tokens": len(gen.prompt_ids), "completion_tokens": gen.output_tokens,
            "total_tokens": len(gen.prompt_ids) + gen.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0}}


async def _collect(gen: Generation, head: dict[str, Any], first: tuple[int, list[Any]],
                   events: AsyncIterator[tuple[int, list[Any]]], return_token_ids: bool) -> dict[str, Any]:
    n = gen.params.n
    texts: list[list[str]] = [[] for _ in range(n)]
    logprobs: list[dict[str, list[Any]] | None] = [None] * n
    finish: list[str | None] = [None] * n
    async for index, event in choice_events(first, events):
        text, lp, reason = _text_and_logprobs(json.loads(event.to_json()))
        texts[index].append(text)
        finish[index] = reason or finish[index]
        if lp:
            acc = logprobs[index] = logprobs[index] or {k: [] for k in lp}
            for k, v in lp.items():
                acc[k] += v
    choices = [{"index": i, "text": "".join(texts[i]), "logprobs": logprobs[i], "finish_reason": finish[i]}
               for i in range(n)]
    if return_token_ids:  # vLLM's extension: the generated ids, for checks against offline runs
        for choice, ids in zip(choices, gen.token_ids):
            choice["token_ids"] = ids
    return {**head, "choices": choices, "usage": _usage(gen)}


async def _stream(gen: Generation, head: dict[str, Any], first: tuple[int, list[Any]],
                  events: AsyncIterator[tuple[int, list[Any]]], include_usage: bool) -> AsyncIterator[str]:
    try:
        async for index, event in choice_events(first, events):
            text, lp, reason = _text_and_logprobs(json.loads(event.to_json()))
            if text or reason:
                choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": reason}
                yield sse(json.dumps({**head, "choices": [choice]}, ensure_ascii=False))
        if include_usage:
            yield sse(json.dumps({**head, "choices": [], "usage": _usage(gen)}))
    except APIError as err:
        yield sse(json.dumps(error_payload(PATH, err.status, err.message)))
    yield sse("[DONE]")
