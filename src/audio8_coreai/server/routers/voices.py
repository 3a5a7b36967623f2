"""``/v1/voices``: list, register (a multipart clip upload, encoded by the synthesizer) and delete stored voices;
``GET /v1/audio/voices``: every voice a speech request may name, in Open WebUI's shape."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException

from ...errors import DamagedVoice, VoiceError, VoiceExists, VoiceStorageError
from ...voices import SUFFIX, check_name
from ..errors import ApiError, api_error, damaged, documented, form_error, storage
from ..forms import FormTooLarge, read_form
from ..state import State, state
from ..voicenames import DEFAULT_VOICE, serving_role

router = APIRouter()


@router.get("/v1/voices", responses=documented())
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
        except VoiceError:  # removed since it was listed
            continue
    return {"object": "list", "data": voices}


@router.get("/v1/audio/voices", responses=documented())
def list_voice_ids(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """``{"voices": [{"id", "name"}]}`` (Open WebUI's shape): the default voice (id ``default``: ``serve
    --default-voice``, else the model's own), the stored voices (id: the name), then the ``--voice-map`` names
    (``alloy (ana)``); each id is what ``voice`` takes in a speech request. A stored voice that cannot speak here
    (damaged, or made with another checkpoint) is left out, as Wyoming's describe leaves it: a picker would offer
    a 500 (``GET /v1/voices`` tells why); so is one named like a ``--voice-map`` name (the map speaks that id)."""
    settings, store = server.settings, server.synth.voices
    stored = [name for name in store.names() if name.lower() not in settings.voice_map]
    own = settings.default_voice or "the model's own voice"
    voices = [] if DEFAULT_VOICE in stored else [{"id": DEFAULT_VOICE, "name": f"{DEFAULT_VOICE} ({own})"}]
    voices += [{"id": name, "name": name} for name in stored if _speaks(store, name, server.synth.fingerprint)]
    voices += [{"id": k, "name": f"{k} ({v})"} for k, v in sorted(settings.voice_map.items())]
    return {"voices": voices}


def _speaks(store, name: str, fingerprint: str) -> bool:
    """Whether stored voice ``name`` reads whole and was made with this checkpoint."""
    try:
        store.load(name, fingerprint)
    except VoiceError:
        return False
    return True


# The multipart form, read by hand (for its limits and messages), declared for the OpenAPI schema.
UPLOAD_FORM = {
    "type": "object",
    "required": ["name", "transcript", "audio"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "transcript": {"type": "string", "minLength": 1},
        "audio": {"type": "string", "format": "binary", "description": "a clip of 0.5 to 30 s, any libsndfile format"},
        "replace": {"type": "boolean", "default": False},
    },
}


@router.post(
    "/v1/voices",
    status_code=201,
    responses=documented(400, 409, 413, 503, 507),
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD_FORM}}}},
)
async def add_voice(request: Request, server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """Register a voice from multipart fields ``name``, ``transcript``, ``audio`` (a file of at most
    ``max_upload_bytes``: else 413) and ``replace``; the clip is encoded by the synthesizer. Messages name the client's
    file, never the server's temporary one. A form that cannot be read, or a field that is not UTF-8 text, is a 400
    with its code (:func:`..errors.form_error`)."""
    settings = server.settings
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > settings.max_upload_bytes:
        raise _too_large(settings.max_upload_bytes, int(size))
    try:  # the parts are spooled to temporary files: the server's disk can be full
        form = await read_form(request, settings.max_upload_bytes)
    except OSError as e:
        raise storage(e) from None
    except FormTooLarge:
        raise _too_large(settings.max_upload_bytes) from None
    except MultiPartException as e:
        raise form_error(e) from None
    try:
        return await _register(form, server)
    finally:
        await form.close()


async def _register(form: FormData, server: State) -> dict[str, Any]:
    """The voice of ``form``'s fields, registered (see :func:`add_voice`)."""
    settings = server.settings
    for field in ("name", "transcript", "audio", "replace"):  # the last one was taken, silently
        if (given := len(form.getlist(field))) > 1:
            message = f"the form holds {given} '{field}' fields: send one (a voice is one clip, one name)"
            raise ApiError(400, message, field, "invalid_request")
    name, transcript, upload = form.get("name"), form.get("transcript"), form.get("audio")
    replace_field = str(form.get("replace", "false")).lower()
    if replace_field not in ("1", "true", "yes", "0", "false", "no"):
        raise ApiError(400, f"replace must be true or false, got {replace_field[:20]!r}", "replace", "invalid_request")
    replace = replace_field in ("1", "true", "yes")
    wrong = [
        field
        for field, ok in (
            ("name", isinstance(name, str)),
            ("transcript", isinstance(transcript, str)),
            ("audio", upload is not None and not isinstance(upload, str)),
        )
        if not ok
    ]
    if wrong:
        raise ApiError(
            400,
            "POST /v1/voices takes multipart fields name, transcript and audio (the clip, sent as a file); "
            f"missing: {', '.join(wrong)}",
            wrong[0],
            "invalid_request",
        )
    data = await upload.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise _too_large(settings.max_upload_bytes)
    try:
        name = check_name(name)
        role = serving_role(name, settings.voice_map, settings.default_voice) if replace else None
        if role is not None:  # as DELETE says it
            said = f"{name!r} is the server's {role}: it cannot be replaced while the server runs"
            raise ApiError(409, said, "name", "voice_in_use")
        if name.lower() in settings.voice_map:  # requests naming it speak the map's voice
            target = settings.voice_map[name.lower()]
            raise VoiceError(
                f"{name!r} speaks the stored voice {target!r} here (the server's --voice-map): give the "
                "voice another name"
            )
        server.synth.voices.check_new(name, replace)
    except (VoiceExists, VoiceStorageError) as e:
        raise api_error(e) from None
    except VoiceError as e:
        raise ApiError(400, str(e), "name", "invalid_voice") from None
    # The client's file name, in messages: printable characters only (a NUL or a line break is no name).
    shown = "".join(c if c.isprintable() else "?" for c in Path(upload.filename or "clip.wav").name[-100:])
    voice = await server.synth.register_voice(name, data, shown or "clip.wav", transcript, replace)
    server.metrics.count(201)
    return {
        "name": voice.name,
        "transcript": voice.transcript,
        "duration_s": voice.duration_s,
        "frames": voice.frames,
        "created": voice.created,
        "warnings": list(voice.warnings),
    }


@router.delete("/v1/voices/{name}", responses=documented(400, 404, 409, 507))
def delete_voice(name: str, server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """Delete a stored voice: 404 when there is none of that name."""
    store = server.synth.voices
    try:
        name = check_name(name)
    except VoiceError as e:
        raise ApiError(400, str(e), "name", "invalid_voice") from None
    gone = ApiError(404, f"no voice named {name!r}", "name", "voice_not_found")
    if store.find(name) is None:
        raise gone
    role = serving_role(name, server.settings.voice_map, server.settings.default_voice)
    if role is not None:
        raise ApiError(
            409, f"{name!r} is the server's {role}: it cannot be deleted while the server runs", "name", "voice_in_use"
        )
    try:
        removed = store.remove(name)
    except VoiceStorageError as e:
        raise storage(e) from None
    except VoiceError:  # removed by another request since
        raise gone from None
    server.metrics.count(200)
    return {"name": removed.name.removesuffix(SUFFIX), "deleted": True}  # as it was stored: "ANA" removed "ana"


def _too_large(limit: int, size: int | None = None) -> ApiError:
    """413 for an upload over ``limit`` bytes (``size``: its content-length, when known)."""
    mb = 2**20
    got = f"is {size} bytes ({size / mb:.1f} MB), over" if size is not None else "is over"
    return ApiError(
        413,
        f"the upload {got} this server's limit of {limit} bytes ({limit / mb:.1f} MB, set by audio8 serve "
        "--max-upload-mb): send a clip of 0.5 to 30 s, as 16-bit or mono or in flac if it is large",
        "audio",
        "upload_too_large",
    )
