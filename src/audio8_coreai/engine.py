"""One utterance: prefill, the frame loop to eos or the cap, then the codec (DESIGN.md pipeline).

The engine is backend-agnostic: it owns the host-side state the graphs take as inputs (the noise
stream and the RAS window) and the stop rule, exactly as the publisher's ``generate`` loop:
frame t is sampled from the slow AR's output for column t-1, eos emits no frame and stops, and the
RAS window skips the step-0 token (SPEC.md section 6).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .backends.torch import FrameResult
from .config import ModelConfig, check_int
from .errors import Audio8Error
from .graphs import SamplingParams
from .sampling import NoiseSource, RasWindow


class EngineError(Audio8Error, ValueError):
    """An utterance that cannot be generated as asked (it does not fit the context)."""


class Lease:
    """Who drives a backend's KV state: one utterance at a time, from any thread (see :func:`lease`).

    :meth:`hold` runs a block alone and starts a new utterance (its token); :meth:`resume` runs a later step of
    the utterance of ``token`` alone, and raises EngineError when another utterance has held the backend since
    (it overwrote the KV state this one would continue from: going on would give wrong audio, silently).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        with self._lock:
            self._epoch += 1
            yield self._epoch

    @contextlib.contextmanager
    def resume(self, token: int) -> Iterator[None]:
        with self._lock:
            if self._epoch != token:
                raise EngineError("this stream was overtaken: another utterance ran on the same model since its "
                                  "last frame (a TTS makes one utterance at a time); finish or close a stream "
                                  "before the next call on that TTS, or give each thread its own TTS")
            yield


_LEASES = threading.Lock()


def lease(backend: object) -> Lease:
    """The :class:`Lease` of ``backend`` (made on first use). Every single-utterance caller takes it: TTS.generate
    and generate_batch for their whole call, a stream for its prefills and each frame step."""
    with _LEASES:
        found = getattr(backend, "_audio8_lease", None)
        if found is None:
            found = Lease()
            backend._audio8_lease = found  # type: ignore[attr-defined]
        return found


class Backend(Protocol):
    """What the engine needs from a backend (torch today, Core AI next)."""

    cfg: ModelConfig

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def first_frame(self, params: SamplingParams, noise_slow: np.ndarray, window: np.ndarray,
                    noise_fast: np.ndarray, forced: np.ndarray | None = None) -> FrameResult: ...

    def frame(self, params: SamplingParams, column: np.ndarray, pos: int, noise_slow: np.ndarray,
              window: np.ndarray, noise_fast: np.ndarray, forced: np.ndarray | None = None) -> FrameResult: ...

    def decode_window(self, codes: np.ndarray) -> np.ndarray: ...


class NoiseLike(Protocol):
    def next_frame(self) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class Generation:
    """What one frame loop produced.

    ``codes`` int64 [num_codebooks, T] (T frames of 2048 samples), ``reached_eos`` False when the loop
    stopped at the frame cap, ``prompt_length`` in columns, times in seconds.
    """

    codes: np.ndarray
    reached_eos: bool
    prompt_length: int
    max_frames: int
    prefill_s: float = 0.0
    frames_s: float = 0.0
    frame_results: list[FrameResult] = field(default_factory=list, repr=False)

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])


def frame_budget(cfg: ModelConfig, prompt_length: int, max_frames: int | None, default_frames: int) -> int:
    """How many frames may follow a prompt of ``prompt_length`` columns.

    The publisher requires prompt length < max_seq_len and clips max_new_tokens to what is left. An
    explicit ``max_frames`` that does not fit is an error rather than a silent clip; the default is
    clipped like the publisher's (the engine then reports a stop at the cap).
    Raises EngineError with the numbers, ConfigError for a ``max_frames`` that is no whole number >= 1.
    """
    room = cfg.max_seq_len - prompt_length
    if room < 1:
        raise EngineError(
            f"the prompt is {prompt_length} tokens but the model's context is {cfg.max_seq_len} "
            "(prompt + frames); shorten the text (or the voice's reference clip)")
    if max_frames is None:
        return min(default_frames, room)
    max_frames = check_int(max_frames, "max_frames")
    if max_frames > room:
        raise EngineError(
            f"the prompt is {prompt_length} tokens, so at most {room} frames fit the model's context of "
            f"{cfg.max_seq_len}; asked for {max_frames}: lower the frame cap (max_frames, --max-frames) or shorten the "
            "text")
    return max_frames


