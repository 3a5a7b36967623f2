"""Every HTTP answer's ``x-request-id``, and the same id in the server's log lines for that request.

The id is the client's own ``x-request-id`` when it sent a sane one (1 to :data:`MAX_LENGTH` printable ASCII
characters), else a fresh one: OpenAI's clients read it (the SDK's ``request_id``; LiveKit warns without one).
While a request is handled the id is in :data:`REQUEST_ID`, which the model's worker threads see too (their jobs
run in the request's context, :mod:`.workers`), and :class:`RequestIdFilter` puts it in each log record that the
server's log handlers write (:func:`.connections.log_config`).
"""

from __future__ import annotations

import logging
import uuid
from contextvars import ContextVar

MAX_LENGTH = 128  # characters of a client's x-request-id kept as the request's id
REQUEST_ID: ContextVar[str | None] = ContextVar("audio8_request_id", default=None)


def request_id(sent: bytes | None) -> str:
    """The id of a request whose ``x-request-id`` header is ``sent`` (None: none sent): ``sent`` itself when it is
    1 to MAX_LENGTH printable ASCII characters, else a fresh ``req_`` and 32 hex digits."""
    text = (sent or b"").decode("latin-1")
    if 0 < len(text) <= MAX_LENGTH and text.isascii() and text.isprintable():
        return text
    return f"req_{uuid.uuid4().hex}"


def proxied_id(sent: bytes | None) -> str:
    """The id of a request to which a proxy in front gave ``sent`` (it answers the client with it as it is), as
    the logs show it: a character that is no printable ASCII (or a backslash) as ``\\xNN``, past MAX_LENGTH
    characters cut with ``...``; a fresh id (:func:`request_id`) when there is none."""
    if not sent:
        return request_id(None)
    text = "".join(
        c if c.isprintable() and c.isascii() and c != "\\" else f"\\x{ord(c):02x}" for c in sent.decode("latin-1")
    )
    return text if len(text) <= MAX_LENGTH else text[:MAX_LENGTH] + "..."


class RequestIds:
    """ASGI middleware giving every HTTP answer an ``x-request-id`` (:func:`request_id`) and setting
    :data:`REQUEST_ID` for the request. Outermost (:func:`.app.create_app`), so starlette's last-resort 500 and
    the body limit's 413 carry it too. The id is set in the request's own task (servers run each request in a
    task of its own) and left there, so the server's own lines after the app returns carry it as well. ``answer``
    False: a proxy in front gives the request its id and puts it in the answer itself (Ray Serve's: the client's
    own whatever its form, else a UUID), so the id is only read here, for the logs (:func:`proxied_id`; a second
    header would repeat it)."""

    def __init__(self, app, answer: bool = True):
        self.app, self.answer = app, answer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"x-request-id")
        rid = request_id(sent) if self.answer else proxied_id(sent)
        REQUEST_ID.set(rid)
        if not self.answer:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", rid.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` to ``"[ID] "`` for a record logged while a request is handled (spaces, brackets,
    quotes and backslashes of the id escaped), else ``""``, for formats that write ``%(request_id)s`` (a handler's
    filter: every record that handler writes has it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = REQUEST_ID.get()
        record.request_id = f"[{rid.translate(_IN_BRACKETS)}] " if rid else ""
        return True


# A client's id as its log lines show it: no space, bracket, quote or backslash of its own, which could make a line
# read as another request's ("abc] 10.0.0.1:1 - \"GET /admin\""); each written \xNN.
_IN_BRACKETS = {ord(c): f"\\x{ord(c):02x}" for c in ' []"\\'}
