"""Audio files: read a reference clip for voice cloning; write synthesized speech."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from .errors import Audio8Error

# Formats written by extension; soundfile (libsndfile) encodes them all.
WRITE_FORMATS = {".wav": ("WAV", "FLOAT"), ".flac": ("FLAC", "PCM_24"), ".ogg": ("OGG", "VORBIS")}


class AudioError(Audio8Error, ValueError):
    """An audio file cannot be written (or read) as asked; the message says what to do."""


def write_audio(path: str | Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write mono float32 ``audio`` [N] (in [-1, 1]) at ``sample_rate`` Hz to ``path``.

    The format follows the extension: ``.wav`` (32-bit float), ``.flac`` (24-bit), ``.ogg`` (Vorbis).
    The file is written beside its target under a temporary name and renamed into place, so an
    interrupted write never leaves a truncated file and never clobbers an existing one half-way.

    Raises:
        AudioError: unknown extension, a missing or unwritable folder, or a path that is a folder.
    """
    path, folder = check_writable(path)
    ext = path.suffix.lower()
    fmt, subtype = WRITE_FORMATS[ext]
    data = np.asarray(audio, dtype=np.float32).reshape(-1)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=ext, dir=folder)
        os.close(fd)
        sf.write(tmp, data, sample_rate, format=fmt, subtype=subtype)
        publish(tmp, path)
    except (OSError, sf.LibsndfileError) as e:
        raise _write_error(path, folder, e) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _write_error(path: Path, folder: Path, e: BaseException) -> AudioError:
    """AudioError for a failed write of ``path``; libsndfile says only 'System error.' when the disk is full."""
    try:
        full = shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        full = False
    return AudioError(f"cannot write {path}: {e}" + (" (the disk is full: free some space or write elsewhere)"
                                                     if full else ""))


