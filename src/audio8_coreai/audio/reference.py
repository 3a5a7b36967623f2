"""Reference clips in: read any audio file as 44.1 kHz mono and refuse or warn about what makes a poor voice."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from ..errors import AudioError

# Reference clips for voice cloning. The publisher's processor takes any length and level (SPEC.md section 9);
# these limits are ours (DESIGN.md pipeline, issue 4): under half a second there is too little of the voice to
# copy, and past 30 s the reference crowds out the frames in the context.
REFERENCE_RATE = 44100  # the codec's sample rate: the encoder sees 44.1 kHz mono only
MIN_REFERENCE_S = 0.5
MAX_REFERENCE_S = 30.0
MIN_RATE_HZ = 8000  # telephone speech: below it a clip holds too few samples to show a voice at all
LOW_RATE_HZ = 16000  # below this the clip lacks the upper speech band, so the clone sounds muffled
SILENCE_WINDOW_S = 0.02  # 20 ms: shorter than a syllable, longer than one pitch period
SILENCE_DBFS = -50.0  # a window whose RMS is below this holds no speech
MIN_SOUND_SHARE = 0.1  # fewer windows of sound than this share: "nearly all silence"
LOW_PEAK_DBFS = -30.0  # a peak below this is a very quiet recording (speech usually peaks near -6 dBFS)
FULL_SCALE = 0.999  # |sample| at or above this counts as full scale (int16 full scale is 0.99997)
CANCELLED = 1e-3  # channels whose average peaks 60 dB under the loudest channel's samples cancel out
CLIP_RUN = 3  # clipping flattens the waveform into runs of equal full-scale samples; a crest never repeats
CLIP_SHARE = 1e-4  # clipped samples above this share of the clip get a warning; a stray run is harmless
# A WAV written to a pipe cannot seek back to fill in its sizes: ffmpeg leaves 0xFFFFFFFF, sox 0x7FFFF000. A size
# this large is a placeholder, not a promise (30 s of 8 channels of 32-bit samples at 192 kHz is 184 MB).
PLACEHOLDER_SIZE = 1 << 30
CUT_SHARE = 0.99  # a writer that counts its header in the data size, or drops a last sample, is no cut
UNKNOWN_FRAMES = 2**63 - 1  # libsndfile's frame count of a file whose header gives no length (SF_COUNT_MAX)


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

    Raises AudioError, with the reason and what to do, for: a missing file, a folder or no regular file, a file
    libsndfile cannot read (not audio, corrupt, truncated header), a WAV cut short (fewer bytes of samples than
    its header says), no samples, NaN or infinite samples, a sample
    rate under 8 kHz, a duration under 0.5 s or over 30 s (checked from the header first, so a long file is refused
    unread), digital silence (also channels that cancel out), and a clip that is nearly all silence (fewer than
    10 % of its 20 ms windows above -50 dBFS RMS).
    Warnings (in ``info.warnings``, the clip is still used): clipping (runs of >= 3 equal full-scale samples
    making up over 0.01 % of the clip), a clip over full scale (peak above 0 dBFS: float or compressed), a very
    low level (peak under -30 dBFS), a sample rate under 16 kHz.
    """
    if not isinstance(path, (str, os.PathLike)):  # samples or an open file: the clip is read from its file
        raise AudioError(
            f"the reference clip must be a file path (str or Path), got {type(path).__name__}: "
            "write the samples to a .wav first (soundfile.write)"
        )
    if not str(path).strip():  # Path("") is the current folder
        raise AudioError("no reference clip given: give the path of an audio file of the speaker")
    if str(path) == "-":
        raise AudioError("a reference clip is read from its file, not from stdin ('-'): give the clip's path")
    path = Path(path).expanduser()
    if path.is_dir():
        raise AudioError(f"{path} is a folder: give the reference clip's audio file")
    if not path.exists():
        raise AudioError(f"reference audio {path} does not exist")
    if not path.is_file():
        raise AudioError(f"reference audio {path} is not a regular file (a device or a pipe): give an audio file")
    if path.stat().st_size == 0:
        raise AudioError(f"reference audio {path} is an empty file (0 bytes): give the clip's audio file")
    try:
        with _Forward(os.fsencode(path)) as f:  # bytes: a name that is no UTF-8 (a Latin-1 archive) opens too
            rate, channels, fmt, subtype = f.samplerate, f.channels, f.format, f.subtype
            if fmt in ("WAV", "WAVEX"):  # RIFF; RF64's sizes live in its ds64 chunk
                _check_wav_whole(path)
            if 0 < f.frames < UNKNOWN_FRAMES:
                _check_duration(path, f.frames, rate)
            data = _read_at_most(f, int(MAX_REFERENCE_S * rate) + 1)  # a sample more tells a clip too long
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        said = e.error_string if isinstance(e, sf.LibsndfileError) else str(e)  # without "Error opening b'name'"
        detail = said.strip().splitlines()[0].rstrip(".") if said.strip() else type(e).__name__
        raise AudioError(
            f"cannot read reference audio {path}: {detail}; give a clip in a format libsndfile "
            "reads (wav, flac, ogg, mp3, aiff), re-exported if this one is damaged"
        ) from e
    if data.shape[0] == 0:
        raise AudioError(f"reference audio {path} holds no samples: give 0.5 to 30 s of the speaker talking")
    duration = data.shape[0] / rate
    if duration > MAX_REFERENCE_S:  # read no further: the header gave no length (or too short a one)
        raise AudioError(f"reference audio {path} is over {MAX_REFERENCE_S:g} s long; {_LONG}")
    _check_duration(path, data.shape[0], rate)  # the header's frame count can be an estimate (mp3) or wrong
    if not np.isfinite(data).all():
        raise AudioError(
            f"reference audio {path} holds NaN or infinite samples (a damaged float file); re-export the clip"
        )
    clipped = _clipped_samples(data)
    mono = data.mean(axis=1)  # the publisher averages channels (SPEC.md section 9)
    peak = float(np.abs(mono).max())
    if channels > 1 and peak < CANCELLED * float(np.abs(data).max()):  # 16-bit R = -L leaves +-1 steps
        raise AudioError(
            f"reference audio {path}'s channels cancel out: their average, the mono clip a voice is made from, "
            "is 0 everywhere (one channel inverted?); give a clip whose channels hold the speech alike, or one channel"
        )
    if peak == 0.0:
        raise AudioError(
            f"reference audio {path} is digital silence (every sample is 0): give a clip of the speaker talking"
        )
    sound = _sound_share(mono, rate)
    peak_dbfs = 20 * float(np.log10(peak))
    if sound < MIN_SOUND_SHARE and peak_dbfs < LOW_PEAK_DBFS:  # a real clip, recorded far too low
        raise AudioError(
            f"reference audio {path} is too quiet to hear a voice in (peak {peak_dbfs:.1f} dBFS; only "
            f"{sound * duration:.2f} s of its {duration:.2f} s is above {SILENCE_DBFS:g} dBFS RMS in 20 ms "
            "windows): raise its level "
            "(normalise it to peak near -3 dBFS) or record closer to the microphone"
        )
    if sound < MIN_SOUND_SHARE:
        raise AudioError(
            f"reference audio {path} is nearly all silence: only {sound * duration:.2f} s of its "
            f"{duration:.2f} s varies above {SILENCE_DBFS:g} dBFS (a steady level, however loud, is no sound); give "
            "a clip of the speaker talking"
        )
    warnings = []
    if clipped > CLIP_SHARE * data.size:
        warnings.append(
            f"{path.name} is clipped: {clipped} samples ({100 * clipped / data.size:.2f} %) sit at "
            "full scale, and the cloned voice may copy the distortion; record at a lower level"
        )
    if peak > 1.0:
        warnings.append(
            f"{path.name} goes over full scale (peak {peak_dbfs:+.1f} dBFS): the encoder hears it unscaled and "
            "the cloned voice may distort; normalise the clip to peak below 0 dBFS"
        )
    if peak_dbfs < LOW_PEAK_DBFS:
        warnings.append(
            f"{path.name} is very quiet (peak {peak_dbfs:.1f} dBFS): noise weighs more in the voice; "
            "record closer to the microphone or raise the level"
        )
    if rate < LOW_RATE_HZ:
        warnings.append(
            f"{path.name} is sampled at {rate} Hz: it holds nothing above {rate // 2} Hz, so the "
            f"cloned voice may sound muffled; use a recording at {LOW_RATE_HZ} Hz or more"
        )
    if rate != REFERENCE_RATE:
        mono = soxr.resample(mono, rate, REFERENCE_RATE, quality="VHQ")
    info = ReferenceInfo(path, rate, channels, duration, fmt, subtype, peak_dbfs, warnings)
    return np.ascontiguousarray(mono, dtype=np.float32), info


