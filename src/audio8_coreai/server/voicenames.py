"""What a request's ``voice`` means on this server: a stored voice, an OpenAI name mapped onto one
(``serve --voice-map``), or the default voice (``serve --default-voice``, else the model's own voice with a fixed
seed, so requests naming no voice and no seed get one steady speaker)."""

from __future__ import annotations

import logging

from ..errors import ConfigError, DamagedVoice, VoiceError
from ..voice_rules import DEFAULT_VOICE
from ..voices import Voice, VoiceStore, check_name
from .errors import ApiError

# OpenAI's voice names: a client written for OpenAI sends one of these; without a stored or mapped voice of that
# name it gets the default voice rather than an error.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"}
)
log = logging.getLogger("audio8_coreai.server")


def parse_voice_map(text: str) -> dict[str, str]:
    """``"alloy=ana,echo=bob"`` as ``{"alloy": "ana", "echo": "bob"}`` (names checked as voice names, keys
    lower-cased as OpenAI's are matched). Raises ConfigError for a pair without ``=``, a bad name or a name mapped
    twice."""
    mapping = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, sep, target = (s.strip() for s in pair.partition("="))
        try:
            if not sep:
                raise VoiceError("a pair has no '='")
            key = check_name(name).lower()
            if key in mapping:
                raise VoiceError(f"{name!r} is mapped twice (names differing only in case are one)")
            mapping[key] = check_name(target)
        except VoiceError as e:
            raise ConfigError(
                f"--voice-map {pair!r}: {e}; give pairs NAME=STORED_VOICE separated by commas, e.g. alloy=ana,echo=bob",
                "voice_map",
            ) from None
    return mapping


def check_voices(store: VoiceStore, voice_map: dict[str, str], default_voice: str | None, fingerprint: str) -> None:
    """Refuse, at start, a ``--voice-map`` target or ``--default-voice`` that is not a readable stored voice of this
    checkpoint (``fingerprint``): raises VoiceError naming the setting and the remedy."""
    named = [(f"--voice-map {k}={v}", v) for k, v in voice_map.items()]
    if default_voice is not None:
        named.append((f"--default-voice {default_voice}", default_voice))
    for setting, name in named:
        try:
            store.load(name, fingerprint)
        except VoiceError as e:
            raise VoiceError(f"{setting}: {e}") from None


def serving_role(name: str, voice_map: dict[str, str], default_voice: str | None) -> str | None:
    """What the stored voice ``name`` serves as under the server's settings (any case): ``--voice-map alloy=NAME``
    or ``--default-voice NAME``; None when neither. Such a voice may not be replaced or deleted through the API
    while the server runs (a client would take over every request for those names)."""
    key = name.lower()
    roles = [f"--voice-map {k}={v}" for k, v in voice_map.items() if v.lower() == key]
    if default_voice is not None and default_voice.lower() == key:
        roles.append(f"--default-voice {default_voice}")
    return ", ".join(roles) or None


def resolve(name: str | None, store: VoiceStore, voice_map: dict[str, str], default_voice: str | None) -> Voice | None:
    """The voice a request's ``name`` asks for: its ``voice_map`` target (the operator's map wins over a stored voice
    of the same name); else a stored voice of that name; else, for None, DEFAULT_VOICE or an OpenAI name, the
    ``default_voice`` (None: the model's own voice). Raises ApiError 400 voice_not_found for any other name,
    VoiceError for a damaged stored voice (DamagedVoice), ApiError 500 mapped_voice_missing (logged) when a voice
    the server's settings name is no longer stored."""
    key = None if name is None else name.lower()
    if key in voice_map:
        return _mapped(store, voice_map[key], f"--voice-map {key}={voice_map[key]}")
    if name is not None and store.find(name) is not None:
        return store.load(name)
    if key is None or key == DEFAULT_VOICE or key in OPENAI_VOICES:
        return None if default_voice is None else _mapped(store, default_voice, f"--default-voice {default_voice}")
    raise ApiError(
        400,
        f"no voice named {name!r}: GET /v1/audio/voices lists the voices (OpenAI's names, such as alloy, and "
        f"{DEFAULT_VOICE!r} speak in the default voice)",
        "voice",
        "voice_not_found",
    )


def _mapped(store: VoiceStore, name: str, setting: str) -> Voice:
    """The stored voice ``name`` that the server's ``setting`` names. It was there at start (:func:`check_voices`)
    and the API refuses to delete it, but a server sharing the voice folder may have: ApiError 500, logged."""
    try:
        return store.load(name)
    except DamagedVoice:
        raise
    except VoiceError:
        log.warning("%s names the stored voice %r, which is gone from %s", setting, name, store.root)
        raise ApiError(
            500,
            f"this server's {setting} names the stored voice {name!r}, which is no longer stored (deleted through "
            "another server sharing the voice folder?): its operator registers it again (POST /v1/voices) or "
            "changes the setting",
            "voice",
            "mapped_voice_missing",
        ) from None