def check_writable(path: str | Path) -> tuple[Path, Path]:
    """``(path, its folder)`` if an audio file can be written there (see :func:`write_audio`), else AudioError."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in WRITE_FORMATS:
        raise AudioError(f"cannot write {path.name!r}: use a .wav, .flac or .ogg file name")
    if path.is_dir():
        raise AudioError(f"{path} is a folder: give a file name such as {path / 'speech.wav'}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise AudioError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise AudioError(f"cannot write {path}: no permission to write in {folder}")
    return path, folder


def partial_path(path: str | Path) -> Path:
    """Where :func:`open_audio_writer` grows the audio for ``path``: ``.NAME.partial.EXT`` beside it."""
    path = Path(path)
    return path.parent / f".{path.stem}.partial{path.suffix}"


@contextlib.contextmanager
def open_audio_writer(path: str | Path, sample_rate: int) -> Iterator[sf.SoundFile]:
    """Write mono audio at ``sample_rate`` Hz to ``path`` chunk by chunk, as it is made (``say --stream``).

    Formats as :func:`write_audio`. The audio grows in ``.NAME.partial.EXT`` beside ``path`` with every
    ``write(chunk float32 [n])`` (call ``flush()`` after each to keep a wav's header sizes current, so the file so
    far plays) and becomes ``path`` when the block ends without an error; an interrupted run (an exception in the
    block) leaves ``path`` as it was (an existing file is never clobbered) and the audio made until then in the
    partial file, which is removed when it holds none.
    Raises AudioError as :func:`write_audio`.
    """
    path, folder = check_writable(path)
    fmt, subtype = WRITE_FORMATS[path.suffix.lower()]
    partial = partial_path(path)
    try:
        f = sf.SoundFile(str(partial), "w", sample_rate, 1, subtype, format=fmt)
    except (OSError, sf.LibsndfileError) as e:
        raise _write_error(partial, folder, e) from e
    try:
        with f:
            yield _ChunkWriter(f, partial, folder)
    except BaseException:
        if f.frames == 0:  # nothing was made: no partial file to keep
            partial.unlink(missing_ok=True)
        raise
    publish(partial, path)


class _ChunkWriter:
    """:func:`open_audio_writer`'s file: ``write(chunk)``, ``flush()`` and ``frames`` of a ``soundfile.SoundFile``,
    whose failures (a full disk mid-stream) raise AudioError naming the partial file."""

    def __init__(self, f: sf.SoundFile, partial: Path, folder: Path):
        self._f, self._partial, self._folder = f, partial, folder

    @property
    def frames(self) -> int:
        return self._f.frames

    def write(self, chunk: np.ndarray) -> None:
        self._call(self._f.write, chunk)

    def flush(self) -> None:
        self._call(self._f.flush)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except (OSError, sf.LibsndfileError) as e:
            raise _write_error(self._partial, self._folder, e) from e


def _read_umask() -> int:
    mask = os.umask(0)  # the only way to read it; done once, at import, before any thread writes files
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def publish(tmp: str | Path, path: Path) -> None:
    """Rename the finished file ``tmp`` over ``path`` (atomic), with the usual permissions (0666 less the
    umask; ``mkstemp`` makes its files owner-only). Raises AudioError when it cannot."""
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except OSError as e:
        raise AudioError(f"cannot write {path}: {e}") from e


# Reference clips for voice cloning. The publisher's processor takes any length and level (SPEC.md section 9);
# these limits are ours (DESIGN.md pipeline, issue 4): under half a second there is too little of the voice to
# copy, and past 30 s the reference crowds out the frames in the context.
REFERENCE_RATE = 44100  # the codec's sample rate: the encoder sees 44.1 kHz mono only
MIN_REFERENCE_S = 0.5
MAX_REFERENCE_S = 30.0
LOW_RATE_HZ = 16000  # below this the clip lacks the upper speech band, so the clone sounds muffled
SILENCE_WINDOW_S = 0.02  # 20 ms: shorter than a syllable, longer than one pitch period
SILENCE_DBFS = -50.0  # a window whose RMS is below this holds no speech
MIN_SOUND_SHARE = 0.1  # fewer windows of sound than this share: "nearly all silence"
LOW_PEAK_DBFS = -30.0  # a peak below this is a very quiet recording (speech usually peaks near -6 dBFS)
FULL_SCALE = 0.999  # |sample| at or above this counts as full scale (int16 full scale is 0.99997)
CLIP_RUN = 3  # clipping flattens the waveform into runs of equal full-scale samples; a crest never repeats
CLIP_SHARE = 1e-4  # clipped samples above this share of the clip get a warning; a stray run is harmless


@dataclass
class ReferenceInfo:
    """What :func:`read_reference` found in a clip.

    ``sample_rate`` (Hz), ``channels`` and ``duration_s`` (seconds) are the source file's; ``format`` and
    ``subtype`` are libsndfile's names (e.g. ``WAV``/``PCM_16``, ``FLAC``/``PCM_24``); ``peak_dbfs`` is the peak
    of the mono mix; ``warnings`` are sentences for the user (clipping, low level, low sample rate).
    """

    path: Path
    sample_rate: int
    channels: int
    duration_s: float
    format: str
    subtype: str
    peak_dbfs: float
    warnings: list[str] = field(default_factory=list)


def read_reference(path: str | Path) -> tuple[np.ndarray, ReferenceInfo]:
    """Read a reference clip -> (mono float32 audio [N] at 44100 Hz, :class:`ReferenceInfo`).

    Any file libsndfile reads (wav, flac, ogg, mp3 with libsndfile >= 1.1, aiff, ...; 8- to 32-bit integer or
    float samples) at any sample rate and channel count. As the publisher's processor (SPEC.md section 9):
    channels are averaged to mono, and there is no normalisation, trimming or padding. The publisher
    resamples with torchaudio's windowed sinc (Hann, width 6, rolloff 0.99); we resample with soxr (very high
    quality), so a clip that is not already at 44.1 kHz can give codes that differ slightly from the
    publisher's. A 44.1 kHz clip is not resampled and gives the publisher's codes exactly.

    Raises AudioError, with the reason and what to do, for: a missing file or a folder, a file libsndfile
    cannot read (not audio, corrupt, truncated header), no samples, NaN or infinite samples, a duration under
    0.5 s or over 30 s (checked from the header first, so a long file is refused unread), digital silence,
    and a clip that is nearly all silence (fewer than 10 % of its 20 ms windows above -50 dBFS RMS).
    Warnings (in ``info.warnings``, the clip is still used): clipping (runs of >= 3 equal full-scale samples
    making up over 0.01 % of the clip), a very low level (peak under -30 dBFS), a sample rate under 16 kHz.
    """
    if not isinstance(path, (str, os.PathLike)):  # samples or an open file: the clip is read from its file
        raise AudioError(f"the reference clip must be a file path (str or Path), got {type(path).__name__}: "
                         "write the samples to a .wav first (soundfile.write)")
    path = Path(path).expanduser()
    if path.is_dir():
        raise AudioError(f"{path} is a folder: give the reference clip's audio file")
    if not path.is_file():
        raise AudioError(f"reference audio {path} does not exist")
    try:
        with sf.SoundFile(str(path)) as f:
            rate, channels, fmt, subtype = f.samplerate, f.channels, f.format, f.subtype
            if f.frames > 0:
                _check_duration(path, f.frames / rate)
            data = f.read(dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        detail = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        raise AudioError(f"cannot read reference audio {path}: {detail}; give a clip in a format libsndfile "
                         "reads (wav, flac, ogg, mp3, aiff), re-exported if this one is damaged") from e
    if data.shape[0] == 0:
        raise AudioError(f"reference audio {path} holds no samples: give 0.5 to 30 s of the speaker talking")
    duration = data.shape[0] / rate
    _check_duration(path, duration)  # the header's frame count can be an estimate (mp3) or wrong (truncation)
    if not np.isfinite(data).all():
        raise AudioError(f"reference audio {path} holds NaN or infinite samples (a damaged float file); "
                         "re-export the clip")
    clipped = _clipped_samples(data)
    mono = data.mean(axis=1)  # the publisher averages channels (SPEC.md section 9)
    peak = float(np.abs(mono).max())
    if peak == 0.0:
        raise AudioError(f"reference audio {path} is digital silence (every sample is 0): give a clip of the "
                         "speaker talking")
    sound = _sound_share(mono, rate)
    if sound < MIN_SOUND_SHARE:
        raise AudioError(f"reference audio {path} is nearly all silence: only {sound * duration:.2f} s of its "
                         f"{duration:.2f} s is above {SILENCE_DBFS:g} dBFS; give a clip of the speaker talking")
    peak_dbfs = 20 * float(np.log10(peak))
    warnings = []
    if clipped > CLIP_SHARE * data.size:
        warnings.append(f"{path.name} is clipped: {clipped} samples ({100 * clipped / data.size:.2f} %) sit at "
                        "full scale, and the cloned voice may copy the distortion; record at a lower level")
    if peak_dbfs < LOW_PEAK_DBFS:
        warnings.append(f"{path.name} is very quiet (peak {peak_dbfs:.1f} dBFS): noise weighs more in the voice; "
                        "record closer to the microphone or raise the level")
    if rate < LOW_RATE_HZ:
        warnings.append(f"{path.name} is sampled at {rate} Hz: it holds nothing above {rate // 2} Hz, so the "
                        f"cloned voice may sound muffled; use a recording at {LOW_RATE_HZ} Hz or more")
    if rate != REFERENCE_RATE:
        mono = soxr.resample(mono, rate, REFERENCE_RATE, quality="VHQ")
    info = ReferenceInfo(path, rate, channels, duration, fmt, subtype, peak_dbfs, warnings)
    return np.ascontiguousarray(mono, dtype=np.float32), info


def _check_duration(path: Path, seconds: float) -> None:
    if seconds < MIN_REFERENCE_S:
        raise AudioError(f"reference audio {path} is {seconds:.2f} s long; a voice needs {MIN_REFERENCE_S:g} to "
                         f"{MAX_REFERENCE_S:g} s of speech: give a longer clip")
    if seconds > MAX_REFERENCE_S:
        raise AudioError(f"reference audio {path} is {seconds:.2f} s long; a voice needs {MIN_REFERENCE_S:g} to "
                         f"{MAX_REFERENCE_S:g} s of speech: cut the clip (about 10 s of clear speech is plenty)")


def _sound_share(mono: np.ndarray, rate: int) -> float:
    """The share of 20 ms windows of ``mono`` [N] whose RMS is at least -50 dBFS (the last partial window
    is left out)."""
    window = max(1, min(len(mono), round(rate * SILENCE_WINDOW_S)))
    n = len(mono) // window
    frames = mono[: n * window].reshape(n, window)
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=1))
    return float(np.mean(rms >= 10 ** (SILENCE_DBFS / 20)))


def _clipped_samples(data: np.ndarray) -> int:
    """How many samples of ``data`` [N, channels] lie in runs of >= 3 equal full-scale samples.

    Equal, not just loud: a full-scale sine (even a 100 Hz one, whose crest spans several samples above
    0.999) never repeats a value three times, while a clipped one sits flat at the limit.
    """
    n = data.shape[0] - CLIP_RUN + 1
    if n <= 0:
        return 0
    starts = np.abs(data[:n]) >= FULL_SCALE
    for i in range(1, CLIP_RUN):
        starts &= data[i:i + n] == data[:n]
    hit = np.zeros(data.shape, dtype=bool)
    for i in range(CLIP_RUN):
        hit[i:i + n] |= starts
    return int(hit.sum())


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
        raise AudioError(f"{fmt} cannot be streamed (its header must give the length); use one of "
                         f"{', '.join(STREAMABLE_FORMATS)} to stream, or {fmt} without streaming")
    if fmt in _SOUNDFILE:
        container, subtype = _SOUNDFILE[fmt]
        if container not in sf.available_formats() or subtype not in sf.available_subtypes(container):
            raise AudioError(f"this server's libsndfile {sf.__libsndfile_version__} cannot encode {fmt}; use wav, "
                             "pcm or flac (or install libsndfile >= 1.1 with MP3 and Opus support)")


def _pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def _wav_header(sample_rate: int, data_bytes: int) -> bytes:
    """A 44-byte RIFF header for mono 16-bit PCM; ``data_bytes`` 0xFFFFFFFF means 'until the end' (streams)."""
    riff = 0xFFFFFFFF if data_bytes == 0xFFFFFFFF else 36 + data_bytes
    return (b"RIFF" + riff.to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
            + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + sample_rate.to_bytes(4, "little")
            + (2 * sample_rate).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
            + b"data" + data_bytes.to_bytes(4, "little"))


class _Drain(io.BytesIO):
    """A BytesIO for libsndfile to write into, handing out each byte once as it is written. What libsndfile
    rewrites at close over bytes already handed out (the length in an MP3's first frame) is lost: a stream
    cannot take it back."""

    def __init__(self) -> None:
        super().__init__()
        self._sent = 0

    def take(self) -> bytes:
        data = self.getbuffer()[self._sent:].tobytes()
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

    wav, pcm: 16-bit signed little-endian (wav with exact sizes); flac 16-bit; mp3 (LAME, variable bit rate,
    gapless length tag); opus (Ogg, resampled to 48 kHz). Raises AudioError as :func:`check_speech_format`.
    """
    check_speech_format(fmt)
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if fmt == "pcm":
        return _pcm16(audio)
    if fmt == "wav":
        data = _pcm16(audio)
        return _wav_header(sample_rate, len(data)) + data
    container, subtype = _SOUNDFILE[fmt]
    if fmt == "opus":
        audio = soxr.resample(audio, sample_rate, OPUS_RATE, quality="VHQ").astype(np.float32)
        sample_rate = OPUS_RATE
    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, subtype=subtype, format=container)
    return buf.getvalue()
