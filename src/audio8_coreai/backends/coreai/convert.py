"""Conversion: a checkpoint into a Core AI asset folder (manifest.py) with coreai-torch, part by part."""

from __future__ import annotations

import dataclasses
import errno
import gc
import math
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ...audio.files import staged_folder
from ...audio.reference import MAX_REFERENCE_S
from ...checkpoint import Checkpoint, load_checkpoint
from ...checkpoint.validate import require_finite_weights
from ...config import SamplingParams
from ...errors import AssetError
from ...model.frame import PREFILL_WIDTH
from ...precision import resolve_precision
from ...settings import DEFAULTS
from .export import AssetFunction, decoder_functions, dualar_functions, encoder_function, export_function
from .manifest import (
    DUALAR_FUNCTIONS,
    PARTS,
    asset_metadata,
    decoder_max_frames,
    decoder_pushes,
    decoder_state_manifest,
    function_contract,
    manifest_base,
    read_manifest,
    require_coreai,
    source_name,
)
from .weights import decoder_module, dualar_model, encoder_module


class _Steps:
    """The conversion's progress bar (rich, on stderr); a no-op when ``show`` is False."""

    def __init__(self, total: int, show: bool):
        self._progress = None
        if show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(stderr=True)
            self._progress = Progress(
                TextColumn("{task.description:<32}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
                disable=not console.is_terminal,  # off a terminal rich would leave a blank line
            )
            self._task = self._progress.add_task("converting", total=total)

    def __enter__(self) -> _Steps:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def run(self, description: str, fn: Callable[[], Any], pause: bool = False) -> Any:
        """Run one step under ``description``; ``pause`` hides the bar meanwhile (coreai-torch draws its own
        on stdout, and two live bars on one terminal overwrite each other)."""
        if self._progress is not None:
            self._progress.update(self._task, description=description)
            if pause:
                self._progress.stop()
        try:
            return fn()
        finally:
            if self._progress is not None:
                if pause:
                    self._progress.start()
                self._progress.advance(self._task)


def _save(functions: dict[str, AssetFunction], path: Path, manifest: dict[str, Any], steps: _Steps) -> None:
    """Export ``functions`` (entry point -> function), convert them into one asset and save it at ``path`` with
    ``manifest`` (completed with their contract)."""
    import coreai_torch

    converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
    contract = {}
    for name, fn in functions.items():
        what = f"{path.stem}: export" + (f" {name}" if len(functions) > 1 else "")
        program = steps.run(what, lambda fn=fn: export_function(fn))
        contract[name] = function_contract(program, fn.inputs, fn.outputs, fn.states)
        converter.add_exported_program(
            program,
            input_names=list(fn.inputs),
            output_names=list(fn.outputs),
            state_names=list(fn.states),
            entrypoint_name=name,
        )
    ai_program = steps.run(f"{path.stem}: to Core AI", converter.to_coreai, pause=True)
    meta = asset_metadata({**manifest, "contract": contract})
    steps.run(f"{path.stem}: save", lambda: ai_program.save_asset(path, meta))


def _convert_dualar(
    ckpt: Checkpoint,
    path: Path,
    precision: str,
    context: int,
    params: SamplingParams,
    base: dict[str, Any],
    steps: _Steps,
) -> None:
    model = steps.run("dualar: weights", lambda: dualar_model(ckpt, precision, context))
    manifest = {**base, "part": "dualar", "context": context, "sampling": dataclasses.asdict(params)}
    _save(dualar_functions(model, params, context), path, manifest, steps)


def _convert_codec(
    ckpt: Checkpoint,
    path: Path,
    part: str,
    precision: str,
    frames: int,
    first: int,
    base: dict[str, Any],
    steps: _Steps,
) -> None:
    cc = ckpt.codec_config
    state = steps.run(f"{part}: weights", ckpt.codec_state_dict)
    require_finite_weights((t for t in state.values() if t.is_floating_point()), ckpt.codec_file.name)
    if part == "codec_decoder":
        longest = decoder_max_frames(ckpt.config.max_seq_len, cc.quantizer_transformer.window_size)
        pushes = decoder_pushes(frames, first)
        # RoPE rows for a last push that starts near the end and is padded past it
        fns = decoder_functions(decoder_module(cc, state, precision, longest + frames), cc, pushes)
        states = fns["main"].states
        extra = {"push": frames, "pushes": pushes, "max_frames": longest, "state": decoder_state_manifest(states)}
    else:
        fns = {"main": encoder_function(encoder_module(cc, state, precision, frames), cc, frames)}
        extra = {"frames": frames}
    del state
    _save(fns, path, {**base, "part": part, **extra}, steps)


def _check_completion(out: Path, ckpt: Checkpoint, precision: str, parts: Collection[str]) -> None:
    """Check that the existing folder ``out`` is empty or an asset folder the conversion of ``parts`` completes.

    Raises AssetError when it holds anything but parts (dot files aside: a Mac's .DS_Store), a part of ``parts``
    already, or parts that are stale (:func:`.manifest.read_manifest`), of another checkpoint or another precision:
    a backend refuses a folder that mixes two conversions.
    """
    entries = [e for e in out.iterdir() if not e.name.startswith(".")]
    names = {f"{p}.aimodel": p for p in PARTS}
    strays = sorted(e.name for e in entries if e.name not in names)
    if strays:
        raise AssetError(
            f"{out} is a non-empty folder that is not an asset folder (it holds {', '.join(strays[:3])}): the "
            "assets go into a new or empty folder, or into an asset folder that lacks the parts asked for; "
            "choose one or remove it"
        )
    held = sorted((names[e.name] for e in entries), key=PARTS.index)
    again = [p for p in held if p in parts]
    if again:
        lacks = [p for p in PARTS if p not in held]
        more = f"; or convert only what it lacks: {' '.join(f'--part {p}' for p in lacks)}" if lacks else ""
        raise AssetError(
            f"{out} already holds {', '.join(f'{p}.aimodel' for p in again)}: remove it to convert it again, or "
            f"choose a new folder{more}"
        )
    for part in held:
        manifest = read_manifest(out / f"{part}.aimodel")
        if manifest["source"]["fingerprint"] != ckpt.fingerprint():
            raise AssetError(
                f"{out / (part + '.aimodel')} was converted from another checkpoint ({source_name(manifest)}), "
                f"not from {ckpt.path}: a folder's parts come from one checkpoint; choose a new folder"
            )
        if manifest["precision"] != precision:
            raise AssetError(
                f"{out / (part + '.aimodel')} is {manifest['precision']}, not {precision}: a folder's parts share "
                f"one precision; convert with --precision {manifest['precision']}, or into a new folder"
            )


def convert(
    checkpoint: Checkpoint | str | Path,
    out_dir: str | Path,
    precision: str = "fp32",
    context: int | None = None,
    *,
    sampling: SamplingParams | None = None,
    decoder_frames: int = DEFAULTS.coreai.decoder_frames,
    decoder_first_frames: int = DEFAULTS.coreai.decoder_first_frames,
    encoder_frames: int = DEFAULTS.coreai.encoder_frames,
    parts: Collection[str] = PARTS,
    progress: bool = True,
) -> Path:
    """Convert a checkpoint into a Core AI asset folder ``out_dir`` (see manifest.py); return it.

    Args:
        checkpoint: a loaded :class:`Checkpoint`, or its folder / hub id.
        out_dir: a new (or empty) folder, or an asset folder that lacks the ``parts`` asked for (converted from
            this checkpoint at this precision: ``audio8 convert --part`` a part at a time). The assets are written
            beside it under a temporary name and moved into place when all are written, so a failed conversion
            leaves nothing half-made.
        precision: ``fp32``, ``fp16`` or ``int8-fp16`` (precision.py).
        context: KV slots (prompt + frames), a multiple of 32 up to ``max_seq_len`` (the default).
        sampling: the settings baked into the frame graphs (default: the checkpoint's defaults).
        decoder_frames: the codec decoder's push (frames of 2048 samples per call; the decoder state carries
            the utterance from call to call).
        decoder_first_frames: the decoder's second function's push (``first``, sharing the state; a stream's
            first chunk then costs a call of that many frames), below ``decoder_frames``; 0: none.
        encoder_frames: the codec encoder's bucket (frames per call: the longest clip).
        parts: which of PARTS to write (tests convert only what they use).
        progress: show a progress bar on stderr.

    Peak memory is about three times the largest part's weights in its precision (the torch module, the
    exported program's constants and the Core AI program): about 8 GB for the 0.6b fp32 DualAR.

    Raises:
        BackendError: the Core AI packages are missing; AssetError: bad ``precision``, ``context``, buckets,
        ``parts``, or an ``out_dir`` that is a file, a non-empty folder other than such an asset folder, or
        cannot be made or written;
        CheckpointError: as :func:`load_checkpoint`, or a weight holding NaN or inf (a damaged file).
    """
    require_coreai()
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    cfg = ckpt.config
    precision = resolve_precision(precision, "coreai").name
    context = cfg.max_seq_len if context is None else context
    if not (PREFILL_WIDTH <= context <= cfg.max_seq_len and context % PREFILL_WIDTH == 0):
        raise AssetError(
            f"context {context} must be a multiple of {PREFILL_WIDTH} between {PREFILL_WIDTH} and "
            f"the model's max_seq_len {cfg.max_seq_len}"
        )
    if decoder_frames < 1 or encoder_frames < 1 or decoder_first_frames < 0:
        raise AssetError(
            f"codec calls must hold frames: decoder push {decoder_frames}, encoder bucket {encoder_frames} (>= 1), "
            f"decoder first push {decoder_first_frames} (>= 0; 0: none)"
        )
    if decoder_frames > cfg.max_seq_len:
        raise AssetError(
            f"decoder push {decoder_frames} must be at most the {cfg.max_seq_len} frames an utterance may hold"
        )
    cc = ckpt.codec_config
    longest_clip = math.ceil(MAX_REFERENCE_S * cc.sample_rate / cc.frame_length)
    if encoder_frames > longest_clip:
        raise AssetError(
            f"encoder bucket {encoder_frames} frames is over the longest clip a voice takes ({MAX_REFERENCE_S:g} s: "
            f"{longest_clip} frames of {cc.frame_length} samples); give --encoder-frames {longest_clip} or fewer"
        )
    if decoder_first_frames >= decoder_frames:
        raise AssetError(
            f"the decoder's first push {decoder_first_frames} must be below its push {decoder_frames} (0: none; "
            "--decoder-first-frames 1 for a stream's first chunk)"
        )
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise AssetError(f"unknown or no parts {unknown or list(parts)}: choose from {', '.join(PARTS)}")
    params = sampling or SamplingParams.from_configs(cfg, ckpt.generation)
    out = Path(out_dir).expanduser()
    if out.is_symlink() and out.is_dir():  # a link to an empty folder: the folder is filled, the link kept
        out = out.resolve()
    elif out.is_symlink():
        raise AssetError(f"{out} is a link to {os.readlink(out)}, not a folder; choose a new folder or remove it")
    if out.exists() and not out.is_dir():
        raise AssetError(f"{out} is a file: the assets go into a new or empty folder; choose one or remove it")
    if out.is_dir():
        _check_completion(out, ckpt, precision, parts)
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise AssetError(f"cannot write the assets at {out}: {blocker} is a file, not a folder; choose another place")
    base = manifest_base(ckpt, precision)
    wanted = [p for p in PARTS if p in parts]
    decoder_steps = 3 + len(decoder_pushes(decoder_frames, decoder_first_frames))
    per_part = {"dualar": 1 + len(DUALAR_FUNCTIONS) + 2, "codec_decoder": decoder_steps, "codec_encoder": 4}
    try:  # a folder that cannot be made or written (no such place, read-only, a disk full) is said, not a traceback
        out.parent.mkdir(parents=True, exist_ok=True)
        with staged_folder(out, merge=out.is_dir()) as tmp, _Steps(sum(per_part[p] for p in wanted), progress) as steps:
            for part in wanted:
                path = tmp / f"{part}.aimodel"
                if part == "dualar":
                    _convert_dualar(ckpt, path, precision, context, params, base, steps)
                else:
                    frames = decoder_frames if part == "codec_decoder" else encoder_frames
                    _convert_codec(ckpt, path, part, precision, frames, decoder_first_frames, base, steps)
                gc.collect()  # free this part's weights and programs before the next one
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):  # the last rename found the place taken since the checks
            raise AssetError(
                f"another conversion wrote {out} while this one ran (two into one folder at once?), so this one's "
                f"parts were not moved in; see what it holds, then convert what it lacks: --out {out} --part NAME"
            ) from None
        raise AssetError(
            f"cannot write the assets at {out}: {e.strerror or e}; choose a folder you can write, with room for them"
        ) from None
    return out
