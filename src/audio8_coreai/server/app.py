"""The FastAPI app: its shared state, the error handlers, the body limit, the request ids and a router per endpoint
group; the model side is a synthesizer (:mod:`.synth`): model instances of this process, or a cluster's."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..settings import DEFAULTS, ServerSettings
from ..tts import TTS
from . import errors
from .body_limit import SpeechBodyLimit
from .connections import Server, uvicorn_config
from .metrics import Metrics
from .requestid import RequestIds
from .routers import health, models, page, speech, voices
from .state import State
from .synth import LocalSynthesizer, Synthesizer
from .voicenames import check_voices

# What a web page's script may read of an answer (CORS hides every other header): the headers this server writes.
EXPOSED_HEADERS = (
    "x-request-id",
    "x-seed",
    "x-sample-rate",
    "x-model",
    "x-replica",
    "x-audio8-warning",
    "x-audio8-instructions",
    "x-audio8-frame-cap",
    "retry-after",
)


class _App(FastAPI):
    """FastAPI with :class:`.requestid.RequestIds` outside all of its middleware: starlette's last-resort 500,
    sent by its outermost middleware, carries the request's id too (``answer_ids``: see :func:`create_app`); and
    every GET answering HEAD (uptime monitors ask it): routed as the GET, whose body the server (uvicorn, which
    still sees the HEAD) leaves unsent."""

    answer_ids = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        return RequestIds(super().build_middleware_stack(), self.answer_ids)


class _Cors(CORSMiddleware):
    """starlette's CORS, its refusal of a preflight (plain text: "Disallowed CORS origin") in the API's JSON
    error (``cors_refused``), saying what allows it."""

    def preflight_response(self, request_headers: Headers) -> Response:
        answer = super().preflight_response(request_headers)
        if answer.status_code != 400:
            return answer
        why = bytes(answer.body).decode().rstrip(".")
        return errors.ApiError(
            400,
            f"CORS preflight refused ({why}): a page may call this server from the origins its --cors-origin "
            f"names (AUDIO8_SERVER__CORS_ORIGINS), with {', '.join(sorted(self.allow_methods))}",
            None,
            "cors_refused",
        ).response()


def create_app(
    instances: Sequence[TTS] | Synthesizer, settings: ServerSettings | None = None, proxy_ids: bool = False
) -> FastAPI:
    """The FastAPI app serving ``instances`` (model instances of one checkpoint, one per worker) or a
    :class:`.synth.Synthesizer` (a cluster's, :mod:`.ray_app`), under ``settings`` (None: ``DEFAULTS.server``, the
    AUDIO8_SERVER__* environment's); raises ValueError without an instance, VoiceError
    for a ``voice_map`` target or ``default_voice`` that is no usable stored voice (``voicenames.check_voices``).
    Text outside the model's languages is told to each client in an ``X-Audio8-Warning`` header (the plan's
    warning, :class:`..plan.Plan`), not as the keyword API's UnsupportedLanguageWarning; the process's warning
    filters are left as they are. Every answer has an ``x-request-id`` (:mod:`.requestid`); ``proxy_ids``: a proxy
    in front writes it (Ray Serve's), the app only reads it. ``settings.cors_origins``: the web pages' origins
    whose scripts may call it (CORS preflights answered, :data:`EXPOSED_HEADERS` readable); none: same origin only."""
    settings = settings or DEFAULTS.server
    if isinstance(instances, Synthesizer):
        synth, metrics = instances, instances.metrics
    else:
        metrics = Metrics()
        synth = LocalSynthesizer(instances, settings, metrics)
    check_voices(synth.voices, settings.voice_map, settings.default_voice, synth.fingerprint)
    server = State(settings, synth, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server.synth.close()

    # redirect_slashes off: a path with a slash too many gets the JSON 404 that says so, not a bodyless 307
    app = _App(title="audio8-coreai", version="0.1.0", lifespan=lifespan, redirect_slashes=False)
    app.answer_ids = not proxy_ids
    app.state.server = server
    routers = (speech.router, voices.router, health.router, models.router, page.router)  # page: GET /, the web page
    errors.install(app, server.metrics.count, [route for router in routers for route in router.routes])
    app.add_middleware(SpeechBodyLimit, max_input_chars=settings.max_input_chars, metrics=server.metrics)
    if settings.cors_origins:  # outside the body limit: its 413 reaches the page's script too
        app.add_middleware(
            _Cors,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "HEAD", "POST", "DELETE"],
            allow_headers=["*"],
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )
    for router in routers:
        app.include_router(router)
    return app


@contextlib.contextmanager
def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0, log_level: str = "warning"
):
    """Run ``app`` with uvicorn on a thread of this process (tests, benchmarks, embedding), logging from
    ``log_level`` up (``info``: uvicorn's access lines too); yields its base URL ``http://HOST:PORT`` once it
    accepts connections and stops it on exit. ``port`` 0: a free port. Raises RuntimeError when it does not start
    within ``start_timeout_s`` seconds."""
    import socket

    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    server = Server(uvicorn_config(app, app.state.server.settings, host, port, log_level=log_level))
    thread = threading.Thread(target=server.run, name="audio8-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
