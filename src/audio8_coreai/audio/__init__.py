"""Audio in and out: reference clips read and checked, speech written to files (one atomic publish) or encoded."""

from ..errors import AudioError
from .encode import (
    MEDIA_TYPES,
    MPEG_RATES,
    OPUS_RATE,
    RATE_RANGE,
    SPEECH_FORMATS,
    STREAMABLE_FORMATS,
    SpeechEncoder,
    check_speech_format,
    encode_speech,
    output_rate,
)
from .files import check_writable, open_audio_writer, partial_path, publish, write_audio
from .reference import REFERENCE_RATE, ReferenceInfo, read_reference
from .stretch import StreamStretcher, check_speed, time_stretch

__all__ = [
    "MEDIA_TYPES",
    "MPEG_RATES",
    "OPUS_RATE",
    "RATE_RANGE",
    "REFERENCE_RATE",
    "SPEECH_FORMATS",
    "STREAMABLE_FORMATS",
    "StreamStretcher",
    "AudioError",
    "ReferenceInfo",
    "SpeechEncoder",
    "check_speech_format",
    "check_speed",
    "check_writable",
    "encode_speech",
    "open_audio_writer",
    "partial_path",
    "output_rate",
    "publish",
    "read_reference",
    "time_stretch",
    "write_audio",
]
