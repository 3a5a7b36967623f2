"""``GET /v1/models`` (OpenAI's list) and ``GET /v1/audio/models`` (Open WebUI's): the model names listed. Any name
is accepted in a speech request; these are ours and the OpenAI speech models' names clients pick from."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from ..state import State, state

router = APIRouter()

MODEL_IDS = ("audio8-tts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # all one model here


@router.get("/v1/models")
def list_models(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """OpenAI's shape: ``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}``;
    ``created`` is when this server started (Unix seconds)."""
    data = [{"id": m, "object": "model", "created": server.started, "owned_by": "audio8-coreai"} for m in MODEL_IDS]
    return {"object": "list", "data": data}


@router.get("/v1/audio/models")
def list_audio_models() -> dict[str, Any]:
    """Open WebUI's shape: ``{"models": [{"id"}]}``."""
    return {"models": [{"id": m} for m in MODEL_IDS]}
