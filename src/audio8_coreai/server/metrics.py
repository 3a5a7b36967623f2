"""The counters behind ``GET /metrics`` and their Prometheus text."""

from __future__ import annotations

import threading

from ..engine.stream import SpeechStream


class Metrics:
    """Counters for ``/metrics``, updated from worker threads (under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.frames = 0
        self.audio_s = 0.0
        self.compute_s = 0.0
        self.ttfa_sum = 0.0
        self.ttfa_count = 0

    def count(self, status: int) -> None:
        with self._lock:
            self.requests[str(status)] = self.requests.get(str(status), 0) + 1

    def frame(self) -> None:
        with self._lock:
            self.frames += 1

    def finished(self, stream: SpeechStream) -> None:
        with self._lock:
            self.audio_s += stream.duration_s
            self.compute_s += stream.prefill_s + stream.frames_s + stream.codec_s
            if stream.first_audio_s is not None:
                self.ttfa_sum += stream.first_audio_s
                self.ttfa_count += 1

    def text(self, queued: int, running: int) -> str:
        with self._lock:
            rtf = self.compute_s / self.audio_s if self.audio_s else 0.0
            ttfa = self.ttfa_sum / self.ttfa_count if self.ttfa_count else 0.0
            rows = [
                (
                    "audio8_requests_total",
                    "counter",
                    "Finished HTTP requests by status code.",
                    [(f'{{status="{s}"}}', n) for s, n in sorted(self.requests.items())],
                ),
                ("audio8_frames_total", "counter", "Frames generated (46 ms of audio each).", [("", self.frames)]),
                ("audio8_audio_seconds_total", "counter", "Seconds of speech delivered.", [("", self.audio_s)]),
                (
                    "audio8_compute_seconds_total",
                    "counter",
                    "Seconds spent in prefill, frames and codec.",
                    [("", self.compute_s)],
                ),
                ("audio8_rtf", "gauge", "Compute seconds per second of speech, all requests so far.", [("", rtf)]),
                ("audio8_ttfa_seconds_mean", "gauge", "Mean time to first audio (prefill included).", [("", ttfa)]),
                ("audio8_queue_depth", "gauge", "Requests waiting for a worker.", [("", queued)]),
                ("audio8_in_flight", "gauge", "Requests running on a worker.", [("", running)]),
            ]
        lines = []
        for name, kind, help_text, samples in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{labels} {value:g}" for labels, value in samples]
        return "\n".join(lines) + "\n"
