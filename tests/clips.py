"""Reference clips made in the tests: sine sweeps, noise bursts and (when espeak-ng is installed) speech."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

ESPEAK = shutil.which("espeak-ng")
needs_espeak = pytest.mark.skipif(ESPEAK is None, reason="espeak-ng is not installed (apt-get install espeak-ng)")


def sweep(rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    """A logarithmic sine sweep from 100 Hz to 0.45 x ``rate`` (below Nyquist), float32 [N]."""
    n = round(rate * seconds)
    t = np.arange(n) / rate
    f0, f1 = 100.0, 0.45 * rate
    k = np.log(f1 / f0) / seconds
    return (amplitude * np.sin(2 * np.pi * f0 * (np.exp(k * t) - 1) / k)).astype(np.float32)


def bursts(rate: int, seconds: float, amplitude: float = 0.3, seed: int = 0) -> np.ndarray:
    """White noise switched on and off every 100 ms (half sound, half digital silence), float32 [N]."""
    n = round(rate * seconds)
    gate = (np.arange(n) // round(0.1 * rate)) % 2 == 0
    return (amplitude * np.random.default_rng(seed).uniform(-1, 1, n) * gate).astype(np.float32)


def stereo(rate: int, seconds: float) -> np.ndarray:
    """A sweep on the left and noise bursts on the right, float32 [N, 2]."""
    return np.stack([sweep(rate, seconds), bursts(rate, seconds)], axis=1)


def write(path: Path, data: np.ndarray, rate: int, subtype: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, data, rate, subtype=subtype)
    return path


def speech(path: Path, text: str = "The quick brown fox jumps over the lazy dog.") -> Path:
    """espeak-ng reading ``text`` into a 22.05 kHz 16-bit mono WAV (callers skip when ESPEAK is None)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([ESPEAK, "-w", str(path), text], check=True, capture_output=True, timeout=60)
    return path
