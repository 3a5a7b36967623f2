"""The counters behind ``GET /metrics`` (prometheus-client, one registry per app): requests by status, errors by
code, frames, audio and compute seconds, RTF, time to first audio (TTFA), queue depth."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine.stream import SpeechStream

# TTFA buckets (seconds): a tiny model's first chunk on a GPU to a 0.6b cloned voice's cold prefill on a CPU
TTFA_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Spoken:
    """What a stream that ran to its end adds to the counters: its ``frames``, ``audio_s`` (seconds of speech),
    ``compute_s`` (prefill, frames and codec), ``ttfa_s`` (time to its first audio; None: no audio) and ``capped``
    (its pieces stopped at their frame cap). Picklable: a cluster's replica sends it to the ingress."""

    frames: int
    audio_s: float
    compute_s: float
    ttfa_s: float | None
    capped: int

    @classmethod
    def of(cls, stream: SpeechStream) -> Spoken:
        compute_s = stream.prefill_s + stream.frames_s + stream.codec_s
        return cls(stream.frames, stream.duration_s, compute_s, stream.first_audio_s, len(stream.capped))


class Metrics:
    """Prometheus metrics for ``/metrics``, updated from worker threads (prometheus-client locks its values).
    Names: ``audio8_requests_total{status}``, ``audio8_errors_total{code}``, ``audio8_frames_total``,
    ``audio8_audio_seconds_total``, ``audio8_compute_seconds_total``, ``audio8_rtf`` (compute seconds per second
    of speech, all requests so far), ``audio8_ttfa_seconds`` (histogram) and its mean ``audio8_ttfa_seconds_mean``,
    ``audio8_queue_depth``, ``audio8_in_flight``, ``audio8_capped_pieces_total`` (pieces of speech stopped at their
    frame cap before the model ended them: cut, perhaps). ``queue=False`` (Ray's ingress, which does not see Ray's
    queue): no ``audio8_queue_depth``, which would read 0 whatever waits."""

    def __init__(self, queue: bool = True) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("audio8_requests", "Finished HTTP requests by status code.", ["status"], registry=r)
        self.errors = Counter("audio8_errors", "Refused or failed requests by error code.", ["code"], registry=r)
        self.running = Gauge("audio8_in_flight", "Requests running on a worker.", registry=r)
        self.frames = Counter("audio8_frames", "Frames generated (46 ms of audio each).", registry=r)
        self.audio_s = Counter("audio8_audio_seconds", "Seconds of speech delivered.", registry=r)
        self.compute_s = Counter("audio8_compute_seconds", "Seconds spent in prefill, frames and codec.", registry=r)
        self.ttfa = Histogram(
            "audio8_ttfa_seconds", "Time to first audio (prefill included).", buckets=TTFA_BUCKETS, registry=r
        )
        rtf = Gauge("audio8_rtf", "Compute seconds per second of speech, all requests so far.", registry=r)
        rtf.set_function(lambda: _ratio(_sample(self.compute_s, "_total"), _sample(self.audio_s, "_total")))
        mean = Gauge("audio8_ttfa_seconds_mean", "Mean time to first audio (prefill included).", registry=r)
        mean.set_function(lambda: _ratio(_sample(self.ttfa, "_sum"), _sample(self.ttfa, "_count")))
        self.queued = Gauge("audio8_queue_depth", "Requests waiting for a worker.", registry=r) if queue else None
        self.capped = Counter(
            "audio8_capped_pieces", "Pieces stopped at their frame cap before the model ended them.", registry=r
        )

    def count(self, status: int, code: str | None = None) -> None:
        """A finished request: its HTTP ``status``, and for a refusal or failure its error ``code``."""
        self.requests.labels(str(status)).inc()
        if code is not None:
            self.errors.labels(code).inc()

    def frame(self) -> None:
        self.frames.inc()

    def finished(self, spoken: Spoken, frames: bool = False) -> None:
        """A stream that ran to its end (:class:`Spoken`): its audio and compute seconds, its TTFA, its capped
        pieces, and with ``frames`` its frames (where they were not counted as they were made: a cluster's)."""
        if frames:
            self.frames.inc(spoken.frames)
        self.audio_s.inc(spoken.audio_s)
        self.capped.inc(spoken.capped)
        self.compute_s.inc(spoken.compute_s)
        if spoken.ttfa_s is not None:
            self.ttfa.observe(spoken.ttfa_s)

    def text(self, queued: int, running: int) -> bytes:
        """The Prometheus text exposition, with the queue's ``queued`` and ``running`` requests now."""
        if self.queued is not None:
            self.queued.set(queued)
        self.running.set(running)
        return generate_latest(self.registry)


def _sample(metric: Counter | Histogram, suffix: str) -> float:
    """The value of ``metric``'s sample whose name ends with ``suffix`` (``_total``, ``_sum``, ``_count``)."""
    return next(s.value for s in metric.collect()[0].samples if s.name.endswith(suffix))


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0
