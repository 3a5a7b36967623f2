"""``POST /v1/audio/speech``: speech for a text, streamed as it is made (as OpenAI's) or whole (OpenAI's endpoint)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from ...audio import MEDIA_TYPES, output_rate
from ...errors import AudioError, DamagedVoice, PromptError, VoiceError
from ...request import CheckedRequest, check_request
from ...settings import DEFAULTS
from ..errors import ApiError, documented
from ..metrics import Metrics
from ..relay import Stalled, disconnected
from ..schemas import SpeechRequest
from ..state import State, state
from ..synth import Output, Speech
from ..voicenames import resolve

router = APIRouter()
log = logging.getLogger("audio8_coreai.server")

_GONE = object()


def _check(req: SpeechRequest, server: State) -> CheckedRequest:
    """A request the schema has passed, checked against this server's limits and voices and by
    :func:`...request.check_request` (the seed drawn here; the model's own voice without one takes
    DEFAULTS.server.default_voice_seed, one steady speaker); raises ApiError or the Audio8Error that says what to
    change. A stored voice is read here, its codes and checkpoint checked (a damaged one is refused before a place is
    taken), and handed to the synthesizer: deleting it while the request waits for a place changes nothing."""
    settings, synth = server.settings, server.synth
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
        voice = resolve(req.voice, synth.voices, settings.voice_map, settings.default_voice)
    except DamagedVoice:
        raise
    except VoiceError:  # deleted since it was found: said without the server's folder
        raise ApiError(
            400,
            f"voice {req.voice!r} is not stored on this server: GET /v1/audio/voices lists the voices",
            "voice",
            "voice_not_found",
        ) from None
    if voice is not None and voice.fingerprint != synth.fingerprint:
        raise ApiError(
            400,
            f"the stored voice {voice.name!r} was made with another checkpoint than this server's model: DELETE "
            f"/v1/voices/{voice.name} and POST its clip again",
            "voice",
            "voice_checkpoint_mismatch",
        )
    seed = req.seed
    if seed is None and voice is None:
        seed = DEFAULTS.server.default_voice_seed
    try:
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
            text_field="input",
        )
    except PromptError as e:  # the CLI's rule: nothing to speak (empty, whitespace, punctuation only)
        raise ApiError(400, str(e), "input", "empty_input") from None


@router.post(
    "/v1/audio/speech",
    response_class=Response,
    responses={
        200: {
            "description": "The speech, streamed as it is made (sse: events) or whole (stream: false; flac)",
            "content": {t: {} for t in (*MEDIA_TYPES.values(), "text/event-stream")},
        },
        **documented(400, 413, 422, 503),
    },
)
async def speech(req: SpeechRequest, request: Request, server: Annotated[State, Depends(state)]) -> Response:
    """Have the synthesizer (:mod:`..synth`) make the speech; stream its chunks (audio, or OpenAI's speech events
    with ``stream_format`` sse) or answer the whole file (:attr:`..schemas.SpeechRequest.streamed`). The request is
    checked before a place is taken, the rest (the prompt's fit in the context, the voice's checkpoint) when its
    stream is built, and the status line goes out with the first bytes: a refusal or failure before them is a JSON
    400, 422 or 500 (see :mod:`..errors`); one after them cuts the stream (:func:`_sent`). A client that leaves
    before the response is handed over (while its request waits, before the first bytes, or while a whole file is
    made) is noticed as it happens: 499, the synthesis stopped."""
    metrics = server.metrics
    checked = _check(req, server)
    rate = _rate(req, server)
    output = Output(req.response_format, rate, req.speed, req.streamed)
    gone = asyncio.ensure_future(disconnected(request))  # watched until the response is handed over
    try:
        speech = await _or_gone(server.synth.open(checked, output), gone)
        parts = _GONE if speech is _GONE else await _read(speech.body, gone, whole=not output.stream)
    finally:
        gone.cancel()
    if parts is _GONE:  # the client left while its request waited, or before it had any byte
        metrics.count(499, "client_closed")  # nginx's 'client closed request'
        return Response(status_code=499)
    headers = {
        "X-Model": req.model,
        "X-Seed": str(checked.seed),
        "X-Sample-Rate": str(rate),
        "X-Replica": speech.replica,
    }
    if req.instructions:  # accepted as OpenAI's clients send them; the model takes no style prompt
        headers["X-Audio8-Instructions"] = "ignored"
    if speech.warning:  # not in the model's languages (the plan's line): ASCII, no text of the request
        headers["X-Audio8-Warning"] = speech.warning
    if speech.frame_cap:  # a whole file, read to its end: which pieces stopped at their cap (ASCII)
        headers["X-Audio8-Frame-Cap"] = speech.frame_cap
    media = MEDIA_TYPES[req.response_format]
    if output.stream:  # from here the body's generator tells the synthesizer when to stop
        speech.body = _resumed(parts, speech.body)
        if req.stream_format == "sse":
            from sse_starlette import EventSourceResponse  # imported by the schema's check (stream_format)

            events = _events(speech, metrics)
            return _Droppable(EventSourceResponse(events, headers=headers), events, speech.dropped)
        body = _sent(speech.body, metrics, speech.dropped)
        return _Droppable(_Cuttable(body, media_type=media, headers=headers), body, speech.dropped)
    metrics.count(200)
    return Response(b"".join(parts), media_type=media, headers=headers)


def _rate(req: SpeechRequest, server: State) -> int:
    """The body's sample rate (Hz): the request's ``sample_rate``, else the server's, else the format's default
    (:func:`...audio.output_rate`; the server's is not opus's, always 48 kHz); raises ApiError 400
    unsupported_sample_rate for one the format cannot take."""
    own = req.sample_rate is not None or req.response_format == "opus"
    asked = req.sample_rate if own else server.settings.sample_rate
    try:
        return output_rate(req.response_format, server.synth.sample_rate, asked)
    except AudioError as e:
        raise ApiError(400, str(e), "sample_rate", "unsupported_sample_rate") from None


async def _or_gone(step: Awaitable[Any], gone: asyncio.Future) -> Any:
    """What ``step`` gives, or ``_GONE`` (``step`` then cancelled) once ``gone`` (the client disconnected) is done:
    a request that waits for a place, or a whole-file response that sends nothing until the end, is otherwise not
    told that its client gave up, however fast chunks come (a streamed one notices at its next chunk)."""
    task = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        return task.result() if task in done else _GONE
    finally:
        if not task.done():  # the client left: let the step see its cancellation before its body is closed
            task.cancel()
            await asyncio.wait({task})


async def _read(body: AsyncGenerator[bytes, None], gone: asyncio.Future, whole: bool) -> list[bytes] | object:
    """The bytes of ``body`` up to its end when ``whole``, else its first bytes (a list of one item, none if it
    ended empty), or ``_GONE`` once the client has left. Raises what ``body`` raises before them (the request's
    JSON error). ``body`` is closed unless a stream's first bytes were read (its rest is the response's to send),
    also when this is cancelled: the synthesis stops at its next frame."""
    parts, handed = [], False
    try:
        while (data := await _or_gone(anext(body, None), gone)) is not None:
            if data is _GONE:
                return _GONE
            parts.append(data)
            if not whole:
                handed = True
                return parts
        return parts
    finally:
        if not handed:
            await body.aclose()


async def _resumed(first: list[bytes], body: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """``first`` (already read from ``body``), then the rest of ``body``; closing this closes ``body``."""
    try:
        for data in first:
            yield data
        async for data in body:
            yield data
    finally:
        await body.aclose()


class _Cut(Exception):
    """A streamed body that failed after its first bytes: the response is cut, not ended."""


class _Cuttable(StreamingResponse):
    """A streamed answer whose body may end with :class:`_Cut`: its last, empty chunk is then not sent, so the
    server resets the connection (uvicorn logs that the response was not completed; :mod:`..connections`) and the
    client sees the body cut (httpx: a ReadError, connection reset), not a short file that looks whole."""

    async def stream_response(self, send) -> None:
        with contextlib.suppress(_Cut):
            await super().stream_response(send)


class _Droppable(Response):
    """A streamed answer ``inner`` (audio or events) sent until it ends, or until ``dropped`` is set (the synthesizer
    dropped the stream for a client that stopped reading, while ``inner``'s ``send`` may wait on a full socket for
    ever): ``inner`` is then stopped at once, its last chunk not sent (the response cut, as :class:`_Cuttable`'s),
    and its ``body`` closed, which counts the 499 client_stalled (:func:`_sent`)."""

    def __init__(self, inner: Response, body: AsyncGenerator[Any, None], dropped: asyncio.Event):
        self.inner, self.body, self.dropped = inner, body, dropped
        self.background = None  # FastAPI's background tasks (none here) would be set on this

    async def __call__(self, scope, receive, send) -> None:
        sending = asyncio.ensure_future(self.inner(scope, receive, send))
        dropped = asyncio.ensure_future(self.dropped.wait())
        try:
            await asyncio.wait({sending, dropped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dropped.cancel()
            if not sending.done():  # dropped (or the client left): stop sending now, the body closed and counted
                sending.cancel()
                await asyncio.wait({sending})
                await self.body.aclose()
        if not sending.cancelled():
            sending.result()


async def _sent(
    body: AsyncGenerator[bytes, None], metrics: Metrics, dropped: asyncio.Event
) -> AsyncGenerator[bytes, None]:
    """A streamed body as sent, counted in ``/metrics``: 200 when whole; 500 stream_cut when the synthesis failed
    after the first bytes (logged; raises :class:`_Cut`: the status line is sent, only cutting the stream tells the
    client); 499 client_closed when the client left (the server then cancels or closes this generator, which closes
    ``body``: the synthesis stops at its next frame); 499 client_stalled when it stopped reading for ``stall_s``
    (the stream dropped, ``dropped`` set, :mod:`..relay`): counted as the server drops it, the response cut; 503
    shutting_down when the server's shutdown grace ended it (logged as a warning; cut)."""
    try:
        async for data in body:
            yield data
    except (GeneratorExit, asyncio.CancelledError):
        metrics.count(499, "client_stalled" if dropped.is_set() else "client_closed")
        raise
    except Stalled:
        metrics.count(499, "client_stalled")
        raise _Cut from None
    except Exception as e:  # whatever stopped the synthesis, the response can only be cut now
        if isinstance(e, ApiError) and e.code == "shutting_down":
            log.warning("a stream was cut: the server is shutting down (its grace, shutdown_s, is over)")
            metrics.count(503, "shutting_down")
            raise _Cut from None
        log.error("a stream failed after its first bytes and was cut: %s", e)
        metrics.count(500, "stream_cut")
        raise _Cut from None
    else:
        metrics.count(200)
    finally:
        await body.aclose()


async def _events(speech: Speech, metrics: Metrics) -> AsyncIterator[dict[str, str]]:
    """OpenAI's speech events, each an sse-starlette event's fields: ``speech.audio.delta`` with base64 ``audio``
    per encoded chunk, then ``speech.audio.done`` with ``usage`` (input tokens: the text's; output tokens: the frames
    made; ``audio8_frame_cap`` when pieces stopped at their cap, :func:`..synth.frame_cap_note`). A stream cut after
    its first event ends without ``speech.audio.done``."""
    sent = _sent(speech.body, metrics, speech.dropped)
    async with contextlib.aclosing(sent):  # closing these events (a dropped stream) closes and counts the body
        with contextlib.suppress(_Cut):
            async for data in sent:
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                yield {"data": json.dumps(event)}
    if speech.frames is not None:  # the body ran to its end
        usage = {
            "input_tokens": speech.tokens,
            "output_tokens": speech.frames,
            "total_tokens": speech.tokens + speech.frames,
        }
        done = {"type": "speech.audio.done", "usage": usage}
        if speech.frame_cap:
            done["audio8_frame_cap"] = speech.frame_cap
        yield {"data": json.dumps(done)}
