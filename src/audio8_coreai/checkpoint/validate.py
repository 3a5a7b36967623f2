"""Check a checkpoint before anything is allocated: tensor names, shapes and dtypes against the config, the
codec's sizes read back from its shapes, and finite outputs (damaged weights that pass every header check)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..config import CodecConfig, ModelConfig, QuantizerTransformerConfig
from ..errors import CheckpointError

MAX_LISTED = 5  # mismatches named in one message; the totals say how many more there are

_FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16}


def require_finite(values, part: str, file: str):
    """``values`` (a NumPy array: logits, audio) unchanged when every entry is finite; else CheckpointError naming
    ``file``: NaN or inf out of the model or codec means damaged weights (a bad download or disk), whose
    headers and shapes still pass the load's checks. A check per prefill, frame and codec push: microseconds."""
    import numpy as np

    if not np.isfinite(values).all():
        raise damaged(part, file)
    return values


def damaged(part: str, file: str) -> CheckpointError:
    """The error for NaN or inf out of the ``part`` (model, codec): ``file`` is damaged (see :func:`require_finite`)."""
    return CheckpointError(
        f"the {part} produced NaN or infinite values: {file} is damaged (a bad download or disk); download the "
        "checkpoint again"
    )


def require_finite_weights(weights: Iterable[torch.Tensor], file: str) -> float:
    """The largest magnitude among ``weights``; raises CheckpointError naming ``file`` when one holds NaN or inf
    (damaged weights): a precision that packs them (fp16w saturates, int16 scales) would turn them finite and speak
    noise where fp32's outputs are refused (:func:`require_finite`). One ``aminmax`` a weight, which propagates
    NaN (a read at about the memory's bandwidth)."""
    reach = 0.0
    for w in weights:
        lo, hi = torch.aminmax(w.detach())
        lo, hi = lo.item(), hi.item()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise CheckpointError(
                f"{file} holds NaN or infinite weights: it is damaged (a bad download or disk); download the "
                "checkpoint again"
            )
        reach = max(reach, -lo, hi)
    return reach


def check_tensors(
    path: Path,
    against: str,
    expected: dict[str, tuple[int, ...]],
    actual: dict[str, tuple[tuple[int, ...], torch.dtype]],
) -> None:
    """Raise :class:`CheckpointError` unless ``actual`` has exactly the ``expected`` names and shapes.

    Every tensor must also be floating point. The message gives the totals and names the first few
    problems of each kind.
    """
    missing = [n for n in expected if n not in actual]
    unexpected = [n for n in actual if n not in expected]
    wrong = [
        f"{n} has shape {list(actual[n][0])}, expected {list(s)}"
        for n, s in expected.items()
        if n in actual and tuple(actual[n][0]) != tuple(s)
    ]
    wrong += [
        f"{n} has dtype {str(d).removeprefix('torch.')}, expected float32, float16 or bfloat16"
        for n, (_, d) in actual.items()
        if n in expected and d not in _FLOAT_DTYPES
    ]
    if not (missing or unexpected or wrong):
        return

    def listed(kind: str, items: list[str]) -> str:
        more = f" (+{len(items) - MAX_LISTED} more)" if len(items) > MAX_LISTED else ""
        return f"{kind}: " + "; ".join(items[:MAX_LISTED]) + more

    parts = [
        listed("missing", [f"{n} {list(expected[n])}" for n in missing]) if missing else "",
        listed("unexpected", [f"{n} {list(actual[n][0])}" for n in unexpected]) if unexpected else "",
        listed("wrong", wrong) if wrong else "",
    ]
    raise CheckpointError(
        f"{path} does not match {against}: {len(missing)} missing, {len(unexpected)} unexpected, "
        f"{len(wrong)} mis-shaped or mistyped of {len(expected)} expected tensors. "
        + " | ".join(p for p in parts if p)
        + f". Use the files that came together with this {against}, or download the checkpoint again."
    )


