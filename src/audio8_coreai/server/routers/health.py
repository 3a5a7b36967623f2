"""``GET /health`` (model, backend, device, workers, queue) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..errors import documented
from ..state import State, state

router = APIRouter()


@router.get("/health", responses=documented(503))
async def health(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """The model served (its folder's name), its backend and device, its ``sample_rate``, and the workers' load
    (:meth:`..synth.Synthesizer.health`); on Ray the Synth replicas running, and a 503 when none runs.
    ``output_sample_rate``: the bodies' rate (``serve --sample-rate``, opus's aside), or None: each format's own
    (pcm 24 kHz as OpenAI's, opus 48 kHz, the others the model's)."""
    return {"status": "ok", **await server.synth.health(), "output_sample_rate": server.settings.sample_rate}


@router.get("/metrics", response_class=PlainTextResponse, responses=documented())
def metrics_text(server: Annotated[State, Depends(state)]) -> Response:
    """Requests by status, errors by code, frames, audio and compute seconds, RTF, time to first audio, queue
    depth (Prometheus text, :class:`..metrics.Metrics`)."""
    running, queued = server.synth.load()
    return Response(server.metrics.text(queued, running), media_type=CONTENT_TYPE_LATEST)
