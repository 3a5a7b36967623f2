"""Every refusal of the HTTP API in one shape: OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

One handler set (:func:`install`) maps what a request can raise to that body and its status, and counts it in
``/metrics``: a schema violation (pydantic) is a 400, an :class:`ApiError` says its own status, any other
:class:`.Audio8Error` is a 400 whose message says what to change (a damaged stored voice, the server's own file, is
a 500 with the API's remedy; a voice name taken a 409; a voice store that cannot be written a 500, or 507 when its
disk is full), a body the framework cannot parse (not UTF-8, JSON nested too deep, a number too long, a multipart
form it cannot read: :func:`unparsed`, :func:`form_error`) a 400 with its code, an unknown route or method a 404 or
405 (its Allow header every method of the path), and anything else a 500 that says nothing of the server (logged
there with its traceback). No answer carries a server path.
"""

from __future__ import annotations

import errno
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Match, Route

from ..errors import AssetError, Audio8Error, DamagedVoice, VoiceExists, VoiceStorageError
from .forms import FieldNotText
from .schemas import ErrorBody

log = logging.getLogger("audio8_coreai.server")
# What a client is told of an AssetError (HTTP and Wyoming): the operator's to fix; the path stays in the log.
ASSET_FAULT = "the server's model assets cannot do this (a part is missing or stale; logged there): tell its operator"

# A speech request's body, as the remedy of a body that cannot be read.
EXAMPLE = '{"model": "tts-1", "input": "Hello", "voice": "alloy"}'
# A voice upload as curl sends it, as the remedy of a form that cannot be read.
UPLOAD = "curl -F name=ana -F transcript='The words of the clip.' -F audio=@clip.wav"

# Our codes for pydantic's own errors on some fields, codes a client can branch on; a schema validator gives its
# code in the error's context (see schemas.refusal); any other schema error is invalid_request.
FIELD_CODES = {
    ("response_format", "literal_error"): "unsupported_format",
    ("stream_format", "literal_error"): "unsupported_stream_format",
    ("speed", "greater_than_equal"): "invalid_speed",
    ("speed", "less_than_equal"): "invalid_speed",
    ("speed", "finite_number"): "invalid_speed",
    ("sample_rate", "greater_than_equal"): "invalid_sample_rate",
    ("sample_rate", "less_than_equal"): "invalid_sample_rate",
}

# What each refusal status means, for the OpenAPI schema (:func:`documented`).
STATUSES = {
    400: "A request the server refuses: the message says what to change.",
    404: "No such voice (or model).",
    409: "A voice of that name exists (replace=true overwrites it), or the server's settings speak it (no delete).",
    413: "The body or the upload is over this server's limit.",
    422: "The model ended the utterance at once: no audio (another seed speaks).",
    500: "The server failed (its storage, a stored voice, or a bug, logged there).",
    503: "The queue is full (or, on Ray, the replica was lost, or none runs): retry after Retry-After seconds.",
    507: "The server's disk is full.",
}


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses`` for the OpenAPI schema: the refusals ``statuses`` it answers, and 500 (any route)."""
    return {status: {"model": ErrorBody, "description": STATUSES[status]} for status in (*statuses, 500)}


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
        body = {"error": {"message": _utf8(self.message), "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _utf8(text: str) -> str:
    """``text`` with any lone surrogate (which UTF-8 cannot carry) written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def exists(e: VoiceExists) -> ApiError:
    """A voice name already taken, said for an HTTP client: 409 without the server's folder."""
    return ApiError(
        409,
        f"a voice named {e.name!r} already exists (names that differ only in case are one voice): choose "
        "another name, or replace it (replace=true in POST /v1/voices)",
        "name",
        "voice_exists",
    )


def storage(e: OSError | VoiceStorageError) -> ApiError:
    """The server's own disk failing a write (the voice store, an upload's temporary file), said without a path:
    507 when it is full, else 500."""
    full = e.full if isinstance(e, VoiceStorageError) else e.errno in (errno.ENOSPC, errno.EDQUOT)
    log.error("storage fault: %s", e)
    if full:
        return ApiError(
            507, "the server's disk is full: it cannot store this now; retry later", None, "insufficient_storage"
        )
    return ApiError(
        500,
        "the server cannot write its storage (read-only or not permitted): tell its operator",
        None,
        "storage_error",
    )


def damaged(e: DamagedVoice) -> ApiError:
    """A stored voice the server cannot read, said for an HTTP client: a 500 with the API's remedy, no path."""
    return ApiError(
        500,
        f"the stored voice {e.name!r} is damaged or from a newer version on this server: DELETE "
        f"/v1/voices/{e.name} and POST it again",
        "voice",
        "voice_damaged",
    )