def check_model_sizes(cfg: ModelConfig, where: str, path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise :class:`CheckpointError` naming the ``config.json`` field (``where``) whose size the tensors of
    ``path`` (``shapes``, from its header) contradict: the slow and fast layer counts, vocabulary, width, codebooks,
    FFN widths and heads. Runs before the expected tensor list is built (it is as long as the layer counts say);
    :func:`check_tensors` then checks every tensor."""

    def layers(prefix: str) -> int | None:  # None, as for an absent tensor: check_tensors lists what is missing
        return len(_sorted_indices(list(shapes), rf"{prefix}\.(\d+)\.")) or None

    def size(name: str, axis: int) -> int | None:
        return shapes[name][axis] if name in shapes and len(shapes[name]) > axis else None

    found = [
        ("n_layer", cfg.n_layer, layers("layers"), "slow layers (layers.N)"),
        ("n_fast_layer", cfg.n_fast_layer, layers("fast_layers"), "fast layers (fast_layers.N)"),
        ("vocab_size", cfg.vocab_size, size("embeddings.weight", 0), "rows of embeddings.weight"),
        ("dim", cfg.dim, size("embeddings.weight", 1), "columns of embeddings.weight"),
        ("codebook_size", cfg.codebook_size, size("fast_embeddings.weight", 0), "rows of fast_embeddings.weight"),
        (
            "num_codebooks",
            cfg.codebook_size * cfg.num_codebooks,
            size("codebook_embeddings.weight", 0),
            "rows of codebook_embeddings.weight (codebook_size x num_codebooks)",
        ),
    ]
    for prefix, s in (("layers.0", cfg.slow_block), ("fast_layers.0", cfg.fast_block)):
        fast = "fast_" if prefix.startswith("fast") else ""
        heads = f"{fast}n_head, {fast}n_local_heads, {fast}head_dim"
        found += [
            (
                f"{fast}intermediate_size",
                s.ffn,
                size(f"{prefix}.feed_forward.w1.weight", 0),
                f"rows of {prefix}.feed_forward.w1.weight",
            ),
            (
                heads,
                (s.n_head + 2 * s.n_kv) * s.head_dim,
                size(f"{prefix}.attention.wqkv.weight", 0),
                f"rows of {prefix}.attention.wqkv.weight",
            ),
            (
                heads,
                s.n_head * s.head_dim,
                size(f"{prefix}.attention.wo.weight", 1),
                f"columns of {prefix}.attention.wo.weight",
            ),
        ]
    for field, expected, actual, what in found:
        if actual is not None and actual != expected:
            raise CheckpointError(
                f"{where}: {what} by {field}: {expected}, but {path} holds {actual}; use the files that came "
                "together with this config.json, or download the checkpoint again"
            )


def check_codec_sizes(
    cfg: ModelConfig, where: str, codec: CodecConfig, spec: str | None, path: Path, shapes: dict[str, tuple[int, ...]]
) -> None:
    """Raise :class:`CheckpointError` naming the field of ``codec_spec.json`` (``spec``; None: no spec) whose size
    the codec tensors of ``path`` (``shapes``) contradict, or the field of ``config.json`` (``where``, parsed as
    ``cfg``) that disagrees with the codec (``codec_sample_rate``, ``codec_frame_size``, ``num_codebooks``,
    ``codebook_size``). Runs before the expected tensor list is built; :func:`check_tensors` then checks every
    tensor."""
    if spec is not None:
        derived = derive_codec_config(shapes, codec)
        pairs = [(f.name, getattr(codec, f.name), getattr(derived, f.name)) for f in dataclasses.fields(codec)]
        pairs += [
            (
                f"quantizer_transformer.{f.name}",
                getattr(codec.quantizer_transformer, f.name),
                getattr(derived.quantizer_transformer, f.name),
            )
            for f in dataclasses.fields(codec.quantizer_transformer)
        ]
        for field, given, held in pairs:
            if field != "quantizer_transformer" and given != held:
                raise CheckpointError(
                    f"{spec}: {field} is {_listed(given)} but {path} holds {_listed(held)}; use the files that "
                    "came together with this codec_spec.json, or download the checkpoint again"
                )
    for field, given, held in (
        ("codec_sample_rate", cfg.codec_sample_rate, codec.sample_rate),
        ("codec_frame_size", cfg.codec_frame_size, codec.frame_length),
        ("num_codebooks", cfg.num_codebooks, codec.num_codebooks),
        ("codebook_size", cfg.codebook_size, codec.semantic_codebook_size),
    ):
        if given != held:
            raise CheckpointError(
                f"{where}: {field} is {given} but the codec ({path}) has {held}; use the files that came "
                "together with this config.json, or download the checkpoint again"
            )


def _listed(value: object) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


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
            len(_sorted_indices(names, rf"encoder\.block\.{b}\.block\.5\.layers\.(\d+)\.")) for b in enc_blocks
        )
        ffn = [
            shapes[n][0]
            for n in names
            if re.fullmatch(
                r"encoder\.block\.\d+\.block\.5\.layers\.0\.feed_forward"
                r"\.w1\.weight",
                n,
            )
        ]
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
