"""``POST /v1/audio/speech``: speech for a text, whole or streamed as it is made (OpenAI's endpoint)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from ...audio import MEDIA_TYPES, SpeechEncoder, StreamStretcher, encode_speech, output_rate, time_stretch
from ...engine.stream import SpeechStream
from ...errors import Audio8Error, AudioError, DamagedVoice, VoiceError
from ...request import CheckedRequest, check_request
from ...settings import DEFAULTS
from ...tts import TTS
from ..errors import ApiError, documented
from ..metrics import Metrics
from ..relay import Cancelled, Relay, Stalled, disconnected
from ..schemas import SpeechRequest
from ..state import State, state
from ..voicenames import resolve

router = APIRouter()
log = logging.getLogger("audio8_coreai.server")

_GONE = object()
_STARTED = object()  # a job's first item when its stream is built


class _End:
    """The last item of a job's queue: the stream that ran (its statistics) or the error that stopped it."""

    def __init__(self, stream: SpeechStream | None = None, error: BaseException | None = None):
        self.stream, self.error = stream, error


def _check(req: SpeechRequest, server: State) -> CheckedRequest:
    """A request the schema has passed, checked against this server's limits and voices and by
    :func:`...request.check_request` (the seed drawn here; the model's own voice without one takes
    DEFAULTS.default_voice_seed, one steady speaker); raises ApiError or the Audio8Error that says what to change.
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
    try:
        voice = resolve(req.voice, tts.voices, settings.voice_map, settings.default_voice)
    except DamagedVoice:
        raise
    except VoiceError:  # deleted since it was found: said without the server's folder
        raise ApiError(
            400,
            f"voice {req.voice!r} is not stored on this server: GET /v1/audio/voices lists the voices",
            "voice",
            "voice_not_found",
        ) from None
    if voice is not None and voice.fingerprint != tts.checkpoint.fingerprint():
        raise ApiError(
            400,
            f"the stored voice {voice.name!r} was made with another checkpoint than this server's model: DELETE "
            f"/v1/voices/{voice.name} and POST its clip again",
            "voice",
            "voice_checkpoint_mismatch",
        )
    seed = req.seed
    if seed is None and voice is None:
        seed = DEFAULTS.default_voice_seed
    return check_request(
        req.input,
        voice=voice,
        seed=seed,
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
        200: {
            "description": "The speech, whole or streamed (sse: events)",
            "content": {t: {} for t in (*MEDIA_TYPES.values(), "text/event-stream")},
        },
        **documented(400, 413, 422, 503),
    },
)
async def speech(req: SpeechRequest, request: Request, server: Annotated[State, Depends(state)]) -> Response:
    """Run the request on a worker; stream its chunks or answer the whole file. The request is checked before a
    worker is taken, the rest (the prompt's fit in the context, the voice's checkpoint) when the worker builds its
    stream, before the status line is sent: a refusal is a 400 or 500 (see :mod:`..errors`)."""
    first, metrics, settings = server.tts, server.metrics, server.settings
    checked = _check(req, server)
    rate = _rate(req, server)
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
                frame_cap=server.settings.max_frames,  # a ceiling: clipped to what each prompt leaves
                **checked.stream_options(),
            )
            relay.put(_STARTED)
            for chunk in stream:
                relay.put(chunk)  # waits while the client is not reading (back-pressure)
            metrics.finished(stream)
            relay.put(_End(stream))
        except Cancelled:
            metrics.count(499, "client_closed")  # nginx's 'client closed request'
        except Stalled as e:
            log.warning("dropped a stream: its client was not reading for %g s", settings.stall_s)
            metrics.count(499, "client_stalled")
            relay.put(_End(error=e))
        except BaseException as e:  # delivered to the request, which answers 500 or ends the stream
            relay.put(_End(error=e))

    server.workers.submit(job)
    headers = {"X-Model": req.model, "X-Seed": str(checked.seed), "X-Sample-Rate": str(rate)}
    if req.instructions:  # accepted as OpenAI's clients send them; the model takes no style prompt
        headers["X-Audio8-Instructions"] = "ignored"
    media = MEDIA_TYPES[req.response_format]
    gone = asyncio.ensure_future(disconnected(request))  # watched until the response is handed over
    streamed = False
    try:
        if (item := await _next_or_gone(relay, gone)) is not _STARTED:  # the stream could not be built
            if item is _GONE:  # the client left: the worker stops at its next frame (counted 499 there)
                return Response(status_code=499)
            raise item.error if isinstance(item.error, Audio8Error) else _failed(item.error)
        if req.stream or req.stream_format == "sse":
            streamed = True  # from here the body's generator tells the worker when to stop
            encoder = _ChunkEncoder(req.response_format, first.sample_rate, rate, req.speed)
            if req.stream_format == "sse":
                tokens = len(first.prompts.encode(checked.text))
                return EventSourceResponse(_stream_body(relay, encoder, metrics, tokens), headers=headers)
            body = _stream_body(relay, encoder, metrics, None)
            return StreamingResponse(body, media_type=media, headers=headers)
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
    # Off the event loop: a long mp3 or opus takes a noticeable time to encode (and a stretch to compute).
    data = await asyncio.to_thread(_encode_whole, audio, first.sample_rate, req.response_format, rate, req.speed)
    return Response(data, media_type=media, headers=headers)


def _rate(req: SpeechRequest, server: State) -> int:
    """The body's sample rate (Hz): the request's ``sample_rate``, else the server's, else the format's default
    (:func:`...audio.output_rate`); raises ApiError 400 unsupported_sample_rate for one the format cannot take."""
    asked = req.sample_rate if req.sample_rate is not None else server.settings.sample_rate
    try:
        return output_rate(req.response_format, server.tts.sample_rate, asked)
    except AudioError as e:
        raise ApiError(400, str(e), "sample_rate", "unsupported_sample_rate") from None


def _encode_whole(audio: np.ndarray, sample_rate: int, fmt: str, rate: int, speed: float) -> bytes:
    """A whole utterance at ``speed`` (pitch kept), encoded as ``fmt`` at ``rate`` Hz."""
    return encode_speech(time_stretch(audio, sample_rate, speed), sample_rate, fmt, rate)


class _ChunkEncoder:
    """An utterance's chunks at ``speed`` (a streaming time stretch, pitch kept), encoded as ``fmt`` at ``rate``
    Hz as they come: ``write(chunk)`` and ``close()`` give the bytes ready to send."""

    def __init__(self, fmt: str, sample_rate: int, rate: int, speed: float):
        self.stretcher = StreamStretcher(sample_rate, speed)
        self.encoder = SpeechEncoder(fmt, sample_rate, rate)

    def write(self, chunk: np.ndarray) -> bytes:
        return self.encoder.write(self.stretcher.write(chunk))

    def close(self) -> bytes:
        return self.encoder.write(self.stretcher.close()) + self.encoder.close()


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


async def _stream_body(
    relay: Relay, encoder: _ChunkEncoder, metrics: Metrics, sse_tokens: int | None
) -> AsyncIterator[bytes | ServerSentEvent]:
    """The body of a streaming response: encoded chunks as the worker makes them; with ``sse_tokens`` (the
    text's token count) as OpenAI's speech events: ``speech.audio.delta`` with base64 ``audio`` per chunk, then
    ``speech.audio.done`` with ``usage`` (output tokens: the frames made). When the client goes, the server
    cancels this generator; ``finally`` then tells the worker to stop at its next frame."""

    def out(data: bytes) -> bytes | ServerSentEvent:
        if sse_tokens is None:
            return data
        return ServerSentEvent(
            data=json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        )

    try:
        while not isinstance(item := await relay.get(), _End):
            if data := encoder.write(item):
                yield out(data)
        if isinstance(item.error, Stalled):  # dropped, counted by the worker
            return
        if item.error is not None:  # the status line is sent: end the body short, the client sees it cut
            metrics.count(500, "server_error")
            return
        if data := encoder.close():
            yield out(data)
        if sse_tokens is not None:
            frames = item.stream.frames
            usage = {"input_tokens": sse_tokens, "output_tokens": frames, "total_tokens": sse_tokens + frames}
            yield ServerSentEvent(data=json.dumps({"type": "speech.audio.done", "usage": usage}))
        metrics.count(200)
    finally:
        relay.stop()
