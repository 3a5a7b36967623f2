"""How many CPU threads a torch backend's calls run on: all of them for a prefill; with the codec in a process of
its own, the CPUs split between its decodes and the frames.

torch's intra-op thread count is per OS thread (OpenMP's setting): ``torch.set_num_threads`` on the main thread
does not reach a server's worker threads, which start at OpenMP's default. So each call sets the count on the
thread that runs it (and restores it after), a fixed count per kind of call: the draws do not depend on which
thread runs an utterance or on timing (a frame's logits differ in the last bits between 1 and 2 threads; a
prefill's do not).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...errors import ConfigError


@dataclass(frozen=True)
class CallThreads:
    """Intra-op threads per kind of call: ``total`` for prefills and this process's codec and encoder calls,
    ``frame`` for frames, ``codec`` in the codec process (0: none).

    The codec process decodes beside the frames (:mod:`.codec_worker`), so the CPUs are split: the codec takes
    half (at least one), the frames the rest. A frame on every CPU beside a busy codec is slower than on its share
    (OpenMP's team waits on the thread the codec took), and a codec on one CPU beside frames on many becomes the
    slower side of the pipeline (a decode is compute-bound and scales with threads; a frame reads its weights and
    gains less). A prefill runs while the codec of its utterance has nothing to decode yet: it uses them all.
    """

    total: int
    frame: int
    codec: int

    @classmethod
    def for_backend(cls, threads: int, codec_process: bool, codec_threads: int | None = None) -> CallThreads:
        """The counts for a backend given ``threads`` (torch's count where it was loaded; at least 1 is used),
        whether its codec runs in a process of its own, and that process's ``codec_threads`` (None: half of
        ``threads``, at least 1). Raises ConfigError for ``codec_threads`` over the machine's CPUs."""
        threads = max(1, int(threads))
        cpus = os.cpu_count() or 1
        if codec_threads is not None and codec_threads > cpus:
            raise ConfigError(
                f"codec_threads is {codec_threads}, more than this machine's {cpus} CPUs: set at most {cpus} "
                "(AUDIO8_TORCH__CODEC_THREADS; none: half the threads)",
                "codec_threads",
            )
        if not codec_process:
            return cls(threads, threads, 0)
        codec = max(1, threads // 2 if codec_threads is None else int(codec_threads))
        return cls(threads, max(1, threads - codec), codec)


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
