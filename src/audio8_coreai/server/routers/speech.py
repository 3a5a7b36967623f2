"""``POST /v1/audio/speech``: speech for a text, whole or streamed as it is made (OpenAI's endpoint)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from ...audio import MEDIA_TYPES, output_rate
from ...errors import AudioError
from ...request import CheckedRequest, check_request
from ...settings import DEFAULTS
from ..errors import ApiError
from ..metrics import Metrics
from ..schemas import SpeechRequest
from ..state import State, state
from ..synth import Output, Speech
from ..voicenames import resolve

router = APIRouter()

_GONE = object()


def _check(req: SpeechRequest, server: State) -> CheckedRequest:
    """A request the schema has passed, checked against this server's limits and voices and by
    :func:`...request.check_request` (the seed drawn here; the model's own voice without one takes
    DEFAULTS.default_voice_seed, one steady speaker); raises ApiError or the Audio8Error that says what to change.
    A stored voice is read here (a damaged one is refused before a worker is taken) and handed to the worker."""
    settings, store = server.settings, server.synth.voices
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
    voice = resolve(req.voice, store, settings.voice_map, settings.default_voice)
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


@router.post("/v1/audio/speech")
async def speech(req: SpeechRequest, request: Request, server: Annotated[State, Depends(state)]) -> Response:
    """Have the synthesizer (:mod:`..synth`) make the speech; stream its chunks (audio, or OpenAI's speech events
    with ``stream_format`` sse) or answer the whole file. The request is checked before a place is taken, the rest
    (the prompt's fit in the context, the voice's checkpoint) when its stream is built, before the status line is
    sent: a refusal is a 400 or 500 (see :mod:`..errors`)."""
    metrics = server.metrics
    checked = _check(req, server)
    rate = _rate(req, server)
    output = Output(req.response_format, rate, req.speed, req.stream or req.stream_format == "sse")
    speech = await _or_gone(server.synth.open(checked, output), request)
    if speech is _GONE:  # the client left while its request waited or its stream was built
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
    media = MEDIA_TYPES[req.response_format]
    if req.stream_format == "sse":  # from here the body's generator tells the synthesizer when to stop
        return EventSourceResponse(_events(speech, metrics), headers=headers)
    if req.stream:
        return StreamingResponse(_sent(speech.body, metrics), media_type=media, headers=headers)
    parts = []
    try:
        while (data := await _or_gone(anext(speech.body, None), request)) is not None:
            if data is _GONE:  # nothing is sent until the end: the client left while it waited
                metrics.count(499, "client_closed")
                return Response(status_code=499)
            parts.append(data)
    finally:
        await speech.body.aclose()  # also when this handler is cancelled: the synthesis stops at its next frame
    metrics.count(200)
    return Response(b"".join(parts), media_type=media, headers=headers)


def _rate(req: SpeechRequest, server: State) -> int:
    """The body's sample rate (Hz): the request's ``sample_rate``, else the server's, else the format's default
    (:func:`...audio.output_rate`); raises ApiError 400 unsupported_sample_rate for one the format cannot take."""
    asked = req.sample_rate if req.sample_rate is not None else server.settings.sample_rate
    try:
        return output_rate(req.response_format, server.synth.sample_rate, asked)
    except AudioError as e:
        raise ApiError(400, str(e), "sample_rate", "unsupported_sample_rate") from None


async def _or_gone(step: Awaitable[Any], request: Request) -> Any:
    """What ``step`` gives, or ``_GONE`` (``step`` then cancelled) once the client has disconnected: a request that
    waits for a place, or a whole-file response that sends nothing until the end, is otherwise not told that its
    client gave up (a streamed one notices at its next chunk)."""
    task = asyncio.ensure_future(step)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DEFAULTS.disconnect_poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                return _GONE
    finally:
        task.cancel()


async def _sent(body: AsyncGenerator[bytes, None], metrics: Metrics) -> AsyncIterator[bytes]:
    """A streamed body as sent, counted in ``/metrics``: 200 when whole; 500 when the synthesis failed (the status
    line is sent: the body ends short, the client sees it cut); 499 when the client left (the server then cancels
    or closes this generator, which closes ``body``: the synthesis stops at its next frame)."""
    try:
        async for data in body:
            yield data
    except (GeneratorExit, asyncio.CancelledError):
        metrics.count(499, "client_closed")
        raise
    except Exception:  # whatever stopped the synthesis, the response can only end short now
        metrics.count(500, "server_error")
        return
    else:
        metrics.count(200)
    finally:
        await body.aclose()


async def _events(speech: Speech, metrics: Metrics) -> AsyncIterator[ServerSentEvent]:
    """OpenAI's speech events: ``speech.audio.delta`` with base64 ``audio`` per encoded chunk, then
    ``speech.audio.done`` with ``usage`` (input tokens: the text's; output tokens: the frames made)."""
    async for data in _sent(speech.body, metrics):
        yield ServerSentEvent(data=json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}))
    if speech.frames is not None:  # the body ran to its end
        usage = {
            "input_tokens": speech.tokens,
            "output_tokens": speech.frames,
            "total_tokens": speech.tokens + speech.frames,
        }
        yield ServerSentEvent(data=json.dumps({"type": "speech.audio.done", "usage": usage}))
