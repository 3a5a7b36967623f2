"""The gate's error and the remedy it names when an extra is missing."""

from __future__ import annotations

from ...errors import GateError
from ...packages import install_extra

_GATE_EXTRA = install_extra("gate")

__all__ = ["GateError", "_GATE_EXTRA"]
