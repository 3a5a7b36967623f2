"""Batched rows: several utterances in one frame call, and one frame thread behind many request threads.

:class:`TorchBatchFrames` holds ``max_batch`` rows of KV state [n_layer, max_batch, n_kv, max_seq_len, head_dim], one
utterance per row. A row is filled by a prefill (run alone); then :meth:`TorchBatchFrames.frames` runs one frame for
any set of rows in one call: the linears of the slow AR, the fast AR and the heads on all of them at once,
attention per row at its own position (:meth:`...model.frame.Frame.slow_rows`), frame-0 rows (drawn from their
prefill) in the same sampler pass. Rows come and go between frames (continuous batching).

This is how ``audio8 serve --batch N`` shares the weights: a :class:`FrameServer` owns a :class:`TorchBatchFrames` and
one thread that runs it. Each of its ``N`` rows
is lent to a :class:`RowBackend`, a backend with the engine's calls (``prefill``, ``frame``,
the codec) that hands its model work to that thread and waits for the answer. A request thread drives its
utterance exactly as with a backend of its own (:class:`...engine.stream.SpeechStream`: splitting, noise, RAS window,
streaming codec all unchanged), while the frame thread gathers the frame calls of every row that is waiting and
runs them as one batched call: N streams read the weights once per frame. The codec runs on the request
threads, beside the frame loop (on another core), or (``batch_codec``, the default on CUDA) on one codec thread
that stacks the rows' pushes into one call on its own CUDA stream (:mod:`.codec_rows`). With the backend's frames
as CUDA graphs (the default on CUDA) the batched frames are graphs too, one per bucketed batch size
(:class:`.cudagraphs.GraphedRows`).

Rows whose thread is busy elsewhere (decoding a chunk, sending bytes) are simply not in that frame's call; the
frame thread waits at most ``gather_s`` for the rows heard from in the last ``DEFAULTS.server.recent_s`` once one call
is ready.
Calls with different sampling
settings go in separate batched calls.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...config import SamplingParams
from ...errors import BackendError, ConfigError, EngineError
from ...model.frame import packed
from ...settings import DEFAULTS
from ..base import Backend, CodecStream, FrameResult, StepInputs
from .backend import TorchBackend
from .codec_rows import CodecRows
from .cudagraphs import GraphedRows, StepTimes, bucket_sizes
from .host_edge import draw_ahead, frame_inputs, frame_results, prefilled
from .memory import device_memory_bytes
from .threads import running_on


def _check_fits(backend: TorchBackend, rows: int) -> None:
    """ConfigError (field ``max_batch``) when a KV state of ``rows`` rows is larger than the device's memory, before
    it is allocated (a huge ``--batch`` is refused, not an allocator failure or the OOM killer)."""
    cfg, dtype = backend.cfg, backend.model.slow.norm.weight.dtype
    row = 2 * cfg.n_layer * cfg.n_local_heads * cfg.max_seq_len * cfg.head_dim * dtype.itemsize  # k and v
    have = device_memory_bytes(backend.device)
    if have is not None and rows * row > have:
        gb = 2**30
        raise ConfigError(
            f"{rows} batch rows of KV state need {rows * row / gb:.1f} GB ({row / 2**20:.1f} MB a row), more than "
            f"the {have / gb:.1f} GB of {backend.device.type} memory: lower --batch (max_batch); at most "
            f"{have // row} rows fit in it, the weights aside",
            "max_batch",
        )


class TorchBatchFrames:
    """The rows of a batch over a :class:`.backends.torch.TorchBackend`'s model (same weights, same precision).

    Holds the KV state [n_layer, max_batch, n_kv, max_seq_len, head_dim] (each row 50 MB at fp32 for the 0.6b
    model) and which rows are taken. :meth:`prefill` fills one row (the backend's prefill, written into that row);
    :meth:`frames` runs one frame for any set of rows in one call. Not thread-safe: one thread drives it.

    When the backend's ``frame_mode`` is ``graph`` (CUDA graphs), frames run the frame's static batched form
    through :class:`.cudagraphs.GraphedRows` (captured on CUDA, eager elsewhere) at the batch sizes of
    :func:`.cudagraphs.bucket_sizes`, over the KV state's first rows in place: :meth:`acquire` lends the lowest
    free row, so the rows in use stay low and a call's bucket small.
    """

    def __init__(self, backend: TorchBackend, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend, self.max_batch, self.cfg = backend, max_batch, backend.cfg
        _check_fits(backend, max_batch)
        self.k_cache, self.v_cache = backend.model.new_kv_cache(batch=max_batch)
        self.graphed = None
        if backend.frame_mode == "graph":
            capture = backend.device.type == "cuda"
            self.graphed = GraphedRows(backend.model, self.k_cache, self.v_cache, bucket_sizes(max_batch), capture)
        self._free = list(range(max_batch))
        self.times: StepTimes | None = None  # set one to time the batched graphs' steps (benchmarks)
        self._prefilled: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # row -> its prefill's logits, hidden

    @property
    def free(self) -> int:
        """Rows not taken."""
        return len(self._free)

    def acquire(self) -> int:
        """Take a free row (the lowest); raises EngineError when every row is taken."""
        if not self._free:
            raise EngineError(f"all {self.max_batch} rows of the batch are busy; wait until one frees")
        self._free.sort()
        return self._free.pop(0)

    def release(self, row: int) -> None:
        """Give ``row`` back (its KV slots are overwritten by the next prefill)."""
        self._prefilled.pop(row, None)
        if row not in self._free:
            self._free.append(row)

    def prefill(self, row: int, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prefill ``prompt`` int [1+C, P] into ``row``; returns its last logits [V+1] and hidden [dim]
        (float32, as the backend's prefill) and keeps them for the row's frame 0."""
        b = self.backend
        logits, hidden = b.prefill(prompt, self.k_cache[:, row : row + 1], self.v_cache[:, row : row + 1])
        dtype = b.model.slow.norm.weight.dtype
        self._prefilled[row] = (
            torch.as_tensor(logits, device=b.device).to(dtype),
            torch.as_tensor(hidden, device=b.device).to(dtype),
        )
        return logits, hidden

    @torch.inference_mode()
    def frames(self, params: SamplingParams, calls: Sequence[tuple[int, StepInputs]]) -> list[FrameResult]:
        """One frame for each call (its KV row and its step's inputs), in one batched call: the slow step of the
        calls (a frame 0 steps one it drops, unless every call is a frame 0), then one sampler pass (semantic draws,
        the fast AR's rows, codebook draws) for all.
        Returns their results in order;
        each equals the backend's ``frame`` on the same inputs up to float rounding."""
        if not calls:
            return []
        with running_on(self.backend.threads.frame):
            if self.graphed is not None:
                return self._graphed_frames(params, calls)
            return self._eager_frames(params, calls)

    def _graphed_frames(self, params: SamplingParams, calls: Sequence[tuple[int, StepInputs]]) -> list[FrameResult]:
        """:meth:`frames` through the batched graphs: stage, replay, results (each timed into :attr:`times` when
        it is set, the replay then waited for)."""
        t0 = time.perf_counter()
        size = self.graphed.stage(calls, self._prefilled)
        t1 = time.perf_counter()
        out, ids = self.graphed.replay(params, size)
        draw_ahead([x for _, x in calls])
        if self.times is not None and self.backend.device.type == "cuda":
            torch.cuda.synchronize(self.backend.device)
        t2 = time.perf_counter()
        results = frame_results(out, ids, [row for row, _ in calls], [x.logits for _, x in calls])
        if self.times is not None:
            self.times.add(t1 - t0, t2 - t1, time.perf_counter() - t2)
        return results

    def _eager_frames(self, params: SamplingParams, calls: Sequence[tuple[int, StepInputs]]) -> list[FrameResult]:
        """:meth:`frames` in eager mode: the frame over the calls' KV rows (:meth:`...model.frame.Frame.forward`)."""
        b = self.backend
        rows = [row for row, _ in calls]
        steps = [x for _, x in calls]
        inputs = frame_inputs(self.cfg, steps, b.device, rows=rows)
        first = prefilled([self._prefilled[row] if x.column is None else None for row, x in calls])
        out = b.frame_maths(params, inputs, self.k_cache, self.v_cache, first)
        draw_ahead(steps)
        return frame_results(out, packed(out), range(len(calls)), [x.logits for x in steps])


@dataclass
class _Job:
    """Work for the frame thread: ``run()`` (a prefill) or a frame ``call`` with its ``params``."""

    row: int
    run: Callable[[], Any] | None = None
    params: SamplingParams | None = None
    call: StepInputs | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class FrameServer:
    """The frame thread and its rows: ``rows()`` gives the ``max_batch`` :class:`RowBackend` s.

    Thread-safe: each RowBackend is used by one request thread at a time (the server's workers). ``close()``
    stops the thread (calls waiting then raise RuntimeError).

    ``batch_codec`` (None: on CUDA): the rows' codec streams share one codec thread that stacks their pushes into
    one call (:class:`.codec_rows.CodecRows`, on its own CUDA stream); off, each row decodes on its request thread.
    ``warm``: sampling settings whose batched graphs are captured now, every bucket (a capture mid-serving stalls
    every stream); others are captured on first use. On CUDA the frame thread issues its work on a stream of the
    highest priority, so the codec's kernels (on a stream of the default, low priority) wait behind the frames.
    Raises ValueError for ``batch_codec`` with the backend's codec in a process of its own.
    """

    def __init__(
        self,
        backend: TorchBackend,
        max_batch: int,
        gather_s: float = DEFAULTS.server.gather_s,
        batch_codec: bool | None = DEFAULTS.torch.batch_codec,
        warm: Sequence[SamplingParams] = (),
    ):
        if batch_codec is None:
            batch_codec = backend.device.type == "cuda" and backend.codec_worker is None
        if batch_codec and backend.codec_worker is not None:
            raise ValueError("the batched codec runs the decoder in this process: load with codec_process off")
        self.backend = backend
        self.batch = TorchBatchFrames(backend, max_batch)
        if self.batch.graphed is not None:
            for params in warm:
                self.batch.graphed.capture_all(params)
        self.codec = CodecRows(backend.decoder, gather_s, tf32=backend.codec_tf32) if batch_codec else None
        self.gather_s = gather_s
        self._cond = threading.Condition()
        self._jobs: list[_Job] = []
        self._closed = False
        self._seen: dict[int, float] = {}  # row -> when it last submitted work
        self.encode_lock = threading.Lock()  # the backend builds its encoder on first use
        self._rows = [RowBackend(self, self.batch.acquire()) for _ in range(max_batch)]
        self.frame_calls = 0  # batched calls run, and the frames they held (mean batch = frames / calls)
        self.frames = 0
        self._thread = threading.Thread(target=self._loop, name="audio8-frames", daemon=True)
        self._thread.start()

    def rows(self) -> list[RowBackend]:
        """The ``max_batch`` row backends, one per request thread."""
        return list(self._rows)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        if self.codec is not None:
            self.codec.close()

    def submit(self, job: _Job) -> Any:
        """Queue ``job`` for the frame thread and wait for its result (its exception is raised here)."""
        with self._cond:
            if self._closed:
                raise _closed_error()
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
            expected = sum(now - seen < DEFAULTS.server.recent_s for seen in self._seen.values())
            while len(self._jobs) < expected and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
                if any(job.run is not None for job in self._jobs):
                    break
            jobs = [job for job in self._jobs if job.run is None]
            self._jobs = [job for job in self._jobs if job.run is not None]
            return jobs

    def _loop(self) -> None:
        dev = self.backend.device
        stream = torch.cuda.Stream(dev, priority=-1) if dev.type == "cuda" else None  # -1: the highest
        with contextlib.nullcontext() if stream is None else torch.cuda.stream(stream):
            self._serve()

    def _serve(self) -> None:
        while (jobs := self._take()) is not None:
            if jobs[0].run is not None:
                self._finish(jobs, lambda: [jobs[0].run()])
                continue
            groups: dict[SamplingParams, list[_Job]] = {}
            for job in jobs:
                groups.setdefault(job.params, []).append(job)
            for params, group in groups.items():
                calls = [(job.row, job.call) for job in group]
                self._finish(group, lambda params=params, calls=calls: self.batch.frames(params, calls))
                self.frame_calls += 1
                self.frames += len(group)
        with self._cond:  # closed: fail whatever still waits
            for job in self._jobs:
                job.error = _closed_error()
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


def _closed_error() -> BackendError:
    return BackendError("this batched model's frame server was closed: call batched() again on the model it came from")


class RowBackend(Backend):
    """A backend for one request thread at a time, on one row of a :class:`FrameServer`: the calls of
    :class:`..base.Backend` with the model work done by the frame thread, the codec on the caller's thread.
    Results equal the torch backend's up to the rounding of batched matmuls."""

    name = "torch"
    overlaps_codec = True

    def __init__(self, server: FrameServer, row: int):
        super().__init__()
        self.server, self.row = server, row
        self.shared = server.backend
        self.cfg = self.shared.cfg
        self.checkpoint = self.shared.checkpoint
        self.device = self.shared.device
        self.precision = self.shared.precision
        self.codec_process = self.shared.codec_process
        self.noise_ahead = self.shared.noise_ahead

    @property
    def description(self) -> str:
        return f"{self.shared.description}, batched x{self.server.batch.max_batch}"

    @property
    def device_name(self) -> str:
        return self.shared.device_name

    def no_batching(self) -> BackendError:
        return BackendError(
            "this model is one row of a batched model (TTS.batched): it speaks one utterance at a time beside the "
            "other rows; batch with the model batched() was called on"
        )

    def reset(self) -> None:
        """Nothing to zero: a row's prefill overwrites the slots its frames attend."""

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prefill ``prompt`` int [1+C, P] into this row (on the frame thread, alone)."""
        return self.server.submit(_Job(self.row, run=lambda: self.server.batch.prefill(self.row, prompt)))

    def frame(self, params: SamplingParams, step: StepInputs) -> FrameResult:
        """This row's frame, run by the frame thread in one batched call with the other rows waiting."""
        return self.server.submit(_Job(self.row, params=params, call=step))

    def decode_window(self, codes: np.ndarray) -> np.ndarray:
        """A whole utterance's decode (``generate``, ``synthesize``): through the server's batched codec when it has
        one (its pushes stacked with the other rows' in one call), else the backend's own."""
        if self.server.codec is None:
            return self.shared.decode_window(codes)
        return self.server.codec.stream().push(codes)

    def codec_stream(self) -> CodecStream:
        """The server's batched codec stream when it has one, else the backend's own."""
        codec = self.server.codec
        return self.shared.codec_stream() if codec is None else codec.stream()

    def encode(self, audio: np.ndarray) -> np.ndarray:
        with self.server.encode_lock:
            return self.shared.encode(audio)