def _check_duration(path: Path, samples: int, rate: int) -> None:
    """AudioError unless ``samples`` at ``rate`` Hz are 0.5 to 30 s at a rate of at least MIN_RATE_HZ: three samples
    at 1 Hz are "3 s" of nothing."""
    if rate < MIN_RATE_HZ:
        raise AudioError(
            f"reference audio {path} holds {samples} samples at {rate} Hz: a voice needs a recording at "
            f"{MIN_RATE_HZ} Hz or more (16000 Hz or more sounds better), {MIN_REFERENCE_S:g} to {MAX_REFERENCE_S:g} s"
        )
    seconds = samples / rate
    if MIN_REFERENCE_S <= seconds <= MAX_REFERENCE_S:  # the limits themselves included
        return
    # as many decimals as tell it from the limit ("30.00 s" said of 30 s and 10 samples contradicts "up to 30 s")
    limits = (MIN_REFERENCE_S, MAX_REFERENCE_S)
    shown = next((f"{seconds:.{d}f}" for d in range(2, 8) if float(f"{seconds:.{d}f}") not in limits), f"{seconds!r}")
    if seconds < MIN_REFERENCE_S:
        raise AudioError(
            f"reference audio {path} is {shown} s long; a voice needs {MIN_REFERENCE_S:g} to "
            f"{MAX_REFERENCE_S:g} s of speech: give a longer clip"
        )
    if seconds > MAX_REFERENCE_S:
        raise AudioError(f"reference audio {path} is {shown} s long; {_LONG}")


