"""One batched frame loop behind many request threads: how ``audio8 serve --batch N`` shares the weights.

A :class:`FrameServer` owns a :class:`.batching.BatchModel` and one thread that runs it. Each of its ``N`` rows
is lent to a :class:`RowBackend`, a backend with the engine's calls (``prefill``, ``first_frame``, ``frame``,
the codec) that hands its model work to that thread and waits for the answer. A request thread drives its
utterance exactly as with a backend of its own (:class:`.streaming.SpeechStream`: splitting, noise, RAS window,
streaming codec all unchanged), while the frame thread gathers the frame calls of every row that is waiting and
runs them as one batched call: N streams read the weights once per frame. The codec runs on the request
threads, beside the frame loop (on another core).

Rows whose thread is busy elsewhere (decoding a chunk, sending bytes) are simply not in that frame's call; the
frame thread waits at most ``gather_s`` for the rows heard from in the last ``RECENT_S`` once one call is ready. Calls with different sampling
settings go in separate batched calls (see :mod:`.batching`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .backends.torch import FrameResult, TorchBackend
from .batching import BatchModel, FrameCall
from .graphs import SamplingParams
from .settings import DEFAULTS

GATHER_S = DEFAULTS.gather_s  # how long a ready frame call waits for the other rows' calls (a frame takes 50-500 ms)
RECENT_S = DEFAULTS.recent_s  # a row that submitted work this recently is expected to submit its next frame soon


@dataclass
class _Job:
    """Work for the frame thread: ``run()`` (a prefill) or a frame ``call`` with its ``params``."""

    row: int
    run: Callable[[], Any] | None = None
    params: SamplingParams | None = None
    call: FrameCall | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class FrameServer:
    """The frame thread and its rows: ``rows()`` gives the ``max_batch`` :class:`RowBackend` s.

    Thread-safe: each RowBackend is used by one request thread at a time (the server's workers). ``close()``
    stops the thread (calls waiting then raise RuntimeError).
    """

    def __init__(self, backend: TorchBackend, max_batch: int, gather_s: float = GATHER_S):
        self.backend = backend
        self.model = BatchModel(backend, max_batch)
        self.gather_s = gather_s
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._closed = False
        self._seen: dict[int, float] = {}  # row -> when it last submitted work
        self._encode_lock = threading.Lock()  # the backend builds its encoder on first use
        self._rows = [RowBackend(self, self.model.acquire()) for _ in range(max_batch)]
        self.frame_calls = 0  # batched calls run, and the frames they held (mean batch = frames / calls)
        self.frames = 0
        self._thread = threading.Thread(target=self._loop, name="audio8-frames", daemon=True)
        self._thread.start()

    def rows(self) -> list["RowBackend"]:
        return list(self._rows)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def submit(self, job: _Job) -> Any:
        """Queue ``job`` for the frame thread and wait for its result (its exception is raised here)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the frame server is closed")
            self._jobs.append(job)
            self._seen[job.row] = time.monotonic()
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _take(self) -> list[_Job] | None:
        """The next jobs to run: a prefill alone, or the frame calls waiting (after gathering stragglers)."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            for i, job in enumerate(self._jobs):
                if job.run is not None:
                    return [self._jobs.pop(i)]
            now = time.monotonic()
            deadline = now + self.gather_s
            # Rows heard from lately are in an utterance: worth waiting a moment for.
            expected = sum(now - seen < RECENT_S for seen in self._seen.values())
            while len(self._jobs) < expected and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
                if any(job.run is not None for job in self._jobs):
                    break
            jobs = [job for job in self._jobs if job.run is None]
            self._jobs = [job for job in self._jobs if job.run is not None]
            return jobs

    def _loop(self) -> None:
        while (jobs := self._take()) is not None:
            if jobs[0].run is not None:
                self._finish(jobs, lambda: [jobs[0].run()])
                continue
            groups: dict[SamplingParams, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.params, []).append(job)
            for params, group in groups.items():
                self._finish(group, lambda: self.model.frames(params, [job.call for job in group]))
                self.frame_calls += 1
                self.frames += len(group)
        with self._cond:  # closed: fail whatever still waits
            for job in self._jobs:
                job.error = RuntimeError("the frame server is closed")
                job.done.set()

    @staticmethod
    def _finish(jobs: list[_Job], work: Callable[[], list[Any]]) -> None:
        try:
            for job, result in zip(jobs, work()):
                job.result = result
        except BaseException as e:  # the callers raise it
            for job in jobs:
                job.error = e
        for job in jobs:
            job.done.set()


class RowBackend:
    """A backend for one request thread at a time, on one row of a :class:`FrameServer`: the engine's calls
    (see :class:`.engine.Backend`) with the model work done by the frame thread, the codec on the caller's
    thread. Results equal the torch backend's up to the rounding of batched matmuls (:mod:`.batching`)."""

    name = "torch"

    def __init__(self, server: FrameServer, row: int):
        self.server, self.row = server, row
        self.shared = server.backend
        self.cfg = self.shared.cfg
        self.checkpoint = self.shared.checkpoint
        self.device = self.shared.device
        self.precision = self.shared.precision

    @property
    def description(self) -> str:
        return f"{self.shared.description}, batched x{self.server.model.max_batch}"

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prefill ``prompt`` int [1+C, P] into this row (on the frame thread, alone)."""
        return self.server.submit(_Job(self.row, run=lambda: self.server.model.prefill(self.row, prompt)))

    def first_frame(self, params: SamplingParams, noise_slow: np.ndarray, window: np.ndarray,
                    noise_fast: np.ndarray, forced: np.ndarray | None = None) -> FrameResult:
        call = FrameCall(self.row, None, 0, noise_slow, window, noise_fast, forced)
        return self.server.submit(_Job(self.row, params=params, call=call))

    def frame(self, params: SamplingParams, column: np.ndarray, pos: int, noise_slow: np.ndarray,
              window: np.ndarray, noise_fast: np.ndarray, forced: np.ndarray | None = None) -> FrameResult:
        call = FrameCall(self.row, np.asarray(column, dtype=np.int64), pos, noise_slow, window, noise_fast, forced)
        return self.server.submit(_Job(self.row, params=params, call=call))

    def decode_window(self, codes: np.ndarray) -> np.ndarray:
        return self.shared.decode_window(codes)

    def codec_stream(self):
        return self.shared.codec_stream()

    def encode(self, audio: np.ndarray) -> np.ndarray:
        with self.server._encode_lock:
            return self.shared.encode(audio)


def batched_engines(tts, max_batch: int) -> tuple[FrameServer, list]:
    """``max_batch`` :class:`.tts.TTS` instances sharing ``tts``'s model through one :class:`FrameServer` (its
    backend must be the torch backend): one per server worker. Raises BackendError otherwise, ValueError for
    ``max_batch`` < 1."""
    from .backends.torch import BackendError
    from .tts import TTS

    if not isinstance(tts.backend, TorchBackend):
        raise BackendError(f"batching runs on the torch backend, not {tts.backend.name}: drop --batch")
    server = FrameServer(tts.backend, max_batch)
    return server, [TTS(tts.checkpoint, row, tts.prompts, tts.voices) for row in server.rows()]
