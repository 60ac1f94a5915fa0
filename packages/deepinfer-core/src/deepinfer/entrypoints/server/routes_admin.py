"""/health (shallow liveness), /ready, /metrics, /version, /tokenize and /detokenize."""

from __future__ import annotations

import time
from importlib.metadata import version

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deepinfer.entrypoints.server.errors import APIError
from deepinfer.entrypoints.server.http import read_json
from deepinfer.entrypoints.server.protocols import CHAT, convert
from deepinfer.entrypoints.server.state import ServerState

router = APIRouter()


@router.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@router.get("/ready")
async def ready(request: Request) -> Response:
    """200 while the engine loop advances (it ticks while idle too); 503 once it died or stalled."""
    state: ServerState = request.app.state.server
    snap = state.engine.snapshot
    stalled = time.monotonic() - snap.heartbeat
    body = {"model": state.model_name, "running": snap.running, "waiting": snap.waiting, "steps": snap.steps,
            "failed_steps": snap.failed_steps, "seconds_since_last_tick": round(stalled, 3)}
    reason = None
    if state.engine.dead is not None:
        reason = f"engine loop died: {state.engine.dead}"
    elif stalled > state.ready_stall_s:
        reason = f"engine loop stalled for {stalled:.0f} s"
    if reason is not None:
        return JSONResponse({**body, "ready": False, "reason": reason}, 503)
    return JSONResponse({**body, "ready": True})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.server
    return Response(state.metrics.render(state.engine.snapshot, state.engine.num_in_flight),
                    media_type=CONTENT_TYPE_LATEST)


@router.get("/version")
async def get_version() -> Response:
    return JSONResponse({"version": version("deepinfer-core")})


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    """`{"prompt": text}` (BOS added unless `add_special_tokens` is false) or chat `{"messages": [...]}`."""
    state: ServerState = request.app.state.server
    body = await read_json(request, state.max_body_bytes)
    if "messages" in body:
        body.setdefault("model", state.model_name)
        state.check_model(body["model"])
        tokens = list(state.encoding.encode(convert(state, CHAT, body).conversation))
    elif isinstance(body.get("prompt"), str):
        tokens = state.text_tokenizer.encode(body["prompt"])
        if body.get("add_special_tokens") is False and state.text_tokenizer.bos_id is not None:
            tokens = tokens[1:]
    else:
        raise APIError(400, "tokenize needs a string 'prompt' or a 'messages' list", param="prompt")
    return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": state.max_model_len})


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await read_json(request, state.max_body_bytes)
    tokens = body.get("tokens")
    vocab = state.engine.engine.vocab_size
    if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < vocab for t in tokens):
        raise APIError(400, f"'tokens' must be a list of token ids in [0, {vocab})", param="tokens")
    return JSONResponse({"prompt": state.text_tokenizer.decode(tokens)})
