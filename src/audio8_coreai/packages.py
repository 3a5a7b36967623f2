"""Packages imported where a feature needs them, not when the package is: one :func:`require` for all of them.

``import audio8_coreai``, loading a model, speaking and writing wav need none of these; a feature asked for without
its package is an :class:`.Audio8Error` that names the package and the pip command that brings it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import Audio8Error

# module -> (the feature that needs it, the install that brings it, what to do instead). Each comes with a plain
# `pip install audio8-coreai` (pyproject.toml), yet may be missing where the package runs from its tree (a lent GPU
# machine carries only the wheels it needs).
PACKAGES = {
    "av": ("response_format aac", "pip install av", "or use wav, pcm, flac, mp3 or opus"),
    "pedalboard": ("a speed other than 1.0 (Rubber Band's time stretch)", "pip install pedalboard", "or speed 1.0"),
    "sse_starlette": ("stream_format sse", "pip install sse-starlette", 'or "stream": true for the audio itself'),
    "triton": (
        "precision bf16w and the fused CUDA kernels (Triton's)",
        "pip install triton (PyTorch's CUDA builds bring it)",
        "or fp32 and fused_kernels=False",
    ),
}


def install_extra(extra: str) -> str:
    """The pip command that brings the optional dependencies ``extra`` (pyproject.toml), said both ways: from the
    package index, and in a clone of the repository (where the index's name would fetch another copy)."""
    return f"pip install 'audio8-coreai[{extra}]' (in a clone of the repository: pip install -e '.[{extra}]')"


def require(module: str, error: type[Audio8Error]) -> ModuleType:
    """``module`` (a key of :data:`PACKAGES`) imported; raises ``error`` naming the feature, the package, its
    install and what to do instead when this Python cannot import it."""
    feature, install, instead = PACKAGES[module]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise error(
            f"{feature} needs the {module} package, which cannot be imported here ({e}): {install}, {instead}"
        ) from None
