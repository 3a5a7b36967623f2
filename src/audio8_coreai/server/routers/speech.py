"""``POST /v1/audio/speech``: speech for a text, whole or streamed as it is made (OpenAI's endpoint)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from ...audio import MEDIA_TYPES, SpeechEncoder, encode_speech
from ...engine.stream import SpeechStream
from ...errors import Audio8Error, DamagedVoice, VoiceError
from ...request import CheckedRequest, check_request
from ...tts import TTS
from ..errors import ApiError, documented
from ..metrics import Metrics
from ..relay import Cancelled, Relay, Stalled, disconnected
from ..schemas import SpeechRequest
from ..state import State, state

router = APIRouter()
log = logging.getLogger("audio8_coreai.server")

# OpenAI's voice names: a client written for OpenAI sends one of these; without a stored voice of that name it
# gets the model's own voice rather than an error.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"}
)
_GONE = object()
_STARTED = object()  # a job's first item when its stream is built


class _End:
    """The last item of a job's queue: the stream that ran (its statistics) or the error that stopped it."""

    def __init__(self, stream: SpeechStream | None = None, error: BaseException | None = None):
        self.stream, self.error = stream, error


def _check(req: SpeechRequest, server: State) -> CheckedRequest:
    """A request the schema has passed, checked against this server's limits and voices and by
    :func:`...request.check_request` (the seed drawn here); raises ApiError or the Audio8Error that says what to change.
    A stored voice is read here, its codes and checkpoint checked (a damaged one is refused before a worker is
    taken), and handed to the worker: deleting it while the request waits for a worker changes nothing."""
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
        try:
            voice = tts.voices.load(req.voice)
        except DamagedVoice:
            raise
        except VoiceError:  # none of that name (or deleted since it was asked for)
            if req.voice.lower() not in OPENAI_VOICES:
                raise ApiError(
                    400,
                    f"no voice named {req.voice!r}: GET /v1/voices lists the stored voices (OpenAI's "
                    "names, such as alloy, speak in the model's own voice)",
                    "voice",
                    "voice_not_found",
                ) from None
        if voice is not None and voice.fingerprint != tts.checkpoint.fingerprint():
            raise ApiError(
                400,
                f"the stored voice {req.voice!r} was made with another checkpoint than this server's model: DELETE "
                f"/v1/voices/{voice.name} and POST its clip again",
                "voice",
                "voice_checkpoint_mismatch",
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


@router.post(
    "/v1/audio/speech",
    response_class=Response,
    responses={
        200: {"description": "The speech, whole or streamed", "content": {t: {} for t in MEDIA_TYPES.values()}},
        **documented(400, 413, 422, 503),
    },
)
async def speech(req: SpeechRequest, request: Request, server: Annotated[State, Depends(state)]) -> Response:
    """Run the request on a worker; stream its chunks or answer the whole file. The request is checked before a
    worker is taken, the rest (the prompt's fit in the context, the voice's checkpoint) when the worker builds its
    stream, before the status line is sent: a refusal is a 400 or 500 (see :mod:`..errors`)."""
    first, metrics, settings = server.tts, server.metrics, server.settings
    checked = _check(req, server)
    server.workers.admit()
    relay = Relay(asyncio.get_running_loop(), settings.stream_buffer_chunks, settings.stall_s)

    def on_frame(step: int) -> None:
        relay.check()
        metrics.frame()

    def job(tts: TTS) -> None:
        try:
            if relay.stopped.is_set():
                return
            stream = tts.stream(
                checked.text,
                voice=checked.voice,
                on_frame=on_frame,
                frame_cap=settings.max_frames,  # a ceiling: clipped to what each prompt leaves
                **checked.stream_options(),
            )
            relay.put(_STARTED)
            for chunk in stream:
                relay.put(chunk)  # waits while the client is not reading (back-pressure)
            metrics.finished(stream)
            relay.put(_End(stream))
        except Cancelled:
            metrics.count(499)  # nginx's 'client closed request'
        except Stalled as e:
            log.warning("dropped a stream: its client was not reading for %g s", settings.stall_s)
            metrics.count(499)
            relay.put(_End(error=e))
        except BaseException as e:  # delivered to the request, which answers 500 or ends the stream
            relay.put(_End(error=e))

    server.workers.submit(job)
    headers = {"X-Model": req.model, "X-Seed": str(checked.seed), "X-Sample-Rate": str(first.sample_rate)}
    media = MEDIA_TYPES[req.response_format]
    gone = asyncio.ensure_future(disconnected(request))  # watched until the response is handed over
    streamed = False
    try:
        if (item := await _next_or_gone(relay, gone)) is not _STARTED:  # the stream could not be built
            if item is _GONE:  # the client left: the worker stops at its next frame (counted 499 there)
                return Response(status_code=499)
            raise item.error if isinstance(item.error, Audio8Error) else _failed(item.error)
        if req.stream:
            streamed = True  # from here the body's generator tells the worker when to stop
            return StreamingResponse(
                _stream_body(relay, req.response_format, first.sample_rate, metrics), media_type=media, headers=headers
            )
        chunks = []
        while not isinstance(item := await _next_or_gone(relay, gone), _End):
            if item is _GONE:
                return Response(status_code=499)
            chunks.append(item)
    finally:
        gone.cancel()
        if not streamed:
            relay.stop()  # also when this handler is cancelled: the worker stops at its next frame
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
    """A synthesis that failed on its worker, said as a 500 that names nothing of the server (logged there)."""
    log.error("synthesis failed: %s", type(error).__name__, exc_info=error)
    return ApiError(500, f"synthesis failed on the server ({type(error).__name__}; logged there)", code="server_error")


async def _next_or_gone(relay: Relay, gone: asyncio.Future) -> Any:
    """The next item of a job, or ``_GONE`` once ``gone`` (the client disconnected) is done: a whole-file response
    sends nothing until the end, so nothing else notices a client that gave up, however fast chunks come (a
    streamed one notices at its next chunk). No item is lost to the get cancelled here."""
    getter = asyncio.ensure_future(relay.get())
    try:
        done, _ = await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        return getter.result() if getter in done else _GONE
    finally:
        getter.cancel()


async def _stream_body(relay: Relay, fmt: str, sample_rate: int, metrics: Metrics) -> AsyncIterator[bytes]:
    """The body of a streaming response: encoded chunks as the worker makes them. When the client goes, the
    server cancels this generator; ``finally`` then tells the worker to stop at its next frame."""
    encoder = SpeechEncoder(fmt, sample_rate)
    try:
        while not isinstance(item := await relay.get(), _End):
            if data := encoder.write(item):
                yield data
        if isinstance(item.error, Stalled):  # dropped, counted by the worker
            return
        if item.error is not None:  # the status line is sent: end the body short, the client sees it cut
            metrics.count(500)
            return
        yield encoder.close()
        metrics.count(200)
    finally:
        relay.stop()
