"""Read and validate a checkpoint folder (configs now, weights from headers); load its weights on demand.

Everything is validated from file headers before use (names, shapes, dtypes), so a wrong or damaged
checkpoint fails at load time with a message naming the file and the first mismatches, never deep inside
a forward pass.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..config import MODEL_TYPE, CodecConfig, GenerationConfig, ModelConfig
from ..errors import CheckpointError, ConfigError
from ..model.codec import codec_param_shapes
from ..model.dualar import dualar_param_shapes
from .layout import (
    CODEC_SAFETENSORS_FILE,
    CODEC_SPEC_FILE,
    CONFIG_FILE,
    DEFAULT_MODEL,
    FOLDER_CONTENTS,
    GENERATION_FILE,
    MODEL_FILE,
    TOKENIZER_FILES,
)
from .locate import resolve_checkpoint
from .read import codec_tensors, read_json, safetensors_shapes
from .validate import check_codec_sizes, check_model_sizes, check_tensors, derive_codec_config


@dataclass
class Checkpoint:
    """A validated checkpoint folder; weights are read on demand.

    Attributes:
        path: the folder.
        config: ``config.json``.
        generation: ``generation_config.json``, or the publisher's defaults when the file is absent.
        codec_config: ``codec_spec.json`` if present; else derived from the codec tensors' shapes (equal to
            the 0.6b defaults for the real codec); the 0.6b defaults when the codec has not been read yet
            (``load_checkpoint(codec=False)``): then :meth:`codec_state_dict` derives and updates it.
        tokenizer_dir: the folder holding ``tokenizer.json`` (the checkpoint folder), or None if it has none.
    """

    path: Path
    config: ModelConfig
    generation: GenerationConfig
    codec_config: CodecConfig
    tokenizer_dir: Path | None
    _model_checked: bool = field(default=False, repr=False)
    _codec_checked: bool = field(default=False, repr=False)
    _fingerprint: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """The checkpoint's name: its hub id (``OWNER/NAME``) for a folder in the hub's cache
        (``models--OWNER--NAME/snapshots/REVISION``, as ``huggingface_hub`` lays it out), else the folder's name."""
        path = Path(os.path.abspath(self.path))  # "." has a name too; links are not followed
        if len(path.parts) >= 3 and path.parts[-2] == "snapshots" and path.parts[-3].startswith("models--"):
            return path.parts[-3].removeprefix("models--").replace("--", "/")
        return path.name

    @property
    def model_file(self) -> Path:
        """``model.safetensors`` of this checkpoint."""
        return self.path / MODEL_FILE

    @property
    def codec_file(self) -> Path:
        """``codec.safetensors`` when present (no pickle involved), else the config's ``codec_filename``."""
        st = self.path / CODEC_SAFETENSORS_FILE
        return st if st.is_file() else self.path / self.config.codec_filename

    @property
    def codec_mapped(self) -> bool:
        """Whether :meth:`codec_state_dict` with ``mapped`` maps the codec file rather than reading it whole
        (a ``.safetensors`` or zip-format ``.pth``: every file ``torch.save`` writes; not a legacy pickle)."""
        return self.codec_file.suffix == ".safetensors" or zipfile.is_zipfile(self.codec_file)

    @property
    def stored_dtype(self) -> torch.dtype:
        """The dtype ``model.safetensors`` stores the DualAR's weights in (bf16 for the release), from the header.

        Raises CheckpointError as :meth:`check_model`."""
        self.check_model()
        return safetensors_shapes(self.model_file)["embeddings.weight"][1]

    def check_model(self) -> None:
        """Validate ``model.safetensors`` against ``config.json`` from its header (no tensor data read).

        Raises:
            CheckpointError: the file is missing, truncated/corrupt, or a tensor is missing, unexpected,
                mis-shaped or not floating point (first five named, with totals).
        """
        if self._model_checked:
            return
        if not self.model_file.is_file():
            raise CheckpointError(f"{self.path}: no {MODEL_FILE}; a checkpoint folder must hold {FOLDER_CONTENTS}")
        actual = safetensors_shapes(self.model_file)
        check_model_sizes(
            self.config, str(self.path / CONFIG_FILE), self.model_file, {n: s for n, (s, _) in actual.items()}
        )
        check_tensors(self.model_file, CONFIG_FILE, dualar_param_shapes(self.config), actual)
        self._model_checked = True

    def check_codec(self) -> None:
        """Validate the codec file against ``codec_config`` (deriving that first when there is no spec).

        Reads only headers (safetensors) or maps the pickle (zip ``.pth``); the pickle is loaded with
        ``weights_only=True``. Raises :class:`CheckpointError` for a missing, corrupt or code-carrying file
        and for tensors that do not match.
        """
        if self._codec_checked:
            return
        file = self.codec_file
        if not file.is_file():
            raise CheckpointError(
                f"{self.path}: no {self.config.codec_filename} (or {CODEC_SAFETENSORS_FILE}); "
                f"a checkpoint folder must hold {FOLDER_CONTENTS}"
            )
        tensors = codec_tensors(file, lazy=True)
        actual = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}
        shapes = {n: s for n, (s, _) in actual.items()}
        spec = self.path / CODEC_SPEC_FILE
        if not spec.is_file():
            self.codec_config = derive_codec_config(shapes)
        check_codec_sizes(
            self.config,
            str(self.path / CONFIG_FILE),
            self.codec_config,
            str(spec) if spec.is_file() else None,
            file,
            shapes,
        )
        check_tensors(
            file,
            CODEC_SPEC_FILE if spec.is_file() else "the codec layout",
            codec_param_shapes(self.codec_config),
            actual,
        )
        self._codec_checked = True

    def model_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """All DualAR tensors (publisher names, shapes as in :func:`dualar_param_shapes`), on CPU.

        ``dtype`` converts each tensor as it is read (so bf16 -> fp32 never holds two full copies); None
        keeps the stored dtype (bf16 for the release, fp32 for the tiny checkpoint). Validates first.

        Raises:
            CheckpointError: as :meth:`check_model`, or tensor data that cannot be read.
        """
        self.check_model()
        out: dict[str, torch.Tensor] = {}
        try:
            with safe_open(str(self.model_file), framework="pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    out[name] = t if dtype is None else t.to(dtype)
            return out
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{self.model_file}: tensor data unreadable ({e}); download it again") from e

    def codec_state_dict(self, mapped: bool = False) -> dict[str, torch.Tensor]:
        """All codec tensors under the publisher's module names, in the stored dtype (fp32 in the release).

        ``mapped``: a zip ``.pth`` is memory-mapped, so only the tensors a caller touches are read (the decoder
        alone needs under half of the release's 1.6 GB).

        The publisher's loading rules are applied (unwrap ``state_dict``, strip ``generator.``, drop
        ``freqs_cis``/``causal_mask``); weight norm stays unfolded (``original0``/``original1``,
        ``weight_g``/``weight_v``). Validates first.

        Raises:
            CheckpointError: as :meth:`check_codec`.
        """
        self.check_codec()
        return codec_tensors(self.codec_file, lazy=mapped and self.codec_file.suffix != ".safetensors")

    def fingerprint(self) -> str:
        """A stable id of these weights: sha256 hex (64 chars) over cheap-to-read parts of the files.

        Covers: the bytes of ``config.json`` and (if present) ``codec_spec.json``; for ``model.safetensors``
        and the codec file in use: the file name, its size, and five 64 KiB samples at fixed fractions of
        the file (start, 1/4, 1/2, 3/4, end), the first of which holds the safetensors header (names,
        dtypes, shapes, offsets). Not covered: ``generation_config.json`` and the tokenizer (they do not
        change the weights voices and converted assets depend on), and weight edits that fall entirely
        between the samples while keeping the size (a retrained or re-seeded checkpoint changes them all).
        Reads under 1 MB, so it is fast even for the 2.8 GB release.
        """
        if self._fingerprint is None:
            h = hashlib.sha256(b"audio8-checkpoint-fingerprint-v1\0")

            def add(label: str, data: bytes) -> None:
                h.update(label.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

            for name in (CONFIG_FILE, CODEC_SPEC_FILE):
                if (self.path / name).is_file():
                    add(name, (self.path / name).read_bytes())
            for file in (self.model_file, self.codec_file):
                if not file.is_file():
                    add(file.name, b"absent")
                    continue
                size = file.stat().st_size
                add(file.name, size.to_bytes(8, "little"))
                chunk = 1 << 16
                with file.open("rb") as f:
                    for frac in range(5):
                        f.seek(max(0, min(size - chunk, size * frac // 4)))
                        add(f"{file.name}@{frac}/4", f.read(chunk))
            self._fingerprint = h.hexdigest()
        return self._fingerprint


def load_checkpoint(path_or_id: str | Path = DEFAULT_MODEL, *, weights: bool = True, codec: bool = True) -> Checkpoint:
    """Find (see :func:`resolve_checkpoint`), read and validate a checkpoint; weights stay on disk.

    ``weights`` / ``codec`` False skip ``model.safetensors`` / the codec file entirely (not downloaded,
    not checked): the prompt builder needs only the configs and the tokenizer. Validation reads headers
    only; :meth:`Checkpoint.model_state_dict` and :meth:`Checkpoint.codec_state_dict` load the data.

    Raises:
        CheckpointError: the folder cannot be found or fetched; ``config.json`` is missing, not JSON, not
            an ``arktts`` config or inconsistent; ``generation_config.json`` / ``codec_spec.json`` are
            malformed; or a weight file is missing, damaged or does not match the config.
    """
    path = resolve_checkpoint(path_or_id, weights=weights, codec=codec)
    cfg_path = path / CONFIG_FILE
    raw = read_json(cfg_path, required=True)
    if raw.get("model_type") != MODEL_TYPE:
        raise CheckpointError(
            f"{cfg_path}: model_type is {raw.get('model_type')!r}, so this is not an Audio8/arktts checkpoint "
            f"(expected model_type '{MODEL_TYPE}', the publisher's Audio8-TTS-Preview-0.6b); point --model at "
            f"that checkpoint's folder or use {DEFAULT_MODEL}"
        )
    try:
        config = ModelConfig.from_dict(raw, str(cfg_path))
        generation = GenerationConfig.from_dict(
            read_json(path / GENERATION_FILE, required=False), str(path / GENERATION_FILE)
        )
        spec = read_json(path / CODEC_SPEC_FILE, required=False)
        codec_config = CodecConfig() if spec is None else CodecConfig.from_spec(spec, str(path / CODEC_SPEC_FILE))
    except ConfigError as e:
        raise CheckpointError(f"{e}; fix or restore the file from the checkpoint") from e
    tokenizer_dir = path if (path / TOKENIZER_FILES[0]).is_file() else None
    ckpt = Checkpoint(path, config, generation, codec_config, tokenizer_dir)
    if weights:
        ckpt.check_model()
    if codec:
        ckpt.check_codec()
    return ckpt
