"""``GET /v1/models`` (OpenAI's list), ``GET /v1/models/{model}`` (one of it) and ``GET /v1/audio/models`` (Open
WebUI's): the model names listed. Any name is accepted in a speech request; these are ours and the OpenAI speech
models' names clients pick from."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from ..errors import ApiError, documented
from ..state import State, state

router = APIRouter()

MODEL_IDS = ("audio8-tts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # all one model here


@router.get("/v1/models")
def list_models(server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """OpenAI's shape: ``{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}``;
    ``created`` is when this server started (Unix seconds)."""
    return {"object": "list", "data": [_model(m, server) for m in MODEL_IDS]}


@router.get("/v1/models/{model}", responses=documented(404))
def retrieve_model(model: str, server: Annotated[State, Depends(state)]) -> dict[str, Any]:
    """One model of :func:`list_models` (OpenAI's ``models.retrieve``); 404 ``model_not_found`` for another name."""
    if model not in MODEL_IDS:
        raise ApiError(404, f"no model {model!r}: this server lists {', '.join(MODEL_IDS)}", "model", "model_not_found")
    return _model(model, server)


def _model(name: str, server: State) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": server.started, "owned_by": "audio8-coreai"}


@router.get("/v1/audio/models")
def list_audio_models() -> dict[str, Any]:
    """Open WebUI's shape: ``{"models": [{"id"}]}``."""
    return {"models": [{"id": m} for m in MODEL_IDS]}
