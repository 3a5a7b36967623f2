"""What every route shares: the server's settings, its synthesizer (model instances and their workers, or a
cluster) and the metrics."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from ..settings import DEFAULTS
from .metrics import Metrics
from .synth import Synthesizer


@dataclass
class ServerSettings:
    """What ``audio8 serve`` can set (defaults: :data:`.settings.DEFAULTS`). ``max_frames``: the cap per piece
    (None: the model's default budget); a request may ask for less, never more. ``chunk_frames``: frames per
    streamed chunk; ``first_chunk_frames``: frames in a stream's first chunk (None: the default of
    :class:`..engine.stream.SpeechStream`)."""

    workers: int = DEFAULTS.workers
    max_queue: int = DEFAULTS.max_queue
    max_input_chars: int = DEFAULTS.max_input_chars
    max_upload_bytes: int = DEFAULTS.max_upload_bytes
    max_frames: int | None = None
    chunk_frames: int = DEFAULTS.chunk_frames
    first_chunk_frames: int | None = None


@dataclass
class State:
    """One app's shared state: ``synth`` makes the speech and voices (:mod:`.synth`)."""

    settings: ServerSettings
    synth: Synthesizer
    metrics: Metrics


async def state(request: Request) -> State:
    """The app's :class:`State` (a route dependency)."""
    return request.app.state.server
