"""Every error this package raises on purpose: :class:`Audio8Error` and its subclasses, one taxonomy.

A caller catches them in one ``except Audio8Error`` (the CLI and the server do) and shows the message, which
says what to do. Anything else escaping the package is a bug.
"""

from __future__ import annotations


class Audio8Error(Exception):
    """An input, file or setting this package cannot use; the message names it and what to change. ``field`` names
    the request's input or setting it is about when there is one (``text``, ``seed``, ``max_frames``...), for the
    HTTP error's ``param``."""

    def __init__(self, message: str = "", field: str | None = None):
        super().__init__(message)
        self.field = field


class ConfigError(Audio8Error, ValueError):
    """A config file is missing a key, has a wrong type or describes another model, or a setting is out of
    range (``field``: that setting, when there is one)."""


class CheckpointError(Audio8Error):
    """A checkpoint cannot be found, read or used; the message names the file and what to do."""


class PrecisionError(Audio8Error, ValueError):
    """A precision name that does not exist, or that the chosen runtime does not run."""


class PromptError(Audio8Error, ValueError):
    """The text, reference or prompt length cannot make a valid prompt; the message says what to change."""


class PromptTooLong(PromptError):
    """A well-formed prompt that, with the frames asked for, does not fit the context (``max_seq_len``)."""


class TokenizerError(CheckpointError, ValueError):
    """A checkpoint's tokenizer file is missing or unreadable, or a rebuilt tokenizer came out inconsistent."""


class AudioError(Audio8Error, ValueError):
    """An audio file cannot be written (or read) as asked; the message says what to do."""


class VoiceError(Audio8Error, ValueError):
    """A voice cannot be named, saved, found, read or used as asked; the message says what to do."""


class DamagedVoice(VoiceError):
    """A stored voice file that cannot be read (damaged, or written by a newer version); ``name`` is the voice's.
    The message gives the file and the CLI's remedy; a server says its own (its clients see no paths)."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


class VoiceExists(VoiceError):
    """A voice of that name is already stored and replacing it was not asked for; ``name`` is the stored one's."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


class VoiceStorageError(VoiceError):
    """The voice store's folder cannot be written or changed (a full disk: ``full``; read-only, not permitted). The
    message names the folder and the CLI's remedy; a server says its own (its clients see no paths)."""

    def __init__(self, message: str, full: bool = False):
        super().__init__(message)
        self.full = full


class BackendError(Audio8Error, ValueError):
    """A device, precision, backend or asset folder that cannot be used as asked."""


class EngineError(Audio8Error, ValueError):
    """An utterance that cannot be generated as asked (it does not fit the context, or its stream was
    overtaken by another utterance on the same backend)."""


class AssetError(BackendError):
    """A Core AI asset folder that is missing, incomplete, stale, or converted from another checkpoint."""


class QuantError(Audio8Error, RuntimeError):
    """The low-precision kernels are unavailable (onnxruntime missing) or a shape does not fit them."""


class ParityError(Audio8Error, ValueError):
    """The fixture file is missing, unreadable or was recorded for another checkpoint."""


class GateError(Audio8Error, ValueError):
    """The gate cannot run as asked (bad fixtures file, no espeak-ng for a clip, missing extra)."""


class ProtocolError(Audio8Error, ValueError):
    """A Wyoming event that is malformed (a field missing or of the wrong type) or out of order."""


class NoAudio(EngineError):
    """The model ended every utterance of a request on its first frame (eos drawn at once): no audio to send."""


class ClipWarning(UserWarning):
    """A warning, not an error: a reference clip that will clone less well (clipped, quiet, a low sample rate, over
    full scale; audio/reference.py): the voice is made all the same."""


class UnsupportedLanguageWarning(UserWarning):
    """A warning, not an error: text in a script none of the languages this port measures uses, or written
    Cantonese (text/languages.py); it is spoken all the same, possibly as noise or not at all."""
