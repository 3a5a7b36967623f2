"""Speech samples handed to a writer or an encoder, checked once at its entry: mono, finite, a whole-number rate."""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import AudioError


def mono_samples(audio: np.ndarray, what: str = "speech audio") -> np.ndarray:
    """``audio`` as float32 [N]: float samples (in [-1, 1]), mono [N], or one channel shaped [N, 1] / [1, N].
    Raises AudioError for what is no array of numbers (``synthesize``'s whole (audio, sample_rate) pair), integer
    samples (int16's 32767 would be written 32767 times full scale), several channels (they would be written one
    after the other as one longer signal) or a NaN or infinite sample (LAME aborts the process on NaN; wav would
    hold noise)."""
    try:
        given = np.asarray(audio)
    except ValueError:  # ragged: a sequence of an array and something else
        given = np.asarray(None)
    if given.dtype.kind in "iub":
        raise AudioError(
            f"{what} is {given.dtype} samples: give float samples in [-1, 1] (int16 samples: divide them by "
            "32768 first)"
        )
    if given.dtype.kind not in "f":
        pair = isinstance(audio, tuple) and len(audio) == 2
        said = (
            "an (audio, sample_rate) pair: synthesize() returns one, give its audio" if pair else type(audio).__name__
        )
        raise AudioError(f"{what} must be an array of float samples [N], got {said}")
    data = given.astype(np.float32, copy=False)
    if sum(n > 1 for n in data.shape) > 1:
        raise AudioError(
            f"{what} must be mono [samples], not shape {list(data.shape)}: mix the channels first "
            "(audio.mean(axis=1) for [samples, channels], axis=0 for [channels, samples])"
        )
    data = data.reshape(-1)
    if not np.isfinite(data).all():
        raise AudioError(f"{what} holds {int((~np.isfinite(data)).sum())} NaN or infinite samples")
    return data


# Formats whose encoders write no readable file for no samples (libsndfile: nothing, or an Ogg Opus with no page).
HOLD_NO_EMPTY = ("flac", "mp3", "aac", "opus")


def check_some(data: np.ndarray, fmt: str) -> None:
    """Raise AudioError when ``data`` (float32 [N]) holds no samples and ``fmt`` cannot hold none (an empty file
    would be written: :data:`HOLD_NO_EMPTY`)."""
    if data.size == 0 and fmt in HOLD_NO_EMPTY:
        raise AudioError(f"speech audio holds no samples, which {fmt} cannot hold (wav, pcm and ogg can)")


def clip_samples(audio: np.ndarray) -> np.ndarray:
    """A clip handed to a codec encoder (``Backend.encode``) as float32 [N]: :func:`mono_samples` holding at least
    one sample. Raises AudioError."""
    data = mono_samples(audio, "clip audio")
    if data.size == 0:
        raise AudioError("clip audio holds no samples: give the clip's audio")
    return data


def sample_rate_of(sample_rate: object) -> int:
    """``sample_rate`` as an int of Hz. Raises AudioError for anything but a whole number >= 1 (bools too)."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral) or sample_rate < 1:
        raise AudioError(f"sample_rate must be a whole number of Hz >= 1, not {sample_rate!r}")
    return int(sample_rate)
