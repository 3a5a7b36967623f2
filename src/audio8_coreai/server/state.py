"""What every route shares: the server's settings, its model instances, their workers and the metrics."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from ..streaming import DEFAULT_CHUNK_FRAMES
from ..tts import TTS
from .metrics import Metrics
from .workers import Workers

MAX_INPUT_CHARS = 4096  # OpenAI's limit for input
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a 30-s clip is 5.3 MB as 16-bit stereo wav, 10.6 MB as float


@dataclass
class ServerSettings:
    """What ``audio8 serve`` can set. ``max_frames``: the cap per piece (None: the model's default budget);
    a request may ask for less, never more. ``chunk_frames``: frames per streamed chunk; ``first_chunk_frames``:
    frames in a stream's first chunk (None: the default of :class:`.streaming.SpeechStream`)."""

    workers: int = 1
    max_queue: int = 8
    max_input_chars: int = MAX_INPUT_CHARS
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_frames: int | None = None
    chunk_frames: int = DEFAULT_CHUNK_FRAMES
    first_chunk_frames: int | None = None


@dataclass
class State:
    """One app's shared state. ``engine``: the first model instance, for what needs no worker (checks, the
    voice store, the sample rate)."""

    settings: ServerSettings
    engines: list[TTS]
    workers: Workers
    metrics: Metrics

    @property
    def engine(self) -> TTS:
        return self.engines[0]


async def state(request: Request) -> State:
    """The app's :class:`State` (a route dependency)."""
    return request.app.state.server
