"""The benchmark's configurations and constants (the sentence, streaming chunk sizes, the default checkpoint),
and the median timer every figure uses."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...settings import DEFAULTS

SENTENCE = (
    "The meeting has been moved to Thursday afternoon, so please update your calendars and let "
    "the rest of the team know before the end of the day."
)
STREAM_CHUNK = 32  # frames emitted per streaming decode
FIRST_CHUNK = DEFAULTS.speech.first_chunk_frames  # frames of a stream's first chunk (engine/stream.py)
STREAM_WINDOW = 160  # frames decoded per streaming chunk (128 of context, attention window of the codec)
FAST_PASSES = 9  # rows 0+1 in one pass, then rows 2..9
DEFAULT_CHECKPOINT = Path(DEFAULTS.bench.checkpoint)
PUBLISHER = {"ms_per_frame": 265.0, "rtf": 6.7, "peak_rss_gb": 5.75}  # its own fp32 generate, this machine


@dataclass(frozen=True)
class BenchConfig:
    """One configuration, run in its own subprocess."""

    checkpoint: str
    backend: str = "torch"
    device: str = "cpu"
    precision: str = "fp32"
    threads: int | None = None
    runs: int = DEFAULTS.bench.runs
    frames: int = DEFAULTS.bench.frames
    baseline: bool = False  # measure the publisher-style frame instead of the backend's
    codec_dtype: str | None = None  # None: the backend's default (fp32 on CPU); bf16 opts in
    cuda_graphs: bool = False  # the frame replayed as one CUDA graph (backends/torch/cudagraphs.py)

    @property
    def label(self) -> str:
        name = "baseline" if self.baseline else self.precision
        codec = f" codec {self.codec_dtype}" if self.codec_dtype else ""
        return f"{name} {self.threads or 'auto'}t{codec}" + (" graphs" if self.cuda_graphs else "")


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
