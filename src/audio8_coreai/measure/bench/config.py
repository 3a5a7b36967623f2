"""The benchmark's constants (the sentence, streaming chunk sizes), a configuration's label (a configuration is
the settings tree's :class:`...settings.BenchSettings`) and the median timer every figure uses."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from ...settings import BenchSettings

SENTENCE = (
    "The meeting has been moved to Thursday afternoon, so please update your calendars and let "
    "the rest of the team know before the end of the day."
)
STREAM_CHUNK = 32  # frames emitted per streaming decode
STREAM_WINDOW = 160  # frames decoded per streaming chunk (128 of context, attention window of the codec)
FAST_PASSES = 9  # rows 0+1 in one pass, then rows 2..9
PUBLISHER = {"ms_per_frame": 265.0, "rtf": 6.7, "peak_rss_gb": 5.75}  # its own fp32 generate, this machine
PUBLISHER_SIZE = (896, 24, 4)  # the 0.6b's slow AR width and blocks, fast AR blocks: PUBLISHER's figures are its


def label(cfg: BenchSettings) -> str:
    """A configuration's name in the table: its precision (or baseline), threads, codec dtype and graphs."""
    name = "baseline" if cfg.baseline else cfg.precision
    codec = f" codec {cfg.codec_dtype}" if cfg.codec_dtype else ""
    return f"{name} {cfg.threads or 'auto'}t{codec}" + (" graphs" if cfg.cuda_graphs else "")


def median_ms(fn: Callable[[], object], runs: int, inner: int = 1) -> tuple[float, list[float]]:
    """One warm-up call, then ``runs`` timed runs of ``inner`` calls; (median ms per call, all runs)."""
    fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(out), out
