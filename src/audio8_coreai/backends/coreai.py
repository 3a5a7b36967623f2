"""Core AI: convert the graphs to ``.aimodel`` assets, then load and run them (DESIGN.md principle 1).

Only published packages are used: ``coreai-torch`` (torch.export programs -> Core AI), ``coreai-opt`` (int8
weights for ``mixed``) and ``coreai-core`` (the asset format and ``coreai.runtime``, which runs assets natively
on Apple devices and, on Linux, in a CPU interpreter: slow, but it is how tests prove an asset right).

An asset folder (written by :func:`convert`, read by :class:`CoreAIBackend`) holds:

* ``dualar.aimodel``: ``prefill``, ``first_frame`` and ``frame`` (PORT-NOTES.md section 2, contract below);
  ``prefill`` and ``frame`` share the KV state ``k_cache``/``v_cache`` [n_layer, 1, n_kv, context, head_dim].
* ``codec_decoder.aimodel``: ``main`` codes [1, C, T_dec] int32 -> wav [1, T_dec * 2048] float32 (codes
  clamped in the graph); T_dec = 160 frames (7.4 s) by default.
* ``codec_encoder.aimodel``: ``main`` audio [1, 1, T_enc * 2048] float32 (mono, 44.1 kHz, right-padded
  with zeros) -> codes [1, C, T_enc] int32; T_enc = 216 frames (10 s) by default.

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

Sampling is baked into ``first_frame``/``frame``: top-k, top-p, temperature, do_sample and the RAS settings
are graph constants, by default the checkpoint's generation_config.json and config.json at conversion time.
The backend refuses other settings with a clear error; :func:`convert` with ``sampling=`` makes a variant
(``audio8 convert --greedy``: do_sample false, argmax draws, which replays the oracle's greedy scenario).

Precisions: ``fp32`` (reference: reproduces the oracle), ``fp16`` (the DualAR's and the decoder's weights,
activations and KV state in fp16; RMSNorm, RoPE and the sampler in fp32 inside the graph), ``mixed`` (``fp16``
with the slow AR's linear weights in int8, symmetric, one scale per block of 32 input channels, via coreai-opt;
the fast AR stays fp16 because int8 there costs draws). The encoder computes in fp32 in every precision
(fp16 arithmetic flips its nearest-neighbour code choices); in ``fp16`` and ``mixed`` its weights are stored
fp16 and cast to fp32 in the graph, except the vector quantizers' (:func:`_encoder_module`). coreai-torch 0.4.3
folds such a cast into an fp32 constant when the weight is small (under about 250,000 elements, 1 MB as fp32:
measured), so every tiny-checkpoint weight stays fp32 while the 0.6b encoder's large ones (206M of its 207M)
stay fp16: about 417 MB instead of 830 (from the 0.6b parameter shapes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hashlib
import importlib.metadata
import json
import shutil
import sys
import threading
import uuid
import warnings
import weakref
from collections.abc import Callable, Collection, Coroutine, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ..checkpoint import CODEC_SPEC_FILE, CONFIG_FILE, GENERATION_FILE, Checkpoint, load_checkpoint
from ..config import ModelConfig
from ..config import SamplingParams
from ..model.frame import PREFILL_WIDTH, Frame, FrameInputs, FrameOutputs
from ..model.codec import CodecDecoder, CodecEncoder
from ..model.dualar import DualAR
from ..model.layers import causal_cache_mask
from .base import Backend, BackendError, CodecStream, FrameResult, RedecodeStream

FORMAT = 1  # bump when the graphs, their contract or the manifest change: older folders are then refused
MANIFEST_KEY = "audio8"
PRECISIONS = ("fp32", "fp16", "mixed")
PARTS = ("dualar", "codec_decoder", "codec_encoder")
DUALAR_FUNCTIONS = ("prefill", "first_frame", "frame")
FRAME_OUTPUTS = ("semantic", "codes", "logits", "hidden", "fast_logits", "sampled_semantic", "sampled_codes")
STATE_NAMES = ("k_cache", "v_cache")
DECODER_FRAMES = 160  # 7.4 s: 128 frames of context + 32 new ones per streaming window (DESIGN.md)
ENCODER_FRAMES = 216  # 10.0 s: the voice-registration bucket
DECODER_STEP = 32  # new frames per window when an utterance is longer than the decoder's bucket
QUANT_BLOCK = 32  # int8 weights: one scale per this many input channels

# coreai-torch compares torch's version as a string: "2.13.0+cpu" reads as newer than its validated 2.13.0.
warnings.filterwarnings("ignore", message="coreai-torch has only been validated", category=UserWarning)
# torch.export in torch 2.13 warns about its own pytree internals on every export.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


class AssetError(BackendError):
    """A Core AI asset folder that is missing, incomplete, stale, or converted from another checkpoint."""


def _require_coreai() -> None:
    """Raise BackendError naming the extra to install when the Core AI packages cannot be imported."""
    try:
        import coreai.runtime  # noqa: F401
        import coreai_torch  # noqa: F401
    except ImportError as e:
        raise BackendError(f"Core AI support needs the coreai-core and coreai-torch packages ({e}); install "
                           "them with: pip install 'audio8-coreai[coreai]' (wheels exist for macOS and Linux "
                           "x86_64)") from e


# --------------------------------------------------------------------------------------------------------
# The asset functions: the graphs of graphs.py behind the contract's exact names, shapes and dtypes.


def _frame_outputs(out: FrameOutputs) -> tuple[Tensor, ...]:
    """A frame's batch-1 outputs in FRAME_OUTPUTS order, ids as int32, batch axis dropped."""
    i32 = torch.int32
    return (out.semantic.to(i32), out.codes[0].to(i32), out.logits[0], out.hidden[0], out.fast_logits[0],
            out.sampled_semantic.to(i32), out.sampled_codes[0].to(i32))


