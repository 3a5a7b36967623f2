"""The HTTP API (``audio8 serve``): OpenAI-compatible speech, voices, health and metrics (FastAPI).

Endpoints:

* ``POST /v1/audio/speech`` (JSON), as OpenAI's: ``model`` (any name; echoed in the ``X-Model`` header),
  ``input`` (1 to ``max_input_chars`` characters, 4096 by default as OpenAI's), ``voice`` (a stored voice; absent,
  or one of OpenAI's names such as ``alloy`` that is not a stored voice: the model's own voice),
  ``response_format`` wav | pcm | flac | mp3 | opus (default mp3 as OpenAI's; wav and pcm are 16-bit
  little-endian at 44.1 kHz, the model's rate, not OpenAI's 24 kHz: the ``X-Sample-Rate`` header says it; opus
  is Ogg Opus at 48 kHz), ``speed`` (only 1.0: there is no time stretch, so any other value is a 400 rather
  than ignored), ``stream_format`` (only ``audio``). Our extras: ``stream`` (true: send the audio as it is made,
  chunked, every ``chunk_frames`` frames; wav, pcm, mp3 and opus), ``seed`` (the same request and seed give the
  same bytes; the seed used is in ``X-Seed``), ``temperature``, ``top_p``, ``top_k`` and ``max_frames`` (a
  frame cap per piece, at most the server's). Long input is split into pieces (``TTS.stream``).
  With the OpenAI SDK: ``client.audio.speech.create(model=..., voice=..., input=..., extra_body={"seed": 1})``.
* ``GET /v1/voices``, ``POST /v1/voices`` (multipart: ``name``, ``transcript``, ``audio`` file of at most
  ``max_upload_bytes``; ``replace=true`` overwrites), ``DELETE /v1/voices/{name}``.
* ``GET /health``: model, backend and the device in use, workers, queue. ``GET /metrics``: Prometheus text
  (requests by status, frames, audio and compute seconds, RTF, time to first audio, queue depth).

Errors are JSON ``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape) with 400 (bad
request), 404 (no such voice), 413 (upload too large), 503 (queue full, with ``Retry-After``) or 500.

Concurrency: a model instance is not thread-safe (the KV state is its backend's), so the server holds
``workers`` instances, each used by one request at a time on its own thread; requests wait in a queue of at
most ``max_queue`` (then 503). Requests share nothing but the voice store: each builds its own prompt, noise
and codec state, and the backend's prefill clears the KV state. A streaming client that disconnects stops its
generation at the next frame and frees its worker.
With ``audio8 serve --batch N`` the workers are N rows of one model instance (:mod:`.serving`): the same
isolation, with their frames computed in shared batched calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt
from starlette.exceptions import HTTPException

from .audio import MEDIA_TYPES, AudioError, SpeechEncoder, check_speech_format, encode_speech
from .config import ConfigError
from .engine import EngineError
from .prompt import PromptError
from .settings import DEFAULTS
from .streaming import SpeechStream
from .tts import TTS
from .voices import DamagedVoice, VoiceError, check_name

# OpenAI's voice names: a client written for OpenAI sends one of these; without a stored voice of that name it
# gets the model's own voice rather than an error.
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx",
                           "sage", "shimmer", "verse"})
MAX_INPUT_CHARS = DEFAULTS.max_input_chars  # OpenAI's limit for input
MAX_SPEECH_BODY_BYTES = DEFAULTS.max_speech_body_bytes  # JSON of the longest input, escaped, with room to spare
MAX_UPLOAD_BYTES = DEFAULTS.max_upload_bytes  # a 30-s clip is 5.3 MB as 16-bit stereo wav, 10.6 MB as float


@dataclass
class ServerSettings:
    """What ``audio8 serve`` can set. ``max_frames``: the cap per piece (None: the model's default budget);
    a request may ask for less, never more. ``chunk_frames``: frames per streamed chunk; ``first_chunk_frames``:
    frames in a stream's first chunk (None: the default of :class:`.streaming.SpeechStream`)."""

    workers: int = DEFAULTS.workers
    max_queue: int = DEFAULTS.max_queue
    max_input_chars: int = MAX_INPUT_CHARS
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_frames: int | None = None
    chunk_frames: int = DEFAULTS.chunk_frames
    first_chunk_frames: int | None = None


class ApiError(Exception):
    """A request the server refuses: HTTP ``status`` and an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# The project's user-facing errors: the message says what to change, so they become 400s.
USER_ERRORS = (AudioError, ConfigError, EngineError, PromptError, VoiceError)


class SpeechRequest(BaseModel):
    """The body of ``POST /v1/audio/speech``; see the module docstring. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = "audio8-tts"
    input: str
    voice: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    instructions: str | None = None
    stream: StrictBool = False  # JSON true/false only: "yes" or "false" as strings are mistakes, not choices
    # JSON integers only: true, 1.5 or "7" are mistakes, not seeds or counts
    seed: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    max_frames: StrictInt | None = None


class _SpeechBodyLimit:
    """ASGI middleware: a speech request's body over MAX_SPEECH_BODY_BYTES is a 413 before it is parsed (by its
    content-length; a chunked body is read here up to the limit). Plain ASGI, not ``@app.middleware``: that wrapper hides a client's disconnect from the
    handler, which watches for it (see :func:`_next_or_gone`)."""

    def __init__(self, app, max_input_chars: int, metrics: "Metrics"):
        self.app, self.max_input_chars, self.metrics = app, max_input_chars, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/audio/speech":
            size = dict(scope["headers"]).get(b"content-length", b"")
            if size.isdigit():
                if int(size) > MAX_SPEECH_BODY_BYTES:
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
                    if len(body) > MAX_SPEECH_BODY_BYTES:
                        await self._refuse(f"over {MAX_SPEECH_BODY_BYTES} bytes", scope, receive, send)
                        return
                receive = _replay(body, receive)
        await self.app(scope, receive, send)

    async def _refuse(self, size: str, scope, receive, send) -> None:
        self.metrics.count(413)
        refusal = ApiError(413, f"the body is {size}, over {MAX_SPEECH_BODY_BYTES} for a speech request: send the "
                                f"text (at most {self.max_input_chars} characters) and the settings only", None,
                           "body_too_large")
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


def _damaged(e: DamagedVoice) -> ApiError:
    """A stored voice the server cannot read, said for an HTTP client: a 500 with the API's remedy, no path."""
    return ApiError(500, f"the stored voice {e.name!r} is damaged or from a newer version on this server: DELETE "
                         f"/v1/voices/{e.name} and POST it again", "voice", "voice_damaged")


class _Cancelled(Exception):
    """Raised in a worker's frame loop when the client of a streaming request has gone."""


_GONE = object()
DISCONNECT_POLL_S = DEFAULTS.disconnect_poll_s  # how often a whole-file request checks that its client is still there


async def _next_or_gone(items: asyncio.Queue, request: Request) -> Any:
    """The next item of a job's queue, or ``_GONE`` once the client has disconnected: a whole-file response sends
    nothing until the end, so nothing else notices a client that gave up (a streamed one notices at its next
    chunk). One get task, kept across polls, so no item is lost to a cancelled get."""
    getter = asyncio.ensure_future(items.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
            if done:
                return getter.result()
            if await request.is_disconnected():
                return _GONE
    finally:
        getter.cancel()


class _End:
    """The last item of a job's queue: the stream that ran (its statistics) or the error that stopped it."""

    def __init__(self, stream: SpeechStream | None = None, error: BaseException | None = None):
        self.stream, self.error = stream, error


class Metrics:
    """Counters for ``/metrics``, updated from worker threads (under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.frames = 0
        self.audio_s = 0.0
        self.compute_s = 0.0
        self.ttfa_sum = 0.0
        self.ttfa_count = 0

    def count(self, status: int) -> None:
        with self._lock:
            self.requests[str(status)] = self.requests.get(str(status), 0) + 1

    def frame(self) -> None:
        with self._lock:
            self.frames += 1

    def finished(self, stream: SpeechStream) -> None:
        with self._lock:
            self.audio_s += stream.duration_s
            self.compute_s += stream.prefill_s + stream.frames_s + stream.codec_s
            if stream.first_audio_s is not None:
                self.ttfa_sum += stream.first_audio_s
                self.ttfa_count += 1

    def text(self, queued: int, running: int) -> str:
        with self._lock:
            rtf = self.compute_s / self.audio_s if self.audio_s else 0.0
            ttfa = self.ttfa_sum / self.ttfa_count if self.ttfa_count else 0.0
            rows = [("audio8_requests_total", "counter", "Finished HTTP requests by status code.",
                     [(f'{{status="{s}"}}', n) for s, n in sorted(self.requests.items())]),
                    ("audio8_frames_total", "counter", "Frames generated (46 ms of audio each).", [("", self.frames)]),
                    ("audio8_audio_seconds_total", "counter", "Seconds of speech delivered.", [("", self.audio_s)]),
                    ("audio8_compute_seconds_total", "counter", "Seconds spent in prefill, frames and codec.",
                     [("", self.compute_s)]),
                    ("audio8_rtf", "gauge", "Compute seconds per second of speech, all requests so far.",
                     [("", rtf)]),
                    ("audio8_ttfa_seconds_mean", "gauge", "Mean time to first audio (prefill included).",
                     [("", ttfa)]),
                    ("audio8_queue_depth", "gauge", "Requests waiting for a worker.", [("", queued)]),
                    ("audio8_in_flight", "gauge", "Requests running on a worker.", [("", running)])]
        lines = []
        for name, kind, help_text, samples in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{labels} {value:g}" for labels, value in samples]
        return "\n".join(lines) + "\n"


class Workers:
    """``engines`` (one model instance each) behind a bounded queue: a job runs on a worker thread with an
    engine of its own; at most ``len(engines) + max_queue`` jobs are admitted at once."""

    def __init__(self, engines: Sequence[TTS], max_queue: int):
        self.engines = list(engines)
        self.max_queue = max_queue
        self._free: queue.Queue[TTS] = queue.Queue()
        for e in self.engines:
            self._free.put(e)
        self._pool = ThreadPoolExecutor(len(self.engines), thread_name_prefix="audio8-worker")
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self._job_s = 1.0  # running mean of job seconds, for Retry-After

    @property
    def queued(self) -> int:
        return self.admitted - self.running

    def admit(self) -> None:
        """Take a place, or raise ApiError 503 with Retry-After (the expected wait, seconds) when full."""
        with self._lock:
            if self.admitted >= len(self.engines) + self.max_queue:
                wait = math.ceil(self._job_s * (1 + self.queued / len(self.engines)))
                raise ApiError(503, f"the server is busy ({self.running} requests running, {self.queued} "
                               "waiting); retry later", code="queue_full", headers={"Retry-After": str(wait)})
            self.admitted += 1

    def submit(self, job: Callable[[TTS], Any]) -> "asyncio.Future[Any]":
        """Run ``job(engine)`` on a worker (after :meth:`admit`); the place is freed when it returns."""

        def run() -> Any:
            engine = self._free.get()
            t0 = time.perf_counter()
            with self._lock:
                self.running += 1
            try:
                return job(engine)
            finally:
                self._free.put(engine)
                with self._lock:
                    self.running -= 1
                    self.admitted -= 1
                    self._job_s = 0.8 * self._job_s + 0.2 * (time.perf_counter() - t0)

        return asyncio.wrap_future(self._pool.submit(run))

    def shutdown(self) -> None:
        """Drop waiting jobs; running ones end with their requests (a closed stream stops at its next frame)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _speech_kwargs(req: SpeechRequest, settings: ServerSettings, engine: TTS) -> dict[str, Any]:
    """Check a speech request against the limits; the keyword arguments of ``TTS.stream`` for it."""
    if not req.input.strip():
        raise ApiError(400, "input is empty: give the text to speak", "input", "empty_input")
    if len(req.input) > settings.max_input_chars:
        raise ApiError(400, f"input is {len(req.input)} characters; this server takes at most "
                       f"{settings.max_input_chars} per request: split the text", "input", "input_too_long")
    try:
        check_speech_format(req.response_format, req.stream)
    except AudioError as e:
        raise ApiError(400, str(e), "response_format", "unsupported_format") from None
    if not 0.25 <= req.speed <= 4.0:
        raise ApiError(400, f"speed must be 0.25 to 4.0, got {req.speed}", "speed", "invalid_speed")
    if req.speed != 1.0:
        raise ApiError(400, f"speed {req.speed} is not supported: this server makes speech at the model's own "
                       "pace only (no time stretch); send speed 1.0 or leave it out", "speed", "unsupported_speed")
    if req.stream_format != "audio":
        raise ApiError(400, f"stream_format {req.stream_format!r} is not supported: use 'audio' (raw bytes, "
                       "with stream: true for chunked delivery)", "stream_format", "unsupported_stream_format")
    if req.instructions:
        raise ApiError(400, "instructions are not supported: this model takes no voice directions",
                       "instructions", "unsupported_instructions")
    if req.max_frames is not None and settings.max_frames is not None and req.max_frames > settings.max_frames:
        raise ApiError(400, f"max_frames {req.max_frames} is over this server's cap of {settings.max_frames}",
                       "max_frames", "max_frames_too_large")
    voice = None
    if req.voice is not None:
        try:
            name = check_name(req.voice)
        except VoiceError as e:
            raise ApiError(400, str(e), "voice", "invalid_voice") from None
        if engine.voices.path(name).is_file():
            voice = name
        elif name.lower() not in OPENAI_VOICES:
            raise ApiError(400, f"no voice named {name!r}: GET /v1/voices lists the stored voices (OpenAI's names, "
                           "such as alloy, speak in the model's own voice)", "voice", "voice_not_found")
    return {"seed": req.seed, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
            "max_frames": req.max_frames if req.max_frames is not None else settings.max_frames,
            "voice": voice, "chunk_frames": settings.chunk_frames, "first_chunk_frames": settings.first_chunk_frames}


def create_app(engines: Sequence[TTS], settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app serving ``engines`` (model instances of one checkpoint, one per worker)."""
    settings = settings or ServerSettings()
    if not engines:
        raise ValueError("the server needs at least one model instance")
    workers = Workers(engines, settings.max_queue)
    metrics = Metrics()
    first = engines[0]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        workers.shutdown()

    app = FastAPI(title="audio8-coreai", version="0.1.0", lifespan=lifespan)
    app.state.workers, app.state.metrics, app.state.settings = workers, metrics, settings

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        metrics.count(exc.status)
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Unknown routes (404) and wrong methods (405) in the same error shape as every other refusal.
        routes = "POST /v1/audio/speech, GET and POST /v1/voices, DELETE /v1/voices/NAME, GET /health, GET /metrics"
        message = {404: f"no such endpoint: {request.method} {request.url.path}; this server has {routes}",
                   405: f"{request.method} is not allowed on {request.url.path}; this server has {routes}"}.get(
            exc.status_code, str(exc.detail))
        code = {404: "unknown_url", 405: "method_not_allowed"}.get(exc.status_code)
        return await api_error(request, ApiError(exc.status_code, message, None, code, exc.headers))

    app.add_middleware(_SpeechBodyLimit, max_input_chars=settings.max_input_chars, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first_error = exc.errors()[0]
        if first_error.get("type") == "json_invalid":  # loc is (body, character offset): say it in words
            at = first_error.get("loc", ("body", "?"))[-1]
            return await api_error(request, ApiError(
                400, f"the body is not valid JSON (at character {at}): send a JSON object such as "
                     '{"model": "tts-1", "input": "Hello", "voice": "alloy"}', None, "invalid_json"))
        where = ".".join(str(p) for p in first_error.get("loc", ())[1:]) or None
        return await api_error(request, ApiError(400, f"{where or 'body'}: {first_error.get('msg')}", where,
                                                 "invalid_request"))

    @app.get("/health")
    def health() -> dict[str, Any]:
        backend = first.backend
        device = getattr(backend, "device", None)
        return {"status": "ok", "model": str(first.checkpoint.path), "backend": backend.description,
                "device": str(device) if device is not None else backend.description,
                "sample_rate": first.sample_rate, "workers": len(engines), "running": workers.running,
                "queued": workers.queued, "max_queue": settings.max_queue}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics_text() -> str:
        return metrics.text(workers.queued, workers.running)

    @app.post("/v1/audio/speech")
    async def speech(req: SpeechRequest, request: Request) -> Response:
        kwargs = _speech_kwargs(req, settings, first)
        try:
            # Everything (text, split, voice, sampling, frame budget) is checked before a worker is taken; the
            # worker builds its own stream with the seed drawn here.
            kwargs["seed"] = first.stream(req.input, **kwargs).seed
        except DamagedVoice as e:  # the server's file, not the request: no path, the HTTP remedy
            raise _damaged(e) from None
        except USER_ERRORS as e:
            raise ApiError(400, str(e), getattr(e, "field", None), "invalid_request") from None
        workers.admit()
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()

        def on_frame(step: int) -> None:
            if cancel.is_set():
                raise _Cancelled
            metrics.frame()

        def job(engine: TTS) -> None:
            put = loop.call_soon_threadsafe
            try:
                if cancel.is_set():
                    return
                stream = engine.stream(req.input, on_frame=on_frame, **kwargs)
                for chunk in stream:
                    put(items.put_nowait, chunk)
                metrics.finished(stream)
                put(items.put_nowait, _End(stream))
            except _Cancelled:
                metrics.count(499)  # nginx's 'client closed request'
            except BaseException as e:  # delivered to the request, which answers 500 or ends the stream
                put(items.put_nowait, _End(error=e))

        workers.submit(job)
        headers = {"X-Model": req.model, "X-Seed": str(kwargs["seed"]), "X-Sample-Rate": str(first.sample_rate)}
        media = MEDIA_TYPES[req.response_format]
        if req.stream:
            return StreamingResponse(_stream_body(items, cancel, req.response_format, first.sample_rate, metrics),
                                     media_type=media, headers=headers)
        try:
            chunks = []
            while not isinstance(item := await _next_or_gone(items, request), _End):
                if item is _GONE:  # the client left: the worker stops at its next frame (counted 499 there)
                    return Response(status_code=499)
                chunks.append(item)
        finally:
            cancel.set()  # also when this handler is cancelled: the worker stops at its next frame
        if item.error is not None:
            raise ApiError(500, f"synthesis failed: {type(item.error).__name__}: {item.error}", code="server_error")
        if item.stream.frames == 0:  # not an empty file: a client would play silence and not know why
            raise ApiError(422, "the model ended the utterance at once (eos on the first frame): no audio to send; "
                           "send the request again without a seed, or with another one", "seed", "no_audio")
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        metrics.count(200)
        # Off the event loop: a long mp3 or opus takes a noticeable time to encode.
        data = await asyncio.to_thread(encode_speech, audio, first.sample_rate, req.response_format)
        return Response(data, media_type=media, headers=headers)

    @app.get("/v1/voices")
    def list_voices() -> dict[str, Any]:
        voices = []
        for name in first.voices.names():
            try:
                v = first.voices.load(name)
                voices.append({"name": v.name, "transcript": v.transcript, "duration_s": v.duration_s,
                               "frames": v.frames, "created": v.created})
            except DamagedVoice as e:
                voices.append({"name": name, "error": _damaged(e).message})
            except VoiceError as e:
                voices.append({"name": name, "error": str(e)})
        return {"object": "list", "data": voices}

    @app.post("/v1/voices", status_code=201)
    async def add_voice(request: Request) -> dict[str, Any]:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > settings.max_upload_bytes:
            raise ApiError(413, f"upload is {int(size)} bytes, over this server's {settings.max_upload_bytes}: "
                           "send a clip of 0.5 to 30 s", "audio", "upload_too_large")
        form = await request.form(max_part_size=settings.max_upload_bytes)
        name, transcript, upload = form.get("name"), form.get("transcript"), form.get("audio")
        replace = str(form.get("replace", "false")).lower() in ("1", "true", "yes")
        if not isinstance(name, str) or not isinstance(transcript, str) or upload is None or isinstance(upload, str):
            raise ApiError(400, "POST /v1/voices takes multipart fields name, transcript and an audio file",
                           None, "invalid_request")
        data = await upload.read(settings.max_upload_bytes + 1)
        if len(data) > settings.max_upload_bytes:
            raise ApiError(413, f"upload is over this server's {settings.max_upload_bytes} bytes: send a clip of "
                           "0.5 to 30 s", "audio", "upload_too_large")
        try:
            name = check_name(name)
            first.voices.check_new(name, replace)
        except VoiceError as e:
            raise ApiError(400, str(e), "name", "invalid_voice") from None
        workers.admit()
        shown = Path(upload.filename or "clip.wav").name[-100:] or "clip.wav"  # the client's name, in messages

        def job(engine: TTS):
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / ("clip" + Path(shown).suffix[:16])
                path.write_bytes(data)
                try:
                    return engine.register_voice(name, path, transcript, replace=replace)
                except USER_ERRORS as e:  # say the uploaded file's name, not the server's temporary path
                    raise type(e)(str(e).replace(str(path), shown).replace(path.name, shown)) from None

        try:
            voice = await workers.submit(job)
        except USER_ERRORS as e:
            raise ApiError(400, str(e), None, "invalid_voice") from None
        warnings = [w.replace("clip" + Path(shown).suffix[:16], shown) for w in voice.warnings]
        metrics.count(201)
        return {"name": voice.name, "transcript": voice.transcript, "duration_s": voice.duration_s,
                "frames": voice.frames, "created": voice.created, "warnings": warnings}

    @app.delete("/v1/voices/{name}")
    def delete_voice(name: str) -> dict[str, Any]:
        try:
            name = check_name(name)
        except VoiceError as e:
            raise ApiError(400, str(e), "name", "invalid_voice") from None
        if not first.voices.path(name).is_file():
            raise ApiError(404, f"no voice named {name!r}", "name", "voice_not_found")
        try:
            first.voices.remove(name)
        except VoiceError as e:
            raise ApiError(400, str(e), "name", "invalid_voice") from None
        metrics.count(200)
        return {"name": name, "deleted": True}

    return app


async def _stream_body(items: asyncio.Queue, cancel: threading.Event, fmt: str, sample_rate: int,
                       metrics: Metrics) -> AsyncIterator[bytes]:
    """The body of a streaming response: encoded chunks as the worker makes them. When the client goes, the
    server cancels this generator; ``finally`` then tells the worker to stop at its next frame."""
    encoder = SpeechEncoder(fmt, sample_rate)
    try:
        while not isinstance(item := await items.get(), _End):
            if data := encoder.write(item):
                yield data
        if item.error is not None:  # the status line is sent: end the body short, the client sees it cut
            metrics.count(500)
            return
        yield encoder.close()
        metrics.count(200)
    finally:
        cancel.set()


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
    """Run ``app`` with uvicorn on a thread of this process (tests, benchmarks, embedding); yields its base URL
    ``http://HOST:PORT`` once it accepts connections and stops it on exit. ``port`` 0: a free port.
    Raises RuntimeError when it does not start within ``start_timeout_s`` seconds."""
    import socket

    import uvicorn

    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
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
