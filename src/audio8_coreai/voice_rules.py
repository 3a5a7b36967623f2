"""What a voice's name and fields may be (voices.py): a name that is a portable file name, codes of their codec's
shape and range, fields of their types; checked before a voice is stored and again as it is read."""

from __future__ import annotations

import math
import numbers
import unicodedata

import numpy as np

from .errors import VoiceError

MAX_NAME = 64
DEFAULT_VOICE = "default"  # the name requests give the default voice (the HTTP server's, Wyoming's): no stored one's
MAX_NAME_BYTES = 240  # UTF-8: its temporary file ``.NAME.XXXXXXXX.tmp`` within the 255 bytes file systems take
_NAME_PUNCTUATION = set(" _-.")
_NAME_RULE = (
    "a voice name is 1 to 64 letters, digits, spaces, '_', '-' or '.' (at most 240 bytes in UTF-8), starting "
    "with a letter, digit or '_' (no path separators, no '..')"
)


# File names Windows keeps for devices (with any extension): a voice store should copy to any disk.
_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def check_name(name: str) -> str:
    """Return ``name`` (NFC-normalised) if it is a valid voice name, else raise :class:`VoiceError`.

    A name becomes a file name, so it must not reach outside the folder or hide as a dot-file: no path
    separators, no ``..``, no leading dot; at most 64 characters and 240 bytes in UTF-8 (its files' names
    within the 255 bytes of every file system); letters and digits of any script plus
    space, ``_``, ``-`` and ``.``; no leading or trailing space and no trailing dot (Windows drops them); not
    a Windows device name (CON, NUL, COM1...).
    NFC because macOS may hand back decomposed file names: "é" typed and "é" listed must be one voice.
    """
    if not isinstance(name, str):
        raise VoiceError(f"a voice name must be a string, got {type(name).__name__}")
    name = unicodedata.normalize("NFC", name)
    why = None
    if not name:
        why = "it is empty"
    elif len(name) > MAX_NAME:
        why = f"it is {len(name)} characters long"
    elif len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:  # a file name, in bytes
        why = f"it is {len(name.encode('utf-8', 'surrogatepass'))} bytes in UTF-8"
    elif "/" in name or "\\" in name:
        why = "it holds a path separator"
    elif ".." in name:
        why = "it holds '..'"
    elif not (name[0].isalnum() or name[0] == "_"):
        why = f"it starts with {name[0]!r}"
    elif name[-1] in " .":
        why = f"it ends with {name[-1]!r}"
    elif bad := sorted({c for c in name if not (c.isalnum() or c in _NAME_PUNCTUATION)}):
        why = "it holds " + ", ".join(repr(c) for c in bad)
    elif name.split(".")[0].rstrip().upper() in _WINDOWS_DEVICES:
        why = "Windows reserves it for a device"
    if why:  # the name shown cut: a request may send 100,000 characters of it
        shown = repr(name) if len(name) <= MAX_NAME else f"{name[:MAX_NAME]!r}..."
        raise VoiceError(f"bad voice name {shown}: {why}; {_NAME_RULE}")
    return name


def codes_problem(codes: np.ndarray, codebooks: int = 0, codebook_size: int = 0) -> str | None:
    """What is wrong with a voice's ``codes`` (integers [codebooks, frames] in [0, codebook_size); a 0 bound is not
    checked), or None."""
    if codes.ndim != 2 or not np.issubdtype(codes.dtype, np.integer):
        return f"codes {codes.dtype} {list(codes.shape)}, not integers [codebooks, frames]"
    if codes.shape[1] == 0:
        return f"codes {list(codes.shape)}: no frames"
    if codebooks and codes.shape[0] != codebooks:
        return f"codes of {codes.shape[0]} codebooks, where the codec that made them gives {codebooks}"
    bad = (codes < 0) | (codes >= codebook_size) if codebook_size else codes < 0
    if bad.any():
        row, col = (int(i[0]) for i in np.nonzero(bad))
        bound = f"outside [0, {codebook_size}) of the codec that made them" if codebook_size else "negative"
        return f"code {int(codes[row, col])} at codebook {row}, frame {col} is {bound}"
    return None


# A Voice's scalar fields: (types, range rule, what it must be); Voice.problem checks them.


def _whole(v: float) -> bool:
    return math.isfinite(v) and float(v).is_integer()  # 44100.0 too: a float a hand-made voice may hold


FIELD_KINDS = {
    "transcript": (str, lambda v: True, "a text"),
    "sample_rate": (numbers.Real, lambda v: _whole(v) and v >= 1, "a whole number of Hz >= 1"),
    "duration_s": (numbers.Real, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0"),
    "fingerprint": (str, bool, "a checkpoint fingerprint"),
    "created": (str, lambda v: True, "a text"),
    "name": (str, lambda v: True, "a text"),
    "source": (str, lambda v: True, "a text"),
    "codebooks": (numbers.Real, lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
    "codebook_size": (numbers.Real, lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
}
WHOLE_FIELDS = ("sample_rate", "codebooks", "codebook_size")
