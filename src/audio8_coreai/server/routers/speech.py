"""``POST /v1/audio/speech``: speech for a text, whole or streamed as it is made (OpenAI's endpoint)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from ...audio import MEDIA_TYPES, output_rate
from ...errors import AudioError, DamagedVoice, VoiceError
from ...request import CheckedRequest, check_request
from ...settings import DEFAULTS
from ...text import language_warning
from ..errors import ApiError, documented
from ..metrics import Metrics
from ..relay import Stalled, disconnected
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
    A stored voice is read here, its codes and checkpoint checked (a damaged one is refused before a place is
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
    """Have the synthesizer (:mod:`..synth`) make the speech; stream its chunks (audio, or OpenAI's speech events
    with ``stream_format`` sse) or answer the whole file. The request is checked before a place is taken, the rest
    (the prompt's fit in the context, the voice's checkpoint) when its stream is built, before the status line is
    sent: a refusal is a 400 or 500 (see :mod:`..errors`). A client that leaves before the response is handed over
    (while its request waits, or a whole file is made) is noticed as it happens: 499, the synthesis stopped."""
    metrics = server.metrics
    checked = _check(req, server)
    rate = _rate(req, server)
    output = Output(req.response_format, rate, req.speed, req.stream or req.stream_format == "sse")
    gone = asyncio.ensure_future(disconnected(request))  # watched until the response is handed over
    try:
        speech = await _or_gone(server.synth.open(checked, output), gone)
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
        if note := language_warning(checked.text):  # not in the model's languages: ASCII, no text of the request
            headers["X-Audio8-Warning"] = note
        media = MEDIA_TYPES[req.response_format]
        if req.stream_format == "sse":  # from here the body's generator tells the synthesizer when to stop
            from sse_starlette import EventSourceResponse  # imported by the schema's check (stream_format)

            return EventSourceResponse(_events(speech, metrics), headers=headers)
        if req.stream:
            return StreamingResponse(_sent(speech.body, metrics), media_type=media, headers=headers)
        parts = []
        try:
            while (data := await _or_gone(anext(speech.body, None), gone)) is not None:
                if data is _GONE:  # nothing is sent until the end: the client left while it waited
                    metrics.count(499, "client_closed")
                    return Response(status_code=499)
                parts.append(data)
        finally:
            await speech.body.aclose()  # also when this handler is cancelled: the synthesis stops at its next frame
    finally:
        gone.cancel()
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


async def _sent(body: AsyncGenerator[bytes, None], metrics: Metrics) -> AsyncIterator[bytes]:
    """A streamed body as sent, counted in ``/metrics``: 200 when whole; 500 when the synthesis failed (the status
    line is sent: the body ends short, the client sees it cut); 499 when the client left (the server then cancels
    or closes this generator, which closes ``body``: the synthesis stops at its next frame) or stopped reading for
    ``stall_s`` (the stream dropped, :mod:`..relay`)."""
    try:
        async for data in body:
            yield data
    except (GeneratorExit, asyncio.CancelledError):
        metrics.count(499, "client_closed")
        raise
    except Stalled:
        metrics.count(499, "client_stalled")
        return
    except Exception:  # whatever stopped the synthesis, the response can only end short now
        metrics.count(500, "server_error")
        return
    else:
        metrics.count(200)
    finally:
        await body.aclose()


async def _events(speech: Speech, metrics: Metrics) -> AsyncIterator[dict[str, str]]:
    """OpenAI's speech events, each an sse-starlette event's fields: ``speech.audio.delta`` with base64 ``audio``
    per encoded chunk, then ``speech.audio.done`` with ``usage`` (input tokens: the text's; output tokens: the
    frames made)."""
    async for data in _sent(speech.body, metrics):
        yield {"data": json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})}
    if speech.frames is not None:  # the body ran to its end
        usage = {
            "input_tokens": speech.tokens,
            "output_tokens": speech.frames,
            "total_tokens": speech.tokens + speech.frames,
        }
        yield {"data": json.dumps({"type": "speech.audio.done", "usage": usage})}