def generate(backend: Backend, prompt: np.ndarray, params: SamplingParams, seed: int, max_frames: int,
             on_frame: Callable[[int], None] | None = None, keep_results: bool = False,
             noise: NoiseLike | None = None) -> Generation:
    """Run the frame loop for ``prompt`` int [1+C, P] until eos or ``max_frames`` frames.

    Noise comes from ``NoiseSource(seed)`` (one [2, V+1] and one [C-1, codebook_size] uniform draw per
    step, eos step included), so the same seed gives the same codes. ``on_frame(t)`` is called after
    every step (progress bars). ``keep_results`` keeps every :class:`FrameResult` (parity, gate).
    ``noise`` replaces the seeded source (parity replays recorded uniforms).
    """
    cfg = backend.cfg
    check_context(cfg, prompt.shape[1], max_frames)
    if noise is None:
        noise = noise_source(cfg, seed)
    p_len = prompt.shape[1]
    frames: list[np.ndarray] = []
    results: list[FrameResult] = []
    reached_eos = False
    with lease(backend).hold():  # other threads' utterances on this backend wait; a paused stream is overtaken
        t0 = time.perf_counter()
        backend.prefill(prompt)
        t1 = time.perf_counter()
        for step, res in enumerate(frame_steps(backend, p_len, params, max_frames, noise)):
            if keep_results:
                results.append(res)
            if on_frame is not None:
                on_frame(step)
            if res.semantic == cfg.eos_token_id:
                reached_eos = True
            else:
                frames.append(res.codes)
    codes = np.stack(frames, axis=1) if frames else np.zeros((cfg.num_codebooks, 0), dtype=np.int64)
    return Generation(codes, reached_eos, p_len, max_frames, t1 - t0, time.perf_counter() - t1, results)


def check_context(cfg: ModelConfig, prompt_length: int, max_frames: int) -> None:
    """Raise EngineError unless a prompt of ``prompt_length`` columns and ``max_frames`` frames fit the context."""
    if prompt_length + max_frames > cfg.max_seq_len:
        raise EngineError(f"prompt {prompt_length} + {max_frames} frames exceeds the context {cfg.max_seq_len}")


def noise_source(cfg: ModelConfig, seed: int) -> NoiseSource:
    """The seeded noise stream of an utterance (see :func:`generate`); several utterances may share one."""
    return NoiseSource(seed, cfg.num_semantic, cfg.codebook_size, cfg.num_codebooks - 1)


def frame_steps(backend: Backend, prompt_length: int, params: SamplingParams, max_frames: int,
                noise: NoiseLike) -> Iterator[FrameResult]:
    """The frame loop after ``backend.prefill`` of a prompt of ``prompt_length`` columns, one step at a time.

    Yields each step's :class:`FrameResult` as soon as the backend returns it: frames 0, 1, ... and, when the
    model ends the utterance, the eos step last (its ``semantic`` is ``cfg.eos_token_id`` and its codes are not
    a frame); stops after ``max_frames`` steps otherwise. Takes one ``noise.next_frame()`` per step. The
    caller owns the pace (streaming decodes between steps) and may stop early by closing the generator; the
    backend's KV state is then left mid-utterance until its next prefill. :func:`generate` is this loop run
    to the end.
    """
    cfg = backend.cfg
    window = RasWindow(cfg.ras_window_size)
    column = None
    for step in range(max_frames):
        noise_slow, noise_fast = noise.next_frame()
        if column is None:
            res = backend.first_frame(params, noise_slow, window.current()[0], noise_fast)
        else:
            res = backend.frame(params, column, prompt_length + step - 1, noise_slow, window.current()[0],
                                noise_fast)
        yield res
        if res.semantic == cfg.eos_token_id:
            return
        window.push(res.semantic)
        column = np.concatenate([[res.semantic], res.codes])
