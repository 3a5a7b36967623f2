"""The Core AI asset folder's format: its parts, the dualar contract, and the manifest each asset carries.

An asset folder (written by :func:`~.convert.convert`, read by :class:`~.runtime.CoreAIBackend`) holds:

* ``dualar.aimodel``: ``prefill``, ``first_frame`` and ``frame`` (contract below);
  ``prefill`` and ``frame`` share the KV state ``k_cache``/``v_cache`` [n_layer, 1, n_kv, context, head_dim].
* ``codec_decoder.aimodel``: ``main``, the exact incremental codec decoder with its state as Core AI state
  (contract below), and where asked ``first``, the same for a 1-frame push (a stream's first chunk) on its state;
  every frame of an utterance is decoded once, in pushes of P frames (``DEFAULTS.coreai.decoder_frames`` by default).
* ``codec_encoder.aimodel``: ``main`` audio [1, 1, T_enc * 2048] float32 (mono, 44.1 kHz, right-padded
  with zeros) -> codes [1, C, T_enc] int32; T_enc frames (``DEFAULTS.coreai.encoder_frames`` by default).

Every asset's metadata carries a JSON manifest (creator-defined key ``audio8``): the format version, the
graph contract (names, shapes, dtypes of inputs, outputs and states), the precision, the shapes chosen at
conversion, the sampling settings baked into the frame graphs, and the source checkpoint's fingerprint and
the sha256 of its files. The backend refuses a folder whose manifest does not match this code or the
checkpoint it is given.

The dualar contract (V = semantic ids + 1 (eos), C = num_codebooks, W = 32, ``~`` = model dtype):

* ``prefill``: codes [1, 1+C, W] int32 (row 0 ids padded with the pad id, rows 1..C codes padded with 0),
  pos [1] int32 (the window's first slot) -> logits [W, V] ~, hidden [W, dim] ~ (post final norm).
* ``first_frame``: logits [V] ~, hidden [dim] ~ (prefill's last real row), then the tail inputs
  noise_slow [2, V] float32, window [ras_window] int32 (-1 = empty), noise_fast [C-1, codebook_size]
  float32, forced [1+C] int32, use_forced [1] float32 (1 = teacher forcing) -> semantic [1] int32 (a token
  id; eos ends the utterance), codes [C] int32, logits [V] ~, hidden [dim] ~, fast_logits [C-1,
  codebook_size] ~, sampled_semantic [1] int32, sampled_codes [C] int32.
* ``frame``: codes [1, 1+C, 1] int32 (the previous column), pos [1] int32 (its slot), then the tail
  inputs -> as ``first_frame``, logits/hidden being this step's: one runtime call per frame.

An app speaking needs ``semantic`` and ``codes`` only. ``fast_logits`` (the fast AR's logits of codebooks 1..C-1)
and ``sampled_semantic``/``sampled_codes`` (the sampler's own draws, which differ from ``semantic``/``codes``
only under teacher forcing, ``use_forced`` 1) serve parity (``audio8 parity``).

The codec decoder contract (P = the push, manifest ``push``; the state in the decoder's dtype: float32 for
fp32, float16 otherwise):

* ``main``: codes [1, C, P] int32 (clamped in the graph; frames after ``count`` are padding, any codes),
  start [1] int32 (the utterance position of the push's first frame), count [1] int32 (1..P real frames) ->
  wav [1, P * 2048] float32, of which the first ``count * 2048`` samples are the frames' audio. The state
  (``contract.main.states``, described in manifest ``state``, zeros to start an utterance) is read and
  written in place: per post_module layer the rotated keys and values of the 127 frames before the push, and
  per causal convolution its last input steps (:class:`..model.codec.StreamingDecoder`). ``start + count``
  may reach the manifest's ``max_frames`` (the checkpoint's ``max_seq_len``: the RoPE positions).
* ``first`` (opt-in: ``audio8 convert --decoder-first-frames 1``): as ``main`` with P = that push (manifest
  ``pushes``: function -> P), on the same state: a stream's 1-frame first chunk costs a 1-frame call, not a
  16-frame one.

Sampling is baked into ``first_frame``/``frame``: top-k, top-p, temperature, do_sample and the RAS settings
are graph constants, by default the checkpoint's generation_config.json and config.json at conversion time.
The backend refuses other settings with a clear error; ``convert`` with ``sampling=`` makes a variant
(``audio8 convert --greedy``: do_sample false, argmax draws, which replays the oracle's greedy scenario).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ...checkpoint import CODEC_SPEC_FILE, CONFIG_FILE, GENERATION_FILE, Checkpoint
from ...errors import AssetError, BackendError
from ...packages import install_extra

FORMAT = 3  # bump when the graphs, their contract or the manifest change: older folders are then refused
MANIFEST_KEY = "audio8"
PARTS = ("dualar", "codec_decoder", "codec_encoder")
DUALAR_FUNCTIONS = ("prefill", "first_frame", "frame")
FRAME_OUTPUTS = ("semantic", "codes", "logits", "hidden", "fast_logits", "sampled_semantic", "sampled_codes")
STATE_NAMES = ("k_cache", "v_cache")

# coreai-torch compares torch's version as a string: "2.13.0+cpu" reads as newer than its validated 2.13.0.
warnings.filterwarnings("ignore", message="coreai-torch has only been validated", category=UserWarning)


def require_coreai() -> None:
    """Raise BackendError naming the extra to install when the Core AI packages cannot be imported."""
    try:
        import coreai.runtime  # noqa: F401
        import coreai_torch  # noqa: F401
    except ImportError as e:
        raise BackendError(
            f"Core AI support needs the coreai-core and coreai-torch packages ({e}); install them with: "
            f"{install_extra('coreai')} (wheels exist for macOS and Linux x86_64)"
        ) from e


def decoder_max_frames(max_seq_len: int, window: int) -> int:
    """The longest utterance (frames) the codec decoder asset decodes: the checkpoint's ``max_seq_len`` (prompt
    and frames never exceed it), at least the codec transformer's ``window`` (its mask band needs the rows)."""
    return max(max_seq_len, window)