_LONG = (
    f"a voice needs {MIN_REFERENCE_S:g} to {MAX_REFERENCE_S:g} s of speech: cut the clip (about 10 s of clear speech "
    "is plenty)"
)


class _Forward(sf.SoundFile):
    """A sound file read front to back, never seeking: soundfile seeks after every read to keep its place, which a
    file of unknown length refuses (a FLAC written to a pipe: libsndfile gives :data:`UNKNOWN_FRAMES`), and reads a
    file libsndfile cannot seek (GSM 6.10 or G.721 in a WAV) only a given number of frames at a time."""

    def seekable(self) -> bool:
        return False


def _read_at_most(f: sf.SoundFile, most: int) -> np.ndarray:
    """The samples of ``f`` (float32 [frames, channels]) up to ``most`` frames, read a second at a time: memory
    bounded whatever the file says of its length."""
    parts, n = [], 0
    while n < most:
        part = f.read(frames=min(f.samplerate, most - n), dtype="float32", always_2d=True)
        if not len(part):
            break
        parts.append(part)
        n += len(part)
    return np.concatenate(parts) if parts else np.zeros((0, f.channels), np.float32)


def _check_wav_whole(path: Path) -> None:
    """AudioError when the RIFF WAV at ``path`` holds under 99 % of the bytes of samples its ``data`` chunk says.

    libsndfile reads what is there and reports that length, so a copy or download cut short would pass as a
    shorter clip whose transcript no longer matches it. A pipe's placeholder sizes pass.
    """
    with path.open("rb") as f:
        if f.read(12)[8:] != b"WAVE":
            return
        while len(head := f.read(8)) == 8:
            tag, size = head[:4], struct.unpack("<I", head[4:])[0]
            if tag == b"data":
                have = path.stat().st_size - f.tell()
                if have < CUT_SHARE * size and size < PLACEHOLDER_SIZE:
                    raise AudioError(
                        f"reference audio {path} is cut short: its header promises {size} bytes of samples and "
                        f"the file holds {have} ({100 * have / size:.1f} %); copy or download the clip again"
                    )
                return
            f.seek(size + size % 2, os.SEEK_CUR)  # RIFF chunks are padded to an even size


def _sound_share(mono: np.ndarray, rate: int) -> float:
    """The share of 20 ms windows of ``mono`` [N] whose RMS about their own mean is at least -50 dBFS (the last
    partial window is left out): a constant offset (DC) is no sound."""
    window = max(1, min(len(mono), round(rate * SILENCE_WINDOW_S)))
    n = len(mono) // window
    frames = mono[: n * window].reshape(n, window).astype(np.float64)
    rms = frames.std(axis=1)
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
        starts &= data[i : i + n] == data[:n]
    hit = np.zeros(data.shape, dtype=bool)
    for i in range(CLIP_RUN):
        hit[i : i + n] |= starts
    return int(hit.sum())
