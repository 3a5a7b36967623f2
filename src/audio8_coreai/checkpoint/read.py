"""Read a checkpoint's files safely: JSON configs, safetensors headers without their data, the codec's tensors
(a ``.safetensors`` file, or a ``.pth`` pickle loaded with ``weights_only=True`` only)."""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..bounds import MAX_CONFIG_BYTES, MAX_NUMBER_DIGITS, LongNumber
from ..errors import CheckpointError
from ..model.codec import normalize_codec_state_dict
from .layout import FOLDER_CONTENTS
from .validate import MAX_LISTED

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_json(path: Path, required: bool) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is absent and not ``required``.

    Raises:
        CheckpointError: absent though ``required``, unreadable, not JSON, or not an object.
    """
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path.parent}: no {path.name}; a checkpoint folder must hold {FOLDER_CONTENTS}")
        return None
    restore = "restore the file from the checkpoint"
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise CheckpointError(
                f"{path}: {path.stat().st_size} bytes, not a config file (at most {MAX_CONFIG_BYTES}); {restore}"
            )
        data = json.loads(path.read_text(encoding="utf-8"), parse_int=_json_int)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}); {restore}") from e
    except RecursionError as e:
        raise CheckpointError(f"{path}: nested too deeply to be a config file; {restore}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _json_int(text: str) -> int | LongNumber:
    """A JSON integer; one of over MAX_NUMBER_DIGITS digits as a :class:`LongNumber`, which every check refuses
    by its key (Python itself refuses to read over 4300 digits, and no size has so many)."""
    digits = len(text.lstrip("-"))
    return LongNumber(digits) if digits > MAX_NUMBER_DIGITS else int(text)


def safetensors_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) from a safetensors header, without reading tensor data.

    ``safe_open`` checks that the header is well formed and that its offsets cover the file exactly, so a
    truncated or padded file fails here.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for name in f.keys():
                sl = f.get_slice(name)
                if sl.get_dtype() not in _SAFETENSORS_DTYPES:
                    raise CheckpointError(
                        f"{path}: tensor {name} has dtype {sl.get_dtype()}, which torch cannot "
                        "hold; expected F32, F16 or BF16"
                    )
                out[name] = (tuple(sl.get_shape()), _SAFETENSORS_DTYPES[sl.get_dtype()])
            return out
    except (SafetensorError, OSError) as e:
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({e}); it is truncated or corrupt, download or write it again"
        ) from e


def _load_pickle(path: Path, lazy: bool) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors and plain containers only, never arbitrary code.

    ``lazy`` maps a zip-format file instead of reading it (tensor data stays on disk until touched), which
    is how the codec is validated without loading its 1.6 GB.
    """
    try:
        with warnings.catch_warnings():  # torch's note on a pickle protocol it does not write: the error says more
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=lazy and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):  # the unpickler itself: a cut or damaged pickle
            raise _unreadable(path, e) from e
        culprit = _GLOBAL.search(str(e))
        if culprit is None and not _builds_objects(path):  # an instruction refused in what is no pickle: damage
            raise _unreadable(path, e) from e
        what = f"the global {culprit.group(1)}" if culprit else "pickle instructions that build objects"
        raise CheckpointError(
            f"{path}: holds objects a weights file must not hold ({what}, beyond tensors and plain containers); "
            "loading it could run code from the file, so it is refused unread. Use codec.safetensors (the same "
            "tensors, no pickle), or a codec.pth saved as a plain dict of tensors (torch.save(state_dict))"
        ) from e
    except Exception as e:  # noqa: BLE001 - zip, EOF and runtime errors all mean a damaged file
        raise _unreadable(path, e) from e


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")  # the class or function torch's weights-only unpickler refused
_BUILDING = frozenset({"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "BUILD"})


def _builds_objects(path: Path) -> bool:
    """Whether ``path`` (a zip-format file: its ``data.pkl``) starts with a well-formed pickle that builds objects
    (imports a global, calls it or sets its state). ``pickletools`` parses it, checking its stack; nothing is run.
    Tells a pickle of objects from a damaged file where torch's refusal only names an opcode."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
        else:
            with path.open("rb") as f:
                data = f.read(1 << 24)  # a legacy file's pickles come first, its tensor data after them
        pickletools.dis(io.BytesIO(data), out=io.StringIO())
        return any(op.name in _BUILDING for op, _, _ in pickletools.genops(io.BytesIO(data)))
    except Exception:  # noqa: BLE001 - any parse failure: not a pickle
        return False


def _unreadable(path: Path, error: Exception) -> CheckpointError:
    """The error for a damaged pickle: its first line says what broke (torch's advice about weights_only, which is
    no remedy here, is left out)."""
    lines = [line for line in str(error).strip().splitlines() if line and "weights_only" not in line]
    return CheckpointError(
        f"{path}: not a readable torch weights file ({type(error).__name__}: {lines[0] if lines else 'no detail'}); "
        "it is corrupt or truncated, download or write it again"
    )


def codec_tensors(path: Path, lazy: bool) -> dict[str, torch.Tensor]:
    """The codec file's tensors under the publisher's module names (after its loading rules, SPEC 3.2).

    ``lazy``: for ``.safetensors`` the tensors are ``meta`` tensors built from the header (shape and dtype
    only); for a zip ``.pth`` they are memory-mapped. Otherwise everything is read into memory.
    """
    if path.suffix == ".safetensors":
        if lazy:
            return {n: torch.empty(s, dtype=d, device="meta") for n, (s, d) in safetensors_shapes(path).items()}
        safetensors_shapes(path)  # a damaged file gets the checked message, not a bare Rust error
        try:
            with safe_open(str(path), framework="pt") as f:
                raw: Any = {n: f.get_tensor(n) for n in f.keys()}
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}: tensor data unreadable ({e}); download or write it again") from e
    else:
        raw = _load_pickle(path, lazy)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: holds a {type(raw).__name__}, expected a dict of tensors")
    sd = normalize_codec_state_dict(raw)
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(
            f"{path}: entries that are not tensors: {bad[:MAX_LISTED]}; expected a plain state dict of the codec"
        )
    return sd
