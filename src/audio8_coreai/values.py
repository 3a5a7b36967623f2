"""Checks of the values the API's keywords take: whole numbers, numbers, on/off switches. Each raises ConfigError
naming the keyword, where Python would fail later and elsewhere (or take ``'no'`` as on)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .errors import ConfigError


def check_int(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` as an int when it is a whole number (a Python or NumPy integer, not a bool) >= ``minimum``;
    else ConfigError naming ``name`` (a float such as 8.5 is refused, not rounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be a whole number, got {value!r}", name)
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}", name)
    return int(value)


def check_number(value: Any, name: str) -> float:
    """``value`` as a float when it is a finite real number (not a bool or a string); else ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}", name)
    return float(value)


def check_switch(name: str, value: object) -> bool | None:
    """``value`` of the on/off keyword ``name``: True, False or None (its default); a numpy bool or the whole
    number 0 or 1 is taken as the bool. Raises ConfigError for anything else (a text such as ``'no'`` would be
    taken as on)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (np.bool_, numbers.Integral)) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name} must be True, False or None, not {value!r}", name)
