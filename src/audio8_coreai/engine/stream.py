"""Speech as it is made: the frame loop feeding an exact incremental codec, chunk by chunk (DESIGN.md pipeline).

A :class:`SpeechStream` speaks one or more pieces of text (long text split by :func:`..text.split_text`) in
order: per piece, prefill, then every ``chunk_frames`` new frames the codec decodes just those frames (keeping
its own state, see :class:`..model.codec.StreamingDecoder`) and the stream yields their audio; pieces are
joined by a short silence. The stream's first chunk is shorter (``first_chunk_frames``), so the first audio
comes after fewer frames: time to first audio (TTFA) is prefill + the first chunk's frames + its decode. The
samples are those of a whole-utterance decode of each piece (to float rounding, about 1e-6 at fp32), so
streaming changes when audio arrives, not what it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..backends.base import Backend, CodecStream
from ..config import SamplingParams
from ..errors import EngineError
from ..settings import DEFAULTS
from .loop import Utterance, frame_steps
from .noise import seeded_noise
from .overlap import CodecQueue


class _Reader:
    """An iteration of a stream (its ``chunks`` generator), read by one thread at a time: a ``next`` while another
    thread's runs raises EngineError (Python's generator said "generator already executing")."""

    def __init__(self, chunks: Generator[np.ndarray, None, None]):
        self.chunks, self._reading = chunks, threading.Lock()

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> np.ndarray:
        if not self._reading.acquire(blocking=False):
            raise EngineError(
                "this stream is being read by another thread: read a stream from one thread at a time (it is one "
                "utterance, its chunks in order)"
            )
        try:
            return next(self.chunks)
        finally:
            self._reading.release()

    def close(self) -> None:
        """Close the generator unless a thread is reading it (that one ends at its next frame, by the stream's stop
        flag): closing a generator that runs raised "generator already executing" in the closing thread."""
        if self._reading.acquire(blocking=False):
            try:
                self.chunks.close()
            finally:
                self._reading.release()


@dataclass
class ChunkTimes:
    """One chunk of a stream, timed in seconds from the start of iteration: its ``frames``, when its last frame was
    made (``made_s``: its codes handed to the codec), when its decode began and ended (``decode_start_s``,
    ``decoded_s``) and when its audio was handed to the reader (``sent_s``); None until it happens."""

    frames: int
    made_s: float
    decode_start_s: float | None = None
    decoded_s: float | None = None
    sent_s: float | None = None


@dataclass(frozen=True)
class Piece:
    """One utterance of a stream: its ``text``, its frame cap and its ``prompt`` int64 [1+C, P], built each time it
    is read by ``build`` (a book's thousands of pieces each holding its prompt took gigabytes with a cloned voice,
    whose reference every prompt repeats)."""

    text: str
    max_frames: int
    build: Callable[[], np.ndarray] = field(repr=False, compare=False)

    @property
    def prompt(self) -> np.ndarray:
        return self.build()


class SpeechStream:
    """An iterable of float32 mono chunks at ``sample_rate`` Hz: the speech of ``pieces``, made as it is read.

    Build with :meth:`.tts.TTS.stream`, from a plan (:class:`..plan.Plan`: everything checked before the first
    frame, nothing here). Iterating runs the model: the stream's first chunk holds ``first_chunk_frames`` frames
    (both sizes whole numbers >= 1), each next one twice the last up to ``chunk_frames`` (``n`` frames are ``n *
    frame_length`` samples), so audio already sent covers the making of the next chunk whenever frames come
    faster than real time; a piece's last chunk holds what is left when it ends (eos or its cap); a silence of
    ``pause_s`` seconds follows a piece with audio when another piece follows (none after a piece that ended at
    once, without audio).
    The seeded noise stream (``seed``) runs on across pieces, so a split text is as reproducible as one
    utterance; a one-piece stream gives the samples of ``TTS.generate`` with the same seed. ``on_frame(step)``
    is called after each model step (steps numbered across pieces; eos steps included); raising there, or
    :meth:`close` (``with tts.stream(...) as stream:`` closes at the block's end; or closing the iterator),
    stops generation at once. Iterating again resumes an iteration left midway (a ``break``), as a generator
    does; one that ended or was closed starts over (same audio).

    Filled in while iterating: ``frames`` (frames made), ``reached_eos`` (one bool per finished piece),
    ``first_audio_s`` (time to first audio: seconds from the start of iteration to the first chunk, prefill
    included), ``prefill_s``, ``frames_s``, ``codec_s`` (seconds), ``timeline`` (a :class:`ChunkTimes` per chunk, in
    order: how frames and codec overlapped). It drives the backend's single KV state: a
    stream paused while another utterance runs on the same backend (another stream, a generate, from any thread)
    raises EngineError when resumed, instead of continuing from the other's state. ``overlap_codec``: decode chunk k
    beside the frames of chunk k+1 (:class:`.overlap.CodecQueue`, at most ``DEFAULTS.torch.codec_queue`` chunks in
    flight; the stream's first chunk is decoded at once, for the earliest first audio; the samples are the same);
    None: when the backend's codec runs in a process of its own (``Backend.codec_process``), the only way the two
    truly run at once on a CPU; True also overlaps an in-process codec on a thread (same samples); only for a
    backend whose codec overlaps its frames (``Backend.overlaps_codec``).
    """

    def __init__(
        self,
        backend: Backend,
        pieces: list[Piece],
        params: SamplingParams,
        seed: int,
        *,
        chunk_frames: int,
        first_chunk_frames: int,
        sample_rate: int,
        frame_length: int,
        pause_s: float = DEFAULTS.speech.pause_s,
        on_frame: Callable[[int], None] | None = None,
        overlap_codec: bool | None = None,
    ):
        self.backend = backend
        self.pieces = pieces
        self.params = params
        self.seed = seed
        self.chunk_frames = chunk_frames
        self.first_chunk_frames = first_chunk_frames
        self.sample_rate = sample_rate
        self.frame_length = frame_length
        self.pause_s = pause_s
        self.on_frame = on_frame
        # Only a codec that can run beside the frames (torch's: its own process, or a thread) overlaps them; Core
        # AI's decoder calls go through the same runtime loop as the frames.
        if overlap_codec is None:
            overlap_codec = backend.codec_process
        self.overlap_codec = overlap_codec and backend.overlaps_codec
        self._running: Generator[np.ndarray, None, None] | None = None  # the latest iteration's generator
        self._stop = threading.Event()  # set by close: the running iteration ends at its next frame
        self._reset_stats()

    def _reset_stats(self) -> None:
        self.frames = 0
        self.reached_eos: list[bool] = []
        self.first_audio_s: float | None = None
        self.prefill_s = self.frames_s = self.codec_s = 0.0
        self.timeline: list[ChunkTimes] = []
        self._decodes = self._sent = 0  # chunks decoded and handed on so far (both in order)
        self._pauses = 0  # pauses sent: after each piece with audio that another piece follows

    @property
    def max_frames(self) -> int:
        """The most frames the stream can make (the pieces' caps together)."""
        return sum(p.max_frames for p in self.pieces)

    @property
    def duration_s(self) -> float:
        """Seconds of audio made so far, pauses included."""
        pauses = self._pauses * round(self.pause_s * self.sample_rate)
        return (self.frames * self.frame_length + pauses) / self.sample_rate

    @property
    def capped(self) -> list[int]:
        """The finished pieces (indices into ``pieces``) that stopped at their frame cap before the model ended
        them: their audio may be cut."""
        return [i for i, eos in enumerate(self.reached_eos) if not eos]

    def __iter__(self) -> Iterator[np.ndarray]:
        running = self._running
        if running is not None and running.chunks.gi_frame is not None:  # left midway (a break): resumed
            return running
        self._stop.clear()
        self._running = _Reader(self._chunks())
        return self._running

    def close(self) -> None:
        """Stop the latest iteration: at once when it waits between chunks (its codec work ended, the model free for
        the next utterance), else at its next frame (called from ``on_frame`` or from another thread); idempotent.
        Iterating again then starts over."""
        self._stop.set()
        running, self._running = self._running, None
        if running is not None:
            running.close()

    def __enter__(self) -> SpeechStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _chunks(self) -> Generator[np.ndarray, None, None]:
        self._reset_stats()
        cfg = self.backend.cfg
        noise = seeded_noise(self.backend, self.seed)  # one stream across the pieces
        pause = np.zeros(round(self.pause_s * self.sample_rate), dtype=np.float32)
        self._start = time.perf_counter()
        step = 0
        size = self.first_chunk_frames
        spoke = False  # audio was sent since the last pause: the next piece opens with one
        for piece in self.pieces:
            if spoke:  # at once, played while this piece's first chunk is made; not again after a silent piece
                yield self._paused(pause)
                spoke = False
            t0 = time.perf_counter()
            with self.backend.lease.hold() as token:
                self.backend.prefill(piece.prompt)
            self.prefill_s += time.perf_counter() - t0
            decode = partial(self._decode, self.backend.codec_stream())
            utterance = Utterance(cfg, piece.prompt.shape[1], piece.max_frames, noise)
            steps = frame_steps(self.backend, utterance, self.params)
            pending: list[np.ndarray] = []
            eos = False
            with CodecQueue(decode, self.overlap_codec) as codec:
                for res in self._timed(steps, token):
                    if self.on_frame is not None:
                        with self.backend.lease.resume(token):  # as generate's: a call on this TTS from it is refused
                            self.on_frame(step)
                    if self._stop.is_set():
                        return
                    step += 1
                    if res.semantic == cfg.eos_token_id:
                        eos = True
                        break
                    pending.append(res.codes)
                    self.frames += 1
                    if len(pending) == size:
                        self._put(codec, pending)
                        pending = []
                        size = min(self.chunk_frames, 2 * size)
                    # the stream's first chunk at once (the earliest first audio), later ones as they are done
                    for audio in codec.drain() if self.first_audio_s is None else codec.ready():
                        spoke = True
                        yield self._sending(audio)
                if pending:
                    self._put(codec, pending)
                for audio in codec.drain():
                    spoke = True
                    yield self._sending(audio)
            self.reached_eos.append(eos)

    def _paused(self, pause: np.ndarray) -> np.ndarray:
        """``pause``, counted (:attr:`duration_s`)."""
        self._pauses += 1
        return pause

    def _put(self, codec: CodecQueue, frames: list[np.ndarray]) -> None:
        """Hand the chunk of ``frames`` (codes int [C] each) to the codec, timed."""
        self.timeline.append(ChunkTimes(len(frames), time.perf_counter() - self._start))
        codec.put(np.stack(frames, axis=1))

    def _sending(self, audio: np.ndarray) -> np.ndarray:
        """The next chunk's ``audio``, timed as handed on (the time to first audio for the stream's first)."""
        sent = time.perf_counter() - self._start
        self.timeline[self._sent].sent_s = sent
        self._sent += 1
        if self.first_audio_s is None:
            self.first_audio_s = sent
        return audio

    def _timed(self, steps: Iterator, token: int) -> Iterator:
        """``steps`` with the time spent inside them added to ``frames_s`` (not the consumer's time), each one
        run under the backend's lease of the piece's utterance ``token`` (EngineError once it is overtaken)."""
        lease_ = self.backend.lease
        while True:
            t0 = time.perf_counter()
            with lease_.resume(token):
                res = next(steps, None)
            self.frames_s += time.perf_counter() - t0
            if res is None:
                return
            yield res

    def _decode(self, decoder: CodecStream, codes: np.ndarray) -> np.ndarray:
        """The audio float32 [n * frame_length] of ``codes`` int [C, n], timed (``codec_s``)."""
        t0 = time.perf_counter()
        audio = np.asarray(decoder.push(codes), dtype=np.float32)
        t1 = time.perf_counter()
        self.codec_s += t1 - t0
        chunk = self.timeline[self._decodes]  # decodes run in order, one at a time
        chunk.decode_start_s, chunk.decoded_s = t0 - self._start, t1 - self._start
        self._decodes += 1
        return audio
