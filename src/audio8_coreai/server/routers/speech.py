"""``POST /v1/audio/speech``: speech for a text, whole or streamed as it is made (OpenAI's endpoint)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from ...audio import MEDIA_TYPES, SpeechEncoder, encode_speech
from ...engine.stream import SpeechStream
from ...errors import Audio8Error
from ...request import CheckedRequest, check_request
from ...settings import DEFAULTS
from ...text import language_warning
from ...tts import TTS
from ..errors import ApiError
from ..metrics import Metrics
from ..schemas import SpeechRequest
from ..state import State, state

router = APIRouter()

# OpenAI's voice names: a client written for OpenAI sends one of these; without a stored voice of that name it
# gets the model's own voice rather than an error.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"}
)
_GONE = object()
_STARTED = object()  # a job's first item when its stream is built


class _Cancelled(Exception):
    """Raised in a worker's frame loop when the client of a streaming request has gone."""


class _End:
    """The last item of a job's queue: the stream that ran (its statistics) or the error that stopped it."""

    def __init__(self, stream: SpeechStream | None = None, error: BaseException | None = None):
        self.stream, self.error = stream, error


def _check(req: SpeechRequest, server: State) -> CheckedRequest:
    """A request the schema has passed, checked against this server's limits and voices and by
    :func:`...request.check_request` (the seed drawn here); raises ApiError or the Audio8Error that says what to change.
    A stored voice is read here (a damaged one is refused before a worker is taken) and handed to the worker."""
    settings, tts = server.settings, server.tts
    if len(req.input) > settings.max_input_chars:
        raise ApiError(
            400,
            f"input is {len(req.input)} characters; this server takes at most "
            f"{settings.max_input_chars} per request: split the text",
            "input",
            "input_too_long",
        )
    if req.max_frames is not None and settings.max_frames is not None and req.max_frames > settings.max_frames:
        raise ApiError(
            400,
            f"max_frames {req.max_frames} is over this server's cap of {settings.max_frames}",
            "max_frames",
            "max_frames_too_large",
        )
    voice = None
    if req.voice is not None:
        if tts.voices.path(req.voice).is_file():
            voice = tts.voices.load(req.voice)
        elif req.voice.lower() not in OPENAI_VOICES:
            raise ApiError(
                400,
                f"no voice named {req.voice!r}: GET /v1/voices lists the stored voices (OpenAI's "
                "names, such as alloy, speak in the model's own voice)",
                "voice",
                "voice_not_found",
            )
    return check_request(
        req.input,
        voice=voice,
        seed=req.seed,
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        max_frames=req.max_frames,
        chunk_frames=settings.chunk_frames,
        first_chunk_frames=settings.first_chunk_frames,
    )


@router.post("/v1/audio/speech")
async def speech(req: SpeechRequest, request: Request, server: Annotated[State, Depends(state)]) -> Response:
    """Run the request on a worker; stream its chunks or answer the whole file. The request is checked before a
    worker is taken, the rest (the prompt's fit in the context, the voice's checkpoint) when the worker builds its
    stream, before the status line is sent: a refusal is a 400 or 500 (see :mod:`..errors`)."""
    first, metrics = server.tts, server.metrics
    checked = _check(req, server)
    server.workers.admit()
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[Any] = asyncio.Queue()
    cancel = threading.Event()

    def on_frame(step: int) -> None:
        if cancel.is_set():
            raise _Cancelled
        metrics.frame()

    def job(tts: TTS) -> None:
        put = loop.call_soon_threadsafe
        try:
            if cancel.is_set():
                return
            stream = tts.stream(
                checked.text,
                voice=checked.voice,
                on_frame=on_frame,
                frame_cap=server.settings.max_frames,  # a ceiling: clipped to what each prompt leaves
                **checked.stream_options(),
            )
            put(items.put_nowait, _STARTED)
            for chunk in stream:
                put(items.put_nowait, chunk)
            metrics.finished(stream)
            put(items.put_nowait, _End(stream))
        except _Cancelled:
            metrics.count(499)  # nginx's 'client closed request'
        except BaseException as e:  # delivered to the request, which answers 500 or ends the stream
            put(items.put_nowait, _End(error=e))

    server.workers.submit(job)
    headers = {"X-Model": req.model, "X-Seed": str(checked.seed), "X-Sample-Rate": str(first.sample_rate)}
    if note := language_warning(checked.text):  # text not in the model's languages: ASCII, no text of the request
        headers["X-Audio8-Warning"] = note
    media = MEDIA_TYPES[req.response_format]
    streamed = False
    try:
        if (item := await _next_or_gone(items, request)) is not _STARTED:  # the stream could not be built
            if item is _GONE:  # the client left: the worker stops at its next frame (counted 499 there)
                return Response(status_code=499)
            raise item.error if isinstance(item.error, Audio8Error) else _failed(item.error)
        if req.stream:
            streamed = True  # from here the body's generator tells the worker when to stop
            return StreamingResponse(
                _stream_body(items, cancel, req.response_format, first.sample_rate, metrics),
                media_type=media,
                headers=headers,
            )
        chunks = []
        while not isinstance(item := await _next_or_gone(items, request), _End):
            if item is _GONE:
                return Response(status_code=499)
            chunks.append(item)
    finally:
        if not streamed:
            cancel.set()  # also when this handler is cancelled: the worker stops at its next frame
    if item.error is not None:
        raise _failed(item.error)
    if item.stream.frames == 0:  # not an empty file: a client would play silence and not know why
        raise ApiError(
            422,
            "the model ended the utterance at once (eos on the first frame): no audio to send; "
            "send the request again without a seed, or with another one",
            "seed",
            "no_audio",
        )
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    metrics.count(200)
    # Off the event loop: a long mp3 or opus takes a noticeable time to encode.
    data = await asyncio.to_thread(encode_speech, audio, first.sample_rate, req.response_format)
    return Response(data, media_type=media, headers=headers)


def _failed(error: BaseException) -> ApiError:
    """A synthesis that failed on its worker, said as a 500."""
    return ApiError(500, f"synthesis failed: {type(error).__name__}: {error}", code="server_error")


async def _next_or_gone(items: asyncio.Queue, request: Request) -> Any:
    """The next item of a job's queue, or ``_GONE`` once the client has disconnected: a whole-file response sends
    nothing until the end, so nothing else notices a client that gave up (a streamed one notices at its next
    chunk). One get task, kept across polls, so no item is lost to a cancelled get."""
    getter = asyncio.ensure_future(items.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=DEFAULTS.disconnect_poll_s)
            if done:
                return getter.result()
            if await request.is_disconnected():
                return _GONE
    finally:
        getter.cancel()


async def _stream_body(
    items: asyncio.Queue, cancel: threading.Event, fmt: str, sample_rate: int, metrics: Metrics
) -> AsyncIterator[bytes]:
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
