"""The one cosine the measuring tools share (parity, agreement, the gate's codec rung)."""

from __future__ import annotations

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays of any shape, flattened, in float64.

    When either has zero norm there is no angle: 1.0 if the two are equal (all zeros), else 0.0.
    """
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    norm = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / norm) if norm else float(np.array_equal(a, b))
