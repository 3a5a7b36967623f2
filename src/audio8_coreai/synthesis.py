"""What :meth:`.tts.TTS.generate` returns: one utterance's audio, codes, seed and times."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)  # identity: equality of arrays is no truth value
class Synthesis:
    """One utterance: ``audio`` float32 [N] at ``sample_rate`` Hz (N = frames x 2048), its ``codes``
    int64 [num_codebooks, frames], whether eos ended it (False: stopped at the frame cap), the seed that
    reproduces it, and times in seconds (``rtf`` = compute time / audio duration; ``codec_s`` is the decode's time
    after the last frame: with the codec in a process of its own the rest ran beside the frames)."""

    audio: np.ndarray = field(repr=False)  # the repr: the figures, not the arrays
    sample_rate: int
    codes: np.ndarray = field(repr=False)
    reached_eos: bool
    seed: int
    prompt_length: int
    max_frames: int
    prefill_s: float
    frames_s: float
    codec_s: float

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def rtf(self) -> float:
        total = self.prefill_s + self.frames_s + self.codec_s
        return total / self.duration_s if self.duration_s else float("inf")
