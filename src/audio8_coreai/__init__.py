"""audio8-coreai: Audio8-TTS-Preview-0.6b from the publisher's checkpoint, in PyTorch and Apple Core AI.

Public API::

    from audio8_coreai import TTS
    tts = TTS.load("Audio8/Audio8-TTS-Preview-0.6b")   # or a local checkpoint folder
    audio, sample_rate = tts.synthesize("Hello, world!", seed=0)
    tts.register_voice("ana", "ana.wav", "What the clip says.")   # a cloned voice, stored by name
    audio, sample_rate = tts.synthesize("Hello again.", voice="ana")
    for chunk in tts.stream("A long text. Spoken as it is made."):   # float32 chunks, exact to the whole
        ...

Every error raised on purpose is an :class:`Audio8Error`; its message says what to change. Exported here too:
ConfigError, CheckpointError, PrecisionError, PromptError (PromptTooLong), AudioError, VoiceError (VoiceExists,
DamagedVoice, VoiceStorageError), EngineError (NoAudio: the model ended at once) and BackendError; the tools'
own (AssetError, ParityError, GateError...) live in :mod:`audio8_coreai.errors`.
"""

import importlib
from typing import TYPE_CHECKING

from .errors import (
    Audio8Error,
    AudioError,
    BackendError,
    CheckpointError,
    ClipWarning,
    ConfigError,
    DamagedVoice,
    EngineError,
    NoAudio,
    PrecisionError,
    PromptError,
    PromptTooLong,
    UnsupportedLanguageWarning,
    VoiceError,
    VoiceExists,
    VoiceStorageError,
)

if TYPE_CHECKING:
    from .tts import TTS, Synthesis
    from .voices import Voice, VoiceStore

_LATER = {"TTS": "tts", "Synthesis": "tts", "Voice": "voices", "VoiceStore": "voices"}


def __getattr__(name: str) -> object:
    """TTS, Synthesis, Voice and VoiceStore, imported on first use: importing the package and its errors reads no
    settings yet, so the ``audio8`` command says a wrong AUDIO8_* variable in one line (cli/__init__.py)."""
    if name not in _LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LATER[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "TTS",
    "Synthesis",
    "Voice",
    "VoiceStore",
    "Audio8Error",
    "AudioError",
    "BackendError",
    "CheckpointError",
    "ConfigError",
    "EngineError",
    "UnsupportedLanguageWarning",
    "ClipWarning",
    "PromptError",
    "VoiceError",
    "PrecisionError",
    "PromptTooLong",
    "VoiceExists",
    "DamagedVoice",
    "VoiceStorageError",
    "NoAudio",
]
__version__ = "0.1.0"
