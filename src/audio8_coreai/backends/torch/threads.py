"""How many CPU threads a torch backend's calls run on: all of them for a prefill, one fewer for frames while the
codec has a process of its own.

torch's intra-op thread count is per OS thread (OpenMP's setting): ``torch.set_num_threads`` on the main thread
does not reach a server's worker threads, which start at OpenMP's default. So each call sets the count on the
thread that runs it (and restores it after), a fixed count per kind of call: the draws do not depend on which
thread runs an utterance or on timing (a frame's logits differ in the last bits between 1 and 2 threads; a
prefill's do not).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CallThreads:
    """Intra-op threads per kind of call: ``total`` for prefills and this process's codec and encoder calls,
    ``frame`` for frames.

    The codec process decodes on one CPU beside the frames (:mod:`.codec_worker`), so frames leave it one: a
    frame on every CPU beside a busy codec is slower than on one fewer (the memory-bound frame gains little from
    the last thread, and OpenMP's workers wait on the one the codec took). A prefill runs while the codec of its
    utterance has nothing to decode yet (compute-bound: it uses them all).
    """

    total: int
    frame: int

    @classmethod
    def for_backend(cls, threads: int, codec_process: bool) -> CallThreads:
        """The counts for a backend given ``threads`` (>= 1, torch's count where it was loaded) and whether its
        codec runs in a process of its own."""
        threads = max(1, int(threads))
        return cls(threads, max(1, threads - 1) if codec_process else threads)


@contextmanager
def running_on(n: int) -> Iterator[None]:
    """Run this OS thread's torch ops inside the block on ``n`` intra-op threads, the count it had restored after
    (each switch well under a microsecond). Set even when ``torch.get_num_threads()`` already says ``n``: in a
    thread that never set it, that reports the count last set anywhere while OpenMP runs its default."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
