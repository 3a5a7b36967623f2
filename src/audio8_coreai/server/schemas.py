"""The request bodies of the HTTP API, validated by pydantic: types, ranges and choices in the fields; what a
field may not be (an empty input, a bad voice name) in validators that give our error code (:func:`refusal`).
Limits set per server (input length, frame cap) are checked by the route."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..audio import (
    MPEG_RATES,
    OPUS_RATE,
    RATE_RANGE,
    SPEECH_FORMATS,
    STREAMABLE_FORMATS,
    check_speech_format,
    check_speed,
)
from ..errors import AudioError, PromptError, VoiceError
from ..packages import require
from ..request import MAX_SEED
from ..text import check_unicode
from ..voices import check_name

SpeechFormat = Literal[SPEECH_FORMATS]  # wav | pcm | flac | mp3 | opus | aac

# The voice as the schema says it: a name, or OpenAI's custom-voice object {"id": NAME} (the validator takes both).
VOICE_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"], "additionalProperties": False},
        {"type": "null"},
    ],
    "description": 'a stored voice\'s name (or {"id": NAME}), or an OpenAI name such as alloy for the default voice',
}


def refusal(code: str, message: str) -> PydanticCustomError:
    """A schema error whose API error code is ``code`` (see :func:`.errors.schema_error`)."""
    return PydanticCustomError(code, message, {"code": code})


class SpeechRequest(BaseModel):
    """The body of ``POST /v1/audio/speech``; see :mod:`audio8_coreai.server`. Unknown fields are ignored, but for
    ``ref_audio`` and ``ref_text`` (the Python API's one-off clip, which would be ignored without a word).

    Whole numbers (``seed``, ``top_k``, ``max_frames``, ``sample_rate``) are JSON integers only, other numbers
    (``speed``, ``temperature``, ``top_p``) JSON numbers only, and ``stream`` JSON true or false only: true, 1.5 or
    "7" as a seed, "0.7" as a temperature and "yes" or "false" as a choice are mistakes, not values. ``model`` is
    echoed in the ``X-Model`` header, so it must be one: at most 256 printable Latin-1 characters. The sampling
    ranges are the checkpoint's own (:meth:`.config.GenerationConfig.check`).

    As OpenAI's: ``voice`` a name or ``{"id": NAME}``; ``speed`` 0.25-4.0 (a time stretch, pitch kept);
    ``stream_format`` ``sse`` (events ``speech.audio.delta`` then ``speech.audio.done``, a streamable format);
    ``instructions`` accepted and ignored (the model takes no style prompt; the response says so in a header).
    Our extras: ``sample_rate`` (Hz), the body's rate (default: pcm 24 kHz as OpenAI's, the others 44.1 kHz);
    ``stream`` (absent: as OpenAI's, the audio is sent as it is made in every format that can be, whole in flac;
    true: streamed, refused for flac; false: the whole file with its lengths, refused with sse), see
    :attr:`streamed`."""

    model_config = ConfigDict(extra="ignore")

    model: str = "audio8-tts"
    input: str = Field(description="the text to speak: at most the server's max_input_chars (4096 unless set)")
    voice: Annotated[str | None, WithJsonSchema(VOICE_SCHEMA)] = None
    stream: StrictBool | None = None  # before response_format, whose validator reads it
    response_format: SpeechFormat = "mp3"
    speed: StrictFloat = Field(1.0, ge=0.25, le=4.0, allow_inf_nan=False)  # OpenAI's range: a time stretch
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = None
    seed: StrictInt | None = Field(None, ge=0, le=MAX_SEED)
    temperature: StrictFloat | None = Field(None, gt=0, allow_inf_nan=False)
    top_p: StrictFloat | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: StrictInt | None = Field(None, ge=1)
    max_frames: StrictInt | None = Field(None, ge=1)
    sample_rate: StrictInt | None = Field(
        None,
        ge=RATE_RANGE[0],
        le=RATE_RANGE[1],
        description=f"Hz; mp3 and aac take {', '.join(map(str, MPEG_RATES))}; opus only {OPUS_RATE}",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_clip(cls, body: object) -> object:
        # The Python API's and the CLI's one-off clip: ignored with the other unknown fields, the speech came in the
        # default voice without a word
        if isinstance(body, dict) and body.keys() & {"ref_audio", "ref_text"}:
            raise refusal(
                "invalid_request",
                "ref_audio and ref_text are the Python API's and the CLI's: over HTTP register the clip with "
                "POST /v1/voices (name, transcript, audio) and give that name as voice",
            )
        return body

    @field_validator("model")
    @classmethod
    def _header_safe(cls, model: str) -> str:
        if len(model) > 256 or any(not (" " <= c <= "~" or "\xa0" <= c <= "\xff") for c in model):
            raise refusal(
                "invalid_model",
                f"model {ascii(model[:80])} cannot be echoed in the X-Model header: send a name of at most 256 "
                "printable Latin-1 characters (no control characters, line breaks or other scripts), e.g. tts-1",
            )
        return model

    @field_validator("input")
    @classmethod
    def _utf8(cls, text: str) -> str:
        try:  # what can be echoed and encoded; whether it says anything is check_request's (the router's 400)
            return check_unicode(text, "input", "input")
        except PromptError as e:
            raise refusal("invalid_input", str(e)) from None

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_id(cls, voice: object) -> object:
        # OpenAI's custom-voice object {"id": NAME} names the voice NAME
        if isinstance(voice, dict) and set(voice) == {"id"} and isinstance(voice["id"], str):
            return voice["id"]
        if voice is None or isinstance(voice, str):
            return voice
        raise refusal("invalid_request", f'voice must be a name or {{"id": NAME}}, got {_json_kind(voice)}')

    @field_validator("voice")
    @classmethod
    def _voice_name(cls, name: str | None) -> str | None:
        try:
            return None if name is None else check_name(name)
        except VoiceError as e:
            raise refusal("invalid_voice", str(e)) from None

    @field_validator("response_format")
    @classmethod
    def _encodable(cls, fmt: str, info: ValidationInfo) -> str:
        try:  # streamable when stream is asked (absent: a flac is sent whole), encoded by this server (its
            # libsndfile; av for aac)
            check_speech_format(fmt, info.data.get("stream") is True)
        except AudioError as e:
            raise refusal("unsupported_format", str(e)) from None
        return fmt

    @field_validator("speed")
    @classmethod
    def _stretchable(cls, speed: float) -> float:
        try:  # any speed but 1.0 is a time stretch: pedalboard's
            check_speed(speed)
        except AudioError as e:
            raise refusal("unsupported_speed", str(e)) from None
        return speed

    @field_validator("stream_format")
    @classmethod
    def _sse_streams(cls, stream_format: str, info: ValidationInfo) -> str:
        if stream_format != "sse":
            return stream_format
        if info.data.get("stream") is False:  # events are sent as the speech is made: no whole file to give
            raise refusal(
                "unsupported_stream_format",
                'stream_format "sse" sends the speech as events while it is made: drop "stream": false, or ask '
                'stream_format "audio" for the whole file',
            )
        try:  # the events are sse-starlette's
            require("sse_starlette", AudioError)
        except AudioError as e:
            raise refusal("unsupported_stream_format", str(e)) from None
        fmt = info.data.get("response_format")
        if fmt is not None:  # sent as it is made: the format must stream
            try:
                check_speech_format(fmt, True)
            except AudioError as e:
                raise refusal("unsupported_format", str(e)) from None
        return stream_format

    @property
    def streamed(self) -> bool:
        """Whether the answer is sent as it is made: always with ``stream_format`` sse; else as ``stream`` says,
        and without it in every format that can be (:data:`...audio.STREAMABLE_FORMATS`: a streamed flac's header
        gives no length, which libsndfile's readers refuse, so flac stays whole)."""
        if self.stream_format == "sse":
            return True
        return self.response_format in STREAMABLE_FORMATS if self.stream is None else self.stream


def _json_kind(value: object) -> str:
    """What a JSON value is, in words, for a message: an object names its keys."""
    if isinstance(value, dict):
        return f"an object with keys {', '.join(map(str, value)) or '(none)'}" + (
            " (id not a string)" if set(value) == {"id"} else ""
        )
    return {list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "another value")


class ErrorDetail(BaseModel):
    """What a refusal says: ``message`` (what to change), ``type`` (invalid_request_error for 4xx, server_error for
    5xx), ``param`` (the field, when one is to blame) and ``code`` (for programs)."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The body of every refusal, OpenAI's shape (documented in the OpenAPI schema; built by :mod:`.errors`)."""

    error: ErrorDetail