def decoder_pushes(push: int, first: int) -> dict[str, int]:
    """The codec decoder's functions, name -> frames per call: ``main`` (``push``) and ``first`` when ``first``
    is 1 or more and shorter than ``push`` (0: no ``first``)."""
    return {"main": push, **({"first": first} if 1 <= first < push else {})}


def decoder_state_manifest(states: dict[str, Tensor]) -> dict[str, str]:
    """What each codec decoder state tensor holds, in call order (shapes and dtypes are in the contract)."""
    out = {}
    for name, t in states.items():
        if name.startswith("post_module_"):
            kind = name.rsplit("_", 1)[1]
            out[name] = f"post_module layer {name.split('_')[2]}: rotated {kind} of the {t.shape[2]} frames before"
        else:
            out[name] = f"the last {t.shape[-1]} input steps of the causal convolution {name}"
    return out


# --------------------------------------------------------------------------------------------------------
# Writing


def _spec(t: Any) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


def function_contract(
    program: Any, inputs: dict[str, Tensor], outputs: Sequence[str], states: dict[str, Tensor]
) -> dict[str, Any]:
    """One function's contract: names -> {shape, dtype}; outputs read from the exported program."""
    nodes = {n.name: n for n in program.graph.nodes}
    results = [nodes[name].meta["val"] for name in program.graph_signature.user_outputs]
    return {
        "inputs": {k: _spec(t) for k, t in inputs.items()},
        "outputs": {k: _spec(t) for k, t in zip(outputs, results, strict=True)},
        "states": {k: _spec(t) for k, t in states.items()},
    }


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _source(ckpt: Checkpoint) -> dict[str, Any]:
    """The checkpoint's name (:attr:`Checkpoint.name`, not its path: assets ship inside apps), its fingerprint
    (checked at load) and the sha256 of every file a part depends on."""
    files = [
        ckpt.path / CONFIG_FILE,
        ckpt.path / GENERATION_FILE,
        ckpt.path / CODEC_SPEC_FILE,
        ckpt.model_file,
        ckpt.codec_file,
    ]
    return {
        "name": ckpt.name,
        "fingerprint": ckpt.fingerprint(),
        "sha256": {f.name: _file_sha256(f) for f in files if f.is_file()},
    }


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("audio8-coreai", "coreai-torch", "coreai-core", "coreai-opt", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def manifest_base(ckpt: Checkpoint, precision: str) -> dict[str, Any]:
    """The fields every part's manifest shares: format, precision, source checkpoint and package versions."""
    return {"format": FORMAT, "precision": precision, "source": _source(ckpt), "versions": _versions()}


def asset_metadata(manifest: dict[str, Any]) -> Any:
    """The ``AIModelAssetMetadata`` of a part, its manifest stored as JSON under MANIFEST_KEY."""
    import coreai.runtime as rt

    meta = rt.AIModelAssetMetadata()
    meta.license = "apache-2.0"
    meta.model_description = (
        f"audio8-coreai {manifest['part']} ({manifest['precision']}) of the checkpoint {manifest['source']['name']}"
    )
    meta.set_custom(MANIFEST_KEY, json.dumps(manifest))
    return meta


# --------------------------------------------------------------------------------------------------------
# Reading


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the asset at ``path`` (``<part>.aimodel``), checked for this code's format.

    Raises AssetError naming the file and what to do when it is missing, unreadable, not written by
    ``audio8 convert`` or written for another format version (stale).
    """
    from coreai.authoring import AIModelAsset

    new = "into a new folder: audio8 convert --model DIR --out NEW, then --assets NEW"
    fix = f"convert the checkpoint again {new}"
    if not path.is_dir():
        if path.parent.suffix == ".aimodel" and (path.parent / "main.mlirb").is_file():  # --assets named one part
            raise AssetError(
                f"{path.parent} is one asset, not an asset folder: give the folder that holds it, --assets "
                f"{path.parent.parent}"
            )
        names = ", ".join(f"{p}.aimodel" for p in PARTS)
        if path.parent.is_dir() and any(path.parent.iterdir()) and not any(path.parent.glob("*.aimodel")):
            # not an asset folder at all (a checkpoint folder, say): convert writes a new or empty one only
            fix = f"convert the checkpoint {new}"
        elif path.stem in PARTS and any(path.parent.glob("*.aimodel")):  # an asset folder lacking this part
            fix = (
                f"convert that part into it, at the precision of the parts it holds: audio8 convert --model DIR "
                f"--out {path.parent} --part {path.stem} (or {fix})"
            )
        raise AssetError(
            f"{path.parent}: no {path.name}; an asset folder holds {names} written by audio8 convert; {fix}"
        )
    _check_program(path, fix)
    try:
        raw = AIModelAsset.load(path).metadata.creator_defined_metadata.get(MANIFEST_KEY)
    except RuntimeError as e:
        raise AssetError(f"{path}: not a readable Core AI asset ({e}); {fix}") from e
    try:
        manifest = json.loads(raw) if raw is not None else None
    except json.JSONDecodeError:
        manifest = None
    if not isinstance(manifest, dict):
        raise AssetError(f"{path}: has no audio8 manifest, so it was not written by audio8 convert; {fix}")
    if manifest.get("format") == FORMAT and manifest.get("part") in PARTS and manifest.get("part") != path.stem:
        raise AssetError(
            f"{path}: holds the {manifest['part']} part, not {path.stem} (a part renamed or moved?); give it back its "
            f"name, {manifest['part']}.aimodel, or {fix}"
        )
    if manifest.get("format") != FORMAT or manifest.get("part") != path.stem:
        raise AssetError(
            f"{path}: stale asset (format {manifest.get('format')}, part {manifest.get('part')!r}; "
            f"this version reads format {FORMAT}); {fix}"
        )
    return manifest


def _check_program(path: Path, fix: str) -> None:
    """Raise AssetError when ``path``'s program (``main.mlirb``) is missing or not the one its ``main.hash`` (the
    raw sha256 coreai writes beside it) names: a copy cut short made the runtime abort the process (SIGABRT)."""
    program, digest = path / "main.mlirb", path / "main.hash"
    if not program.is_file() or not digest.is_file():
        raise AssetError(f"{path}: no {'main.mlirb' if not program.is_file() else 'main.hash'}; {fix}")
    if bytes.fromhex(_file_sha256(program)) != digest.read_bytes():
        raise AssetError(f"{program} is damaged (not the program its main.hash names: a copy cut short?); {fix}")


def source_name(manifest: dict[str, Any]) -> str:
    """The source checkpoint's folder name (assets of this format written before it was kept held its path)."""
    source = manifest["source"]
    return source["name"] if "name" in source else Path(source["path"]).name


def checked_manifest(folder: Path, part: str, checkpoint: Checkpoint, precision: str | None) -> dict[str, Any]:
    """The manifest of ``part`` in ``folder`` (:func:`read_manifest`), checked against ``checkpoint``.

    ``precision`` is the dualar's, which every codec part must share (None when reading the dualar itself).
    Raises AssetError when the part was converted from another checkpoint (fingerprint) or at another precision.
    """
    manifest = read_manifest(folder / f"{part}.aimodel")
    want = checkpoint.fingerprint()
    got = manifest["source"]["fingerprint"]
    if got != want:
        raise AssetError(
            f"{folder / (part + '.aimodel')} was converted from another checkpoint "
            f"({source_name(manifest)}, fingerprint {got[:12]}), not from "
            f"{checkpoint.path} (fingerprint {want[:12]}); convert this checkpoint: "
            f"audio8 convert --model {checkpoint.path} --out DIR"
        )
    if part != "dualar" and manifest["precision"] != precision:
        raise AssetError(
            f"{folder}: {part} is {manifest['precision']} but dualar is {precision}; "
            "the folder mixes two conversions, convert again into a new folder"
        )
    return manifest
