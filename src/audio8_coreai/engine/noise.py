"""An utterance's noise drawn one step ahead, on a worker thread, while the step before runs.

A frame's noise (two semantic draws and nine codebooks: 45,058 uniforms on the 0.6b model) does not depend on the
frame before, so where a step leaves the host idle (frames on a GPU) the next step's noise is drawn during it, off
the critical path. The values and their order are the wrapped stream's: the same seed gives the same audio.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from ..backends.base import Backend
from ..config import ModelConfig
from ..sampling import NoiseSource
from ..settings import DEFAULTS
from ..values import check_int


class NoiseLike(Protocol):
    """A noise stream: one (noise_slow float32 [2, V+1], noise_fast float32 [C-1, codebook_size]) per step."""

    def next_frame(self) -> tuple[np.ndarray, np.ndarray]: ...


def noise_source(cfg: ModelConfig, seed: int) -> NoiseSource:
    """The seeded noise stream of an utterance (see :func:`.loop.generate`); several utterances may share one.
    Raises ConfigError for a ``seed`` that is no whole number >= 0."""
    return NoiseSource(check_int(seed, "seed", minimum=0), cfg.num_semantic, cfg.codebook_size, cfg.num_codebooks - 1)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The process's noise threads (``DEFAULTS.torch.noise_threads``), started on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(DEFAULTS.torch.noise_threads, thread_name_prefix="audio8-noise")
        return _POOL


class NoiseAhead:
    """``noise`` (a :class:`NoiseLike`) one step ahead: :meth:`ahead` starts drawing the next step on the noise
    threads (the backend calls it through :attr:`..backends.base.StepInputs.draw_ahead` once a frame is launched),
    :meth:`next_frame` returns that draw. One wrapper per stream, kept across its pieces (the step drawn ahead is the
    next piece's first). Started once a frame is launched, the draws run while the host waits for the device, not
    while it stages a batch (the two would take turns holding the GIL: docs/speed.md).
    """

    def __init__(self, noise: NoiseLike):
        self._noise = noise
        self._next: Future | None = None
        self.ahead()

    def ahead(self) -> None:
        """Start drawing the next step's noise (nothing when a draw is already under way)."""
        if self._next is None:
            self._next = _pool().submit(self._noise.next_frame)

    def next_frame(self) -> tuple[np.ndarray, np.ndarray]:
        """(noise_slow float32 [2, V+1], noise_fast float32 [C-1, codebook_size]), as the wrapped stream's: the draw
        :meth:`ahead` started, or one drawn now when none was."""
        if self._next is None:
            return self._noise.next_frame()
        frame, self._next = self._next.result(), None
        return frame


def seeded_noise(backend: Backend, seed: int) -> NoiseLike:
    """An utterance's seeded noise stream (:func:`noise_source`), drawn ahead where ``backend.noise_ahead``
    says its frames leave the host idle."""
    noise = noise_source(backend.cfg, seed)
    return NoiseAhead(noise) if backend.noise_ahead else noise