def _inputs(noise_slow: Tensor, window: Tensor, noise_fast: Tensor, forced: Tensor, use_forced: Tensor,
            column: Tensor | None = None, pos: Tensor | None = None) -> FrameInputs:
    """The asset's unbatched inputs as the frame's batch-1 inputs."""
    return FrameInputs(noise_slow[None], window[None], noise_fast[None], forced[None], use_forced,
                       column, 0 if pos is None else pos)


class _PrefillFn(nn.Module):
    """``prefill`` (see the module docstring): one window of W columns into the KV state."""

    def __init__(self, model: DualAR):
        super().__init__()
        self.frame = Frame(model, mode="export")

    def forward(self, codes: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        logits, hidden = self.frame.prefill(codes, pos, k_cache, v_cache)
        return logits[0], hidden[0]


class _FirstFrameFn(nn.Module):
    """``first_frame``: sample frame 0 from prefill's last logits/hidden; no slow step, no state."""

    def __init__(self, model: DualAR, params: SamplingParams):
        super().__init__()
        self.frame, self.params = Frame(model, mode="export"), params

    def forward(self, logits: Tensor, hidden: Tensor, noise_slow: Tensor, window: Tensor, noise_fast: Tensor,
                forced: Tensor, use_forced: Tensor) -> tuple[Tensor, ...]:
        # Outputs that are inputs unchanged would be graph arguments, not results: pass them through an op.
        out = self.frame.sample(self.params, logits.clone()[None], hidden.clone()[None],
                                _inputs(noise_slow, window, noise_fast, forced, use_forced))
        return _frame_outputs(out)


class _FrameFn(nn.Module):
    """``frame``: the slow step on the previous column, both semantic draws and the fast AR in one call."""

    def __init__(self, model: DualAR, params: SamplingParams):
        super().__init__()
        self.frame, self.params = Frame(model, mode="export"), params

    def forward(self, codes: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor, noise_slow: Tensor,
                window: Tensor, noise_fast: Tensor, forced: Tensor, use_forced: Tensor) -> tuple[Tensor, ...]:
        inputs = _inputs(noise_slow, window, noise_fast, forced, use_forced, codes, pos)
        return _frame_outputs(self.frame(self.params, inputs, k_cache, v_cache))


class _DecodeFn(nn.Module):
    """``codec_decoder.main``: codes [1, C, T] int32 -> wav [1, T * frame_length] float32."""

    def __init__(self, decoder: CodecDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, codes: Tensor) -> Tensor:
        return self.decoder(codes)


class _EncodeFn(nn.Module):
    """``codec_encoder.main``: audio [1, 1, T * frame_length] float32 -> codes [1, C, T] int32."""

    def __init__(self, encoder: CodecEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, audio: Tensor) -> Tensor:
        return self.encoder(audio).to(torch.int32)


class _Upcast(nn.Module):
    """A parametrization that hands its module the stored tensor cast to float32."""

    def forward(self, stored: Tensor) -> Tensor:
        return stored.float()


def _store_fp16(module: nn.Module) -> None:
    """Store ``module``'s float32 parameters as float16, each cast back to float32 where it is used, in place.

    The exported program then holds float16 constants followed by a cast, which coreai-torch 0.4.3 keeps for
    weights of about 250,000 elements or more (the asset stores half their bytes while every op computes in
    float32) and folds into a float32 constant for smaller ones (measured; tests/test_coreai.py).
    """
    for sub in list(module.modules()):
        for name, param in list(sub.named_parameters(recurse=False)):
            setattr(sub, name, nn.Parameter(param.detach().half(), requires_grad=False))
            # unsafe: the parametrization changes the dtype (float16 stored, float32 seen).
            parametrize.register_parametrization(sub, name, _Upcast(), unsafe=True)


def _encoder_module(cc: Any, state: dict[str, Tensor], precision: str, frames: int) -> CodecEncoder:
    """The codec encoder for ``precision``: float32 compute always (float16 arithmetic flips its
    nearest-neighbour code choices); for fp16 and mixed, every weight but the vector quantizers' is stored
    float16 (the VQ projections and codebooks, 0.3M of the 0.6b encoder's 207M weights, stay float32: stored
    float16 they flip 5 of the tiny oracle clip's 110 codes, the rest flips none)."""
    encoder = CodecEncoder.from_state_dict(cc, state, max_frames=frames)
    if precision != "fp32":
        for part in (encoder.encoder, encoder.quantizer.downsample, encoder.quantizer.pre_module):
            _store_fp16(part)
    return encoder


def _quantize_slow_linears(model: DualAR, context: int) -> None:
    """Replace the slow AR's linear weights by int8 (symmetric with clipping, per block of QUANT_BLOCK input
    channels, weight only) with coreai-opt, in place. Embeddings, the head and the norms stay as they are."""
    from coreai_opt import ExportBackend
    from coreai_opt.quantization import ModuleQuantizerConfig, QuantizationSpec, Quantizer, QuantizerConfig
    from coreai_opt.quantization.spec import PerBlockGranularity, QuantizationScheme

    spec = QuantizationSpec(dtype=torch.int8, qscheme=QuantizationScheme.SYMMETRIC_WITH_CLIPPING,
                            granularity=PerBlockGranularity(axis=1, block_size=QUANT_BLOCK))
    weights_only = ModuleQuantizerConfig(op_input_spec=None, op_output_spec=None, op_state_spec={"weight": spec})
    # Eager mode keeps an nn.Module, so the one quantized slow AR serves prefill and frame alike.
    config = QuantizerConfig(global_config=None, execution_mode="eager", module_name_configs={
        r"layers\.\d+\.(attention\.(wqkv|wo)|feed_forward\.w[123])": weights_only})
    cfg = model.cfg
    k, v = model.new_kv_cache(length=context)
    slots = torch.arange(PREFILL_WIDTH)
    example = (torch.zeros(1, 1 + cfg.num_codebooks, PREFILL_WIDTH, dtype=torch.long), slots[None], slots,
               causal_cache_mask(slots[:1], PREFILL_WIDTH, context), k, v)
    quantizer = Quantizer(model.slow, config)
    quantizer.prepare(example)
    model.slow = quantizer.finalize(backend=ExportBackend.CoreAI)


# --------------------------------------------------------------------------------------------------------
# Conversion


def _export(module: nn.Module, args: tuple[Tensor, ...]) -> Any:
    """torch.export with static shapes, decomposed for coreai-torch."""
    import coreai_torch

    with torch.no_grad():
        program = torch.export.export(module, args)
    return program.run_decompositions(coreai_torch.get_decomp_table())


def _spec(t: Any) -> dict[str, Any]:
    return {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


def _contract(program: Any, inputs: dict[str, Tensor], outputs: Sequence[str],
              states: dict[str, Tensor]) -> dict[str, Any]:
    """One function's contract: names -> {shape, dtype}; outputs read from the exported program."""
    nodes = {n.name: n for n in program.graph.nodes}
    results = [nodes[name].meta["val"] for name in program.graph_signature.user_outputs]
    return {"inputs": {k: _spec(t) for k, t in inputs.items()},
            "outputs": {k: _spec(t) for k, t in zip(outputs, results, strict=True)},
            "states": {k: _spec(t) for k, t in states.items()}}


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _source(ckpt: Checkpoint) -> dict[str, Any]:
    """The checkpoint's fingerprint (checked at load) and the sha256 of every file a part depends on."""
    files = [ckpt.path / CONFIG_FILE, ckpt.path / GENERATION_FILE, ckpt.path / CODEC_SPEC_FILE, ckpt.model_file,
             ckpt.codec_file]
    return {"path": str(ckpt.path), "fingerprint": ckpt.fingerprint(),
            "sha256": {f.name: _file_sha256(f) for f in files if f.is_file()}}


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("audio8-coreai", "coreai-torch", "coreai-core", "coreai-opt", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def decoder_context(frames: int, window: int) -> int:
    """Frames of context a decoder window of ``frames`` keeps when an utterance is decoded in windows.

    The codec transformer's ``window`` (128) when the bucket leaves at least DECODER_STEP new frames (the
    default 160 = 128 + 32, DESIGN.md), else half the bucket (small test buckets: approximate).
    """
    return min(window, frames - DECODER_STEP) if frames >= window + DECODER_STEP else frames // 2


class _Steps:
    """The conversion's progress bar (rich, on stderr); a no-op when ``show`` is False."""

    def __init__(self, total: int, show: bool):
        self._progress = None
        if show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._task = self._progress.add_task("converting", total=total)

    def __enter__(self) -> "_Steps":
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


def _save(programs: list[tuple[str, Any, list[str], list[str], list[str]]], path: Path,
          manifest: dict[str, Any], steps: _Steps) -> None:
    """Convert exported programs (entry point, program, inputs, outputs, states) into one asset at ``path``."""
    import coreai.runtime as rt
    import coreai_torch

    converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
    for name, program, inputs, outputs, states in programs:
        converter.add_exported_program(program, input_names=inputs, output_names=outputs, state_names=states,
                                       entrypoint_name=name)
    ai_program = steps.run(f"{path.stem}: to Core AI", converter.to_coreai, pause=True)
    meta = rt.AIModelAssetMetadata()
    meta.license = "apache-2.0"
    meta.model_description = f"Audio8-TTS-Preview-0.6b {manifest['part']} ({manifest['precision']})"
    meta.set_custom(MANIFEST_KEY, json.dumps(manifest))
    steps.run(f"{path.stem}: save", lambda: ai_program.save_asset(path, meta))


def _dualar_model(ckpt: Checkpoint, precision: str, context: int) -> DualAR:
    model = DualAR.from_state_dict(ckpt.config, ckpt.model_state_dict(),
                                   torch.float32 if precision == "fp32" else torch.float16)
    if precision == "mixed":
        _quantize_slow_linears(model, context)
    return model


def _convert_dualar(ckpt: Checkpoint, path: Path, precision: str, context: int, params: SamplingParams,
                    base: dict[str, Any], steps: _Steps) -> None:
    cfg = ckpt.config
    model = steps.run("dualar: weights", lambda: _dualar_model(ckpt, precision, context))
    c, v_size = cfg.num_codebooks, cfg.num_semantic + 1
    dtype = model.slow.head.weight.dtype
    states = dict(zip(STATE_NAMES, model.new_kv_cache(length=context), strict=True))
    i32 = torch.int32
    column = torch.zeros(1, 1 + c, 1, dtype=i32)
    column[:, 0] = cfg.pad_token_id
    window = torch.zeros(1, 1 + c, PREFILL_WIDTH, dtype=i32)
    window[:, 0] = cfg.pad_token_id
    tail = {"noise_slow": torch.rand(2, v_size), "window": torch.full((cfg.ras_window_size,), -1, dtype=i32),
            "noise_fast": torch.rand(c - 1, cfg.codebook_size), "forced": torch.zeros(1 + c, dtype=i32),
            "use_forced": torch.zeros(1)}
    specs = {
        "prefill": (_PrefillFn(model), {"codes": window, "pos": torch.tensor([0], dtype=i32)}, ("logits", "hidden"),
                    states),
        "first_frame": (_FirstFrameFn(model, params), {"logits": torch.zeros(v_size, dtype=dtype),
                                                       "hidden": torch.zeros(cfg.dim, dtype=dtype), **tail},
                        FRAME_OUTPUTS, {}),
        "frame": (_FrameFn(model, params), {"codes": column, "pos": torch.tensor([PREFILL_WIDTH], dtype=i32),
                                            **tail}, FRAME_OUTPUTS, states),
    }
    programs, contract = [], {}
    for name, (module, inputs, outputs, st) in specs.items():
        # The states come right after the first two inputs in prefill's and frame's forward.
        args = list(inputs.values())
        args[2:2] = st.values()
        program = steps.run(f"dualar: export {name}", lambda m=module, a=tuple(args): _export(m, a))
        contract[name] = _contract(program, inputs, outputs, st)
        programs.append((name, program, list(inputs), list(outputs), list(st)))
    manifest = {**base, "part": "dualar", "context": context, "sampling": dataclasses.asdict(params),
                "contract": contract}
    _save(programs, path, manifest, steps)


def _convert_codec(ckpt: Checkpoint, path: Path, part: str, precision: str, frames: int,
                   base: dict[str, Any], steps: _Steps) -> None:
    cc = ckpt.codec_config
    state = steps.run(f"{part}: weights", ckpt.codec_state_dict)
    dtype = torch.float32 if precision == "fp32" else torch.float16
    if part == "codec_decoder":
        module: nn.Module = _DecodeFn(CodecDecoder.from_state_dict(cc, state, dtype, max_frames=frames))
        inputs = {"codes": torch.zeros(1, cc.num_codebooks, frames, dtype=torch.int32)}
        outputs, extra = ["wav"], {"decode_context": decoder_context(frames, cc.quantizer_transformer.window_size)}
    else:
        module = _EncodeFn(_encoder_module(cc, state, precision, frames))
        inputs = {"audio": torch.zeros(1, 1, frames * cc.frame_length)}
        outputs, extra = ["codes"], {}
    del state
    program = steps.run(f"{part}: export", lambda: _export(module, tuple(inputs.values())))
    manifest = {**base, "part": part, "frames": frames, **extra,
                "contract": {"main": _contract(program, inputs, outputs, {})}}
    _save([("main", program, list(inputs), outputs, [])], path, manifest, steps)


def convert(checkpoint: Checkpoint | str | Path, out_dir: str | Path, precision: str = "fp32",
            context: int | None = None, *, sampling: SamplingParams | None = None,
            decoder_frames: int = DECODER_FRAMES, encoder_frames: int = ENCODER_FRAMES,
            parts: Collection[str] = PARTS, progress: bool = True) -> Path:
    """Convert a checkpoint into a Core AI asset folder ``out_dir`` (see the module docstring); return it.

    Args:
        checkpoint: a loaded :class:`Checkpoint`, or its folder / hub id.
        out_dir: a new (or empty) folder. The assets are written beside it under a temporary name and
            moved into place when all are written, so a failed conversion leaves nothing half-made.
        precision: ``fp32``, ``fp16`` or ``mixed``.
        context: KV slots (prompt + frames), a multiple of 32 up to ``max_seq_len`` (the default).
        sampling: the settings baked into the frame graphs (default: the checkpoint's defaults).
        decoder_frames, encoder_frames: the codec buckets (frames of 2048 samples per call).
        parts: which of PARTS to write (tests convert only what they use).
        progress: show a progress bar on stderr.

    Peak memory is about three times the largest part's weights in its precision (the torch module, the
    exported program's constants and the Core AI program): about 8 GB for the 0.6b fp32 DualAR.

    Raises:
        BackendError: the Core AI packages are missing; AssetError: bad ``precision``, ``context``, buckets,
        ``parts``, or an ``out_dir`` that is a file or a non-empty folder; CheckpointError: as
        :func:`load_checkpoint`.
    """
    _require_coreai()
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    cfg = ckpt.config
    if precision not in PRECISIONS:
        raise AssetError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    context = cfg.max_seq_len if context is None else context
    if not (PREFILL_WIDTH <= context <= cfg.max_seq_len and context % PREFILL_WIDTH == 0):
        raise AssetError(f"context {context} must be a multiple of {PREFILL_WIDTH} between {PREFILL_WIDTH} and "
                         f"the model's max_seq_len {cfg.max_seq_len}")
    if decoder_frames < 2 or encoder_frames < 1:
        raise AssetError(f"codec buckets must hold frames: decoder {decoder_frames} (>= 2), encoder "
                         f"{encoder_frames} (>= 1)")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise AssetError(f"unknown or no parts {unknown or list(parts)}: choose from {', '.join(PARTS)}")
    params = sampling or SamplingParams.from_configs(cfg, ckpt.generation)
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AssetError(f"{out} already exists and is not an empty folder; choose a new folder or remove it")
    base = {"format": FORMAT, "precision": precision, "source": _source(ckpt), "versions": _versions()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    wanted = [p for p in PARTS if p in parts]
    per_part = {"dualar": 1 + len(DUALAR_FUNCTIONS) + 2, "codec_decoder": 4, "codec_encoder": 4}
    try:
        with _Steps(sum(per_part[p] for p in wanted), progress) as steps:
            for part in wanted:
                path = tmp / f"{part}.aimodel"
                if part == "dualar":
                    _convert_dualar(ckpt, path, precision, context, params, base, steps)
                else:
                    frames = decoder_frames if part == "codec_decoder" else encoder_frames
                    _convert_codec(ckpt, path, part, precision, frames, base, steps)
                gc.collect()  # free this part's weights and programs before the next one
        if out.exists():
            out.rmdir()  # empty (checked above); rename needs the name free
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------------------------------------
# Loading and running


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the asset at ``path`` (``<part>.aimodel``), checked for this code's format.

    Raises AssetError naming the file and what to do when it is missing, unreadable, not written by
    ``audio8 convert`` or written for another format version (stale).
    """
    from coreai.authoring import AIModelAsset

    fix = f"convert the checkpoint again: audio8 convert --model DIR --out {path.parent}"
    if not path.is_dir():
        names = ", ".join(f"{p}.aimodel" for p in PARTS)
        if path.parent.is_dir() and any(path.parent.iterdir()) and not any(path.parent.glob("*.aimodel")):
            # not an asset folder at all (a checkpoint folder, say): convert writes a new or empty one only
            fix = ("convert the checkpoint into a new folder: audio8 convert --model DIR --out NEW_DIR, then --assets "
                   "NEW_DIR")
        raise AssetError(f"{path.parent}: no {path.name}; an asset folder holds {names} written by audio8 convert; "
                         f"{fix}")
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
    if manifest.get("format") != FORMAT or manifest.get("part") != path.stem:
        raise AssetError(f"{path}: stale asset (format {manifest.get('format')}, part {manifest.get('part')!r}; "
                         f"this version reads format {FORMAT}); {fix}")
    return manifest


def _specialization() -> Any:
    """None on Linux (the CPU interpreter takes no options); the GPU on macOS."""
    import coreai.runtime as rt

    if sys.platform != "darwin" or not rt.SpecializationOptions.is_supported():
        return None
    return rt.SpecializationOptions.from_preferred_compute_unit_kind(rt.ComputeUnitKind.gpu())


class _RuntimeLoop:
    """An event loop on its own daemon thread, running coreai.runtime's coroutines for synchronous callers.

    coreai.runtime loads models and runs functions as coroutines. A loop driven from the caller's thread
    (``run_until_complete``) fails whenever that thread already runs a loop, as in an async web handler or a
    notebook: asyncio allows one running loop per thread ("Cannot run the event loop while another loop is
    running"). A loop on a thread of its own serves any caller; the caller blocks until the call is done.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="coreai-runtime", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop's thread and return its result (its exception is raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self, stack: contextlib.AsyncExitStack) -> None:
        """Exit ``stack`` (releasing the loaded models) on the loop, then stop the loop and its thread."""
        if self.loop.is_closed():
            return
        try:
            self.run(stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


class CoreAIBackend(Backend):
    """The DualAR and the codec as Core AI assets, behind :class:`.base.Backend` (batch 1).

    ``checkpoint`` is the one the assets were converted from (its fingerprint is checked; its config,
    tokenizer and codec sizes are used); ``assets`` is the folder :func:`convert` wrote. ``cfg`` is the
    checkpoint's config with ``max_seq_len`` set to the assets' context. The calls are synchronous: each
    runtime call runs on this object's own event loop in a thread of its own (:class:`_RuntimeLoop`), so they
    work from any thread, inside a running event loop too (which they block for the call, as a torch call
    would: an async server should call them from a worker thread). Not thread-safe: one utterance at a time
    (the KV state is the backend's).

    The loaded models are held for the backend's life (a function whose model was collected returns
    garbage); :meth:`close` releases them. The KV state is allocated as explicit zeros (the Linux runtime
    does not zero new arrays) and re-allocated by :meth:`reset`. ``calls`` counts runtime calls: one per
    prefill window, one per frame, one per codec window.

    Raises AssetError (missing, stale or foreign assets) or BackendError (Core AI packages missing).
    """

    name = "coreai"

    def __init__(self, checkpoint: Checkpoint, assets: str | Path):
        super().__init__()
        _require_coreai()
        self.checkpoint = checkpoint
        self.folder = Path(assets).expanduser()
        if not self.folder.is_dir():
            raise AssetError(f"no Core AI asset folder at {self.folder}; write one with: audio8 convert --model "
                             f"{checkpoint.path} --out {self.folder}")
        self.manifest = self._manifest("dualar")
        self.precision: str = self.manifest["precision"]
        self.context: int = self.manifest["context"]
        self.sampling = SamplingParams(**self.manifest["sampling"])
        self.cfg: ModelConfig = dataclasses.replace(checkpoint.config, max_seq_len=self.context)
        contract = self.manifest["contract"]
        self._state_specs = contract["prefill"]["states"]
        self._logit_dtype = np.dtype(contract["first_frame"]["inputs"]["logits"]["dtype"])
        self._runtime = _RuntimeLoop()
        self._stack = contextlib.AsyncExitStack()
        self._finalizer = weakref.finalize(self, self._runtime.close, self._stack)
        self._models: dict[str, Any] = {}
        self._fns = {name: self._model("dualar").load_function(name) for name in DUALAR_FUNCTIONS}
        self._codec: dict[str, tuple[Any, dict[str, Any]]] = {}
        self.calls = 0
        self._state: dict[str, Any] = {}
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self.reset()

    @property
    def description(self) -> str:
        return f"coreai {self.precision} ({self.folder})"

    def close(self) -> None:
        """Release the loaded models (the backend cannot be used afterwards)."""
        self._models.clear()
        self._fns.clear()
        self._codec.clear()
        self._finalizer()

    def _manifest(self, part: str) -> dict[str, Any]:
        manifest = read_manifest(self.folder / f"{part}.aimodel")
        want = self.checkpoint.fingerprint()
        got = manifest["source"]["fingerprint"]
        if got != want:
            raise AssetError(f"{self.folder / (part + '.aimodel')} was converted from another checkpoint "
                             f"({manifest['source']['path']}, fingerprint {got[:12]}), not from "
                             f"{self.checkpoint.path} (fingerprint {want[:12]}); convert this checkpoint: "
                             f"audio8 convert --model {self.checkpoint.path} --out DIR")
        if part != "dualar" and manifest["precision"] != self.precision:
            raise AssetError(f"{self.folder}: {part} is {manifest['precision']} but dualar is {self.precision}; "
                             "the folder mixes two conversions, convert again into a new folder")
        return manifest

    def _model(self, part: str) -> Any:
        """The loaded model of ``part`` (loaded once, held until :meth:`close`)."""
        if part not in self._models:
            from coreai.authoring import AIModelAsset

            asset = AIModelAsset.load(self.folder / f"{part}.aimodel")
            self._models[part] = self._runtime.run(self._stack.enter_async_context(asset.executable(_specialization())))
        return self._models[part]

    def _call(self, fn: Any, inputs: dict[str, np.ndarray],
              state: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """One runtime call of ``fn`` (inputs as NumPy arrays, ``state`` mutated in place) -> outputs (copies)."""
        import coreai.runtime as rt

        args = {k: rt.NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()}
        out = self._runtime.run(fn(inputs=args, state=state or {}))
        self.calls += 1
        # Copies: numpy() is a view of the runtime's buffer, which lives only as long as its NDArray.
        return {k: np.array(v.numpy()) for k, v in out.items()}

    def reset(self) -> None:
        """Fresh zero KV state (a new utterance)."""
        import coreai.runtime as rt

        self._state = {name: rt.NDArray(np.zeros(s["shape"], dtype=s["dtype"]))
                       for name, s in self._state_specs.items()}
        self._last = None

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`TorchBackend.prefill`: windows of 32 columns from slot 0, one runtime call each.

        Raises BackendError when the prompt does not fit the assets' context.
        """
        n = prompt.shape[1]
        if n >= self.context:
            raise BackendError(f"the prompt is {n} tokens but these Core AI assets hold a context of {self.context} "
                               "(prompt + frames); shorten the text, or convert with a larger --context (at most "
                               f"{self.checkpoint.config.max_seq_len})")
        self.reset()
        out: dict[str, np.ndarray] = {}
        real = 0
        for start in range(0, n, PREFILL_WIDTH):
            chunk = prompt[:, start:start + PREFILL_WIDTH]
            real = chunk.shape[1]
            window = np.zeros((prompt.shape[0], PREFILL_WIDTH), dtype=np.int32)
            window[0] = self.cfg.pad_token_id
            window[:, :real] = chunk
            out = self._call(self._fns["prefill"], {"codes": window[None], "pos": np.array([start], np.int32)},
                             self._state)
        self._last = (out["logits"][real - 1], out["hidden"][real - 1])
        return self._last[0].astype(np.float32), self._last[1].astype(np.float32)

    def codec_stream(self) -> CodecStream:
        """A stream that re-decodes the utterance so far at every push (:class:`.base.RedecodeStream`)."""
        return RedecodeStream(self)

    def _tail(self, params: SamplingParams, noise_slow: np.ndarray, window: np.ndarray, noise_fast: np.ndarray,
              forced: np.ndarray | None) -> dict[str, np.ndarray]:
        if not self.draws_like(params):
            raise BackendError(f"these Core AI assets were converted with sampling {self.sampling} baked into the "
                               f"frame graphs; {params} was asked for: use the converted settings, or convert "
                               "a variant with them")
        f = np.zeros(1 + self.cfg.num_codebooks, np.int32) if forced is None else np.asarray(forced, np.int32)
        return {"noise_slow": np.asarray(noise_slow, np.float32), "window": np.asarray(window, np.int32),
                "noise_fast": np.asarray(noise_fast, np.float32), "forced": f,
                "use_forced": np.array([0.0 if forced is None else 1.0], np.float32)}

    @staticmethod
    def _result(out: dict[str, np.ndarray]) -> FrameResult:
        return FrameResult(int(out["semantic"][0]), out["codes"].astype(np.int64), out["logits"].astype(np.float32),
                           out["hidden"].astype(np.float32), out["fast_logits"].astype(np.float32),
                           int(out["sampled_semantic"][0]), out["sampled_codes"].astype(np.int64))

    def first_frame(self, params: SamplingParams, noise_slow: np.ndarray, window: np.ndarray,
                    noise_fast: np.ndarray, forced: np.ndarray | None = None) -> FrameResult:
        """Frame 0 from the prefill's last logits/hidden (``first_frame``, one runtime call)."""
        if self._last is None:
            raise BackendError("first_frame needs a prefill first")
        tail = self._tail(params, noise_slow, window, noise_fast, forced)
        logits, hidden = self._last
        return self._result(self._call(self._fns["first_frame"], {"logits": logits, "hidden": hidden, **tail}))

    def frame(self, params: SamplingParams, column: np.ndarray, pos: int, noise_slow: np.ndarray,
              window: np.ndarray, noise_fast: np.ndarray, forced: np.ndarray | None = None) -> FrameResult:
        """The slow step on ``column`` int [1+C] at slot ``pos`` and the next frame (``frame``, one call).

        Raises BackendError for a ``pos`` outside the context or sampling settings other than the baked ones.
        """
        if not 0 <= pos < self.context:
            raise BackendError(f"slot {pos} is outside the assets' context of {self.context}")
        tail = self._tail(params, noise_slow, window, noise_fast, forced)
        codes = np.asarray(column, np.int32).reshape(1, -1, 1)
        return self._result(self._call(self._fns["frame"], {"codes": codes, "pos": np.array([pos], np.int32),
                                                            **tail}, self._state))

    def _codec_fn(self, part: str) -> tuple[Any, dict[str, Any]]:
        if part not in self._codec:
            manifest = self._manifest(part)
            self._codec[part] = (self._model(part).load_function("main"), manifest)
        return self._codec[part]

    def decode_window(self, codes: np.ndarray) -> np.ndarray:
        """Codes int [C, T] -> float32 audio [T * frame_length] at 44.1 kHz.

        Up to the decoder's bucket (160 frames by default) in one call, right-padded with zeros (the codec is
        causal, so the padding changes nothing before it). Longer utterances go in windows of the bucket that
        each keep ``decode_context`` earlier frames (128 by default: the codec transformer's window) and emit
        the frames after them, as streaming does.
        """
        fn, manifest = self._codec_fn("codec_decoder")
        bucket, ctx = manifest["frames"], manifest["decode_context"]
        hop = self.checkpoint.codec_config.frame_length
        codes = np.asarray(codes, dtype=np.int32)
        total = codes.shape[1]
        pieces = []
        done = 0
        while done < total:
            end = min(total, bucket if done == 0 else done + bucket - ctx)
            begin = max(0, end - bucket)
            window = np.zeros((1, codes.shape[0], bucket), dtype=np.int32)
            window[0, :, :end - begin] = codes[:, begin:end]
            wav = self._call(fn, {"codes": window})["wav"][0]
            pieces.append(wav[(done - begin) * hop:(end - begin) * hop])
            done = end
        return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Mono 44.1 kHz float32 audio [N] -> codes int64 [C, ceil(N / frame_length)] (one call).

        The clip is right-padded with zeros to the encoder's bucket (the encoder is causal). Raises
        BackendError for empty audio or a clip longer than the bucket (216 frames, 10.0 s by default).
        """
        fn, manifest = self._codec_fn("codec_encoder")
        bucket = manifest["frames"]
        hop, rate = self.checkpoint.codec_config.frame_length, self.checkpoint.codec_config.sample_rate
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        frames = -(-len(audio) // hop)
        if not 0 < frames <= bucket:
            raise BackendError(f"the Core AI codec encoder takes clips of up to {bucket * hop / rate:.1f} s "
                               f"({bucket} frames); this one is {len(audio) / rate:.1f} s: use a shorter clip, "
                               "or the torch backend")
        padded = np.zeros((1, 1, bucket * hop), dtype=np.float32)
        padded[0, 0, :len(audio)] = audio
        return self._call(fn, {"audio": padded})["codes"][0, :, :frames].astype(np.int64)
