"""Encoded speech out (the HTTP API's response formats): a whole utterance, or bytes as it is made."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
import soxr

from ..errors import AudioError

# Encoded speech for the HTTP API (OpenAI's response_format names). libsndfile (through soundfile) encodes them
# all: MP3 with LAME since libsndfile 1.1, Opus in Ogg since 1.0.29; a build without them gets a clear error.
# The model speaks at 44.1 kHz; Opus is defined at 48 kHz, so opus is resampled (soxr, very high quality).
# wav and pcm are 16-bit signed little-endian samples (as OpenAI's), pcm without any header.
SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus")
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg"}
OPUS_RATE = 48000
_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
# Formats whose bytes can go out as they are made: a FLAC stream's header would give no length, which
# libsndfile-based readers refuse; every other format here plays from a partial download.
STREAMABLE_FORMATS = ("wav", "pcm", "mp3", "opus")


def check_speech_format(fmt: str, stream: bool = False) -> None:
    """Raise AudioError unless ``fmt`` is one of SPEECH_FORMATS that this libsndfile encodes (and, when
    ``stream``, one of STREAMABLE_FORMATS); the message names what to use instead."""
    if fmt not in SPEECH_FORMATS:
        raise AudioError(f"unknown response_format {fmt!r}: use one of {', '.join(SPEECH_FORMATS)}")
    if stream and fmt not in STREAMABLE_FORMATS:
        raise AudioError(
            f"{fmt} cannot be streamed (its header must give the length); use one of "
            f"{', '.join(STREAMABLE_FORMATS)} to stream, or {fmt} without streaming"
        )
    if fmt in _SOUNDFILE:
        container, subtype = _SOUNDFILE[fmt]
        if container not in sf.available_formats() or subtype not in sf.available_subtypes(container):
            raise AudioError(
                f"this server's libsndfile {sf.__libsndfile_version__} cannot encode {fmt}; use wav, "
                "pcm or flac (or install libsndfile >= 1.1 with MP3 and Opus support)"
            )


def _pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def _wav_header(sample_rate: int, data_bytes: int) -> bytes:
    """A 44-byte RIFF header for mono 16-bit PCM; ``data_bytes`` 0xFFFFFFFF means 'until the end' (streams)."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (
        b"RIFF"
        + riff.to_bytes(4, "little")
        + b"WAVEfmt "
        + (16).to_bytes(4, "little")
        + (1).to_bytes(2, "little")
        + (1).to_bytes(2, "little")
        + sample_rate.to_bytes(4, "little")
        + (2 * sample_rate).to_bytes(4, "little")
        + (2).to_bytes(2, "little")
        + (16).to_bytes(2, "little")
        + b"data"
        + data_bytes.to_bytes(4, "little")
    )


class _Drain(io.BytesIO):
    """A BytesIO for libsndfile to write into, handing out each byte once as it is written. What libsndfile
    rewrites at close over bytes already handed out (the length in an MP3's first frame) is lost: a stream
    cannot take it back."""

    def __init__(self) -> None:
        super().__init__()
        self._sent = 0

    def take(self) -> bytes:
        data = self.getbuffer()[self._sent :].tobytes()
        self._sent += len(data)
        return data


class SpeechEncoder:
    """Encode one utterance as it is made: ``write(chunk)`` and ``close()`` return the bytes ready to send.

    ``chunk`` float32 mono audio [n] in [-1, 1] at ``sample_rate`` Hz. ``fmt`` one of STREAMABLE_FORMATS: wav
    (a header whose sizes say 'until the end', as OpenAI's streamed wav), pcm, mp3 (constant bit rate, so a
    reader can tell the length from the size; 128 kbit/s) and opus (Ogg, 48 kHz). The bytes of all calls
    joined are a file that soundfile reads. Raises AudioError as :func:`check_speech_format`.
    """

    def __init__(self, fmt: str, sample_rate: int):
        check_speech_format(fmt, stream=True)
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._header = _wav_header(sample_rate, 0xFFFFFFFF) if fmt == "wav" else b""
        self._file: sf.SoundFile | None = None
        self._resampler = None
        if fmt in _SOUNDFILE:
            container, subtype = _SOUNDFILE[fmt]
            rate = sample_rate
            if fmt == "opus":
                rate = OPUS_RATE
                self._resampler = soxr.ResampleStream(sample_rate, OPUS_RATE, 1, dtype="float32", quality="VHQ")
            self._sink = _Drain()
            extra = {"bitrate_mode": "CONSTANT", "compression_level": 0.5} if fmt == "mp3" else {}
            self._file = sf.SoundFile(self._sink, "w", rate, 1, subtype, format=container, **extra)

    def write(self, chunk: np.ndarray) -> bytes:
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        head, self._header = self._header, b""
        if self._file is None:
            return head + _pcm16(chunk)
        if self._resampler is not None:
            chunk = self._resampler.resample_chunk(chunk)
        self._file.write(chunk)
        return self._sink.take()

    def close(self) -> bytes:
        if self._file is None:
            return self._header
        if self._resampler is not None:
            self._file.write(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        self._file.close()
        return self._sink.take()


def encode_speech(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Mono float32 ``audio`` [N] at ``sample_rate`` Hz as a complete file (or raw pcm) in ``fmt``.

    wav, pcm: 16-bit signed little-endian (wav with exact sizes); flac 16-bit, the same samples; mp3 (LAME,
    variable bit rate, gapless length tag); opus (Ogg, resampled to 48 kHz). The same audio gives the same bytes in
    every format but opus (Ogg numbers each stream at random). Raises AudioError as :func:`check_speech_format`.
    """
    check_speech_format(fmt)
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if fmt == "pcm":
        return _pcm16(audio)
    if fmt == "wav":
        data = _pcm16(audio)
        return _wav_header(sample_rate, len(data)) + data
    container, subtype = _SOUNDFILE[fmt]
    if fmt == "flac":  # the 16-bit samples of wav and pcm (libsndfile would round floats its own way, +-1)
        audio = np.frombuffer(_pcm16(audio), "<i2")
    if fmt == "opus":
        audio = soxr.resample(audio, sample_rate, OPUS_RATE, quality="VHQ").astype(np.float32)
        sample_rate = OPUS_RATE
    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, subtype=subtype, format=container)
    return buf.getvalue()
