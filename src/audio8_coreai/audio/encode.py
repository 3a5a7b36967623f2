"""Encoded speech out (the HTTP API's response formats): a whole utterance, or bytes as it is made."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf
import soxr

from ..errors import AudioError
from ..settings import DEFAULTS
from .aac import AAC_RATES, AacWriter, pyav
from .mp3tag import gapless_tag, tag_span
from .samples import HOLD_NO_EMPTY, check_some, mono_samples, sample_rate_of

# Encoded speech for the HTTP API (OpenAI's response_format names). libsndfile (through soundfile) encodes all but
# aac: MP3 with LAME since libsndfile 1.1, Opus in Ogg since 1.0.29; a build without them gets a clear error; aac
# is PyAV's (aac.py; where av cannot be imported, an error naming its install). The model speaks at 44.1 kHz; a
# body at another rate is resampled (soxr, very high quality): Opus is defined at 48 kHz, pcm is 24 kHz unless
# asked otherwise (OpenAI's, :func:`output_rate`).
# wav and pcm are 16-bit signed little-endian samples (as OpenAI's), pcm without any header.
SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
OPUS_RATE = 48000
# Rates a body may be asked for (OpenAI-style clients ask 8-48 kHz); mp3 and aac take only the MPEG rates.
RATE_RANGE = (8000, 48000)
MPEG_RATES = AAC_RATES  # MPEG-1/2/2.5 layer III's nine rates are AAC's from 8 to 48 kHz
RESAMPLE_QUALITY = "VHQ"
_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
# Formats whose bytes can go out as they are made: a FLAC stream's header would give no length, which
# libsndfile-based readers refuse; every other format here plays from a partial download.
MP3_STREAM_LEVEL = 0.65  # a streamed mp3's libsndfile compression level at a constant bit rate: 128 kbit/s
STREAMABLE_FORMATS = ("wav", "pcm", "mp3", "opus", "aac")


def output_rate(fmt: str, model_rate: int, asked: int | None = None) -> int:
    """The sample rate (Hz) of a ``fmt`` body of speech made at ``model_rate``: opus always OPUS_RATE; else
    ``asked`` (a request's ``sample_rate`` or the server's); else pcm DEFAULTS.server.pcm_sample_rate (OpenAI's 24 kHz)
    and the rest ``model_rate``. Raises AudioError for ``asked`` outside RATE_RANGE, not one of MPEG_RATES for mp3
    and aac, or not OPUS_RATE for opus."""
    if fmt == "opus":
        if asked not in (None, OPUS_RATE):
            raise AudioError(
                f"opus is always {OPUS_RATE} Hz, not {asked}: leave sample_rate out, or use wav, pcm or flac"
            )
        return OPUS_RATE
    if asked is None:
        return DEFAULTS.server.pcm_sample_rate if fmt == "pcm" else model_rate
    if not RATE_RANGE[0] <= asked <= RATE_RANGE[1]:
        raise AudioError(f"sample_rate {asked} is out of range: give {RATE_RANGE[0]} to {RATE_RANGE[1]} Hz")
    if fmt in ("mp3", "aac") and asked not in MPEG_RATES:
        raise AudioError(
            f"{fmt} cannot be {asked} Hz: give one of {', '.join(map(str, MPEG_RATES))}, or use wav, pcm or flac"
        )
    return asked


def check_speech_format(fmt: str, stream: bool = False) -> None:
    """Raise AudioError unless ``fmt`` is one of SPEECH_FORMATS that this install encodes (libsndfile's formats;
    aac where av can be imported) and, when ``stream``, one of STREAMABLE_FORMATS; the message names what to use
    instead (or to install)."""
    if fmt not in SPEECH_FORMATS:
        raise AudioError(f"unknown response_format {fmt!r}: use one of {', '.join(SPEECH_FORMATS)}")
    if stream and fmt not in STREAMABLE_FORMATS:
        raise AudioError(
            f"{fmt} cannot be streamed (its header must give the length); use one of "
            f"{', '.join(STREAMABLE_FORMATS)} to stream, or {fmt} without streaming"
        )
    if fmt == "aac":
        pyav()
    if fmt in _SOUNDFILE:
        container, subtype = _SOUNDFILE[fmt]
        if container not in sf.available_formats() or subtype not in sf.available_subtypes(container):
            raise AudioError(
                f"this server's libsndfile {sf.__libsndfile_version__} cannot encode {fmt}; use wav, "
                "pcm or flac (or install libsndfile >= 1.1 with MP3 and Opus support)"
            )


def _body_rate(fmt: str, sample_rate: int, rate: int | None) -> int:
    """``rate`` checked by :func:`output_rate`; None: ``sample_rate`` as it is (opus: OPUS_RATE)."""
    if rate is None:
        return OPUS_RATE if fmt == "opus" else sample_rate
    return output_rate(fmt, sample_rate, rate)


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
    rewrites at close over bytes already handed out (an MP3's LAME tag, in its first frame) is lost: a stream
    cannot take it back. With ``mp3_tag``, the blank first frame LAME leaves for that tag goes out filled in
    with what is known when it is sent (:func:`mp3tag.gapless_tag`: the encoder delay, for decoders to trim)."""

    def __init__(self, mp3_tag: bool = False) -> None:
        super().__init__()
        self._sent = 0
        self._mp3_tag = mp3_tag

    def take(self) -> bytes:
        data = self.getbuffer()[self._sent :].tobytes()
        if self._sent == 0 and self._mp3_tag and data:
            data = gapless_tag(data[:4]) + data[tag_span(data[:4]) :]
        self._sent += len(data)
        return data


class SpeechEncoder:
    """Encode one utterance as it is made: ``write(chunk)`` and ``close()`` return the bytes ready to send.

    ``chunk`` float32 mono audio [n] in [-1, 1] at ``sample_rate`` Hz. ``fmt`` one of STREAMABLE_FORMATS: wav
    (a header whose sizes say 'until the end', as OpenAI's streamed wav), pcm, mp3 (constant bit rate, so a
    reader can tell the length from the size; 128 kbit/s; a LAME tag with the encoder delay and no length, see
    :mod:`.mp3tag`), opus (Ogg, 48 kHz) and aac (ADTS). ``rate``: the body's rate (None: ``sample_rate``; opus
    is OPUS_RATE whatever is given), reached by a streaming soxr resampler whose chunks joined equal
    :func:`encode_speech`'s one-shot resampling (the same samples: soxr's stream and one-shot share their
    filter). The bytes of all calls joined are a file that soundfile (aac: PyAV) reads. Raises AudioError as
    :func:`check_speech_format`, :func:`output_rate` and (each chunk) :func:`.samples.mono_samples`.
    """

    def __init__(self, fmt: str, sample_rate: int, rate: int | None = None):
        check_speech_format(fmt, stream=True)
        self.fmt = fmt
        self.sample_rate = sample_rate = sample_rate_of(sample_rate)
        self.rate = _body_rate(fmt, sample_rate, rate)
        self._header = _wav_header(self.rate, 0xFFFFFFFF) if fmt == "wav" else b""
        self._file: sf.SoundFile | AacWriter | None = None
        self._samples = 0  # written so far: a body of none is refused where the format holds none (check_some)
        self._resampler = None
        if self.rate != sample_rate:
            self._resampler = soxr.ResampleStream(sample_rate, self.rate, 1, dtype="float32", quality=RESAMPLE_QUALITY)
        if fmt == "aac":
            self._file = AacWriter(self.rate)
        elif fmt in _SOUNDFILE:
            container, subtype = _SOUNDFILE[fmt]
            self._sink = _Drain(mp3_tag=fmt == "mp3")
            # libsndfile's CBR level: 0.5 gave 160 kbit/s (twice the whole file's VBR), 0.65 gives the 128 said
            extra = {"bitrate_mode": "CONSTANT", "compression_level": MP3_STREAM_LEVEL} if fmt == "mp3" else {}
            self._file = sf.SoundFile(self._sink, "w", self.rate, 1, subtype, format=container, **extra)

    def _out(self, chunk: np.ndarray) -> bytes:
        if self._file is None:
            return _pcm16(chunk)
        if isinstance(self._file, AacWriter):
            return self._file.write(chunk)
        self._file.write(chunk)
        return self._sink.take()

    def write(self, chunk: np.ndarray) -> bytes:
        chunk = mono_samples(chunk)
        self._samples += len(chunk)
        head, self._header = self._header, b""
        if self._resampler is not None:
            chunk = self._resampler.resample_chunk(chunk)
        return head + self._out(chunk)

    def close(self) -> bytes:
        """The body's last bytes. Raises AudioError (:func:`.samples.check_some`) when no sample was written in a
        format that cannot hold none (its encoder released: nothing readable could follow)."""
        if self._samples == 0 and self.fmt in HOLD_NO_EMPTY:
            self.discard()
            check_some(np.zeros(0, np.float32), self.fmt)
        data, self._header = self._header, b""
        if self._resampler is not None:
            data += self._out(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        file, self._file = self._file, None
        if isinstance(file, AacWriter):
            return data + file.close()
        if file is not None:
            file.close()
            data += self._sink.take()
        return data

    def discard(self) -> None:
        """Release an utterance left unfinished (its client left): the encoder is closed while its sink is still
        open, and nothing more is sent. Without it the garbage collector may close the sink first, and
        libsndfile's last write then fails in a callback ("Exception ignored" in the log). After :meth:`close`
        it does nothing."""
        file, self._file = self._file, None
        if file is not None:
            file.close()


def encode_speech(audio: np.ndarray, sample_rate: int, fmt: str, rate: int | None = None) -> bytes:
    """Mono float32 ``audio`` [N] at ``sample_rate`` Hz as a complete file (or raw pcm) in ``fmt``, at ``rate``
    Hz (None: ``sample_rate``; opus is always OPUS_RATE), resampled by soxr (very high quality).

    wav, pcm: 16-bit signed little-endian (wav with exact sizes); flac 16-bit, the samples of wav; mp3 (LAME,
    variable bit rate, gapless length tag); opus (Ogg); aac (ADTS, PyAV). The same audio gives the same bytes in
    every format but opus (Ogg numbers each stream at random). Raises AudioError as :func:`check_speech_format`,
    :func:`output_rate`, :func:`.samples.mono_samples` and :func:`.samples.check_some` (no samples as flac, mp3,
    aac or opus), and for a ``sample_rate`` no whole number.
    """
    check_speech_format(fmt)
    sample_rate = sample_rate_of(sample_rate)
    rate = _body_rate(fmt, sample_rate, rate)
    audio = mono_samples(audio)
    check_some(audio, fmt)
    if rate != sample_rate:
        audio = soxr.resample(audio, sample_rate, rate, quality=RESAMPLE_QUALITY).astype(np.float32)
    if fmt == "pcm":
        return _pcm16(audio)
    if fmt == "wav":
        data = _pcm16(audio)
        return _wav_header(rate, len(data)) + data
    if fmt == "aac":
        writer = AacWriter(rate)
        return writer.write(audio) + writer.close()
    container, subtype = _SOUNDFILE[fmt]
    if fmt == "flac":  # the 16-bit samples of wav and pcm (libsndfile would round floats its own way, +-1)
        audio = np.frombuffer(_pcm16(audio), "<i2")
    buf = io.BytesIO()
    sf.write(buf, audio, rate, subtype=subtype, format=container)
    return buf.getvalue()
