"""What every route shares: the server's settings, its synthesizer (model instances and their workers, or a
cluster) and the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from ..settings import DEFAULTS
from .metrics import Metrics
from .synth import Synthesizer


@dataclass
class ServerSettings:
    """What ``audio8 serve`` can set (defaults: :data:`.settings.DEFAULTS`). ``max_frames``: the cap per piece
    (None: the model's default budget); a request may ask for less, never more. ``chunk_frames``: frames per
    streamed chunk; ``first_chunk_frames``: frames in a stream's first chunk (None: the default of
    :class:`..engine.stream.SpeechStream`). ``sample_rate``: every body's rate unless a request
    asks another (None: pcm 24 kHz, the others the model's). ``voice_map``: OpenAI voice names (lower case) onto
    stored voices; ``default_voice``: the stored voice of requests naming none (None: the model's own voice with
    the seed DEFAULTS.server.default_voice_seed when the request gives none); see :mod:`.voicenames`. Slow clients:
    ``request_timeout_s``, ``keep_alive_s``, ``max_connections`` and ``max_head_bytes`` (:mod:`.connections`),
    ``stream_buffer_chunks`` and ``stall_s`` (:mod:`.relay`)."""

    workers: int = DEFAULTS.server.workers
    max_queue: int = DEFAULTS.server.max_queue
    max_input_chars: int = DEFAULTS.server.max_input_chars
    max_upload_bytes: int = DEFAULTS.server.max_upload_bytes
    max_frames: int | None = None
    chunk_frames: int = DEFAULTS.speech.chunk_frames
    first_chunk_frames: int | None = None
    sample_rate: int | None = None
    voice_map: dict[str, str] = field(default_factory=dict)
    default_voice: str | None = None
    request_timeout_s: float = DEFAULTS.server.request_timeout_s
    keep_alive_s: int = DEFAULTS.server.keep_alive_s
    max_connections: int = DEFAULTS.server.max_connections
    max_head_bytes: int = DEFAULTS.server.max_head_bytes
    stream_buffer_chunks: int = DEFAULTS.server.stream_buffer_chunks
    stall_s: float = DEFAULTS.server.stall_s


@dataclass
class State:
    """One app's shared state: ``synth`` makes the speech and voices (:mod:`.synth`)."""

    settings: ServerSettings
    synth: Synthesizer
    metrics: Metrics
    started: int = field(default_factory=lambda: int(time.time()))  # Unix seconds, as /v1/models' created


async def state(request: Request) -> State:
    """The app's :class:`State` (a route dependency)."""
    return request.app.state.server
