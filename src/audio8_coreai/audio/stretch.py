"""Speech at another speed, pitch kept: Rubber Band's time stretch through pedalboard (OpenAI's ``speed``).

pedalboard (0.9) offers Rubber Band's offline stretcher only, no streaming one; :class:`StreamStretcher` stretches
a stream chunk by chunk, each chunk with the input before it as context, joined by short crossfades. pedalboard is
imported when a speed other than 1.0 is asked for (:func:`check_speed`), not with this module.
"""

from __future__ import annotations

import numpy as np

from ..errors import AudioError
from ..packages import require

# StreamStretcher: input samples before each chunk stretched with it (186 ms at 44.1 kHz: several of Rubber Band's
# analysis windows, so a chunk's start is stretched as mid-signal), and output samples crossfaded at each join.
CONTEXT_SAMPLES = 8192
CROSSFADE_SAMPLES = 1024


def check_speed(speed: float) -> None:
    """Raise AudioError naming pedalboard's install when ``speed`` needs the time stretch (any but 1.0) and
    pedalboard cannot be imported."""
    if speed != 1.0:
        require("pedalboard", AudioError)


def _stretch(audio: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Rubber Band's offline stretch of float32 ``audio`` [N]: float32 [about N / speed]."""
    return require("pedalboard", AudioError).time_stretch(audio[None], float(sample_rate), float(speed))[0]


def time_stretch(audio: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Mono float32 ``audio`` [N] at ``sample_rate`` Hz spoken ``speed`` times as fast, pitch and formants kept:
    float32 [round(N / speed)]. ``speed`` 1.0 returns ``audio`` as it is. Raises AudioError as :func:`check_speed`."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    check_speed(speed)
    if speed == 1.0 or audio.size == 0:
        return audio
    return _fit(_stretch(audio, sample_rate, speed), round(audio.size / speed))


def _fit(audio: np.ndarray, n: int) -> np.ndarray:
    """``audio``'s last ``n`` samples, zeros in front where it is shorter."""
    if audio.size >= n:
        return audio[audio.size - n :]
    return np.concatenate([np.zeros(n - audio.size, np.float32), audio])


class StreamStretcher:
    """:func:`time_stretch` for a stream: ``write(chunk)`` returns the stretched audio ready so far and ``close()``
    the rest; all output joined is float32 [round(N / speed)] for N input samples. Each chunk is stretched with
    the CONTEXT_SAMPLES of input before it, and the last CROSSFADE_SAMPLES of each output are held back and
    crossfaded into the next chunk's version of them (so output lags input by 23 ms at 44.1 kHz). Not sample-equal
    to the whole-utterance stretch (Rubber Band's phase runs on across a whole input): the same length, rate and
    pitch, with a join every chunk. Raises AudioError as :func:`check_speed`."""

    def __init__(self, sample_rate: int, speed: float):
        check_speed(speed)
        self.sample_rate, self.speed = sample_rate, speed
        self._history = np.zeros(0, np.float32)  # the input's last CONTEXT_SAMPLES
        self._pending = np.zeros(0, np.float32)  # output held back for the next join's crossfade
        self._taken = 0  # input samples written
        self._sent = 0  # output samples returned

    def write(self, chunk: np.ndarray) -> np.ndarray:
        chunk = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self.speed == 1.0 or chunk.size == 0:
            return chunk
        self._taken += chunk.size
        segment = np.concatenate([self._history, chunk])
        self._history = segment[-CONTEXT_SAMPLES:]
        stretched = _stretch(segment, self.sample_rate, self.speed)
        part = _fit(stretched, round(self._taken / self.speed) - self._sent)  # pending's span, then the new one
        n = self._pending.size
        fade = np.linspace(0.0, 1.0, n, endpoint=False, dtype=np.float32)
        part[:n] = self._pending * (1.0 - fade) + part[:n] * fade
        ready = max(part.size - CROSSFADE_SAMPLES, 0)
        self._pending = part[ready:].copy()
        self._sent += ready
        return part[:ready]

    def close(self) -> np.ndarray:
        rest, self._pending = self._pending, np.zeros(0, np.float32)
        self._sent += rest.size
        return rest
