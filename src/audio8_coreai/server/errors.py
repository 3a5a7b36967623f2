"""Every refusal of the HTTP API in one shape: OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

One handler set (:func:`install`) maps what a request can raise to that body and its status, and counts it in
``/metrics``: a schema violation (pydantic) is a 400, an :class:`ApiError` says its own status, any other
:class:`.Audio8Error` is a 400 whose message says what to change (a damaged stored voice, the server's own file, is
a 500 with the API's remedy), an unknown route or method a 404 or 405.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..errors import Audio8Error, ConfigError, DamagedVoice

ROUTES = "POST /v1/audio/speech, GET and POST /v1/voices, DELETE /v1/voices/NAME, GET /health, GET /metrics"

# Our codes for pydantic's own errors on some fields, codes a client can branch on; a schema validator gives its
# code in the error's context (see schemas.refusal); any other schema error is invalid_request.
FIELD_CODES = {
    ("response_format", "literal_error"): "unsupported_format",
    ("stream_format", "literal_error"): "unsupported_stream_format",
    ("speed", "greater_than_equal"): "invalid_speed",
    ("speed", "less_than_equal"): "invalid_speed",
    ("sample_rate", "greater_than_equal"): "invalid_sample_rate",
    ("sample_rate", "less_than_equal"): "invalid_sample_rate",
}


class ApiError(Audio8Error):
    """A request the server refuses: HTTP ``status``, the field to change (``param``) and a ``code``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def __reduce__(self):  # pickled whole: a cluster's replica raises it to the app (server/ray_app.py)
        return ApiError, (self.status, self.message, self.param, self.code, self.headers)

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def damaged(e: DamagedVoice) -> ApiError:
    """A stored voice the server cannot read, said for an HTTP client: a 500 with the API's remedy, no path."""
    return ApiError(
        500,
        f"the stored voice {e.name!r} is damaged or from a newer version on this server: DELETE "
        f"/v1/voices/{e.name} and POST it again",
        "voice",
        "voice_damaged",
    )


def api_error(e: Audio8Error) -> ApiError:
    """``e`` as the server says it: an ApiError as it is, a damaged voice a 500, any other a 400 naming the
    setting (a ConfigError's ``field``)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, DamagedVoice):
        return damaged(e)
    return ApiError(400, str(e), e.field if isinstance(e, ConfigError) else None, "invalid_request")


def schema_error(first: dict[str, Any]) -> ApiError:
    """The first error pydantic reports for a body as a 400: invalid_json with the character offset, else the
    field (``param``) and its code (a validator's own, :data:`FIELD_CODES`, or invalid_request)."""
    if first.get("type") == "json_invalid":  # loc is (body, character offset): say it in words
        at = first.get("loc", ("body", "?"))[-1]
        return ApiError(
            400,
            f"the body is not valid JSON (at character {at}): send a JSON object such as "
            '{"model": "tts-1", "input": "Hello", "voice": "alloy"}',
            None,
            "invalid_json",
        )
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    own = (first.get("ctx") or {}).get("code")  # a schema validator's message names the field itself
    if own:
        return ApiError(400, first["msg"], where, own)
    code = FIELD_CODES.get((where, first.get("type")), "invalid_request")
    return ApiError(400, f"{where or 'body'}: {first.get('msg')}", where, code)


def install(app: FastAPI, count) -> None:
    """Register the handlers on ``app``; ``count(status, code)`` is called for each refusal (the metrics)."""

    async def refuse(e: ApiError) -> JSONResponse:
        count(e.status, e.code)
        return e.response()

    @app.exception_handler(Audio8Error)
    async def audio8_error(request: Request, exc: Audio8Error) -> JSONResponse:
        return await refuse(api_error(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return await refuse(schema_error(exc.errors()[0]))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Unknown routes (404) and wrong methods (405) in the same error shape as every other refusal.
        message = {
            404: f"no such endpoint: {request.method} {request.url.path}; this server has {ROUTES}",
            405: f"{request.method} is not allowed on {request.url.path}; this server has {ROUTES}",
        }.get(exc.status_code, str(exc.detail))
        code = {404: "unknown_url", 405: "method_not_allowed"}.get(exc.status_code)
        return await refuse(ApiError(exc.status_code, message, None, code, exc.headers))
