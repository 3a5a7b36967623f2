"""``GET /health`` (model, backend, device, workers, queue) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..errors import documented
from ..state import State, state

router = APIRouter()


@router.get("/health", responses=documented())
def health(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """The model served (its folder's name), its backend and device, and the workers' load."""
    first, workers = server.tts, server.workers
    backend = first.backend
    return {
        "status": "ok",
        "model": first.checkpoint.path.name,  # the folder's name: no answer carries a server path
        "backend": backend.description,
        "device": backend.device_name,
        "sample_rate": first.sample_rate,
        "workers": len(server.instances),
        "running": workers.running,
        "queued": workers.queued,
        "max_queue": server.settings.max_queue,
    }


@router.get("/metrics", response_class=PlainTextResponse, responses=documented())
def metrics_text(server: Annotated[State, Depends(state)]) -> Response:
    """Requests by status, errors by code, frames, audio and compute seconds, RTF, time to first audio, queue
    depth (Prometheus text, :class:`..metrics.Metrics`)."""
    data = server.metrics.text(server.workers.queued, server.workers.running)
    return Response(data, media_type=CONTENT_TYPE_LATEST)