def asset_fault(e: AssetError) -> ApiError:
    """The server's Core AI assets failing a request (a part missing, stale or foreign), said without a path: a
    500 for its operator, logged there with the whole message."""
    log.error("asset fault: %s", e)
    return ApiError(500, ASSET_FAULT, None, "server_error")


def shutting_down() -> ApiError:
    """The 503 of a request the server stops for (SIGTERM, Ctrl-C): refused while it waited for a place, or ended
    at the shutdown's grace (``shutdown_s``) before its answer was whole; the client may send it again."""
    return ApiError(
        503,
        "the server is shutting down: send the request again (to another instance, or here once it is back)",
        code="shutting_down",
        headers={"Retry-After": "1"},
    )


def api_error(e: Audio8Error) -> ApiError:
    """``e`` as the server says it: an ApiError as it is, a damaged voice or an asset fault a 500, any other a
    400 naming the input or setting it is about (its ``field``, as the API names it) as ``param``."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, DamagedVoice):  # a request refused for it: the whole message (its file) logged for the operator
        log.error("damaged voice: %s", e)
        return damaged(e)
    if isinstance(e, VoiceExists):
        return exists(e)
    if isinstance(e, VoiceStorageError):
        return storage(e)
    if isinstance(e, AssetError):
        return asset_fault(e)
    return ApiError(400, str(e), _PARAMS.get(e.field, e.field), "invalid_request")


_PARAMS = {"text": "input", "ref_text": "transcript"}  # the library's keywords as the API names them


def schema_error(first: dict[str, Any]) -> ApiError:
    """The first error pydantic reports for a body as a 400: invalid_json with the character offset, else the
    field (``param``) and its code (a validator's own, :data:`FIELD_CODES`, or invalid_request), with what to do
    (a missing field: send it; another: change it, the fields and their ranges being at ``GET /docs``, or
    ``/openapi.json`` offline)."""
    if first.get("type") == "json_invalid":  # loc is (body, character offset): say it in words
        at = first.get("loc", ("body", "?"))[-1]
        return ApiError(
            400,
            f"the body is not valid JSON (at character {at}): send a JSON object such as {EXAMPLE}",
            None,
            "invalid_json",
        )
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    if where is None and first.get("type") == "model_attributes_type":  # JSON null, a list, or not sent as JSON
        return ApiError(
            400,
            f"the body must be a JSON object sent with Content-Type: application/json, such as {EXAMPLE}",
            None,
            "invalid_request",
        )
    own = (first.get("ctx") or {}).get("code")  # a schema validator's message names the field itself
    if own:
        return ApiError(400, first["msg"], where, own)
    code = FIELD_CODES.get((where, first.get("type")), "invalid_request")
    if first.get("type") == "missing" and where is None:  # no body at all
        return ApiError(400, f"the body is empty: send a JSON object such as {EXAMPLE}", None, "invalid_request")
    if first.get("type") == "missing":
        return ApiError(
            400,
            f"{where} is required: send it, as in {EXAMPLE} (every field: GET /docs, or /openapi.json offline)",
            where,
            code,
        )
    remedy = "change it and send again (every field and its range: GET /docs, or /openapi.json offline)"
    return ApiError(400, f"{where or 'body'}: {first.get('msg')}: {remedy}", where, code)


def unparsed(exc: HTTPException) -> ApiError:
    """The framework's own 400 for a body it could not parse (FastAPI reading JSON, starlette a form; the parser's
    error is its cause or context) with a code and what to send instead: invalid_utf8, json_too_deep,
    number_too_long, a form's (:func:`form_error`), else invalid_request."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, UnicodeDecodeError):
        return ApiError(
            400,
            f"the body is not UTF-8 (byte {cause.start} is {cause.object[cause.start : cause.start + 1]!r}): send "
            f"the JSON encoded in UTF-8, such as {EXAMPLE}",
            None,
            "invalid_utf8",
        )
    if isinstance(cause, RecursionError):
        return ApiError(
            400,
            f"the body's JSON is nested too deep to read: a request is one flat JSON object, such as {EXAMPLE}",
            None,
            "json_too_deep",
        )
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's cap on an integer's digits
        return ApiError(
            400,
            f"the body holds a number of over {sys.get_int_max_str_digits()} digits: the whole numbers a request "
            "takes (seed, top_k, max_frames, sample_rate) have a few digits",
            None,
            "number_too_long",
        )
    if isinstance(cause, MultiPartException):
        return form_error(cause)
    return ApiError(
        400,
        f"the body cannot be read ({exc.detail}): send a JSON object such as {EXAMPLE}, or to POST /v1/voices a "
        f"multipart form ({UPLOAD})",
        None,
        "invalid_request",
    )


