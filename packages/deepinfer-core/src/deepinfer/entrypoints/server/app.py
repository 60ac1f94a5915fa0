"""The FastAPI application: routes, the API-key and access-metrics middleware, protocol-shaped errors."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deepinfer.entrypoints.server import routes_admin, routes_chat, routes_completions, routes_responses
from deepinfer.entrypoints.server.errors import APIError, error_response
from deepinfer.entrypoints.server.http import ClientDisconnected
from deepinfer.entrypoints.server.state import ServerState

logger = logging.getLogger("deepinfer.server")
UNAUTHENTICATED = frozenset({"/health", "/ready"})  # probes: everything else needs the key
QUIET = frozenset({"/health", "/ready", "/metrics"})
ROUTERS = (routes_chat.router, routes_completions.router, routes_responses.router, routes_admin.router)
_PATHS = frozenset(r.path for router in ROUTERS for r in router.routes)


class ServerMiddleware:
    """Checks the API key (Bearer or x-api-key) on every route but the probes, and counts responses."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, status, start = scope["path"], 500, time.monotonic()

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.state.api_key is not None and path not in UNAUTHENTICATED and not self._authorized(scope):
                err = APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>' or "
                               "'x-api-key: <key>'")
                return await error_response(path, err)(scope, receive, counting_send)
            await self.app(scope, receive, counting_send)
        finally:
            self.state.metrics.http.labels(_route_label(path), str(status)).inc()
            generation = scope.get("state", {}).get("generation")
            level = logging.DEBUG if path in QUIET else logging.INFO  # probes and scrapes every few seconds
            logger.log(level, "%s %s %d %.3fs%s", scope["method"], path, status, time.monotonic() - start,
                       f" {generation.summary()}" if generation is not None else "")

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        key = headers.get(b"x-api-key", b"")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            key = auth[7:].strip()
        assert self.state.api_key is not None
        return hmac.compare_digest(key, self.state.api_key.encode())


def _route_label(path: str) -> str:
    """The route a path belongs to, so that ids and unknown paths do not each make a metric series."""
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    return path if path in _PATHS else "other"


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        try:
            yield
        finally:
            await state.engine.shutdown()

    app = FastAPI(title="DeepInfer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    for router in ROUTERS:
        app.include_router(router)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return error_response(request.url.path, exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(request.url.path, APIError(exc.status_code, message))

    @app.exception_handler(ClientDisconnected)
    async def disconnected(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it; it is what the access log and metrics show

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> Response:
        logger.exception("%s %s failed", request.method, request.url.path)
        return error_response(request.url.path, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))

    app.add_middleware(ServerMiddleware, state=state)
    return app


def route_list() -> list[str]:
    """"METHODS /path" of every route, for the start-up log."""
    routes = [r for router in ROUTERS for r in router.routes]
    return sorted(f"{','.join(sorted(getattr(r, 'methods', None) or []))} {r.path}" for r in routes)
