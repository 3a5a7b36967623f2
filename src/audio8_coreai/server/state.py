"""What every route shares: the server's settings (:class:`..settings.ServerSettings`), its synthesizer (model
instances and their workers, or a cluster) and the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from ..settings import ServerSettings
from .metrics import Metrics
from .synth import Synthesizer


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