def form_error(e: MultiPartException) -> ApiError:
    """A multipart form (``POST /v1/voices``) that starlette cannot read, or a field of it that is not text
    (:class:`.forms.FieldNotText`), with a code and what to send instead: invalid_utf8, part_header_too_long,
    413 upload_too_large for a field over the upload limit, else invalid_multipart."""
    if isinstance(e, FieldNotText):
        fix = f"send it encoded in {e.charset} (the form's charset)"
        if e.field == "audio":  # the clip's bytes as a text field: a client that forgot the file name
            fix = "send the clip as a file (a part with a filename), not as a text field"
        return ApiError(400, f"{e.message}: {fix}", e.field, "invalid_utf8")
    if "header size" in str(e.__cause__):  # python-multipart's cap on a part's header line (4 KB)
        return ApiError(
            400,
            "a part of the form has a header line over 4 KB (a file name that long?): send the clip under a "
            "short file name",
            None,
            "part_header_too_long",
        )
    if e.message.startswith("Part exceeded"):
        return ApiError(
            413,
            f"a field of the form is over this server's upload limit ({e.message}): the transcript is the "
            "clip's words, a few sentences",
            None,
            "upload_too_large",
        )
    hint = "with the boundary in its Content-Type" if e.message.startswith("Missing boundary") else "whole"
    return ApiError(
        400,
        f"the multipart form cannot be read ({e.message}): send it {hint}, as an HTTP client makes it ({UPLOAD})",
        None,
        "invalid_multipart",
    )


def install(app: FastAPI, count, routes: Sequence[BaseRoute] = ()) -> None:
    """Register the handlers on ``app``; ``count(status, code)`` is called for each refusal (the metrics);
    ``routes`` (the app's own) give a 405's Allow header and the list of endpoints a 404 or 405 names."""
    endpoints = route_list(routes)

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
        # Unknown routes (404), wrong methods (405) and bodies the framework cannot parse (400) in the same error
        # shape as every other refusal.
        if exc.status_code == 400:
            return await refuse(unparsed(exc))
        path = request.url.path
        slash = path != "/" and path.endswith("/") and _methods(routes, {**request.scope, "path": path.rstrip("/")})
        hint = f" (without the last slash: {path.rstrip('/')})" if slash else ""
        message = {
            404: f"no such endpoint: {request.method} {path}{hint}; this server has {endpoints}",
            405: f"{request.method} is not allowed on {request.url.path}; this server has {endpoints}",
        }.get(exc.status_code, str(exc.detail))
        code = {404: "unknown_url", 405: "method_not_allowed"}.get(exc.status_code)
        headers = {**(exc.headers or {}), "Allow": _allowed(routes, request)} if exc.status_code == 405 else exc.headers
        return await refuse(ApiError(exc.status_code, message, None, code, headers))

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, exc: ClientDisconnect) -> Response:
        # The client left while sending its body (or was closed for taking too long): no one to answer.
        count(499, "client_closed")
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug: the client learns nothing of the server; the log (uvicorn's, as starlette re-raises) has it all.
        log.error("unexpected %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
        return await refuse(
            ApiError(
                500,
                "the server failed on this request (logged there); retry, or tell its operator",
                None,
                "server_error",
            )
        )


_PARAMETER = re.compile(r"{(\w+)}")  # a path parameter of a route, {name}


def route_list(routes: Sequence[BaseRoute]) -> str:
    """The endpoints of ``routes`` as a client reads them, in their order: ``METHODS PATH`` for each path
    (``GET and POST /v1/voices``; HEAD, which starlette adds to every GET, left out; a path parameter such as
    ``{name}`` as ``NAME``), the static files of the web page left out, then ``GET /docs`` (every field; its
    page's scripts come from a CDN, so offline ``GET /openapi.json``)."""
    methods: dict[str, set[str]] = {}
    for route in routes:
        if isinstance(route, Route) and not route.path.startswith("/static/"):
            methods.setdefault(route.path, set()).update((route.methods or set()) - {"HEAD"})
    named = [f"{' and '.join(sorted(m))} {_PARAMETER.sub(lambda p: p[1].upper(), path)}" for path, m in methods.items()]
    return ", ".join([*named, "GET /docs (every field; offline: GET /openapi.json)"])


def _allowed(routes: Sequence[BaseRoute], request: Request) -> str:
    """Every method ``routes`` take at ``request``'s path (starlette names only the first route's), HEAD with GET
    (:class:`.app._App` answers it)."""
    methods = _methods(routes, request.scope)
    return ", ".join(sorted(methods | ({"HEAD"} if "GET" in methods else set())))


def _methods(routes: Sequence[BaseRoute], scope: dict[str, Any]) -> set[str]:
    """The methods ``routes`` take at ``scope``'s path (none: no route there)."""
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods or set()
    return methods
