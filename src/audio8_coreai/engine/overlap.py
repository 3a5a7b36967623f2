"""The codec beside the frame loop: one utterance's chunks of codes decoded in order while the next frames are made.

With the codec in a process of its own (``Backend.codec_process``) the frame loop hands each chunk to a thread that
only sends it and waits on the pipe (releasing the GIL), so frames and codec run on two cores at once. At most
``limit`` chunks are in flight; beyond that the frame loop waits for the oldest, so memory stays bounded when the
codec is the slower of the two.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..backends.base import Backend
from ..settings import DEFAULTS


class CodecQueue:
    """Chunks of one utterance's codes (int [C, n] each) decoded by ``decode`` (-> float32 audio), in order.

    ``overlap``: each chunk is decoded on a thread of its own while the caller goes on; otherwise at once, in
    :meth:`put`. Use as a context manager (or call :meth:`close`):
    leaving it cancels the chunks not yet started and waits for the one being decoded.
    """

    def __init__(
        self, decode: Callable[[np.ndarray], np.ndarray], overlap: bool, limit: int = DEFAULTS.torch.codec_queue
    ):
        self._decode = decode
        self._limit = max(1, limit)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="audio8-codec") if overlap else None
        self._pending: deque[Future] = deque()

    def put(self, codes: np.ndarray) -> None:
        """Queue the next chunk; waits first while ``limit`` chunks are still decoding. Raises what a decode raised
        (at once without ``overlap``)."""
        if self._pool is None:
            future: Future = Future()
            future.set_result(self._decode(codes))
        else:
            running = [f for f in self._pending if not f.done()]
            if len(running) >= self._limit:
                running[0].result()
            future = self._pool.submit(self._decode, codes)
        self._pending.append(future)

    def ready(self) -> Iterator[np.ndarray]:
        """The decoded chunks at the front of the queue, in order, without waiting."""
        while self._pending and self._pending[0].done():
            yield self._pending.popleft().result()

    def drain(self) -> Iterator[np.ndarray]:
        """Every chunk left, in order, waiting for each."""
        while self._pending:
            yield self._pending.popleft().result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> CodecQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UtteranceDecode:
    """A whole utterance's decode, beside its frame loop when the backend's codec runs in a process of its own
    (``Backend.codec_process``): pass :meth:`add` as :func:`.loop.generate`'s ``on_codes``, then :meth:`audio`.

    Overlapped, every ``chunk_frames`` frames go to one codec stream as they come, the pushes
    ``Backend.decode_window`` makes (``DEFAULTS.torch.decode_chunk_frames``), so the samples are its samples; otherwise
    :meth:`audio` is ``decode_window`` of the whole. Use as a context manager (see :class:`CodecQueue`).
    """

    def __init__(self, backend: Backend, chunk_frames: int = DEFAULTS.torch.decode_chunk_frames):
        self._backend = backend
        self._chunk = chunk_frames
        self._frames: list[np.ndarray] = []
        self._queue = CodecQueue(backend.codec_stream().push, overlap=True) if backend.codec_process else None

    def add(self, codes: np.ndarray) -> None:
        """The next frame's codes int64 [C]; a full chunk goes to the codec (waits while the queue is full)."""
        if self._queue is None:
            return
        self._frames.append(codes)
        if len(self._frames) == self._chunk:
            self._queue.put(np.stack(self._frames, axis=1))
            self._frames = []

    def audio(self, codes: np.ndarray) -> np.ndarray:
        """The float32 audio [T * frame_length] of the utterance's codes int64 [C, T] (those given to :meth:`add`)."""
        if self._queue is None:
            return self._backend.decode_window(codes) if codes.shape[1] else np.zeros(0, dtype=np.float32)
        if self._frames:
            self._queue.put(np.stack(self._frames, axis=1))
            self._frames = []
        return np.concatenate([np.zeros(0, dtype=np.float32), *self._queue.drain()])

    def close(self) -> None:
        if self._queue is not None:
            self._queue.close()

    def __enter__(self) -> UtteranceDecode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
