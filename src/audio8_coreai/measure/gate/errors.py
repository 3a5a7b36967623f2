"""The gate's error: it cannot run as asked."""

from __future__ import annotations

from ...errors import Audio8Error

_GATE_EXTRA = "pip install 'audio8-coreai[gate]'"


class GateError(Audio8Error, ValueError):
    """The gate cannot run as asked (bad fixtures file, no espeak-ng for a clip, missing extra)."""
