"""Audio in and out: reference clips read and checked, speech written to files (one atomic publish) or encoded."""

from ..errors import AudioError
from .encode import MEDIA_TYPES, SPEECH_FORMATS, STREAMABLE_FORMATS, SpeechEncoder, check_speech_format, encode_speech
from .files import check_writable, open_audio_writer, partial_path, publish, write_audio
from .reference import REFERENCE_RATE, ReferenceInfo, read_reference

__all__ = [
    "MEDIA_TYPES",
    "REFERENCE_RATE",
    "SPEECH_FORMATS",
    "STREAMABLE_FORMATS",
    "AudioError",
    "ReferenceInfo",
    "SpeechEncoder",
    "check_speech_format",
    "check_writable",
    "encode_speech",
    "open_audio_writer",
    "partial_path",
    "publish",
    "read_reference",
    "write_audio",
]
