"""/v1/chat/completions, /v1/messages (+ count_tokens) and /v1/models."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deepinfer.entrypoints.server.http import read_json
from deepinfer.entrypoints.server.protocols import CHAT, MESSAGES, convert, serve
from deepinfer.entrypoints.server.state import ServerState

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await serve(request, CHAT)


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    return await serve(request, MESSAGES)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await read_json(request, state.max_body_bytes)
    state.check_model(body.get("model"))
    body.setdefault("max_tokens", 1)  # count_tokens bodies carry no max_tokens; conversion wants one
    converted = convert(state, MESSAGES, body)
    return JSONResponse({"input_tokens": len(state.encoding.encode(converted.conversation))})


@router.get("/v1/models")
async def models(request: Request) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse({"object": "list", "data": [_card(state, name) for name in state.served_model_names]})


def _card(state: ServerState, name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "deepinfer",
            "root": name, "max_model_len": state.max_model_len}


@router.get("/v1/models/{model_id}")
async def model(request: Request, model_id: str) -> Response:
    state: ServerState = request.app.state.server
    return JSONResponse(_card(state, state.check_model(model_id)))
