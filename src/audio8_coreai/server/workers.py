"""The model instances behind a bounded queue: one request at a time on each, a 503 when the queue is full."""

from __future__ import annotations

import asyncio
import contextvars
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..tts import TTS
from .errors import ApiError, shutting_down


class Workers:
    """``instances`` (TTS instances, one model each) behind a bounded queue: a job runs on a worker thread with a
    TTS instance of its own, the free one listed first (batched rows: the rows in use stay the lowest, so a batched
    frame's bucket stays small, :class:`..backends.torch.cudagraphs.GraphedRows`); at most ``len(instances) +
    max_queue`` jobs are admitted at once."""

    def __init__(self, instances: Sequence[TTS], max_queue: int):
        self.instances = list(instances)
        self.max_queue = max_queue
        self._free: queue.PriorityQueue[tuple[int, TTS]] = queue.PriorityQueue()  # (index, instance)
        for i, e in enumerate(self.instances):
            self._free.put((i, e))
        self._pool = ThreadPoolExecutor(len(self.instances), thread_name_prefix="audio8-worker")
        self._lock = threading.Lock()
        self.admitted = 0
        self.running = 0
        self._job_s = 1.0  # running mean of job seconds, for Retry-After
        self.draining = False

    @property
    def queued(self) -> int:
        return self.admitted - self.running

    def admit(self) -> None:
        """Take a place, or raise ApiError 503 with Retry-After (the expected wait, seconds) when full, 503
        shutting_down once :meth:`drain` was called."""
        if self.draining:
            raise shutting_down()
        with self._lock:
            if self.admitted >= len(self.instances) + self.max_queue:
                wait = math.ceil(self._job_s * (1 + self.queued / len(self.instances)))
                workers = len(self.instances)
                raise ApiError(
                    503,
                    f"the server is busy: its {workers} worker{'s' * (workers != 1)} and {self.max_queue} queue "
                    f"place{'s' * (self.max_queue != 1)} are all taken; retry later (after Retry-After seconds)",
                    code="queue_full",
                    headers={"Retry-After": str(wait)},
                )
            self.admitted += 1

    def submit(self, job: Callable[[TTS], Any]) -> asyncio.Future[Any]:
        """Run ``job(tts)`` on a worker (after :meth:`admit`), in the caller's context (its log lines carry the
        request's id, :mod:`.requestid`); the place is freed when it returns."""

        def run() -> Any:
            index, tts = self._free.get()
            t0 = time.perf_counter()
            with self._lock:
                self.running += 1
            try:
                return job(tts)
            finally:
                self._free.put((index, tts))
                with self._lock:
                    self.running -= 1
                    self.admitted -= 1
                    self._job_s = 0.8 * self._job_s + 0.2 * (time.perf_counter() - t0)

        return asyncio.wrap_future(self._pool.submit(contextvars.copy_context().run, run))

    async def result(self, job: Callable[[TTS], Any]) -> Any:
        """:meth:`submit`'s result; raises ApiError 503 shutting_down when :meth:`drain` dropped the job unrun."""
        future = self.submit(job)
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.draining and future.cancelled() and not (task is not None and task.cancelling()):
                raise shutting_down() from None
            raise

    def drain(self) -> None:
        """Refuse new work (:meth:`admit`) and drop the jobs waiting for a worker; running ones go on."""
        self.draining = True
        self.shutdown()

    def shutdown(self) -> None:
        """Drop waiting jobs; running ones end with their requests (a closed stream stops at its next frame)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
