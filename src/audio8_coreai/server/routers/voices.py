"""``/v1/voices``: list, register (a multipart clip upload, encoded by the synthesizer) and delete stored voices;
``GET /v1/audio/voices``: every voice a speech request may name, in Open WebUI's shape."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ...errors import DamagedVoice, VoiceError
from ...voices import check_name
from ..errors import ApiError, damaged
from ..state import State, state
from ..voicenames import DEFAULT_VOICE

router = APIRouter()


@router.get("/v1/voices")
def list_voices(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """The stored voices; one that cannot be read is listed with its error."""
    store = server.synth.voices
    voices = []
    for name in store.names():
        try:
            v = store.load(name)
            voices.append(
                {
                    "name": v.name,
                    "transcript": v.transcript,
                    "duration_s": v.duration_s,
                    "frames": v.frames,
                    "created": v.created,
                }
            )
        except DamagedVoice as e:
            voices.append({"name": name, "error": damaged(e).message})
        except VoiceError as e:
            voices.append({"name": name, "error": str(e)})
    return {"object": "list", "data": voices}


@router.get("/v1/audio/voices")
def list_voice_ids(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """``{"voices": [{"id", "name"}]}`` (Open WebUI's shape): the default voice (id ``default``: ``serve
    --default-voice``, else the model's own), the stored voices (id: the name), then the ``--voice-map`` names
    (``alloy (ana)``); each id is what ``voice`` takes in a speech request."""
    settings, stored = server.settings, server.synth.voices.names()
    own = settings.default_voice or "the model's own voice"
    voices = [] if DEFAULT_VOICE in stored else [{"id": DEFAULT_VOICE, "name": f"{DEFAULT_VOICE} ({own})"}]
    voices += [{"id": name, "name": name} for name in stored]
    voices += [{"id": k, "name": f"{k} ({v})"} for k, v in sorted(settings.voice_map.items()) if k not in stored]
    return {"voices": voices}


@router.post("/v1/voices", status_code=201)
async def add_voice(request: Request, server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """Register a voice from multipart fields ``name``, ``transcript``, ``audio`` (a file of at most
    ``max_upload_bytes``: else 413) and ``replace``; the clip is encoded by the synthesizer. Messages name the client's
    file, never the server's temporary one."""
    settings = server.settings
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > settings.max_upload_bytes:
        raise ApiError(
            413,
            f"upload is {int(size)} bytes, over this server's {settings.max_upload_bytes}: send a clip of 0.5 to 30 s",
            "audio",
            "upload_too_large",
        )
    form = await request.form(max_part_size=settings.max_upload_bytes)
    name, transcript, upload = form.get("name"), form.get("transcript"), form.get("audio")
    replace = str(form.get("replace", "false")).lower() in ("1", "true", "yes")
    if not isinstance(name, str) or not isinstance(transcript, str) or upload is None or isinstance(upload, str):
        raise ApiError(
            400, "POST /v1/voices takes multipart fields name, transcript and an audio file", None, "invalid_request"
        )
    data = await upload.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise ApiError(
            413,
            f"upload is over this server's {settings.max_upload_bytes} bytes: send a clip of 0.5 to 30 s",
            "audio",
            "upload_too_large",
        )
    try:
        name = check_name(name)
        server.synth.voices.check_new(name, replace)
    except VoiceError as e:
        raise ApiError(400, str(e), "name", "invalid_voice") from None
    shown = Path(upload.filename or "clip.wav").name[-100:] or "clip.wav"  # the client's name, in messages
    voice = await server.synth.register_voice(name, data, shown, transcript, replace)
    server.metrics.count(201)
    return {
        "name": voice.name,
        "transcript": voice.transcript,
        "duration_s": voice.duration_s,
        "frames": voice.frames,
        "created": voice.created,
        "warnings": list(voice.warnings),
    }


@router.delete("/v1/voices/{name}")
def delete_voice(name: str, server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """Delete a stored voice: 404 when there is none of that name."""
    store = server.synth.voices
    try:
        name = check_name(name)
    except VoiceError as e:
        raise ApiError(400, str(e), "name", "invalid_voice") from None
    if not store.path(name).is_file():
        raise ApiError(404, f"no voice named {name!r}", "name", "voice_not_found")
    try:
        store.remove(name)
    except VoiceError as e:
        raise ApiError(400, str(e), "name", "invalid_voice") from None
    server.metrics.count(200)
    return {"name": name, "deleted": True}
