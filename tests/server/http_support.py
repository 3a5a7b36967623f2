"""The HTTP server tests' shared helpers: a served app in a thread, a speech request, a body decoded, a metric read."""

from __future__ import annotations

import io
import time
from contextlib import contextmanager

import av
import httpx
import numpy as np
import soundfile as sf

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings

TEXT = "The meeting has been moved to Thursday afternoon."
SETTINGS = ServerSettings(
    workers=2, max_queue=4, max_input_chars=300, max_upload_bytes=1_000_000, max_frames=200, chunk_frames=4
)


@contextmanager
def serving(checkpoint, voices_dir, settings: ServerSettings, batch: int = 0, precision: str | None = None):
    """A uvicorn server on a free port of 127.0.0.1 in a thread (``batch``: N rows of one model, as
    ``audio8 serve --batch N``); yields its base URL."""
    if batch:
        _, instances = TTS.load(checkpoint, device="cpu", voices_dir=voices_dir, precision=precision).batched(batch)
    else:
        instances = [
            TTS.load(checkpoint, device="cpu", voices_dir=voices_dir, precision=precision)
            for _ in range(settings.workers)
        ]
    with serve_in_thread(create_app(instances, settings)) as url:
        yield url


JSON = {"content-type": "application/json"}


def speech(base: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", json={"input": TEXT, "seed": 1, "max_frames": 12, **body}, timeout=120)


def decode(data: bytes, fmt: str, pcm_rate: int = 24000) -> tuple[np.ndarray, int]:
    """A body as float32 samples and its rate (pcm carries none: ``pcm_rate``, the server's default)."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767, pcm_rate
    if fmt == "aac":  # ADTS, which libsndfile does not read
        with av.open(io.BytesIO(data)) as f:
            frames = [frame.to_ndarray()[0] for frame in f.decode(audio=0)]
            return np.concatenate(frames), f.streams.audio[0].rate
    return sf.read(io.BytesIO(data), dtype="float32")


RATES = {"pcm": 24000, "opus": 48000}  # the default body rates that are not the model's 44.1 kHz


def metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Endless:
    """A stand-in for a SpeechStream that never ends: ``seconds`` of tone a chunk (float32, 44.1 kHz), one every
    ``every_s`` seconds, ``on_frame`` called before each, until the server stops it."""

    prefill_s = frames_s = codec_s = duration_s = 0.0
    first_audio_s = None
    capped: list[int] = []  # every piece ended by the model
    frames = 0

    def __init__(self, on_frame, seconds: float = 1.0, every_s: float = 0.0):
        self.on_frame, self.every_s = on_frame, every_s
        self.chunk = (0.3 * np.sin(np.arange(round(44100 * seconds)) / 7)).astype(np.float32)

    def __iter__(self):
        for step in range(100_000):
            self.on_frame(step)
            time.sleep(self.every_s)
            yield self.chunk.copy()
