"""Audio files: write synthesized speech (reference-clip reading joins here with voice cloning)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

# Formats written by extension; soundfile (libsndfile) encodes them all.
WRITE_FORMATS = {".wav": ("WAV", "FLOAT"), ".flac": ("FLAC", "PCM_24"), ".ogg": ("OGG", "VORBIS")}


class AudioError(ValueError):
    """An audio file cannot be written (or read) as asked; the message says what to do."""


def write_audio(path: str | Path, audio: np.ndarray, sample_rate: int) -> Path:
    """Write mono float32 ``audio`` [N] (in [-1, 1]) at ``sample_rate`` Hz to ``path``.

    The format follows the extension: ``.wav`` (32-bit float), ``.flac`` (24-bit), ``.ogg`` (Vorbis).
    The file is written beside its target under a temporary name and renamed into place, so an
    interrupted write never leaves a truncated file and never clobbers an existing one half-way.

    Raises:
        AudioError: unknown extension, a missing or unwritable folder, or a path that is a folder.
    """
    path = Path(path).expanduser()
    ext = path.suffix.lower()
    if ext not in WRITE_FORMATS:
        raise AudioError(f"cannot write {path.name!r}: use a .wav, .flac or .ogg file name")
    if path.is_dir():
        raise AudioError(f"{path} is a folder: give a file name such as {path / 'speech.wav'}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise AudioError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise AudioError(f"cannot write {path}: no permission to write in {folder}")
    fmt, subtype = WRITE_FORMATS[ext]
    data = np.asarray(audio, dtype=np.float32).reshape(-1)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=ext, dir=folder)
    os.close(fd)
    try:
        sf.write(tmp, data, sample_rate, format=fmt, subtype=subtype)
        os.replace(tmp, path)
    except (OSError, sf.LibsndfileError) as e:
        raise AudioError(f"cannot write {path}: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
