"""The size limit of a speech request's body, enforced before the body is parsed."""

from __future__ import annotations

from ..settings import DEFAULTS
from .errors import ApiError
from .metrics import Metrics


class SpeechBodyLimit:
    """ASGI middleware: a speech request's body over DEFAULTS.server.max_speech_body_bytes is a 413 before it is parsed
    (by its content-length; a chunked body is read here up to the limit). Plain ASGI, not ``@app.middleware``: that
    wrapper hides a client's disconnect from the handler, which watches for it (see :mod:`.routers.speech`)."""

    def __init__(self, app, max_input_chars: int, metrics: Metrics):
        self.app, self.max_input_chars, self.metrics = app, max_input_chars, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/audio/speech":
            size = dict(scope["headers"]).get(b"content-length", b"")
            if size.isdigit():
                if int(size) > DEFAULTS.server.max_speech_body_bytes:
                    await self._refuse(f"{int(size)} bytes", scope, receive, send)
                    return
            else:  # chunked: read it here, up to the limit, and hand it on whole
                body, more = b"", True
                while more:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client left
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > DEFAULTS.server.max_speech_body_bytes:
                        await self._refuse("over that (sent in chunks)", scope, receive, send)
                        return
                receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _refuse(self, size: str, scope, receive, send) -> None:
        self.metrics.count(413, "body_too_large")
        refusal = ApiError(
            413,
            f"a speech request's body takes at most {DEFAULTS.server.max_speech_body_bytes} bytes; this one is "
            f"{size}: send the text (at most {self.max_input_chars} characters) and the settings only",
            None,
            "body_too_large",
        )
        await refusal.response()(scope, receive, send)


def _replay(body: bytes, receive):
    """An ASGI ``receive`` that gives ``body`` as the whole request first, then what ``receive`` gives (a
    disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
