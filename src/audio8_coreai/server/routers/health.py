"""``GET /health`` (model, backend, device, workers, queue) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from ..state import State, state

router = APIRouter()


@router.get("/health")
async def health(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """The model served, its backend and device, and the workers' load (:meth:`..synth.Synthesizer.health`)."""
    return {"status": "ok", **await server.synth.health()}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics_text(server: Annotated[State, Depends(state)]) -> str:
    """Requests by status, frames, audio and compute seconds, RTF, time to first audio, queue depth."""
    running, queued = server.synth.load()
    return server.metrics.text(queued, running)
