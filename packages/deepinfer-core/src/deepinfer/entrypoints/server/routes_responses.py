"""/v1/responses, GET /v1/responses/{id} and POST /v1/responses/{id}/cancel (bounded in-memory store)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deepinfer.entrypoints.server.errors import APIError
from deepinfer.entrypoints.server.protocols import RESPONSES, Prepared, serve
from deepinfer.entrypoints.server.state import ServerState
from deepinfer.entrypoints.server.store import StoredResponse

router = APIRouter()


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.server

    def on_start(prep: Prepared, body: dict[str, Any]) -> None:
        if body.get("store", True) is not False:
            rid = prep.gen.request_id
            placeholder = {"id": rid, "object": "response", "created_at": prep.created, "model": prep.model,
                           "status": "in_progress", "output": []}
            state.responses.put(rid, StoredResponse(placeholder, cancel=lambda: state.engine.abort(rid)))

    def on_final(prep: Prepared, final: dict[str, Any]) -> None:
        item = state.responses.get(prep.gen.request_id)
        if item is not None:
            if item.cancelled:
                final["status"] = "cancelled"
            item.body, item.cancel = final, None

    return await serve(request, RESPONSES, on_start, on_final)


def _stored(state: ServerState, response_id: str) -> StoredResponse:
    item = state.responses.get(response_id)
    if item is None:
        raise APIError(404, f"response {response_id!r} not found (never stored, or evicted from the "
                       f"store of {state.responses.capacity})", param="response_id")
    return item


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    return JSONResponse(_stored(request.app.state.server, response_id).body)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Response:
    item = _stored(request.app.state.server, response_id)
    if item.cancel is None:
        raise APIError(400, f"response {response_id!r} has already finished with status "
                       f"{item.body.get('status')!r}; only in-progress responses can be cancelled")
    item.cancelled = True
    item.cancel()
    item.body = dict(item.body, status="cancelled")
    return JSONResponse(item.body)
