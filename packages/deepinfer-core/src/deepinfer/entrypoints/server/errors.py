"""Errors in each protocol's own shape: OpenAI `{"error": {...}}`, Anthropic `{"type": "error", ...}`."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "invalid_request_error", 500: "internal_server_error",
                503: "service_unavailable", 504: "timeout"}
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                   413: "request_too_large", 500: "api_error", 503: "overloaded_error", 504: "timeout_error"}


class APIError(Exception):
    """An HTTP error with a message that names what is wrong; `body` overrides the built one."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None, body: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.headers, self.body = headers or {}, body


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_payload(path: str, status: int, message: str, param: str | None = None) -> dict[str, Any]:
    if is_anthropic(path):
        err_type = ANTHROPIC_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": err_type, "message": message}}
    err_type = OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(path: str, err: APIError) -> Response:
    if err.body is not None and not is_anthropic(path):
        return Response(err.body, err.status, err.headers, media_type="application/json")
    message = err.message
    if err.body is not None:  # a recipe error body in OpenAI shape: keep its message
        message = json.loads(err.body).get("error", {}).get("message", message)
    return JSONResponse(error_payload(path, err.status, message, err.param), err.status, err.headers)


def recipe_error(exc: Exception) -> APIError:
    """A deepseek_recipe conversion failure: ConversionError has status and body, ValueError a message."""
    status = getattr(exc, "status_code", None)
    if status is not None:
        return APIError(int(status), str(exc), body=getattr(exc, "body", None))
    return APIError(400, str(exc))
