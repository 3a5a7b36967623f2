"""The gate's error and the remedy it names when an extra is missing."""

from __future__ import annotations

from ...errors import GateError

_GATE_EXTRA = "pip install 'audio8-coreai[gate]'"

__all__ = ["GateError", "_GATE_EXTRA"]
