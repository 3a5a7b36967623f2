"""THE record/replay harness of parity, agreement and the gate: runs recorded through the engine's own loop.

:func:`record` free-runs a prompt through :func:`...engine.loop.generate` and keeps what each step was fed and
what it drew; :func:`replay` teacher-forces a recording through the same loop (every step keeps the recorded
column, so one miss does not change later inputs) and returns each step's :class:`...backends.base.FrameResult`
for the caller to compare with the recording. The oracle's fixtures become recordings in :mod:`.oracle`; the
loop computes the RAS windows and slots itself, so a replay also checks them against the publisher's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend, FrameResult
from ..config import SamplingParams
from ..engine.loop import Generation, generate
from ..engine.noise import NoiseLike


class RecordedNoise:
    """A :class:`...engine.loop.NoiseLike` replaying recorded uniforms: ``noise_slow`` [S, 2, V+1],
    ``noise_fast`` [S, C-1, K]."""

    def __init__(self, noise_slow: np.ndarray, noise_fast: np.ndarray):
        self.noise_slow, self.noise_fast = noise_slow, noise_fast
        self._step = 0

    def next_frame(self) -> tuple[np.ndarray, np.ndarray]:
        s = self._step
        self._step += 1
        return self.noise_slow[s], self.noise_fast[s]


class RecordingNoise:
    """A :class:`...engine.loop.NoiseLike` that keeps every step's uniforms of the stream it passes on."""

    def __init__(self, source: NoiseLike):
        self.source, self.frames = source, []

    def next_frame(self) -> tuple[np.ndarray, np.ndarray]:
        pair = self.source.next_frame()
        self.frames.append(pair)
        return pair


@dataclass
class Recording:
    """A run of one prompt int64 [1+C, P]: per step the kept ``columns`` int64 [S, 1+C] (semantic id then codes:
    what the next step is fed and what teacher forcing imposes), the uniforms ``noise_slow`` float32 [S, 2, V+1]
    and ``noise_fast`` [S, C-1, codebook_size], and the run's slow ``logits`` [S, V+1] and ``fast_logits``
    [S, C-1, codebook_size] (float32)."""

    prompt: np.ndarray
    columns: np.ndarray
    noise_slow: np.ndarray
    noise_fast: np.ndarray
    logits: np.ndarray
    fast_logits: np.ndarray


def record(
    backend: Backend, prompt: np.ndarray, params: SamplingParams, noise: NoiseLike, max_frames: int
) -> tuple[Recording, Generation]:
    """Free-run ``prompt`` on ``backend`` (the reference) up to eos or ``max_frames`` frames, drawing from
    ``noise``; returns the recording (the eos step included) and the generation."""
    kept = RecordingNoise(noise)
    gen = generate(backend, prompt, params, 0, max_frames, keep_results=True, noise=kept)
    res = gen.frame_results
    columns = np.stack([np.concatenate([[r.semantic], r.codes]) for r in res]).astype(np.int64)
    rec = Recording(
        prompt,
        columns,
        np.stack([n[0] for n in kept.frames]),
        np.stack([n[1] for n in kept.frames]),
        np.stack([r.logits for r in res]),
        np.stack([r.fast_logits for r in res]),
    )
    return rec, gen


def replay(
    backend: Backend, prompt: np.ndarray, params: SamplingParams, columns: np.ndarray, noise: NoiseLike
) -> list[FrameResult]:
    """Teacher-force the recorded ``columns`` int64 [S, 1+C] of ``prompt`` through ``backend``, drawing from
    ``noise`` (the recorded uniforms); returns each step's result (its ``sampled_*`` draws are the backend's
    own)."""
    gen = generate(backend, prompt, params, 0, len(columns), keep_results=True, noise=noise, forced=list(columns))
    return gen.frame_results


def replay_recording(backend: Backend, rec: Recording, params: SamplingParams) -> list[FrameResult]:
    """:func:`replay` of a :class:`Recording`."""
    return replay(backend, rec.prompt, params, rec.columns, RecordedNoise(rec.noise_slow, rec.noise_fast))
