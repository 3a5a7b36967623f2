"""Find a checkpoint: a local folder as is, or a hub id ``owner/name`` downloaded into the hub cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import CheckpointError
from .layout import DEFAULT_MODEL, FOLDER_CONTENTS, checkpoint_files

# Hub ids are "owner/name"; anything else that does not exist on disk is a mistyped path.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# A hub that does not answer must not stall the command line: the ETag probe per file gives up after this
# many seconds unless HF_HUB_ETAG_TIMEOUT says otherwise (huggingface_hub's own default is 10 s).
_HUB_ETAG_TIMEOUT_S = 5.0


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_hub_id(model: str | Path) -> bool:
    """Whether ``model`` names a hub repository (``owner/name``) rather than a local folder: not a path that exists,
    and of the hub's form."""
    return not Path(str(model)).expanduser().exists() and _HUB_ID.fullmatch(str(model)) is not None


def _utf8(text: str) -> bool:
    """Whether ``text`` (a path as Python decodes it, undecodable bytes as surrogates) is valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve_checkpoint(model: str | Path = DEFAULT_MODEL, *, weights: bool = True, codec: bool = True) -> Path:
    """Return the local folder of ``model``: an existing folder as is, a hub id ``owner/name`` downloaded.

    A hub id is fetched with ``huggingface_hub.snapshot_download`` restricted to the files a checkpoint
    uses (``weights=False`` / ``codec=False`` leave out ``model.safetensors`` / the codec file), into the
    usual hub cache. ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``), read at call time, limits this to
    the cache. Nothing here checks the folder's contents; :func:`load_checkpoint` does.

    Raises:
        CheckpointError: ``model`` is a folder whose path is not UTF-8 (the file libraries cannot open
            it), a file, or a path that does not exist and is not a hub id, or the hub could not be reached /
            has no such repository / the id is not cached while offline; ``model`` neither a str nor a path, or
            empty. The message lists the files a local folder must hold and suggests ``--model DIR``.
    """
    if not isinstance(model, str | os.PathLike) or not str(model).strip():
        said = repr(model) if isinstance(model, str) else type(model).__name__
        raise CheckpointError(
            f"model must be a checkpoint folder's path or a hub id such as {DEFAULT_MODEL}, got {said}"
        )
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        if not _utf8(str(path)):
            raise CheckpointError(
                f"the checkpoint folder's path {os.fsencode(path).decode('utf-8', 'backslashreplace')} is not UTF-8, "
                "and the safetensors and tokenizers libraries open UTF-8 paths only; rename the folder, or link "
                "it from a UTF-8 name (ln -s) and give that"
            )
        return path
    if path.exists():
        raise CheckpointError(
            f"{path} is a file; --model (TTS.load's model) takes a checkpoint folder holding {FOLDER_CONTENTS}"
        )
    if not is_hub_id(text):
        raise CheckpointError(
            f"no checkpoint folder at {path}, and {text!r} is not a hub id (owner/name); give --model DIR (TTS.load's "
            f"model), a folder holding {FOLDER_CONTENTS}, or a hub id such as {DEFAULT_MODEL}"
        )
    # Imported here: the hub client is only needed for ids, and importing it costs time on every CLI start.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    offline = _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
    etag_timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT", _HUB_ETAG_TIMEOUT_S))
    local_hint = f"give --model DIR (TTS.load's model) a local folder holding {FOLDER_CONTENTS}"
    try:
        return Path(
            snapshot_download(
                text,
                allow_patterns=checkpoint_files(weights, codec),
                etag_timeout=etag_timeout,
                local_files_only=offline,
            )
        )
    except GatedRepoError as e:
        raise CheckpointError(
            f"hub repository {text} is gated: accept its terms on the hub and log in (`hf auth login`), or {local_hint}"
        ) from e
    except RepositoryNotFoundError as e:
        raise CheckpointError(
            f"hub repository {text} does not exist or is private (no local folder {path} "
            f"either); check the id, log in for a private one, or {local_hint}"
        ) from e
    except Exception as e:  # noqa: BLE001 - any network/cache failure means the same thing to the user
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if offline:
            why = f"HF_HUB_OFFLINE is set and {text} is not in the local hub cache"
        else:
            why = f"the hub could not be reached for {text} ({type(e).__name__}: {first_line})"
        raise CheckpointError(f"{why}; {local_hint}") from e
